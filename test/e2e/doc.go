// Package e2e runs the real quictun-server, quictun-client and latency-client
// binaries as processes on loopback and checks what operators and applications
// see: exit codes, logs, the admin API, Prometheus metrics and the bytes that
// cross the tunnel. TestMain builds the binaries once (with -race when the
// tests run with -race, so a data race in a daemon fails the test).
package e2e
