package transport_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The package starts no goroutines itself, but its tests run quic-go
// transports and TLS handshakes; check they all end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
