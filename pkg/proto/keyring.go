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
	sum := keyDigest(secret)
	return KeyID(sum[:KeyIDLen])
}

// keyDigest is SHA-256("quictun key id" || secret): its first KeyIDLen
// bytes are the key ID.
func keyDigest(secret []byte) [sha256.Size]byte {
	return sha256.Sum256(append([]byte("quictun key id"), secret...))
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
	// digest is keyDigest(Secret), filled by NewKeyring (Digest).
	digest [sha256.Size]byte
	// label is Label, filled by NewKeyring: every tunnel's header names
	// its key in logs and rules.
	label string
}

// Digest tells keys apart where their 4-byte IDs may collide (thousands of
// keys): the whole SHA-256 their ID is the start of. Distinct secrets have
// distinct digests.
func (k Key) Digest() [sha256.Size]byte {
	if k.digest == ([sha256.Size]byte{}) {
		return keyDigest(k.Secret)
	}
	return k.digest
}

// Label is how logs and rules name the key: its Name, or its ID in hex.
func (k Key) Label() string {
	if k.label != "" {
		return k.label
	}
	if k.Name != "" {
		return k.Name
	}
	return k.ID.String()
}

// MaxKeys bounds a Keyring: a shared server holds a key per user. A header
// names its key by ID (a map lookup, whatever the number of keys); IDs are
// 4 bytes, so among thousands of keys a few may share one, and such a
// header is tried against each of them (at most a handful).
const MaxKeys = 1 << 17

// MaxLegacyKeys bounds the keys a header without a key ID (a client from
// before key IDs) is tried against: each costs an HMAC per such header, so
// only the first MaxLegacyKeys keys of the ring (the --secret-file key, then
// --keys-file's in file order) accept such clients.
const MaxLegacyKeys = 16

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
	// macs are the HMAC states of keys[i] (macPool), reused across headers.
	macs []macPool
	// byID indexes keys by ID (several when IDs collide).
	byID map[KeyID][]int32
}

// NewKeyring returns a keyring of keys, filling in their IDs. Secrets must
// be non-empty, distinct and at most MaxKeys; names, when given, distinct
// and none the hex ID of a key (the label of an unnamed key: such a name
// would give its holders that key's identity in logs and rules). It takes
// time linear in the number of keys.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) > MaxKeys {
		return nil, fmt.Errorf("%d keys: at most %d", len(keys), MaxKeys)
	}
	kr := &Keyring{keys: make([]Key, 0, len(keys)), byID: make(map[KeyID][]int32, len(keys))}
	digests, names := make(map[[sha256.Size]byte]int, len(keys)), make(map[string]int, len(keys))
	for i, k := range keys {
		if len(k.Secret) == 0 {
			return nil, fmt.Errorf("key %d: empty secret", i+1)
		}
		k.digest = keyDigest(k.Secret)
		k.ID = KeyID(k.digest[:KeyIDLen])
		if j, dup := digests[k.digest]; dup {
			return nil, fmt.Errorf("key %d: the same secret as key %d", i+1, j)
		}
		digests[k.digest] = i + 1
		if k.Name != "" {
			if j, dup := names[k.Name]; dup {
				return nil, fmt.Errorf("key %d: the same name %q as key %d", i+1, k.Name, j)
			}
			names[k.Name] = i + 1
		}
		k.label = ""
		k.label = k.Label()
		kr.byID[k.ID] = append(kr.byID[k.ID], int32(len(kr.keys)))
		kr.keys = append(kr.keys, k)
	}
	for i, k := range kr.keys {
		if len(k.Name) != 2*KeyIDLen {
			continue
		}
		var id KeyID
		if _, err := hex.Decode(id[:], []byte(k.Name)); err != nil || id.String() != k.Name {
			continue
		}
		for _, j := range kr.byID[id] {
			other := kr.keys[j]
			whose := fmt.Sprintf("key %d", j+1)
			if other.Name == "" {
				whose += " (the unnamed key, e.g. --secret-file's)"
			}
			return nil, fmt.Errorf("key %d: the name %q is the ID of %s: a key's ID names the unnamed key in logs and --allow-for key=ID rules; pick another name",
				i+1, k.Name, whose)
		}
	}
	kr.macs = make([]macPool, len(kr.keys))
	for i := range kr.keys {
		kr.macs[i].init(kr.keys[i].Secret)
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

// Verify returns the key h's MAC was made with: the key its ID names (a map
// lookup; among keys sharing the ID, the one whose MAC matches), or, for a
// header without a key ID, whichever of the first MaxLegacyKeys keys
// verifies it. Errors wrap ErrAuth (ErrNoMAC, ErrUnknownKey, or a wrong
// MAC).
func (kr *Keyring) Verify(h *Header) (Key, error) {
	if !h.HasMAC {
		return Key{}, ErrNoMAC
	}
	if h.HasKeyID {
		idx, ok := kr.byID[h.KeyID]
		if !ok {
			return Key{}, ErrUnknownKey
		}
		var err error
		for _, i := range idx {
			if err = h.verifyWith(&kr.macs[i]); err == nil {
				return kr.keys[i], nil
			}
		}
		return Key{}, err
	}
	for i := range min(len(kr.keys), MaxLegacyKeys) {
		if h.verifyWith(&kr.macs[i]) == nil {
			return kr.keys[i], nil
		}
	}
	return Key{}, ErrAuth
}
