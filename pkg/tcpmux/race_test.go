//go:build race

package tcpmux_test

// raceEnabled: the race detector slows copying about tenfold; the bulk
// tests move less data (the code paths are the same).
const raceEnabled = true
