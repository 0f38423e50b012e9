// Command floortun is a benchmark-only floor for issue 13, not a product:
// the simplest TCP-over-QUIC tunnel on the same patched quic-go and the same
// quic.Config as quictun (transport.QUICConfig(transport.DefaultQUICOptions())),
// with nothing of quictun's own: no header but the destination, no
// authentication, no metrics, no liveness, no reconnect. It is
// startFloorTunnel of test/integration/floor_bench_test.go as two processes,
// so that `bench loopback` can run it beside quictun.
//
// One binary; its mode is the name it runs as. A directory holding it under
// both names is a drop-in for `go run ./tools/bench loopback --bin-b DIR`:
//
//	go build -o DIR/quictun-server ./tools/floortun
//	go build -o DIR/quictun-client ./tools/floortun
//
// It takes the flags the loopback harness passes (--listen-on, --allow,
// --server-endpoint, --forward tcp:LOCAL=tcp:DEST, and the `fingerprint` and
// `version` subcommands) and ignores every other flag. The client does not
// verify the server (InsecureSkipVerify: the server makes a new self-signed
// certificate at each start, and `fingerprint` prints a placeholder), and the
// server does not authenticate the client: both refuse to listen on anything
// but loopback or 198.18.0.0/15 (RFC 2544's benchmark range, used by the
// emulated links). Each stream starts with the destination, a 2-byte big-endian
// length and "HOST:PORT"; the server dials it if --allow lists it (required),
// then both sides copy through 32 KiB buffers and pass
// each EOF on as a half-close. Like quictun's daemons it sets no Go runtime
// settings of its own: GOMAXPROCS and GODEBUG come from its environment, where
// the bench harness puts the ones it measures with (tools/bench daemonEnv,
// scripts/lib/bench-env.sh).
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/spf13/pflag"

	"github.com/quictun/quictun/internal/floor"
	"github.com/quictun/quictun/pkg/transport"
)

const alpn = "floortun"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the process at once
	mode := filepath.Base(os.Args[0])
	err := run(ctx, mode, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s (floortun): %v\n", mode, err)
		os.Exit(1)
	}
}

// run is the daemon of mode ("quictun-server" or "quictun-client") with the
// flags args, until ctx is done.
func run(ctx context.Context, mode string, args []string) error {
	fs := pflag.NewFlagSet(mode, pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlagsHandling = pflag.IgnoreUnknownFlag
	listenOn := fs.String("listen-on", "", "server: UDP address (loopback)")
	allowList := fs.String("allow", "", "server: comma-separated tcp:HOST:PORT destinations (required)")
	endpoint := fs.String("server-endpoint", "", "client: the server's UDP address")
	forwards := fs.StringArray("forward", nil, "client: tcp:LOCAL=tcp:DEST (LOCAL on loopback)")
	for _, name := range []string{"state-dir", "secret-file", "httpd-listen-on", "server-fingerprint"} {
		fs.String(name, "", "ignored")
	}
	fs.Bool("audit-log", false, "ignored")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch fs.Arg(0) {
	case "fingerprint":
		fmt.Println("floortun-does-not-verify")
		return nil
	case "version":
		fmt.Println(version())
		return nil
	case "":
	default:
		return fmt.Errorf("unknown subcommand %q", fs.Arg(0))
	}
	fmt.Fprintf(os.Stderr, "%s, %s, GOMAXPROCS=%d, GODEBUG=%q\n", mode, version(), runtime.GOMAXPROCS(0), os.Getenv("GODEBUG"))
	switch mode {
	case "quictun-server":
		var allow []string
		for a := range strings.SplitSeq(*allowList, ",") {
			if a != "" {
				allow = append(allow, strings.TrimPrefix(a, "tcp:"))
			}
		}
		if len(allow) == 0 {
			return errors.New("--allow is required: list the tcp:HOST:PORT destinations the server may dial")
		}
		return serve(ctx, strings.TrimPrefix(*listenOn, "udp:"), allow)
	case "quictun-client":
		return forward(ctx, strings.TrimPrefix(*endpoint, "udp:"), *forwards)
	}
	return fmt.Errorf("run as quictun-server or quictun-client, not %q", mode)
}

// version names the tool and the quic-go it was built with.
func version() string {
	v := "floortun (benchmark floor, issue 13)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/quic-go/quic-go" {
				v += " quic-go " + d.Version
				if d.Replace != nil {
					v += " => " + d.Replace.Path
				}
			}
		}
	}
	return v
}

// benchNet is 198.18.0.0/15, the range RFC 2544 sets aside for benchmarks;
// the emulated links of tools/linkem use it (scripts/floor-lan.sh).
var benchNet = netip.MustParsePrefix("198.18.0.0/15")

// onLoopback refuses addresses that are neither loopback nor in benchNet:
// floortun has no authentication of either side.
func onLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(host); err != nil || !(ip.IsLoopback() || benchNet.Contains(ip)) {
		return fmt.Errorf("%s is not a loopback or 198.18.0.0/15 address (floortun is a benchmark tool without authentication)", addr)
	}
	return nil
}

func serve(ctx context.Context, listenOn string, allow []string) error {
	if err := onLoopback(listenOn); err != nil {
		return err
	}
	tlsConf, err := selfSignedTLS()
	if err != nil {
		return err
	}
	ln, err := quic.ListenAddr(listenOn, tlsConf, transport.QUICConfig(transport.DefaultQUICOptions()))
	if err != nil {
		return err
	}
	defer ln.Close()
	err = floor.ServeStreams(ctx, ln, func(s *quic.Stream) { serveStream(ctx, s, allow) })
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// serveStream reads the destination at the start of s, dials it and pipes.
func serveStream(ctx context.Context, s *quic.Stream, allow []string) {
	var n [2]byte
	var dest []byte
	_, err := io.ReadFull(s, n[:])
	if err == nil {
		dest = make([]byte, binary.BigEndian.Uint16(n[:]))
		_, err = io.ReadFull(s, dest)
	}
	if err == nil && !slices.Contains(allow, string(dest)) {
		err = fmt.Errorf("destination %q not in --allow", dest)
	}
	var tc net.Conn
	if err == nil {
		tc, err = net.Dial("tcp", string(dest))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "stream %d: %v\n", s.StreamID(), err)
		s.CancelRead(0)
		s.CancelWrite(0)
		return
	}
	floor.Pipe(ctx, tc.(*net.TCPConn), s)
}

func forward(ctx context.Context, endpoint string, forwards []string) error {
	if len(forwards) == 0 {
		return errors.New("no --forward")
	}
	conf := transport.QUICConfig(transport.DefaultQUICOptions())
	tlsConf := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}} // benchmark only, loopback only (package doc)
	// The harness starts both daemons at once and waits for the forwards to
	// accept: dial until the server answers, then listen.
	var conn *quic.Conn
	for deadline := time.Now().Add(30 * time.Second); ; {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		c, err := quic.DialAddr(dctx, endpoint, tlsConf, conf)
		cancel()
		if err == nil {
			conn = c
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("dial %s: %w", endpoint, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer func() { _ = conn.CloseWithError(0, "") }()
	for _, f := range forwards {
		local, dest, ok := strings.Cut(f, "=")
		local, dest = strings.TrimPrefix(local, "tcp:"), strings.TrimPrefix(dest, "tcp:")
		if !ok || len(dest) > 0xffff {
			return fmt.Errorf("--forward %q: want tcp:LOCAL=tcp:DEST", f)
		}
		if err := onLoopback(local); err != nil {
			return err
		}
		l, err := net.Listen("tcp", local)
		if err != nil {
			return err
		}
		defer l.Close()
		prefix := binary.BigEndian.AppendUint16(nil, uint16(len(dest)))
		go floor.Forward(ctx, l, conn, append(prefix, dest...))
	}
	select {
	case <-ctx.Done():
		return nil
	case <-conn.Context().Done(): // no reconnect: the run is void
		return fmt.Errorf("QUIC connection ended: %w", context.Cause(conn.Context()))
	}
}

// selfSignedTLS is internal/testutil.SelfSignedTLS's server half (a test
// package): a new self-signed ECDSA certificate at each start.
func selfSignedTLS() (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), DNSNames: []string{alpn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{alpn}}, nil
}
