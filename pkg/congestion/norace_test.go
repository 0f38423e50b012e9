//go:build !race

package congestion_test

const raceEnabled = false
