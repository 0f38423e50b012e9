package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// quictunReverse is a reverse tunnel (quictun-client --remote-forward): the
// service runs next to the client and is exposed on the server's side. Its
// own echo server (latency-client serve) runs in the client namespace on
// loopback; quictun-client asks its server to listen at revListen on the
// server host (allowed there by --allow-remote-listen) and dials the echo
// server for each connection the server accepts. The probe runs in the
// server namespace against that listener (ProbeNS), so the application's
// connect is on the server host's own address and its first byte crosses
// the link once each way plus the client's dial, where direct TCP needs a
// handshake first. Opt-in by name (--variants quictun-reverse); it takes
// part in the latency scenario only (Scenarios).
type quictunReverse struct {
	ServerArgs, ClientArgs []string // extra flags, as the quictun variant's
	echo, server, client   *Proc
	ip                     string // server host's address
}

// Ports of the reverse variant, apart from every quictun instance's.
const (
	revUDPPort     = 7490
	revListenPort  = 6490 // the server listens here (server host's address)
	revEchoPort    = 15686
	revServerAdmin = 8076
	revClientAdmin = 8077
)

func (q *quictunReverse) Name() string { return "quictun-reverse" }

// Scenarios: the probe scenario this variant is measured in.
func (q *quictunReverse) Scenarios() []string { return []string{ScLatency} }

// ProbeNS: the application connects from the server host.
func (q *quictunReverse) ProbeNS(env *Env) string { return env.ServerNS }

func (q *quictunReverse) Start(ctx context.Context, env *Env) error {
	q.ip = env.ServerIP
	var err error
	q.echo, err = StartProc("latency-client-serve-reverse", env.ClientNS, filepath.Join(env.LogDir, "latency-client-serve-reverse.log"),
		env.bin("latency-client"), "serve", "--listen", "127.0.0.1:"+strconv.Itoa(revEchoPort), "--max-connections", "8192")
	if err != nil {
		return err
	}
	state := filepath.Join(env.WorkDir, "quictun-reverse-state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("quictun-reverse state dir: %w", err)
	}
	secret := filepath.Join(env.WorkDir, "quictun-reverse-secret")
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	if err := os.WriteFile(secret, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return fmt.Errorf("quictun-reverse secret: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, env.bin("quictun-server"), "fingerprint", "--state-dir", state).Output()
	if err != nil {
		return fmt.Errorf("quictun-server fingerprint: %w", err)
	}
	fp := strings.TrimSpace(string(out))
	if !strings.HasPrefix(fp, "sha256:") {
		return fmt.Errorf("quictun-server fingerprint printed %q", fp)
	}
	endpoint := net.JoinHostPort(env.ServerIP, strconv.Itoa(revUDPPort))
	listen := "tcp:" + q.Echo()
	denv := benchDaemonEnv(nil)
	sargs := append([]string{
		"--listen-on", endpoint,
		"--state-dir", state, "--secret-file", secret,
		"--allow-remote-listen", listen,
		"--httpd-listen-on", "127.0.0.1:" + strconv.Itoa(revServerAdmin),
	}, q.ServerArgs...)
	q.server, err = startProcEnv("quictun-server-reverse", env.ServerNS, filepath.Join(env.LogDir, "quictun-server-reverse.log"), denv, env.bin("quictun-server"), sargs...)
	if err != nil {
		return err
	}
	cargs := append([]string{
		"--server-endpoint", endpoint,
		"--server-fingerprint", fp, "--secret-file", secret,
		"--remote-forward", listen + "=tcp:127.0.0.1:" + strconv.Itoa(revEchoPort),
		"--httpd-listen-on", "127.0.0.1:" + strconv.Itoa(revClientAdmin),
	}, q.ClientArgs...)
	q.client, err = startProcEnv("quictun-client-reverse", env.ClientNS, filepath.Join(env.LogDir, "quictun-client-reverse.log"), denv, env.bin("quictun-client"), cargs...)
	if err != nil {
		return err
	}
	return waitEcho(ctx, env.ServerNS, q.Echo(), 20*time.Second)
}

// Echo is the server's listener, as the server host's applications reach it.
func (q *quictunReverse) Echo() string { return net.JoinHostPort(q.ip, strconv.Itoa(revListenPort)) }

// Sink: the reverse variant carries no download (latency scenario only).
func (q *quictunReverse) Sink() string { return "" }

func (q *quictunReverse) EndpointPIDs(service string) (client, server []int) {
	if q.server == nil || q.client == nil || service != "echo" {
		return nil, nil
	}
	return []int{q.client.PID()}, []int{q.server.PID()}
}

// Reconnects reads the client's quictun_client_reconnects_total.
func (q *quictunReverse) Reconnects(ctx context.Context, env *Env) float64 {
	v, err := scrapeCounter(ctx, env.ClientNS, "http://127.0.0.1:"+strconv.Itoa(revClientAdmin)+"/metrics", "quictun_client_reconnects_total")
	if err != nil {
		return -1
	}
	return v
}

func (q *quictunReverse) Stop() {
	for _, p := range []*Proc{q.client, q.server, q.echo} {
		if p != nil {
			p.Stop(5 * time.Second)
		}
	}
	q.client, q.server, q.echo = nil, nil, nil
}

// scenarioVariant is a variant measured in some scenarios only.
type scenarioVariant interface {
	Scenarios() []string
}

// inScenario tells whether v takes part in scenario sc.
func inScenario(v Variant, sc string) bool {
	s, ok := v.(scenarioVariant)
	if !ok {
		return true
	}
	for _, x := range s.Scenarios() {
		if x == sc {
			return true
		}
	}
	return false
}

// probeNS is the namespace the probe of v runs in: the client host unless
// v says otherwise.
func probeNS(v Variant, env *Env) string {
	if p, ok := v.(interface{ ProbeNS(*Env) string }); ok {
		return p.ProbeNS(env)
	}
	return env.ClientNS
}
