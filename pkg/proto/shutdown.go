package proto

import (
	"errors"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
)

// A server that shuts down closes each connection with CodeShutdown and a
// reason that says over how long its clients should spread their
// reconnects, ShutdownReason(spread): "server shutting down
// (reconnect-spread=20s)". A client waits a random time within it before
// it dials again, so that a server restarted with thousands of clients is
// not met by all of them in the same instant (its handshakes per second
// are bounded by its CPU: about 300 per core). Clients that do not read
// it reconnect at once, as before; a reason without it means no spread.

// MaxReconnectSpread bounds the spread a client accepts from a server.
const MaxReconnectSpread = time.Minute

const spreadKey = "reconnect-spread="

// ShutdownReason is the reason of a server's CodeShutdown close that asks
// its clients to spread their reconnects over spread (0: none).
func ShutdownReason(spread time.Duration) string {
	if spread <= 0 {
		return "server shutting down"
	}
	return "server shutting down (" + spreadKey + spread.Round(time.Millisecond).String() + ")"
}

// ReconnectSpread returns the spread that err, a connection's end, asks
// for: a CodeShutdown close by the peer whose reason carries one (at most
// MaxReconnectSpread); 0 otherwise.
func ReconnectSpread(err error) time.Duration {
	var ae *quic.ApplicationError
	if !errors.As(err, &ae) || !ae.Remote || Code(ae.ErrorCode) != CodeShutdown {
		return 0
	}
	_, v, ok := strings.Cut(ae.ErrorMessage, spreadKey)
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, ")")
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0
	}
	return min(d, MaxReconnectSpread)
}

// UpgradeReason is the reason of the CodeShutdown close a server sends
// when it hands its connections' tunnels to its successor (an upgrade,
// quictun-server's SIGUSR2): nothing is lost, the new process serves the
// same socket at once, so clients reconnect and re-attach their resumable
// tunnels without a spread or a backoff. It carries no spread, so an older
// client reconnects at once too.
const UpgradeReason = "server upgrading (" + upgradeKey + ")"

const upgradeKey = "reattach-now"

// ClientUpgradeReason is the reason of the CodeShutdown close a client
// sends when it hands its tunnels to its successor (quictun-client's
// SIGUSR2): the new process re-attaches them, and binds its reverse
// forwards again, at once; the server keeps their listeners for it
// (IsUpgrade).
const ClientUpgradeReason = "client upgrading (" + upgradeKey + ")"

// IsUpgrade reports whether err, a connection's end, is the peer's close
// for an upgrade (UpgradeReason, ClientUpgradeReason).
func IsUpgrade(err error) bool {
	var ae *quic.ApplicationError
	return errors.As(err, &ae) && ae.Remote && Code(ae.ErrorCode) == CodeShutdown && strings.Contains(ae.ErrorMessage, upgradeKey)
}
