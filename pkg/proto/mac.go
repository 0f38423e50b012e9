package proto

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
	"sync/atomic"
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

// signer is a client's secret ready to sign headers with: its key ID and
// its HMAC states.
type signer struct {
	id  KeyID
	mac macPool
}

// lastSigner is the signer of the secret Append was last given: a client
// signs every header with one secret, and a new one (a reload) replaces
// it.
var lastSigner atomic.Pointer[signer]

// signerOf returns the signer of secret, made once per secret in a row.
func signerOf(secret []byte) *signer {
	if s := lastSigner.Load(); s != nil && bytes.Equal(s.mac.secret, secret) {
		return s
	}
	s := &signer{id: KeyIDOf(secret)}
	s.mac.init(bytes.Clone(secret))
	lastSigner.Store(s)
	return s
}
