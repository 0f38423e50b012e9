// Package cli holds what both daemons' command packages share: klog flag
// wiring, signal handling with a graceful first and a hard second signal, the
// Prometheus registry, and the admin server.
package cli

import (
	"context"
	"errors"
	goflag "flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/version"
)

// AddKlogFlags registers only -v and --vmodule of klog on fs; klog logs to stderr.
//
// klog's verbosity is process-wide and its flag values read it without
// synchronisation, so each command gets values of its own (see klogValue):
// reading a command's flags never touches klog's state, and commands built in
// parallel (tests) do not race.
func AddKlogFlags(fs *pflag.FlagSet) {
	v := &klogValue{name: "v", val: "0", typ: "int32"}
	fs.VarP(v, "v", "v", "log verbosity: 0 start/stop and errors, 1 effective config, 2 connection events, 4 every stream, 5 trace")
	fs.Var(&klogValue{name: "vmodule", typ: "string"}, "vmodule", "comma-separated list of pattern=N settings for file-filtered logging")
}

// klogValue is one klog flag as a pflag.Value: Set validates and applies the
// value to klog (under klog's own lock) and String returns what was set on
// this flag.
type klogValue struct {
	name, val, typ string
}

var klogFlags struct {
	once sync.Once
	fs   *goflag.FlagSet
}

// klogFlag returns klog's own flag.Value for name, registered once per process.
func klogFlag(name string) goflag.Value {
	klogFlags.once.Do(func() {
		klogFlags.fs = goflag.NewFlagSet("klog", goflag.ContinueOnError)
		klog.InitFlags(klogFlags.fs)
	})
	return klogFlags.fs.Lookup(name).Value
}

func (k *klogValue) String() string { return k.val }
func (k *klogValue) Type() string   { return k.typ }
func (k *klogValue) Set(s string) error {
	if err := klogFlag(k.name).Set(s); err != nil {
		return err
	}
	k.val = s
	return nil
}

// SignalContext returns a context cancelled at the first SIGINT/SIGTERM (start
// a graceful drain); a second signal exits the process at once. Call stop to
// release the signal handler.
func SignalContext(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case s := <-sigs:
			klog.InfoS("Received signal; draining (send it again to stop at once)", "signal", s.String())
			cancel()
		case <-done:
			return
		}
		select {
		case s := <-sigs:
			klog.InfoS("Received second signal; exiting now", "signal", s.String())
			klog.Flush()
			os.Exit(1)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		<-exited
		cancel()
	}
}

// NewRegistry returns a registry with build_info, Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(version.NewCollector(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// OpenAdmin reads the admin token file (if any) and opens the admin listener
// (nil when address is empty). It returns the token for the handler.
func OpenAdmin(address, tokenFile string) (net.Listener, string, error) {
	var token string
	if tokenFile != "" {
		b, err := ReadSecretFile("httpd-token-file", tokenFile, 16)
		if err != nil {
			return nil, "", err
		}
		token = string(b)
	}
	ln, err := ListenAdmin(address, token)
	return ln, token, err
}

// ListenAdmin opens the admin listener, refusing a non-loopback address without a token.
func ListenAdmin(address, token string) (net.Listener, error) {
	if address == "" {
		return nil, nil
	}
	if !admin.IsLoopback(address) && token == "" {
		return nil, fmt.Errorf("--httpd-listen-on %s is not loopback: set --httpd-token-file so the admin API is not open to the network", address)
	}
	ln, err := net.Listen("tcp", address)
	if errors.Is(err, errAddrInUse) {
		// Most often a second daemon on the host, on the same default port.
		return nil, fmt.Errorf("admin listener: %w: another process (another quictun daemon?) uses %s; "+
			"set --httpd-listen-on to a free address for this one (127.0.0.1:0 picks a free port and logs it), or --httpd-listen-on \"\" to turn the admin API off", err, address)
	}
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	return ln, nil
}

// ReadSecretFile reads a secret (or token) file: whitespace is trimmed and an
// empty or too short secret is an error, and so is a file of ours that group
// or others may read (transport.CheckPrivate; the error names the chmod).
func ReadSecretFile(flag, path string, minLen int) ([]byte, error) {
	if err := transport.CheckPrivate("--"+flag, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	s := []byte(strings.TrimSpace(string(b)))
	if len(s) < minLen {
		return nil, fmt.Errorf("--%s %s: secret must be at least %d bytes", flag, path, minLen)
	}
	return s, nil
}

// ErrUsage marks an error caused by bad flags or config; main prints usage hints for it.
var ErrUsage = errors.New("invalid configuration")

// ValidateHostPort checks a HOST:PORT flag value: a numeric port (1..65535,
// or 0 when allowZeroPort) and, when requireHost, a non-empty host.
func ValidateHostPort(flag, value string, requireHost, allowZeroPort bool) error {
	host, port, err := net.SplitHostPort(value)
	if err != nil {
		return fmt.Errorf("--%s %q: %w", flag, value, err)
	}
	if requireHost && host == "" {
		return fmt.Errorf("--%s %q: missing host", flag, value)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || (p == 0 && !allowZeroPort) {
		return fmt.Errorf("--%s %q: port must be a number from 1 to 65535", flag, value)
	}
	return nil
}

// ValidateAdmin checks that a non-loopback admin listener has a token.
func ValidateAdmin(listen, tokenFile string) error {
	if listen == "" {
		return nil
	}
	if err := ValidateHostPort("httpd-listen-on", listen, false, true); err != nil {
		return err
	}
	if !admin.IsLoopback(listen) && tokenFile == "" {
		return fmt.Errorf("--httpd-listen-on %s is not loopback: set --httpd-token-file so the admin API is not open to the network", listen)
	}
	return nil
}

// MinSecretLen is the shortest shared secret accepted.
const MinSecretLen = 16

// ReadKeysFile reads a --keys-file: one named shared secret per line,
// "NAME SECRET" (the name identifies the key's holders in logs and
// --allow-for key=NAME rules; letters, digits, '.', '_', '-'). Blank lines
// and lines starting with '#' are ignored. Permissions are checked as for
// ReadSecretFile, and the keys as for proto.NewKeyring.
func ReadKeysFile(flag, path string) ([]proto.Key, error) {
	if err := transport.CheckPrivate("--"+flag, path); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	var keys []proto.Key
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("--%s %s:%d: want NAME SECRET", flag, path, i+1)
		}
		k := proto.Key{Name: f[0], Secret: []byte(f[1])}
		if !validKeyName(k.Name) {
			return nil, fmt.Errorf("--%s %s:%d: key name %q: use letters, digits, '.', '_' and '-'", flag, path, i+1, k.Name)
		}
		if len(k.Secret) < MinSecretLen {
			return nil, fmt.Errorf("--%s %s:%d: secret must be at least %d bytes", flag, path, i+1, MinSecretLen)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--%s %s: no key in the file", flag, path)
	}
	if _, err := proto.NewKeyring(keys...); err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flag, path, err)
	}
	return keys, nil
}

func validKeyName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return s != ""
}
