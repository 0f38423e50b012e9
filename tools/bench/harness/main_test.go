package harness

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

// needTestbed skips t unless it may build the emulated testbed: not under
// -short, as root, with /dev/net/tun.
func needTestbed(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping the end-to-end harness run under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces and TUN devices")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("skipping: /dev/net/tun is missing")
	}
}

// needIP skips t without the ip command (iproute2).
func needIP(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipping: the ip command (iproute2) is missing")
	}
}

// buildBins builds the named packages of this module into a temporary
// directory and returns it.
func buildBins(t *testing.T, pkgs ...string) string {
	t.Helper()
	bin := t.TempDir()
	args := []string{"build", "-o", bin}
	for _, p := range pkgs {
		args = append(args, "github.com/quictun/quictun/"+p)
	}
	build := exec.Command("go", args...)
	build.Stderr = os.Stderr
	require.NoError(t, build.Run(), "build %v", pkgs)
	return bin
}
