// Package transport builds the TLS and QUIC configuration shared by the quictun
// endpoints: TLS 1.3 only with the quictun ALPN, a persisted self-signed server
// identity with its SHA-256 fingerprint, certificate pinning, mutual TLS, and the
// keys (stateless reset, session tickets) that must survive a server restart.
package transport
