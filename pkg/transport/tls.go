package transport

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
)

// ALPN is the application protocol negotiated by quictun endpoints.
const ALPN = "quictun/1"

// ErrFingerprintMismatch is returned by the TLS handshake when a pinned server
// certificate does not match.
var ErrFingerprintMismatch = errors.New("server certificate fingerprint does not match --server-fingerprint")

// PinMismatchError is the error of a TLS handshake whose server presented a
// certificate that none of the pins in force for it accepts; it matches
// ErrFingerprintMismatch (errors.Is). quic-go keeps it in the dial error
// (errors.As finds it) and its text in the close reason.
type PinMismatchError struct {
	// Presented is the fingerprint of the certificate the server presented
	// ("sha256:HEX"; "" when it presented none).
	Presented string
}

func (e *PinMismatchError) Error() string {
	if e.Presented == "" {
		return ErrFingerprintMismatch.Error() + " (the server presented no certificate)"
	}
	return ErrFingerprintMismatch.Error() + " (the server presented " + e.Presented + ")"
}

// Is reports whether target is ErrFingerprintMismatch.
func (e *PinMismatchError) Is(target error) bool { return target == ErrFingerprintMismatch }

// ServerTLSConfig returns a TLS 1.3 server configuration presenting s.Cert.
// When clientCAs is non-nil, clients must present a certificate signed by
// one of them.
func ServerTLSConfig(s *State, clientCAs *x509.CertPool) *tls.Config {
	var cas *ClientCAs
	if clientCAs != nil {
		cas = NewClientCAs(clientCAs)
	}
	return ServerTLSConfigFor(NewServerCertificate(s.Cert), s.TicketKey, cas)
}

// ServerTLSConfigFor is ServerTLSConfig presenting what cert holds at each
// handshake, and, when clientCAs is non-nil, verifying client certificates
// against what clientCAs holds at each handshake, so both can be replaced
// while the server runs.
func ServerTLSConfigFor(cert *ServerCertificate, ticketKey [32]byte, clientCAs *ClientCAs) *tls.Config {
	c := &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil },
		NextProtos:     []string{ALPN},
	}
	c.SetSessionTicketKeys([][32]byte{ticketKey})
	if clientCAs != nil {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = clientCAs.Load()
		// Each handshake takes the pool in force: crypto/tls verifies a
		// full handshake's chain against it and a resumed session's chain
		// again, so a session ticket made under a removed CA no longer
		// resumes (the client then makes a full handshake, which fails).
		base := c.Clone()
		c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			hc := base.Clone()
			hc.ClientCAs = clientCAs.Load()
			return hc, nil
		}
	}
	return c
}

// ClientCAs are the CAs a server verifies client certificates against
// (mutual TLS), replaceable while it runs (a reload): handshakes from then
// on, resumed sessions included, need a certificate they verify; open
// connections keep running. Safe for concurrent use.
type ClientCAs struct {
	pool atomic.Pointer[x509.CertPool]
}

// NewClientCAs returns ClientCAs holding pool.
func NewClientCAs(pool *x509.CertPool) *ClientCAs {
	c := &ClientCAs{}
	c.Store(pool)
	return c
}

// Load returns the pool in force.
func (c *ClientCAs) Load() *x509.CertPool { return c.pool.Load() }

// Store replaces the pool for the handshakes that follow.
func (c *ClientCAs) Store(pool *x509.CertPool) { c.pool.Store(pool) }

// ServerCertificate is the certificate a server presents, replaceable while
// it runs (a reload): handshakes from then on present the new one; open
// connections, and sessions resumed from tickets made before (the ticket
// key stays), keep the one they were made with. Safe for concurrent use.
type ServerCertificate struct {
	cert atomic.Pointer[tls.Certificate]
}

// NewServerCertificate returns a ServerCertificate presenting c.
func NewServerCertificate(c tls.Certificate) *ServerCertificate {
	s := &ServerCertificate{}
	s.Store(c)
	return s
}

// Load returns the certificate presented now.
func (s *ServerCertificate) Load() *tls.Certificate { return s.cert.Load() }

// Store replaces the certificate for the handshakes that follow.
func (s *ServerCertificate) Store(c tls.Certificate) { s.cert.Store(&c) }

// Fingerprint is the SHA-256 fingerprint of the leaf certificate presented now.
func (s *ServerCertificate) Fingerprint() string { return Fingerprint(s.Load().Certificate[0]) }

// ClientTLSOptions says how a client verifies the server and proves who it is.
type ClientTLSOptions struct {
	// ServerName is verified against the certificate when RootCAs is used.
	ServerName string
	// RootCAs verifies the server's chain (--ca-file).
	RootCAs *x509.CertPool
	// Fingerprints pin the server's leaf certificate (--server-fingerprint):
	// any of them is accepted, so a server key can be rotated by pinning the
	// new one beside the old (as ssh's known_hosts allows several keys).
	// With several servers, each gets the configuration of its own pins
	// (Pins.For).
	Fingerprints [][32]byte
	// InsecureSkipVerify accepts any server (--insecure-skip-verify).
	InsecureSkipVerify bool
	// ClientCert is presented for mutual TLS.
	ClientCert *tls.Certificate
	// SessionCache enables resumption and 0-RTT.
	SessionCache tls.ClientSessionCache
}

// ErrNoServerVerification is returned when no way to verify the server was chosen.
var ErrNoServerVerification = errors.New("no server verification: set --server-fingerprint or --ca-file, or --insecure-skip-verify")

// ClientTLSConfig returns a TLS 1.3 client configuration.
func ClientTLSConfig(o ClientTLSOptions) (*tls.Config, error) {
	c := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{ALPN},
		ServerName:         o.ServerName,
		ClientSessionCache: o.SessionCache,
	}
	if o.ClientCert != nil {
		c.Certificates = []tls.Certificate{*o.ClientCert}
	}
	if scope := sessionScope(o.Fingerprints, o.ClientCert); scope != "" && o.SessionCache != nil {
		c.ClientSessionCache = scopedCache{ClientSessionCache: o.SessionCache, scope: scope}
	}
	switch {
	case len(o.Fingerprints) > 0:
		pins := slices.Clone(o.Fingerprints)
		// Chain verification is replaced by the pins; everything else in TLS stays.
		c.InsecureSkipVerify = true
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return &PinMismatchError{}
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			for _, want := range pins {
				if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
					return nil
				}
			}
			return &PinMismatchError{Presented: Fingerprint32(got)}
		}
	case o.RootCAs != nil:
		c.RootCAs = o.RootCAs
	case o.InsecureSkipVerify:
		c.InsecureSkipVerify = true
	default:
		return nil, ErrNoServerVerification
	}
	return c, nil
}

// scopedCache keeps the tickets of each set of pins, and of each client
// certificate, apart. A resumed session shows the certificates of the
// handshake that made its ticket, to both ends. A server that rotated its
// certificate but kept its session-ticket key resumes it: with pins that no
// longer accept that certificate every dial would fail, and the failed
// ticket would stay (StickySessionCache keeps tickets of failed handshakes,
// to resume after a server comes back). And a client given a new
// certificate would still be known to the server by the old one. With the
// tickets kept apart, another set of pins or another client certificate
// starts with a full handshake, which verifies the certificate the server
// presents now and presents the client's new one.
type scopedCache struct {
	tls.ClientSessionCache
	scope string
}

func (c scopedCache) Get(key string) (*tls.ClientSessionState, bool) {
	return c.ClientSessionCache.Get(c.scope + key)
}

func (c scopedCache) Put(key string, cs *tls.ClientSessionState) {
	c.ClientSessionCache.Put(c.scope+key, cs)
}

// sessionScope names a set of pins (in any order) and a client certificate
// for scopedCache; "" for neither.
func sessionScope(pins [][32]byte, cert *tls.Certificate) string {
	if len(pins) == 0 && (cert == nil || len(cert.Certificate) == 0) {
		return ""
	}
	sorted := slices.Clone(pins)
	slices.SortFunc(sorted, func(a, b [32]byte) int { return bytes.Compare(a[:], b[:]) })
	h := sha256.New()
	for _, p := range sorted {
		h.Write(p[:])
	}
	if cert != nil && len(cert.Certificate) > 0 {
		h.Write([]byte("client"))
		h.Write(cert.Certificate[0])
	}
	return "scope:" + hex.EncodeToString(h.Sum(nil)[:8]) + "|"
}

// LoadCertPool reads PEM certificates from file.
func LoadCertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("CA file %s: no PEM certificates", file)
	}
	return p, nil
}

// StickySessionCache is a TLS client session cache that keeps a ticket when a
// handshake that tried it fails. crypto/tls deletes the ticket then, so a
// client redialing a server that is down would have none left when the
// server comes back, and its reconnect could not use 0-RTT. A ticket the
// server no longer accepts is simply replaced after the full handshake.
type StickySessionCache struct {
	tls.ClientSessionCache
}

// NewStickySessionCache returns a StickySessionCache holding up to capacity tickets.
func NewStickySessionCache(capacity int) *StickySessionCache {
	return &StickySessionCache{ClientSessionCache: tls.NewLRUClientSessionCache(capacity)}
}

// Put stores cs under key; a nil cs (a deletion) is ignored.
func (c *StickySessionCache) Put(key string, cs *tls.ClientSessionState) {
	if cs == nil {
		return
	}
	c.ClientSessionCache.Put(key, cs)
}
