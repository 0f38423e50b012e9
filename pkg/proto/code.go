package proto

import (
	"errors"
	"fmt"

	"github.com/quic-go/quic-go"
)

// Code is the reason a stream or connection ended, as carried on the wire in
// RESET_STREAM, STOP_SENDING and CONNECTION_CLOSE frames and in the Reply byte.
type Code uint8

// The codes are part of the wire protocol: never renumber them.
const (
	// CodeOK means the server dialed the destination; it is the success Reply.
	CodeOK Code = 0
	// CodeRefused means the destination is not on the server's allow-list.
	CodeRefused Code = 1
	// CodeDialFailed means the server could not connect to the destination.
	CodeDialFailed Code = 2
	// CodeAuthFailed means the client's credentials were rejected.
	CodeAuthFailed Code = 3
	// CodeBadHeader means the stream header was malformed or too large.
	CodeBadHeader Code = 4
	// CodeShutdown means the peer is shutting down.
	CodeShutdown Code = 5
	// CodeTimeout means a header, dial or drain deadline expired.
	CodeTimeout Code = 6
	// CodeConnReset means the TCP connection on the far side was reset or failed.
	CodeConnReset Code = 7
	// CodeInternal means an unexpected local error.
	CodeInternal Code = 8
	// CodeOverloaded means a server limit (concurrent dials, streams) was reached.
	CodeOverloaded Code = 9
	// CodeReplay means a stream header was seen before, or its timestamp is
	// outside the server's replay window (replay protection; check clocks).
	CodeReplay Code = 10
	// CodeBadToken means the destination token could not be parsed.
	CodeBadToken Code = 11
	// CodeUnsupported means the server does not serve the stream's kind
	// (a UDP flow to a server without UDP, or a kind from a newer client).
	CodeUnsupported Code = 12
	// CodeAddrInUse means the address a reverse forward asked the server to
	// listen on is held already (by another client, or another program).
	CodeAddrInUse Code = 13
	// CodeQuota means the client's identity has used its quota (--quota):
	// new tunnels are refused until its window frees some.
	CodeQuota Code = 14
	// CodeSuspended means the operator suspended the client's identity for
	// a while (DELETE /identities/NAME?for=10m on the admin API): its
	// connections are closed and new ones refused until then. Clients from
	// before this code report it as code_15 and reconnect with backoff.
	CodeSuspended Code = 15
	// CodeResumeRefused means the server did not continue a tunnel a
	// resume request named (--resume-window): it holds no such tunnel (it
	// ended, its window passed, the server restarted) or another identity
	// opened it. The client resets the application's connection.
	CodeResumeRefused Code = 16
)

var codeNames = [...]string{
	CodeOK:            "ok",
	CodeRefused:       "refused",
	CodeDialFailed:    "dial_failed",
	CodeAuthFailed:    "auth_failed",
	CodeBadHeader:     "bad_header",
	CodeShutdown:      "shutdown",
	CodeTimeout:       "timeout",
	CodeConnReset:     "reset",
	CodeInternal:      "internal",
	CodeOverloaded:    "overloaded",
	CodeReplay:        "replay",
	CodeBadToken:      "bad_token",
	CodeUnsupported:   "unsupported",
	CodeAddrInUse:     "addr_in_use",
	CodeQuota:         "quota",
	CodeSuspended:     "suspended",
	CodeResumeRefused: "resume_refused",
}

// AllCodes lists every defined code, in numeric order (for pre-creating metric series).
func AllCodes() []Code {
	out := make([]Code, len(codeNames))
	for i := range codeNames {
		out[i] = Code(i)
	}
	return out
}

// CodeNames lists every defined code's name (String), in numeric order: the
// label values of the metrics counted by result code.
func CodeNames() []string { return append([]string(nil), codeNames[:]...) }

// String returns the code's snake_case name, used as a metric label value.
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code_%d", uint8(c))
}

// StreamErrorCode converts c for CancelRead/CancelWrite.
func (c Code) StreamErrorCode() quic.StreamErrorCode { return quic.StreamErrorCode(c) }

// ApplicationErrorCode converts c for CloseWithError.
func (c Code) ApplicationErrorCode() quic.ApplicationErrorCode { return quic.ApplicationErrorCode(c) }

// RemoteError is a failure reported by the peer with a Code.
type RemoteError struct {
	Code Code
}

func (e *RemoteError) Error() string { return "peer reported " + e.Code.String() }

// Is reports whether target is a *RemoteError with the same code, so that
// errors.Is(err, &RemoteError{Code: CodeRefused}) works.
func (e *RemoteError) Is(target error) bool {
	t, ok := target.(*RemoteError)
	return ok && t.Code == e.Code
}

// FromError extracts the peer's Code from a quic stream or connection error.
// It returns false when err does not carry a code sent by the peer.
func FromError(err error) (Code, bool) {
	var re *RemoteError
	if errors.As(err, &re) {
		return re.Code, true
	}
	var se *quic.StreamError
	if errors.As(err, &se) && se.Remote {
		return Code(se.ErrorCode), true
	}
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		return Code(ae.ErrorCode), true
	}
	return 0, false
}
