//go:build !race

package testutil

// RaceEnabled reports whether the tests run with the race detector, which
// slows quic-go about five times: tests that move data at a rate scale
// their expectations by it.
const RaceEnabled = false
