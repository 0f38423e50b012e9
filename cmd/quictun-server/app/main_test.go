package app

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the daemon runs in these tests leave no goroutines
// behind (klog's flush daemon is process-wide and expected).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}
