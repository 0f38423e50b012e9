package proto

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

const (
	// Version is the protocol version written by this implementation.
	Version = 1
	// MaxTokenLen bounds the destination token, and so the header size.
	MaxTokenLen = 1024
	// NonceLen is the size of the single-use nonce.
	NonceLen = 16
	// MACLen is the size of the HMAC-SHA256 tag.
	MACLen = sha256.Size
	// KeyIDLen is the size of a key ID.
	KeyIDLen = 4
	// MaxHeaderLen is the largest encoded header.
	MaxHeaderLen = fixedLen + MaxTokenLen + KeyIDLen + 1 + ResumeIDLen + MACLen
	// ResumeIDLen is the size of a resumable tunnel's ID.
	ResumeIDLen = 16

	fixedLen   = 1 + 1 + 8 + NonceLen + 2
	flagMAC    = 1 << 0
	flagKeyID  = 1 << 1
	flagKind   = 1 << 2
	flagResume = 1 << 3
)

// Kind is what a stream carries.
type Kind uint8

// Stream kinds. A header without the kind flag is a TCP stream (KindTCP),
// so TCP tunnels keep working with servers from before kinds.
const (
	// KindTCP is a byte stream to a tcp: or unix: destination.
	KindTCP Kind = 1
	// KindUDP is a UDP flow (pkg/udpflow) to a udp: destination.
	KindUDP Kind = 2
	// KindReverse is reserved for a reverse bind (the server listens).
	KindReverse Kind = 3
	// KindHello proves the shared secret on a new connection before any
	// tunnel: no destination (its token is HelloToken), nothing follows the
	// header; the server answers the Reply and ends the stream.
	KindHello Kind = 4
	// KindCheck asks whether the server's rules admit the header's
	// destination for this client, without dialing it: nothing follows the
	// header; the server answers CodeOK and ends the stream, or resets it
	// with CodeRefused (or the code of another failure).
	KindCheck Kind = 5
	// KindResume continues a resumable tunnel on a new connection: its
	// token names the tunnel and the bytes the client received
	// (pkg/resume, Request); the server answers CodeOK and the bytes it
	// received, or resets the stream with CodeResumeRefused.
	KindResume Kind = 6
)

// HelloToken is the token of a KindHello header (a header's token is never
// empty); servers ignore it.
const HelloToken = "hello"

// NewHello returns a KindHello header with the current time and a fresh nonce.
func NewHello(now time.Time) (*Header, error) {
	h, err := NewHeader(HelloToken, now)
	if err != nil {
		return nil, err
	}
	h.Kind = KindHello
	return h, nil
}

// NewCheck returns a KindCheck header for token with the current time and a
// fresh nonce.
func NewCheck(token string, now time.Time) (*Header, error) {
	h, err := NewHeader(token, now)
	if err != nil {
		return nil, err
	}
	h.Kind = KindCheck
	return h, nil
}

// String names the kind for logs.
func (k Kind) String() string {
	switch k {
	case KindTCP:
		return "tcp"
	case KindUDP:
		return "udp"
	case KindReverse:
		return "reverse"
	case KindHello:
		return "hello"
	case KindCheck:
		return "check"
	case KindResume:
		return "resume"
	}
	return fmt.Sprintf("kind_%d", uint8(k))
}

var (
	// ErrBadHeader is returned (wrapped) for any malformed header.
	ErrBadHeader = errors.New("bad stream header")
	// ErrUnsupportedVersion is returned (wrapped) for a header of an unknown version.
	ErrUnsupportedVersion = errors.New("unsupported protocol version")
	// ErrAuth is returned when a MAC is missing or wrong.
	ErrAuth = errors.New("stream header authentication failed")
)

// Header is the first thing a client writes on a tunnel stream.
type Header struct {
	// Time is when the client made the header (second resolution on the wire).
	Time time.Time
	// Nonce is random and never reused by a client.
	Nonce [NonceLen]byte
	// Token names the destination, as understood by the server's token parser.
	Token string
	// HasMAC reports whether the decoded header carried a MAC.
	HasMAC bool
	// KeyID names the secret the MAC was made with (KeyIDOf), when HasKeyID.
	// Headers of clients before key IDs carry a MAC without one.
	KeyID    KeyID
	HasKeyID bool
	// Kind is what the stream carries; the zero value, like a header without
	// a kind, means KindTCP. Decode keeps unknown kinds for the server to
	// refuse with CodeUnsupported.
	Kind Kind
	// ResumeID, when HasResumeID, asks the server to keep the tunnel
	// resumable (pkg/resume): the client chose it at random. Servers from
	// before resumable tunnels refuse such a header (bad_header): a client
	// sends it only with --resume-window.
	ResumeID    [ResumeIDLen]byte
	HasResumeID bool

	mac    [MACLen]byte
	signed []byte // the bytes the MAC covers, kept by Decode for Verify
}

// NewHeader returns a header for token with the current time and a fresh nonce.
func NewHeader(token string, now time.Time) (*Header, error) {
	h := &Header{Time: now, Token: token}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return nil, fmt.Errorf("nonce: %w", err)
	}
	return h, nil
}

// Append encodes h onto b. When secret is non-empty the header carries the
// secret's key ID and a MAC.
func (h *Header) Append(b []byte, secret []byte) ([]byte, error) {
	return h.AppendSigned(b, NewSigner(secret))
}

// AppendSigned is Append with the secret s holds (nil: none), without
// making its HMAC states again: a client signs every tunnel's header.
func (h *Header) AppendSigned(b []byte, s *Signer) ([]byte, error) {
	if len(s.Secret()) == 0 {
		return h.appendMAC(b, nil, nil)
	}
	return h.appendMAC(b, &s.mac, &s.id)
}

// append is appendMAC with a MAC made with secret when it is non-empty.
func (h *Header) append(b, secret []byte, keyID *KeyID) ([]byte, error) {
	if len(secret) == 0 {
		return h.appendMAC(b, nil, keyID)
	}
	var p macPool
	p.init(secret)
	return h.appendMAC(b, &p, keyID)
}

// appendMAC encodes h with a MAC when mac is not nil, and with keyID when
// it is not nil (nil: the form of clients before key IDs).
func (h *Header) appendMAC(b []byte, mac *macPool, keyID *KeyID) ([]byte, error) {
	if len(h.Token) == 0 || len(h.Token) > MaxTokenLen {
		return nil, fmt.Errorf("%w: token length %d not in 1..%d", ErrBadHeader, len(h.Token), MaxTokenLen)
	}
	// One allocation of the size this header can take at most, not of
	// MaxHeaderLen (1 KiB more per tunnel for a short token).
	b = slices.Grow(b, fixedLen+len(h.Token)+KeyIDLen+1+ResumeIDLen+MACLen)
	start := len(b)
	var flags byte
	if mac != nil {
		flags |= flagMAC
	}
	if keyID != nil {
		flags |= flagKeyID
	}
	if h.Kind != 0 && h.Kind != KindTCP {
		flags |= flagKind
	}
	if h.HasResumeID {
		flags |= flagResume
	}
	b = append(b, Version, flags)
	b = binary.BigEndian.AppendUint64(b, uint64(h.Time.Unix())) // negative times encode as large values and fail the window check
	b = append(b, h.Nonce[:]...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(h.Token))) // bounded by MaxTokenLen above
	b = append(b, h.Token...)
	if keyID != nil {
		b = append(b, keyID[:]...)
	}
	if flags&flagKind != 0 {
		b = append(b, byte(h.Kind))
	}
	if h.HasResumeID {
		b = append(b, h.ResumeID[:]...)
	}
	if mac != nil {
		b = mac.sum(b, b[start:])
	}
	return b, nil
}

// Decode reads exactly one header from r, never more bytes than it needs, so the
// application bytes that follow stay in r.
func Decode(r io.Reader) (*Header, error) {
	var fixed [fixedLen]byte
	if _, err := io.ReadFull(r, fixed[:]); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadHeader, err)
	}
	if fixed[0] != Version {
		return nil, fmt.Errorf("%w: %d", ErrUnsupportedVersion, fixed[0])
	}
	flags := fixed[1]
	if flags&^(flagMAC|flagKeyID|flagKind|flagResume) != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrBadHeader, flags)
	}
	n := int(binary.BigEndian.Uint16(fixed[26:28]))
	if n == 0 || n > MaxTokenLen {
		return nil, fmt.Errorf("%w: token length %d not in 1..%d", ErrBadHeader, n, MaxTokenLen)
	}
	hasKeyID, hasKind, hasResume := flags&flagKeyID != 0, flags&flagKind != 0, flags&flagResume != 0
	tail := 0
	if hasKeyID {
		tail = KeyIDLen
	}
	if hasKind {
		tail++
	}
	if hasResume {
		tail += ResumeIDLen
	}
	signed := make([]byte, fixedLen+n+tail)
	copy(signed, fixed[:])
	if _, err := io.ReadFull(r, signed[fixedLen:]); err != nil {
		return nil, fmt.Errorf("%w: token: %w", ErrBadHeader, err)
	}
	h := &Header{
		Time:     time.Unix(int64(binary.BigEndian.Uint64(fixed[2:10])), 0), // any value is accepted here and checked against the window later
		Token:    string(signed[fixedLen : fixedLen+n]),
		HasMAC:   flags&flagMAC != 0,
		HasKeyID: hasKeyID,
		signed:   signed,
	}
	if hasKeyID {
		copy(h.KeyID[:], signed[fixedLen+n:])
	}
	if hasResume {
		h.HasResumeID = true
		copy(h.ResumeID[:], signed[len(signed)-ResumeIDLen:])
	}
	h.Kind = KindTCP
	if hasKind {
		h.Kind = Kind(signed[len(signed)-1-resumeTail(hasResume)])
		if h.Kind == KindTCP || h.Kind == 0 {
			return nil, fmt.Errorf("%w: kind %d is written without the kind flag", ErrBadHeader, h.Kind)
		}
	}
	copy(h.Nonce[:], fixed[10:26])
	if h.HasMAC {
		if _, err := io.ReadFull(r, h.mac[:]); err != nil {
			return nil, fmt.Errorf("%w: mac: %w", ErrBadHeader, err)
		}
	}
	return h, nil
}

// resumeTail is the size of the resume ID at the end of the signed bytes.
func resumeTail(has bool) int {
	if has {
		return ResumeIDLen
	}
	return 0
}

// Verify checks a decoded header's MAC against secret in constant time.
func (h *Header) Verify(secret []byte) error {
	if !h.HasMAC || h.signed == nil {
		return fmt.Errorf("%w: no MAC", ErrAuth)
	}
	m := hmac.New(sha256.New, secret)
	m.Write(h.signed)
	if !hmac.Equal(m.Sum(nil), h.mac[:]) {
		return ErrAuth
	}
	return nil
}

// verifyWith is Verify with the HMAC states of the secret p holds.
func (h *Header) verifyWith(p *macPool) error {
	if !h.HasMAC || h.signed == nil {
		return fmt.Errorf("%w: no MAC", ErrAuth)
	}
	if !p.verify(h.signed, h.mac[:]) {
		return ErrAuth
	}
	return nil
}

// WriteReply writes the one-byte reply.
func WriteReply(w io.Writer, c Code) error {
	_, err := w.Write([]byte{byte(c)})
	return err
}

// ReadReply reads the one-byte reply. A non-OK code is returned as *RemoteError.
func ReadReply(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	if c := Code(b[0]); c != CodeOK {
		return &RemoteError{Code: c}
	}
	return nil
}

// TunnelID is the header's nonce in the form of a UUID
// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx): random, never reused, and known to
// both ends, it names the tunnel the header opened on both (GET /tunnels).
func (h *Header) TunnelID() string {
	var b [36]byte
	hex.Encode(b[0:8], h.Nonce[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], h.Nonce[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], h.Nonce[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], h.Nonce[8:10])
	b[23] = '-'
	hex.Encode(b[24:36], h.Nonce[10:16])
	return string(b[:])
}
