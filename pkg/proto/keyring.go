package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// KeyID names a shared secret on the wire without revealing it: the first
// KeyIDLen bytes of SHA-256("quictun key id" || secret). Both ends derive it,
// so nothing but the secret needs configuring.
type KeyID [KeyIDLen]byte

// KeyIDOf returns the key ID of secret.
func KeyIDOf(secret []byte) KeyID {
	sum := sha256.Sum256(append([]byte("quictun key id"), secret...))
	return KeyID(sum[:KeyIDLen])
}

// String is the key ID in hex.
func (id KeyID) String() string { return hex.EncodeToString(id[:]) }

// Key is one shared secret a server accepts.
type Key struct {
	// Name identifies the key's holders in logs and --allow-for rules
	// ("key=NAME"); "" names it by its ID.
	Name   string
	Secret []byte
	ID     KeyID
}

// Label is how logs and rules name the key: its Name, or its ID in hex.
func (k Key) Label() string {
	if k.Name != "" {
		return k.Name
	}
	return k.ID.String()
}

// MaxKeys bounds a Keyring: a header without a key ID (a client from before
// key IDs) is tried against every key, so each one costs an HMAC per such
// header.
const MaxKeys = 16

var (
	// ErrUnknownKey: the header names a key the server does not have (a
	// client still using a secret that was removed).
	ErrUnknownKey = fmt.Errorf("%w: unknown key", ErrAuth)
	// ErrNoMAC: the header carries no MAC.
	ErrNoMAC = fmt.Errorf("%w: no MAC", ErrAuth)
)

// Keyring holds the shared secrets a server accepts, for rotation without
// downtime: add the new secret to the servers, move clients to it, remove
// the old one. It is immutable; replace it to change keys.
type Keyring struct {
	keys []Key
}

// NewKeyring returns a keyring of keys, filling in their IDs. Secrets must
// be non-empty, distinct (by ID) and at most MaxKeys; names, when given,
// distinct and none the hex ID of a key (the label of an unnamed key: such
// a name would give its holders that key's identity in logs and rules).
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) > MaxKeys {
		return nil, fmt.Errorf("%d keys: at most %d", len(keys), MaxKeys)
	}
	kr := &Keyring{keys: make([]Key, 0, len(keys))}
	ids, names := map[KeyID]int{}, map[string]int{}
	for i, k := range keys {
		if len(k.Secret) == 0 {
			return nil, fmt.Errorf("key %d: empty secret", i+1)
		}
		k.ID = KeyIDOf(k.Secret)
		if j, dup := ids[k.ID]; dup {
			return nil, fmt.Errorf("key %d: the same secret as key %d", i+1, j)
		}
		ids[k.ID] = i + 1
		if k.Name != "" {
			if j, dup := names[k.Name]; dup {
				return nil, fmt.Errorf("key %d: the same name %q as key %d", i+1, k.Name, j)
			}
			names[k.Name] = i + 1
		}
		kr.keys = append(kr.keys, k)
	}
	for i, k := range kr.keys {
		for j, other := range kr.keys {
			if k.Name == "" || k.Name != other.ID.String() {
				continue
			}
			whose := fmt.Sprintf("key %d", j+1)
			if other.Name == "" {
				whose += " (the unnamed key, e.g. --secret-file's)"
			}
			return nil, fmt.Errorf("key %d: the name %q is the ID of %s: a key's ID names the unnamed key in logs and --allow-for key=ID rules; pick another name",
				i+1, k.Name, whose)
		}
	}
	return kr, nil
}

// Len is the number of keys (0: no shared-secret authentication).
func (kr *Keyring) Len() int {
	if kr == nil {
		return 0
	}
	return len(kr.keys)
}

// Keys returns a copy of the keys.
func (kr *Keyring) Keys() []Key {
	if kr == nil {
		return nil
	}
	return append([]Key(nil), kr.keys...)
}

// Verify returns the key h's MAC was made with: the key its ID names, or,
// for a header without a key ID, whichever key verifies it. Errors wrap
// ErrAuth (ErrNoMAC, ErrUnknownKey, or a wrong MAC).
func (kr *Keyring) Verify(h *Header) (Key, error) {
	if !h.HasMAC {
		return Key{}, ErrNoMAC
	}
	if h.HasKeyID {
		for _, k := range kr.keys {
			if k.ID == h.KeyID {
				if err := h.Verify(k.Secret); err != nil {
					return Key{}, err
				}
				return k, nil
			}
		}
		return Key{}, ErrUnknownKey
	}
	for _, k := range kr.keys {
		if h.Verify(k.Secret) == nil {
			return k, nil
		}
	}
	return Key{}, ErrAuth
}
