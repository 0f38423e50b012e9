// Package loadgen is the many-clients load generator of `bench loadgen`
// (issue 22): N emulated quictun clients in one process, each the real
// client library (client.New) on its own UDP socket and source address in
// 127.0.0.0/8, against a real quictun-server binary. It measures the
// server's memory, goroutines and CPU per connected client, handshakes per
// second per core (full and 0-RTT), and how long the clients take to come
// back after the server is restarted (SIGTERM and SIGKILL). See README.md.
package loadgen
