// Package backoff computes capped exponential reconnect delays with full
// jitter, and resets them once a connection has stayed up for a while
// (cloudflared's retry/backoffhandler.go does the same). Time is read through
// an injectable Clock so tests can run without sleeping.
//
// The package imports only the standard library.
package backoff
