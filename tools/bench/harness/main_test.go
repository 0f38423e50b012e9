package harness

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/tools/linkem/netns"
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

// runTunnelSmoke runs scenarios of the smoke profile with direct TCP and
// quictun (binaries built from this tree) in namespaces named after tag,
// checks that the testbed was torn down, and returns the results, their
// directory and the profile. mutate, if not nil, adjusts the options first.
func runTunnelSmoke(t *testing.T, tag string, mutate func(*Options), scenarios ...string) (*Results, string, Profile) {
	t.Helper()
	needTestbed(t)
	needIP(t)
	bin := buildBins(t, "tools/latency-client", "cmd/quictun-server", "cmd/quictun-client")
	p, err := Profiles("smoke")
	require.NoError(t, err)
	prefix := tag + strconv.Itoa(os.Getpid()%100000)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	opts := Options{Profile: p, BinDir: bin, ResultsDir: t.TempDir(), Prefix: prefix, Variants: []string{"direct", "quictun"},
		Scenarios: scenarios, SkipChecks: true, Spin: time.Millisecond}
	if mutate != nil {
		mutate(&opts)
	}
	dir, err := Run(ctx, opts)
	require.NoError(t, err)
	c, s := netns.Names(prefix)
	assert.False(t, netns.Exists(c), "namespace %s left behind", c)
	assert.False(t, netns.Exists(s), "namespace %s left behind", s)
	res, err := LoadResults(dir)
	require.NoError(t, err)
	return res, dir, p
}
