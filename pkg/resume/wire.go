package resume

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// IDLen is the size of a resume ID.
const IDLen = 16

// ID names a resumable tunnel on both ends. The client picks it at random
// and sends it in the tunnel's (authenticated) header; the server binds it
// to the identity that opened the tunnel. It is not a capability: a
// re-attachment must also come from that identity.
type ID [IDLen]byte

// NewID returns a random ID.
func NewID() (ID, error) {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		return ID{}, fmt.Errorf("resume ID: %w", err)
	}
	return id, nil
}

// String is the ID in hex. Never logged: logs carry the tunnel's UUID.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// ErrBadRequest is returned (wrapped) for a malformed resume request or
// reply.
var ErrBadRequest = errors.New("bad resume request")

// tokenPrefix starts the token of a resume request's header (kind resume):
// "resume/1/<ID in hex>/<offset received>".
const tokenPrefix = "resume/1/"

// Request is what a resume request asks: continue tunnel ID, whose bytes
// the client received up to Offset.
type Request struct {
	ID     ID
	Offset uint64
}

// Token encodes r as the token of a resume request's header (covered by
// its MAC, so replay protection and freshness apply to it as to any header).
func (r Request) Token() string {
	return tokenPrefix + r.ID.String() + "/" + strconv.FormatUint(r.Offset, 10)
}

// ParseRequest decodes a resume request's token.
func ParseRequest(token string) (Request, error) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return Request{}, fmt.Errorf("%w: token does not start with %q", ErrBadRequest, tokenPrefix)
	}
	idHex, offText, ok := strings.Cut(rest, "/")
	if !ok || len(idHex) != 2*IDLen {
		return Request{}, fmt.Errorf("%w: no ID", ErrBadRequest)
	}
	var r Request
	if _, err := hex.Decode(r.ID[:], []byte(idHex)); err != nil {
		return Request{}, fmt.Errorf("%w: ID: %w", ErrBadRequest, err)
	}
	off, err := strconv.ParseUint(offText, 10, 64)
	if err != nil {
		return Request{}, fmt.Errorf("%w: offset: %w", ErrBadRequest, err)
	}
	r.Offset = off
	return r, nil
}

// ReplyLen is the size of an accepted resume request's reply: the reply
// byte (proto.CodeOK) and the offset the server received, big-endian. A
// refused request is reset with a code instead.
const ReplyLen = 1 + 8

// AppendReply appends the reply of an accepted request.
func AppendReply(b []byte, received uint64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0), received)
}

// ParseReply decodes the offset of an accepted request's reply.
func ParseReply(b [ReplyLen]byte) (uint64, error) {
	if b[0] != 0 {
		return 0, fmt.Errorf("%w: reply code %d", ErrBadRequest, b[0])
	}
	return binary.BigEndian.Uint64(b[1:]), nil
}

// TypeAck is the first byte of an ack datagram: pairs of (ID, offset
// received, big-endian uint64), at most MaxAcksPerDatagram of them.
const TypeAck byte = 'R'

// AckLen is the size of one pair in an ack datagram.
const AckLen = IDLen + 8

// MaxAcksPerDatagram keeps an ack datagram under 1,200 bytes, the smallest
// datagram every QUIC path carries.
const MaxAcksPerDatagram = 48

// Ack is one tunnel's confirmation.
type Ack struct {
	ID     ID
	Offset uint64
}

// AppendAcks encodes up to MaxAcksPerDatagram acks as a datagram and
// returns the rest.
func AppendAcks(b []byte, acks []Ack) ([]byte, []Ack) {
	n := min(len(acks), MaxAcksPerDatagram)
	b = append(b, TypeAck)
	for _, a := range acks[:n] {
		b = append(b, a.ID[:]...)
		b = binary.BigEndian.AppendUint64(b, a.Offset)
	}
	return b, acks[n:]
}

// ParseAcks calls f for each pair of an ack datagram (its type byte
// included). A datagram of the wrong length is rejected whole.
func ParseAcks(b []byte, f func(Ack)) error {
	if len(b) == 0 || b[0] != TypeAck || (len(b)-1)%AckLen != 0 || len(b)-1 > MaxAcksPerDatagram*AckLen {
		return fmt.Errorf("%w: ack datagram of %d bytes", ErrBadRequest, len(b))
	}
	for b = b[1:]; len(b) > 0; b = b[AckLen:] {
		var a Ack
		copy(a.ID[:], b)
		a.Offset = binary.BigEndian.Uint64(b[IDLen:])
		f(a)
	}
	return nil
}

// ReadReply reads the reply to a resume request: the offset the server
// received, or the error the stream ended with (a reset with
// CodeResumeRefused: proto.FromError tells its code).
func ReadReply(r io.Reader) (uint64, error) {
	var b [ReplyLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return ParseReply(b)
}
