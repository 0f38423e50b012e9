package proto

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A reverse forward (--remote-forward LISTEN=DESTINATION on the client) is
// two kinds of streams:
//
//   - the bind: a stream the client opens on each new connection, with a
//     header of KindReverse whose token is Bind.Token(): "bind/1/ID/LISTEN".
//     The server checks it as any header (MAC, freshness, replay), then its
//     --allow-remote-listen rules for the client's identity, listens at
//     LISTEN, answers CodeOK and keeps the stream open: the binding lasts
//     until either end ends the stream or the connection ends. A refusal
//     resets the stream with its code (CodeRefused: no rule admits it;
//     CodeAddrInUse: another client holds the address; CodeUnsupported: a
//     server without reverse forwards, or one whose operator allows none).
//   - the bound streams: for each connection (or UDP flow) the server
//     accepts at LISTEN, it opens a stream toward the client with a header
//     of KindTCP or KindUDP whose token is BoundToken(ID) ("bound/1/ID"):
//     it names the binding, never a destination. The client dials the
//     DESTINATION it declared for ID and answers with the reply byte, as
//     the server does for a forward; it refuses any other token (a server
//     cannot make it dial anything else).
//
// The "1" is the version of these encodings: a later one changes it, and a
// peer that does not know it refuses the token (CodeBadToken).
const (
	bindPrefix  = "bind/1/"
	boundPrefix = "bound/1/"
	// MaxBindID bounds a binding's ID (the client numbers its reverse
	// forwards from 0).
	MaxBindID = 1023
)

// ErrBadBind wraps errors about a bind or bound token that does not parse.
var ErrBadBind = errors.New("bad reverse forward token")

// Bind asks the server to listen for a reverse forward.
type Bind struct {
	// ID names the binding on its connection: the bound streams carry it.
	ID int
	// Listen is where the server listens: tcp:HOST:PORT, udp:HOST:PORT or
	// unix:/path (the server parses and checks it).
	Listen string
}

// Token encodes b as a header token.
func (b Bind) Token() string { return bindPrefix + strconv.Itoa(b.ID) + "/" + b.Listen }

// NewBind returns a KindReverse header for b with the current time and a
// fresh nonce.
func NewBind(b Bind, now time.Time) (*Header, error) {
	if b.ID < 0 || b.ID > MaxBindID || b.Listen == "" {
		return nil, fmt.Errorf("%w: id %d, listen %q", ErrBadBind, b.ID, b.Listen)
	}
	h, err := NewHeader(b.Token(), now)
	if err != nil {
		return nil, err
	}
	h.Kind = KindReverse
	return h, nil
}

// ParseBind reads the token of a KindReverse header.
func ParseBind(token string) (Bind, error) {
	rest, ok := strings.CutPrefix(token, bindPrefix)
	if !ok {
		return Bind{}, fmt.Errorf("%w: want %sID/LISTEN", ErrBadBind, bindPrefix)
	}
	idStr, listen, ok := strings.Cut(rest, "/")
	if !ok || listen == "" {
		return Bind{}, fmt.Errorf("%w: want %sID/LISTEN", ErrBadBind, bindPrefix)
	}
	id, err := parseBindID(idStr)
	if err != nil {
		return Bind{}, err
	}
	return Bind{ID: id, Listen: listen}, nil
}

// BoundToken is the token of a stream the server opens for binding id.
func BoundToken(id int) string { return boundPrefix + strconv.Itoa(id) }

// ParseBoundToken returns the binding a bound stream's token names.
func ParseBoundToken(token string) (int, error) {
	rest, ok := strings.CutPrefix(token, boundPrefix)
	if !ok {
		return 0, fmt.Errorf("%w: want %sID", ErrBadBind, boundPrefix)
	}
	return parseBindID(rest)
}

// parseBindID reads a binding ID in canonical decimal (no sign, no leading
// zero), 0..MaxBindID: one ID has one spelling.
func parseBindID(s string) (int, error) {
	if s == "" || len(s) > 4 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: id %q", ErrBadBind, s)
	}
	id := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: id %q", ErrBadBind, s)
		}
		id = id*10 + int(c-'0')
	}
	if id > MaxBindID {
		return 0, fmt.Errorf("%w: id %d above %d", ErrBadBind, id, MaxBindID)
	}
	return id, nil
}
