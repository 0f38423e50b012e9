package socks5

import (
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Version is the SOCKS protocol version this package speaks.
const Version = 5

// Authentication methods (RFC 1928 section 3).
const (
	MethodNoAuth       byte = 0x00
	MethodUserPass     byte = 0x02
	MethodNoAcceptable byte = 0xFF
)

// Commands (RFC 1928 section 4).
const (
	CmdConnect      byte = 0x01
	CmdBind         byte = 0x02
	CmdUDPAssociate byte = 0x03
)

// Address types (RFC 1928 section 5).
const (
	atypIPv4   byte = 0x01
	atypDomain byte = 0x03
	atypIPv6   byte = 0x04
)

// Reply is the REP field of a reply (RFC 1928 section 6).
type Reply byte

// Reply codes.
const (
	ReplySucceeded           Reply = 0x00
	ReplyGeneralFailure      Reply = 0x01
	ReplyNotAllowed          Reply = 0x02 // connection not allowed by ruleset
	ReplyNetworkUnreachable  Reply = 0x03
	ReplyHostUnreachable     Reply = 0x04
	ReplyConnectionRefused   Reply = 0x05
	ReplyTTLExpired          Reply = 0x06
	ReplyCommandNotSupported Reply = 0x07
	ReplyAddressNotSupported Reply = 0x08
)

var (
	// ErrProtocol is wrapped by every error about malformed input.
	ErrProtocol = errors.New("socks5 protocol error")
	// ErrNoAcceptableMethod: the client offered no method the server accepts
	// (it was told so with method 0xFF).
	ErrNoAcceptableMethod = errors.New("socks5: no acceptable authentication method")
	// ErrAuth: the username or password was wrong (the client was told so).
	ErrAuth = errors.New("socks5: authentication failed")
	// ErrAddressType: the request's address type is unknown; the request
	// was not read to its end, reply ReplyAddressNotSupported and close.
	ErrAddressType = fmt.Errorf("%w: unknown address type", ErrProtocol)
	// ErrFragmented: a UDP request with a non-zero FRAG field; fragmentation
	// is optional (RFC 1928 section 7) and not supported: drop the datagram.
	ErrFragmented = errors.New("socks5: fragmented UDP datagram")
)

// Addr is a destination or bound address: an IP address or a domain name,
// and a port. Exactly one of IP and Host is set.
type Addr struct {
	IP   netip.Addr
	Host string
	Port uint16
}

// String returns host:port (IPv6 in brackets).
func (a Addr) String() string {
	h := a.Host
	if a.IP.IsValid() {
		h = a.IP.Unmap().String()
	}
	return net.JoinHostPort(h, strconv.Itoa(int(a.Port)))
}

// Credentials checks a username and password (RFC 1929).
type Credentials interface {
	Valid(user, password string) bool
}

// UserPass is a single username and password, compared in constant time.
type UserPass struct {
	User, Password string
}

// Valid reports whether user and password match.
func (u UserPass) Valid(user, password string) bool {
	a := subtle.ConstantTimeCompare([]byte(user), []byte(u.User))
	b := subtle.ConstantTimeCompare([]byte(password), []byte(u.Password))
	return a&b == 1
}

// Users is a set of usernames and passwords (a client's
// --proxy-credentials-file). Valid compares the given pair with every entry
// in constant time, without stopping at a match.
type Users []UserPass

// Valid reports whether user and password match an entry.
func (u Users) Valid(user, password string) bool {
	ok := 0
	for _, up := range u {
		a := subtle.ConstantTimeCompare([]byte(user), []byte(up.User))
		b := subtle.ConstantTimeCompare([]byte(password), []byte(up.Password))
		ok |= a & b
	}
	return ok == 1
}

// ParseUsers reads lines USER:PASSWORD (the password may hold colons; each
// 1-255 bytes, as RFC 1929 allows); blank lines and lines starting with #
// are skipped, surrounding spaces trimmed. It refuses a file without users
// and a user named twice; errors name the line.
func ParseUsers(b []byte) (Users, error) {
	var users Users
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		user, pass, ok := strings.Cut(line, ":")
		if !ok || user == "" || pass == "" || len(user) > 255 || len(pass) > 255 {
			return nil, fmt.Errorf("line %d: want USER:PASSWORD (each 1-255 bytes)", i+1)
		}
		for _, u := range users {
			if u.User == user {
				return nil, fmt.Errorf("line %d: user %q appears twice", i+1, user)
			}
		}
		users = append(users, UserPass{User: user, Password: pass})
	}
	if len(users) == 0 {
		return nil, errors.New("no USER:PASSWORD line")
	}
	return users, nil
}

// Negotiate reads the client's greeting, chooses a method and, when creds is
// not nil, runs the username/password sub-negotiation. With creds nil the
// client must offer "no authentication"; otherwise it must offer and pass
// username/password. A refusal has been answered on rw when it returns
// ErrNoAcceptableMethod or ErrAuth.
func Negotiate(rw io.ReadWriter, creds Credentials) error {
	var hdr [2]byte
	if _, err := io.ReadFull(rw, hdr[:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if hdr[0] != Version {
		return fmt.Errorf("%w: version %d, want 5", ErrProtocol, hdr[0])
	}
	if hdr[1] == 0 {
		return fmt.Errorf("%w: greeting offers no methods", ErrProtocol)
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(rw, methods); err != nil {
		return fmt.Errorf("read greeting methods: %w", err)
	}
	want := MethodNoAuth
	if creds != nil {
		want = MethodUserPass
	}
	offered := false
	for _, m := range methods {
		offered = offered || m == want
	}
	if !offered {
		_, _ = rw.Write([]byte{Version, MethodNoAcceptable})
		return ErrNoAcceptableMethod
	}
	if _, err := rw.Write([]byte{Version, want}); err != nil {
		return fmt.Errorf("write method: %w", err)
	}
	if creds == nil {
		return nil
	}
	// RFC 1929: VER(1) ULEN(1) UNAME PLEN(1) PASSWD; reply VER STATUS.
	var b [1 + 255]byte
	if _, err := io.ReadFull(rw, b[:2]); err != nil {
		return fmt.Errorf("read username: %w", err)
	}
	if b[0] != 1 {
		return fmt.Errorf("%w: username/password version %d, want 1", ErrProtocol, b[0])
	}
	user, err := readString(rw, int(b[1]))
	if err != nil {
		return fmt.Errorf("read username: %w", err)
	}
	if _, err := io.ReadFull(rw, b[:1]); err != nil {
		return fmt.Errorf("read password: %w", err)
	}
	pass, err := readString(rw, int(b[0]))
	if err != nil {
		return fmt.Errorf("read password: %w", err)
	}
	if !creds.Valid(user, pass) {
		_, _ = rw.Write([]byte{1, 1})
		return ErrAuth
	}
	if _, err := rw.Write([]byte{1, 0}); err != nil {
		return fmt.Errorf("write authentication status: %w", err)
	}
	return nil
}

func readString(r io.Reader, n int) (string, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// Request is a client's request: the command and the destination.
type Request struct {
	Command byte
	Addr    Addr
}

// ReadRequest reads one request. The command is not checked (reply
// ReplyCommandNotSupported to what the caller does not serve); an unknown
// address type returns ErrAddressType.
func ReadRequest(r io.Reader) (Request, error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Request{}, fmt.Errorf("read request: %w", err)
	}
	if hdr[0] != Version {
		return Request{}, fmt.Errorf("%w: request version %d, want 5", ErrProtocol, hdr[0])
	}
	// hdr[2] is RSV, X'00'; other values are tolerated, as most servers do.
	a, err := readAddr(r)
	if err != nil {
		return Request{}, err
	}
	return Request{Command: hdr[1], Addr: a}, nil
}

// readAddr reads ATYP, the address and the port.
func readAddr(r io.Reader) (Addr, error) {
	var b [1 + 255 + 2]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return Addr{}, fmt.Errorf("read address type: %w", err)
	}
	var a Addr
	switch b[0] {
	case atypIPv4:
		if _, err := io.ReadFull(r, b[:4+2]); err != nil {
			return Addr{}, fmt.Errorf("read IPv4 address: %w", err)
		}
		a.IP = netip.AddrFrom4([4]byte(b[:4]))
		a.Port = binary.BigEndian.Uint16(b[4:6])
	case atypIPv6:
		if _, err := io.ReadFull(r, b[:16+2]); err != nil {
			return Addr{}, fmt.Errorf("read IPv6 address: %w", err)
		}
		a.IP = netip.AddrFrom16([16]byte(b[:16]))
		a.Port = binary.BigEndian.Uint16(b[16:18])
	case atypDomain:
		if _, err := io.ReadFull(r, b[:1]); err != nil {
			return Addr{}, fmt.Errorf("read domain length: %w", err)
		}
		n := int(b[0])
		if n == 0 {
			return Addr{}, fmt.Errorf("%w: empty domain name", ErrProtocol)
		}
		if _, err := io.ReadFull(r, b[:n+2]); err != nil {
			return Addr{}, fmt.Errorf("read domain name: %w", err)
		}
		a.Host = string(b[:n])
		a.Port = binary.BigEndian.Uint16(b[n : n+2])
	default:
		return Addr{}, fmt.Errorf("%w %d", ErrAddressType, b[0])
	}
	return a, nil
}

// appendAddr appends ATYP, the address and the port of a. An Addr with
// neither IP nor Host encodes as 0.0.0.0.
func appendAddr(dst []byte, a Addr) []byte {
	switch {
	case a.IP.Is4() || a.IP.Is4In6():
		ip := a.IP.Unmap().As4()
		dst = append(append(dst, atypIPv4), ip[:]...)
	case a.IP.IsValid():
		ip := a.IP.As16()
		dst = append(append(dst, atypIPv6), ip[:]...)
	case a.Host != "" && len(a.Host) <= 255:
		dst = append(append(dst, atypDomain, byte(len(a.Host))), a.Host...)
	default:
		dst = append(dst, atypIPv4, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint16(dst, a.Port)
}

// WriteReply writes a reply with code rep and the bound address (the zero
// Addr, 0.0.0.0:0, when there is nothing useful to tell).
func WriteReply(w io.Writer, rep Reply, bound Addr) error {
	_, err := w.Write(appendAddr([]byte{Version, byte(rep), 0}, bound))
	return err
}

// ParseUDP splits a UDP ASSOCIATE datagram (RFC 1928 section 7: RSV(2)
// FRAG(1) ATYP DST.ADDR DST.PORT DATA) into its destination and payload. The
// payload aliases b.
func ParseUDP(b []byte) (Addr, []byte, error) {
	if len(b) < 4 {
		return Addr{}, nil, fmt.Errorf("%w: UDP datagram of %d bytes", ErrProtocol, len(b))
	}
	if b[2] != 0 {
		return Addr{}, nil, ErrFragmented
	}
	r := &sliceReader{b: b[3:]}
	a, err := readAddr(r)
	if err != nil {
		return Addr{}, nil, err
	}
	return a, r.b, nil
}

// AppendUDPHeader appends the UDP request header for a datagram from (the
// destination that answered) to dst; the payload follows it.
func AppendUDPHeader(dst []byte, from Addr) []byte {
	return appendAddr(append(dst, 0, 0, 0), from)
}

// sliceReader reads from a byte slice without copying the rest.
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}
