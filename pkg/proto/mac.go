package proto

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// macPool keeps keyed HMAC-SHA256 states of one secret for reuse: a new
// one costs several allocations and two SHA-256 blocks (the padded key)
// that a Reset state restores without, and every tunnel's header is
// signed (client) or verified (server) once. init sets its secret.
type macPool struct {
	secret []byte
	pool   sync.Pool
}

// init sets the secret p makes its states with (kept, not copied: the
// caller's is not changed after).
func (p *macPool) init(secret []byte) { p.secret = secret }

// sum appends the MAC of msg to b.
func (p *macPool) sum(b, msg []byte) []byte {
	m, _ := p.pool.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, p.secret)
	}
	m.Write(msg)
	b = m.Sum(b)
	m.Reset()
	p.pool.Put(m)
	return b
}

// verify tells whether mac is the MAC of msg, in constant time.
func (p *macPool) verify(msg, mac []byte) bool {
	var buf [sha256.Size]byte
	return hmac.Equal(p.sum(buf[:0], msg), mac)
}

// Signer signs stream headers with one shared secret: its key ID and
// HMAC states are made once (NewSigner), not per header. A client holds
// the Signer of the secret in force and replaces it on a reload. The zero
// Signer, or nil, signs with no secret (no MAC, no key ID).
type Signer struct {
	id  KeyID
	mac macPool
}

// NewSigner returns the Signer of secret (copied); an empty secret signs
// nothing.
func NewSigner(secret []byte) *Signer {
	if len(secret) == 0 {
		return &Signer{}
	}
	s := &Signer{id: KeyIDOf(secret)}
	s.mac.init(bytes.Clone(secret))
	return s
}

// Secret returns the secret s signs with (nil: none). The caller must not
// change it.
func (s *Signer) Secret() []byte {
	if s == nil {
		return nil
	}
	return s.mac.secret
}
