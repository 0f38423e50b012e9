//go:build !race

package tcpmux_test

const raceEnabled = false
