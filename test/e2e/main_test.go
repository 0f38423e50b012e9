package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// testVersion is stamped into the binaries with -ldflags, so tests can check
// that `version` and quictun_build_info report what the build was given.
const testVersion = "v0.0.0-e2e"

// bins holds the paths of the binaries built by TestMain.
var bins struct {
	server, client, latency string
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// The package runs real daemons through restarts, drains and timeouts:
		// it takes well over a minute, so -short skips it.
		fmt.Println("skipping test/e2e in -short mode")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "quictun-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	code := func() int {
		defer func() { _ = os.RemoveAll(dir) }()
		if err := build(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build:", err)
			return 1
		}
		code := m.Run()
		if code == 0 {
			if err := goleak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "e2e: goroutine leak:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// build compiles the three binaries into dir, with -race when the tests run with it.
func build(dir string) error {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	args := []string{"build", "-o", dir + string(filepath.Separator),
		"-ldflags", "-X github.com/quictun/quictun/pkg/version.Version=" + testVersion}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/quictun-server", "./cmd/quictun-client", "./tools/latency-client")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %w", cmd.Args, err)
	}
	bins.server = filepath.Join(dir, "quictun-server")
	bins.client = filepath.Join(dir, "quictun-client")
	bins.latency = filepath.Join(dir, "latency-client")
	return nil
}
