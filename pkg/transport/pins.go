package transport

import (
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
)

// Pins are a client's certificate pins (--server-fingerprint), for one
// server or several. An entry is either a fingerprint, "sha256:HEX", which
// every server without pins of its own accepts, or "ENDPOINT=sha256:HEX",
// which pins the certificate of the server at ENDPOINT (HOST:PORT, written
// as in --server-endpoint): a server with pins of its own accepts only
// those, so the key of one server cannot impersonate another. A name that
// resolves to several addresses is one endpoint: its pins bind to the name
// as written, and every address it resolves to must present one of them.
// Several pins for one scope are each accepted (a key rotation).
type Pins struct {
	// All are accepted by every server without pins of its own.
	All [][32]byte
	// ByEndpoint are the pins of single servers, by endpoint as written.
	ByEndpoint map[string][][32]byte
	// entries are the entries in canonical form ("sha256:HEX",
	// "ENDPOINT=sha256:HEX"), in order, each once.
	entries []string
}

// ParsePins parses --server-fingerprint entries. Every bad entry is
// reported, each naming the entry and the forms accepted.
func ParsePins(entries []string) (Pins, error) {
	var p Pins
	var errs []error
	for _, e := range entries {
		ep, fp, own := strings.Cut(strings.TrimSpace(e), "=")
		if !own {
			ep, fp = "", ep
		}
		ep, fp = strings.TrimSpace(ep), strings.TrimSpace(fp)
		if own {
			if _, port, err := net.SplitHostPort(ep); err != nil || port == "" {
				errs = append(errs, fmt.Errorf("--server-fingerprint %q: %q is not HOST:PORT; want sha256:HEX (every server) or HOST:PORT=sha256:HEX (the server at that --server-endpoint only)", e, ep))
				continue
			}
		}
		pin, err := ParseFingerprint(fp)
		switch {
		case err != nil && !own && strings.Contains(fp, ":sha256:"):
			errs = append(errs, fmt.Errorf("--server-fingerprint %q: %w; to pin one server write HOST:PORT=sha256:HEX (an '=' between the endpoint and the fingerprint)", e, err))
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("--server-fingerprint %q: %w, as printed by 'quictun-server fingerprint'", e, err))
			continue
		case pin == [32]byte{}:
			errs = append(errs, fmt.Errorf("--server-fingerprint %q is the all-zero placeholder: replace it with the output of 'quictun-server fingerprint' on the server host", e))
			continue
		}
		canon := Fingerprint32(pin)
		if own {
			canon = ep + "=" + canon
		}
		if slices.Contains(p.entries, canon) {
			continue
		}
		p.entries = append(p.entries, canon)
		if !own {
			p.All = append(p.All, pin)
			continue
		}
		if p.ByEndpoint == nil {
			p.ByEndpoint = map[string][][32]byte{}
		}
		p.ByEndpoint[ep] = append(p.ByEndpoint[ep], pin)
	}
	return p, errors.Join(errs...)
}

// Empty reports whether there are no pins.
func (p Pins) Empty() bool { return len(p.entries) == 0 }

// For returns the pins the server at endpoint accepts: its own, or else
// those of every server (nil: none).
func (p Pins) For(endpoint string) [][32]byte {
	if own, ok := p.ByEndpoint[endpoint]; ok {
		return own
	}
	return p.All
}

// Entries returns the entries in canonical form, in order, each once (to
// tell what a reload changed).
func (p Pins) Entries() []string { return slices.Clone(p.entries) }

// Check returns an error for each endpoint with pins of its own that is
// not one of endpoints, and for each of endpoints without a pin when not
// every server has one (no "sha256:HEX" entry): a server no pin covers
// could not be verified.
func (p Pins) Check(endpoints []string) error {
	var errs []error
	for _, e := range p.entries {
		ep, _, own := strings.Cut(e, "=")
		if own && !slices.Contains(endpoints, ep) {
			errs = append(errs, fmt.Errorf("--server-fingerprint %s names %s, which is not a --server-endpoint (%s): write the endpoint exactly as in --server-endpoint, or add it there",
				e, ep, strings.Join(endpoints, ",")))
		}
	}
	if len(p.All) == 0 && len(p.ByEndpoint) > 0 {
		for _, ep := range endpoints {
			if _, ok := p.ByEndpoint[ep]; !ok {
				errs = append(errs, fmt.Errorf("--server-endpoint %s has no pin: add --server-fingerprint %s=sha256:HEX (what 'quictun-server fingerprint' prints on that host), or a sha256:HEX entry for every server without pins of its own", ep, ep))
			}
		}
	}
	return errors.Join(errs...)
}

// Fingerprint32 formats a pin as "sha256:<hex>", as Fingerprint does a
// certificate.
func Fingerprint32(pin [32]byte) string { return "sha256:" + hex.EncodeToString(pin[:]) }

// ClientTLSConfigs returns the TLS configurations of a client of the
// servers pins covers: all verifies every server without pins of its own
// (with pins.All, or o's CAs when there are no pins; nil when every server
// has its own, see Check), byEndpoint each server with pins of its own. o's
// Fingerprints are ignored.
func ClientTLSConfigs(o ClientTLSOptions, pins Pins) (all *tls.Config, byEndpoint map[string]*tls.Config, err error) {
	for ep, own := range pins.ByEndpoint {
		if byEndpoint == nil {
			byEndpoint = map[string]*tls.Config{}
		}
		so := o
		so.Fingerprints = own
		if byEndpoint[ep], err = ClientTLSConfig(so); err != nil {
			return nil, nil, err
		}
	}
	if len(pins.ByEndpoint) > 0 && len(pins.All) == 0 {
		return nil, byEndpoint, nil
	}
	o.Fingerprints = pins.All
	all, err = ClientTLSConfig(o)
	return all, byEndpoint, err
}
