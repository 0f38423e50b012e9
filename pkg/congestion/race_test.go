//go:build race

package congestion_test

const raceEnabled = true
