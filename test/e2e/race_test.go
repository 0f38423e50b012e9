//go:build race

package e2e

// raceEnabled reports whether the tests (and so the binaries) are built with -race.
const raceEnabled = true
