package server

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines. It is the only TestMain of the
// server test binary (package server and server_test share it).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
