// Package integration runs quictun servers and clients in-process on loopback
// with real UDP and TCP sockets and checks what applications see.
package integration

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
