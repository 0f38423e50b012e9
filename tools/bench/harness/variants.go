package harness

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/tools/linkem/netns"
)

// Ports used inside the namespaces.
const (
	EchoPort = 15676
	SinkPort = 15677
)

// Env is what variants need to know about the testbed.
type Env struct {
	ClientNS, ServerNS string
	ServerIP           string
	BinDir             string // quictun binaries and latency-client
	WorkDir            string // scratch: state dirs, secrets
	LogDir             string // process logs

	// Pin: the CPUs of the client and server sides (see cpuPin).
	Pin cpuPin

	mu      sync.Mutex
	ccAddrs map[string]string // TCP congestion control -> server address (see CCServerIP)
}

func (e *Env) bin(name string) string { return filepath.Join(e.BinDir, name) }

// ccAddrBase: the server host's extra addresses are 198.18.0.<ccAddrBase+i>.
const ccAddrBase = 11

// CCServerIP returns an extra address of the server host through which TCP
// connections from the client host use congestion control cc on the
// server side (the sending side of a download), creating it on first use:
// the address on the server's link device, a route to it on the client
// host, and on the server host a source-address rule to a routing table
// whose route back to the client carries `congctl cc`. Only the two
// namespaces change; the global net.ipv4.tcp_allowed_congestion_control,
// which limits what a namespace's default may be set to, does not apply
// to routes. cc must be built into the kernel (no module loading here).
func (e *Env) CCServerIP(ctx context.Context, cc string) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ip, ok := e.ccAddrs[cc]; ok {
		return ip, nil
	}
	avail, err := availableCC(e.ServerNS)
	if err != nil {
		return "", err
	}
	if !slices.Contains(avail, cc) {
		return "", fmt.Errorf("TCP congestion control %q is not available in this kernel (tcp_available_congestion_control: %s; modules cannot be loaded here)",
			cc, strings.Join(avail, " "))
	}
	if e.ccAddrs == nil {
		e.ccAddrs = map[string]string{}
	}
	i := len(e.ccAddrs)
	ip := fmt.Sprintf("198.18.0.%d", ccAddrBase+i)
	table := strconv.Itoa(100 + i)
	if err := ipCommands(ctx, ccRouteCommands(e.ClientNS, e.ServerNS, ip, netns.ClientIP, table, cc)); err != nil {
		return "", err
	}
	e.ccAddrs[cc] = ip
	return ip, nil
}

// ipCommands runs ip(8) with each of cmds in turn, stopping at the first
// that fails.
func ipCommands(ctx context.Context, cmds [][]string) error {
	for _, c := range cmds {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(cctx, "ip", c...).CombinedOutput()
		cancel()
		if err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// ccRouteCommands are the ip(8) commands behind CCServerIP.
func ccRouteCommands(cns, sns, ip, clientIP, table, cc string) [][]string {
	return [][]string{
		{"-n", sns, "addr", "add", ip + "/32", "dev", netns.DevName},
		{"-n", cns, "route", "add", ip + "/32", "dev", netns.DevName, "congctl", cc},
		{"-n", sns, "rule", "add", "from", ip, "lookup", table},
		{"-n", sns, "route", "add", clientIP + "/32", "dev", netns.DevName, "congctl", cc, "table", table},
	}
}

// availableCC lists net.ipv4.tcp_available_congestion_control in ns.
func availableCC(ns string) ([]string, error) {
	var out []string
	err := netns.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
		out = strings.Fields(string(b))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read tcp_available_congestion_control in %s: %w", ns, err)
	}
	return out, nil
}

// Variant is one way of carrying TCP from the client host to the echo and
// sink servers on the server host.
type Variant interface {
	Name() string
	// Start starts the endpoints and returns once they carry traffic.
	Start(ctx context.Context, env *Env) error
	// Echo and Sink return the HOST:PORT the client host connects to.
	Echo() string
	Sink() string
	// EndpointPIDs returns the tunnel's client-side and server-side
	// processes for the given service ("echo" or "sink"); none for direct.
	EndpointPIDs(service string) (client, server []int)
	// Reconnects returns a counter of the tunnel's reconnections, or -1 if
	// the variant does not expose one.
	Reconnects(ctx context.Context, env *Env) float64
	Stop()
}

// --- direct TCP ---

// direct connects across the link to the echo and sink servers. With CC
// set, it connects to an address of the server host whose connections use
// that TCP congestion control (Env.CCServerIP); otherwise the namespaces'
// default (recorded in the report).
type direct struct {
	CC string
	ip string
}

func (d *direct) Name() string {
	if d.CC == "" {
		return "direct"
	}
	return "direct-" + d.CC
}

func (d *direct) Start(ctx context.Context, env *Env) error {
	if d.CC == "" {
		d.ip = env.ServerIP
		return nil
	}
	ip, err := env.CCServerIP(ctx, d.CC)
	if err != nil {
		return err
	}
	d.ip = ip
	return nil
}

func (d *direct) Echo() string                               { return net.JoinHostPort(d.ip, strconv.Itoa(EchoPort)) }
func (d *direct) Sink() string                               { return net.JoinHostPort(d.ip, strconv.Itoa(SinkPort)) }
func (d *direct) EndpointPIDs(string) (client, server []int) { return nil, nil }
func (d *direct) Reconnects(context.Context, *Env) float64   { return -1 }
func (d *direct) Stop()                                      {}

// --- kcptun (Debian package) ---

type kcptun struct {
	procs map[string][2]*Proc // service -> client, server
}

const (
	kcpEchoUDP, kcpSinkUDP     = 29900, 29901
	kcpEchoLocal, kcpSinkLocal = 16676, 16677
)

// KcptunAvailable tells whether kcptun-client and kcptun-server are installed.
func KcptunAvailable() bool {
	_, e1 := exec.LookPath("kcptun-client")
	_, e2 := exec.LookPath("kcptun-server")
	return e1 == nil && e2 == nil
}

func (k *kcptun) Name() string { return "kcptun" }

func (k *kcptun) Start(ctx context.Context, env *Env) error {
	k.procs = map[string][2]*Proc{}
	for _, svc := range []struct {
		name               string
		udp, local, local2 int
	}{{"echo", kcpEchoUDP, kcpEchoLocal, EchoPort}, {"sink", kcpSinkUDP, kcpSinkLocal, SinkPort}} {
		// Defaults of the Debian build: mode fast, FEC 10/3, aes; no compression
		// (the payload is random anyway).
		sbin, sargs := env.Pin.wrap(sideServer, "kcptun-server", []string{"-l", net.JoinHostPort(env.ServerIP, strconv.Itoa(svc.udp)),
			"-t", "127.0.0.1:" + strconv.Itoa(svc.local2), "--mode", "fast", "--nocomp", "--quiet"})
		srv, err := StartProc("kcptun-server-"+svc.name, env.ServerNS, filepath.Join(env.LogDir, "kcptun-server-"+svc.name+".log"), sbin, sargs...)
		if err != nil {
			return err
		}
		cbin, cargs := env.Pin.wrap(sideClient, "kcptun-client", []string{"-l", "127.0.0.1:" + strconv.Itoa(svc.local),
			"-r", net.JoinHostPort(env.ServerIP, strconv.Itoa(svc.udp)), "--mode", "fast", "--nocomp", "--quiet"})
		cli, err := StartProc("kcptun-client-"+svc.name, env.ClientNS, filepath.Join(env.LogDir, "kcptun-client-"+svc.name+".log"), cbin, cargs...)
		if err != nil {
			srv.Stop(time.Second)
			return err
		}
		k.procs[svc.name] = [2]*Proc{cli, srv}
	}
	return waitEcho(ctx, env.ClientNS, k.Echo(), 20*time.Second)
}

func (k *kcptun) Echo() string { return "127.0.0.1:" + strconv.Itoa(kcpEchoLocal) }
func (k *kcptun) Sink() string { return "127.0.0.1:" + strconv.Itoa(kcpSinkLocal) }
func (k *kcptun) EndpointPIDs(service string) (client, server []int) {
	p, ok := k.procs[service]
	if !ok {
		return nil, nil
	}
	return []int{p[0].PID()}, []int{p[1].PID()}
}
func (k *kcptun) Reconnects(context.Context, *Env) float64 { return -1 }

// RestartClient restarts the echo service's kcptun client.
func (k *kcptun) RestartClient(_ context.Context, env *Env) error {
	p, ok := k.procs["echo"]
	if !ok {
		return fmt.Errorf("kcptun echo client not running")
	}
	cli, err := p[0].Restart(3*time.Second, filepath.Join(env.LogDir, "kcptun-client-echo-restarted.log"))
	if err != nil {
		p[1].Stop(3 * time.Second)
		delete(k.procs, "echo")
		return err
	}
	k.procs["echo"] = [2]*Proc{cli, p[1]}
	return nil
}

func (k *kcptun) Stop() {
	for _, p := range k.procs {
		p[0].Stop(3 * time.Second)
		p[1].Stop(3 * time.Second)
	}
	k.procs = nil
}

// --- quictun ---

// QuictunAvailable tells whether the quictun binaries are built in binDir.
func QuictunAvailable(binDir string) bool {
	for _, b := range []string{"quictun-server", "quictun-client"} {
		if st, err := os.Stat(filepath.Join(binDir, b)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

// QuictunHasFlag tells whether both quictun binaries in binDir accept
// flag (e.g. "--congestion"), from their --help.
func QuictunHasFlag(ctx context.Context, binDir, flag string) bool {
	for _, b := range []string{"quictun-server", "quictun-client"} {
		if !binHasFlag(ctx, filepath.Join(binDir, b), flag) {
			return false
		}
	}
	return true
}

// binHasFlag tells whether the binary at path accepts flag, from its --help.
func binHasFlag(ctx context.Context, path, flag string) bool {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, path, "--help").CombinedOutput()
	return err == nil && helpHasFlag(string(out), flag)
}

// helpHasFlag tells whether a --help text lists flag.
func helpHasFlag(help, flag string) bool {
	for _, f := range strings.Fields(help) {
		f = strings.TrimRight(f, ",")
		if f == flag || strings.HasPrefix(f, flag+"=") || strings.HasPrefix(f, flag+"[") {
			return true
		}
	}
	return false
}

// quictun is one quictun-server and its clients: "echo" (Fixed token, the
// echo server) and "sink" (File token source: connections from
// 127.0.0.2 go to the echo server, every other one to the sink, so a
// download and an interactive echo can share one QUIC connection).
// Instance k of a run uses its own ports, so several instances (one per
// congestion controller) run side by side. The daemons run with the
// harness's environment plus Env (a tuned variant, named after it).
type quictun struct {
	ServerArgs, ClientArgs []string // extra flags
	// Congestion is the --congestion value passed to both daemons; "" passes none.
	Congestion string
	// Instance numbers the quictun variants of a run (ports, files).
	Instance int
	// SOCKS opens a SOCKS5 entry point on the echo client (quictunSOCKS).
	SOCKS bool
	// BinDir, if set, holds this instance's daemons instead of Env.BinDir,
	// and Label names it: another build beside the first (before/after).
	BinDir, Label string
	// Env is added to the daemons' inherited environment (--runtime-env);
	// it shows in the name (runtimeEnvName).
	Env []string
	// RateLimit, if set, caps the client's identity on the server
	// (--rate-limit key=ID=RateLimit: DOWN[/UP]); the identity is the
	// secret's key ID (Identity).
	RateLimit string
	// Keys, if set, are more identities on the same server
	// (--keys-file), each with a sink client of its own (KeySink) and
	// its own cap if RateLimit is set; at most maxKeyClients.
	Keys     []KeyClient
	identity string
	server   *Proc
	clients  map[string]*Proc
}

// Identity is the identity the server gives this instance's clients
// (key=<the secret's key ID>), known once Start has written the secret.
func (q *quictun) Identity() string { return q.identity }

// bin is the path of one of this instance's daemons.
func (q *quictun) bin(env *Env, name string) string {
	if q.BinDir != "" {
		return filepath.Join(q.BinDir, name)
	}
	return env.bin(name)
}

// Ports of instance 0; instance k adds 10*k (the UDP port adds k).
const (
	qtUDPPort                = 7500
	qtEchoLocal, qtSinkLocal = 6500, 6501
	qtServerAdminPort        = 8086
	qtEchoAdminPort          = 8087
	qtSinkAdminPort          = 8088
	qtSOCKSLocal             = 6502
	// qtMuxEchoIP: connections to the sink client's listener from this
	// address reach the echo server (see quictun).
	qtMuxEchoIP = "127.0.0.2"
)

func (q *quictun) Name() string {
	base := "quictun-" + q.Congestion
	switch {
	case q.Label != "":
		base = q.Label
	case q.Congestion == "":
		base = "quictun"
	}
	return runtimeEnvName(base, q.Env)
}

func (q *quictun) udpPort() int { return qtUDPPort + q.Instance }

// local is 127.0.0.1 and port shifted for the instance.
func (q *quictun) local(port int) string {
	return "127.0.0.1:" + strconv.Itoa(port+10*q.Instance)
}

// file names a per-instance file or log (instance 0 keeps the old names).
func (q *quictun) file(name string) string {
	if q.Instance == 0 {
		return name
	}
	return q.Name() + "-" + name
}

func (q *quictun) ccArgs() []string {
	if q.Congestion == "" {
		return nil
	}
	return []string{"--congestion", q.Congestion}
}

func (q *quictun) Start(ctx context.Context, env *Env) error {
	state := filepath.Join(env.WorkDir, q.file("quictun-state"))
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("quictun state dir: %w", err)
	}
	secret := filepath.Join(env.WorkDir, q.file("quictun-secret"))
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	text := base64.StdEncoding.EncodeToString(raw)
	if err := os.WriteFile(secret, []byte(text+"\n"), 0o600); err != nil {
		return fmt.Errorf("quictun secret: %w", err)
	}
	// The daemons read the file's trimmed text as the secret.
	q.identity = "key=" + proto.KeyIDOf([]byte(text)).String()
	tokens := filepath.Join(env.WorkDir, q.file("quictun-tokens"))
	if err := os.WriteFile(tokens, []byte(muxTokenFile()), 0o600); err != nil {
		return fmt.Errorf("quictun token file: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, q.bin(env, "quictun-server"), "fingerprint", "--state-dir", state).Output()
	var fp string
	if err != nil {
		return fmt.Errorf("quictun-server fingerprint: %w", err)
	}
	fp = strings.TrimSpace(string(out))
	if !strings.HasPrefix(fp, "sha256:") {
		return fmt.Errorf("quictun-server fingerprint printed %q", fp)
	}
	endpoint := net.JoinHostPort(env.ServerIP, strconv.Itoa(q.udpPort()))
	args := append([]string{
		"--listen-on", endpoint,
		"--state-dir", state, "--secret-file", secret,
		"--allow", fmt.Sprintf("tcp:127.0.0.1:%d,tcp:127.0.0.1:%d", EchoPort, SinkPort),
		"--httpd-listen-on", q.local(qtServerAdminPort),
	}, q.ccArgs()...)
	if q.RateLimit != "" {
		args = append(args, "--rate-limit", q.identity+"="+q.RateLimit)
	}
	keyArgs, keySecrets, err := q.writeKeys(env)
	if err != nil {
		return err
	}
	args = append(append(args, keyArgs...), q.ServerArgs...)
	denv := benchDaemonEnv(q.Env)
	sbin, sargs := env.Pin.wrap(sideServer, q.bin(env, "quictun-server"), args)
	q.server, err = startProcEnv(q.file("quictun-server"), env.ServerNS, filepath.Join(env.LogDir, q.file("quictun-server.log")), denv, sbin, sargs...)
	if err != nil {
		return err
	}
	q.clients = map[string]*Proc{}
	svcs := []qtService{
		{"echo", "Fixed", "tcp:127.0.0.1:" + strconv.Itoa(EchoPort), secret, qtEchoLocal, qtEchoAdminPort},
		{"sink", "File", tokens, secret, qtSinkLocal, qtSinkAdminPort},
	}
	for i, k := range q.Keys {
		svcs = append(svcs, qtService{"sink-" + k.Name, "File", tokens, keySecrets[i], qtKeySinkLocal + i, qtKeyAdminPort + i})
	}
	for _, svc := range svcs {
		if err := q.startClient(env, denv, endpoint, fp, svc); err != nil {
			return err
		}
	}
	for _, k := range q.Keys {
		if err := waitEchoFrom(ctx, env.ClientNS, qtMuxEchoIP, q.KeySink(k.Name), 20*time.Second); err != nil {
			return fmt.Errorf("key %s's client: %w", k.Name, err)
		}
	}
	if err := waitEcho(ctx, env.ClientNS, q.Echo(), 20*time.Second); err != nil {
		return err
	}
	addr, from := q.MuxEcho()
	return waitEchoFrom(ctx, env.ClientNS, from, addr, 20*time.Second)
}

// startClient starts svc's quictun-client against the server at endpoint
// (certificate fingerprint fp), with the environment denv.
func (q *quictun) startClient(env *Env, denv []string, endpoint, fp string, svc qtService) error {
	args := append([]string{
		"--listen-on", "tcp:" + q.local(svc.local),
		"--server-endpoint", endpoint,
		"--token-source-plugin", svc.plugin, "--token-source", svc.source,
		"--server-fingerprint", fp, "--secret-file", svc.secret,
		"--httpd-listen-on", q.local(svc.admin),
		// As the systemd unit: tickets survive a restart (cold start).
		"--session-file", filepath.Join(env.WorkDir, q.file("quictun-sessions-"+svc.name+".json")),
	}, q.ccArgs()...)
	if q.SOCKS && svc.name == "echo" {
		args = append(args, "--proxy", "socks5:"+q.local(qtSOCKSLocal))
	}
	args = append(args, q.ClientArgs...)
	cbin, cargs := env.Pin.wrap(sideClient, q.bin(env, "quictun-client"), args)
	p, err := startProcEnv(q.file("quictun-client-"+svc.name), env.ClientNS, filepath.Join(env.LogDir, q.file("quictun-client-"+svc.name+".log")), denv, cbin, cargs...)
	if err != nil {
		return err
	}
	q.clients[svc.name] = p
	return nil
}

// qtService is one of a quictun instance's clients.
type qtService struct {
	name, plugin, source, secret string
	local, admin                 int
}

// KeyClient is one more identity on a quictun instance's server: a
// --keys-file key named Name, capped at RateLimit (DOWN[/UP], "" for
// none), with a sink client of its own.
type KeyClient struct {
	Name, RateLimit string
}

// maxKeyClients bounds Keys: their clients' ports stay inside the
// instance's range of 10.
const maxKeyClients = 3

// Ports of the Keys' sink clients (the i-th adds i).
const (
	qtKeySinkLocal = qtSOCKSLocal + 1
	qtKeyAdminPort = qtSinkAdminPort + 1
)

// KeySink is the local address of key name's sink client.
func (q *quictun) KeySink(name string) string {
	for i, k := range q.Keys {
		if k.Name == name {
			return q.local(qtKeySinkLocal + i)
		}
	}
	return ""
}

// writeKeys writes the Keys' --keys-file and each key's secret file, and
// returns the server's flags for them and the secret files' paths.
func (q *quictun) writeKeys(env *Env) (args, secrets []string, err error) {
	if len(q.Keys) == 0 {
		return nil, nil, nil
	}
	if len(q.Keys) > maxKeyClients {
		return nil, nil, fmt.Errorf("quictun: %d keys, at most %d", len(q.Keys), maxKeyClients)
	}
	var file strings.Builder
	for _, k := range q.Keys {
		raw := make([]byte, 32)
		_, _ = rand.Read(raw)
		text := base64.StdEncoding.EncodeToString(raw)
		fmt.Fprintf(&file, "%s %s\n", k.Name, text)
		path := filepath.Join(env.WorkDir, q.file("quictun-secret-"+k.Name))
		if err := os.WriteFile(path, []byte(text+"\n"), 0o600); err != nil {
			return nil, nil, fmt.Errorf("quictun key secret: %w", err)
		}
		secrets = append(secrets, path)
		if k.RateLimit != "" {
			args = append(args, "--rate-limit", "key="+k.Name+"="+k.RateLimit)
		}
	}
	keys := filepath.Join(env.WorkDir, q.file("quictun-keys"))
	if err := os.WriteFile(keys, []byte(file.String()), 0o600); err != nil {
		return nil, nil, fmt.Errorf("quictun keys file: %w", err)
	}
	return append(args, "--keys-file", keys), secrets, nil
}

// quictunSOCKS probes through the SOCKS5 entry point (--proxy) of a quictun
// variant's echo client: the same daemons and QUIC connection, with the
// destination named per connection. connect_ms then holds the proxy's
// answer (a round trip to the server and its dial), which a forward spends
// in the first round trip instead. Only probe scenarios (latency, echo-tps,
// request-size, connrate) go through the proxy; Sink is the forward's.
type quictunSOCKS struct{ q *quictun }

func (s *quictunSOCKS) Name() string { return s.q.Name() + "-socks5" }

// Start checks that the quictun variant it rides on started.
func (s *quictunSOCKS) Start(context.Context, *Env) error {
	if s.q.server == nil {
		return errors.New("its quictun variant did not start")
	}
	return nil
}

// Echo is the destination as the quictun server sees it.
func (s *quictunSOCKS) Echo() string { return "127.0.0.1:" + strconv.Itoa(EchoPort) }
func (s *quictunSOCKS) Sink() string { return s.q.Sink() }
func (s *quictunSOCKS) EndpointPIDs(service string) (client, server []int) {
	return s.q.EndpointPIDs(service)
}
func (s *quictunSOCKS) Reconnects(ctx context.Context, env *Env) float64 {
	return s.q.Reconnects(ctx, env)
}
func (s *quictunSOCKS) Stop() {} // the quictun variant stops the daemons

// ProbeArgs are latency-client's extra flags for this variant.
func (s *quictunSOCKS) ProbeArgs() []string { return []string{"--socks5", s.q.local(qtSOCKSLocal)} }

// muxTokenFile is the sink client's File token source.
func muxTokenFile() string {
	return fmt.Sprintf("# written by the bench harness\n%s tcp:127.0.0.1:%d\n* tcp:127.0.0.1:%d\n", qtMuxEchoIP, EchoPort, SinkPort)
}

func (q *quictun) Echo() string { return q.local(qtEchoLocal) }
func (q *quictun) Sink() string { return q.local(qtSinkLocal) }

// MuxEcho returns where to connect, and from which local address, to reach
// the echo server through the sink's QUIC connection.
func (q *quictun) MuxEcho() (addr, from string) { return q.local(qtSinkLocal), qtMuxEchoIP }

func (q *quictun) EndpointPIDs(service string) (client, server []int) {
	if q.server == nil {
		return nil, nil
	}
	if c, ok := q.clients[service]; ok {
		return []int{c.PID()}, []int{q.server.PID()}
	}
	return nil, []int{q.server.PID()}
}

// AllPIDs returns the PIDs of all the instance's clients and of its server.
func (q *quictun) AllPIDs() (clients, server []int) {
	if q.server == nil {
		return nil, nil
	}
	for _, c := range q.clients {
		clients = append(clients, c.PID())
	}
	return clients, []int{q.server.PID()}
}

// RestartClient restarts the echo service's client and returns when the new
// process has started (not when it is ready).
func (q *quictun) RestartClient(_ context.Context, env *Env) error {
	p, ok := q.clients["echo"]
	if !ok {
		return fmt.Errorf("quictun echo client not running")
	}
	np, err := p.Restart(5*time.Second, filepath.Join(env.LogDir, q.file("quictun-client-echo-restarted.log")))
	if err != nil {
		delete(q.clients, "echo")
		return err
	}
	q.clients["echo"] = np
	return nil
}

// Reconnects sums quictun_client_reconnects_total of the echo client.
func (q *quictun) Reconnects(ctx context.Context, env *Env) float64 {
	return q.ServiceReconnects(ctx, env, "echo")
}

// ServiceReconnects sums quictun_client_reconnects_total of the client of
// service ("echo" or "sink"), or returns -1.
func (q *quictun) ServiceReconnects(ctx context.Context, env *Env, service string) float64 {
	admin := map[string]int{"echo": qtEchoAdminPort, "sink": qtSinkAdminPort}[service]
	if admin == 0 {
		return -1
	}
	v, err := scrapeCounter(ctx, env.ClientNS, "http://"+q.local(admin)+"/metrics", "quictun_client_reconnects_total")
	if err != nil {
		return -1
	}
	return v
}

func (q *quictun) Stop() {
	for _, c := range q.clients {
		c.Stop(5 * time.Second)
	}
	if q.server != nil {
		q.server.Stop(5 * time.Second)
	}
	q.clients, q.server = nil, nil
}

// scrapeCounter sums the samples of a metric in a Prometheus exposition;
// name may be a whole series, labels included, when they are the only ones
// (quictun_client_transport{transport="tcp"}).
func scrapeCounter(ctx context.Context, ns, url, name string) (float64, error) {
	req, err := newGet(ctx, url)
	if err != nil {
		return 0, err
	}
	resp, err := httpClientIn(ns).Do(req)
	if err != nil {
		return 0, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	return parseMetric(resp.Body, name)
}

func parseMetric(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	var sum float64
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer metric name
		}
		fs := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %q: %w", line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	return sum, nil
}

// waitEcho retries one echo round trip through addr until it works.
func waitEcho(ctx context.Context, ns, addr string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		last = echoOnce(ctx, ns, addr, 100)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no echo through %s in %s within %v: %w", addr, ns, limit, errors.Join(last, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitEchoFrom is waitEcho from local address from ("": any).
func waitEchoFrom(ctx context.Context, ns, from, addr string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		last = echoOnceFrom(ctx, ns, from, addr, 100)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no echo through %s from %s in %s within %v: %w", addr, from, ns, limit, errors.Join(last, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func echoOnce(ctx context.Context, ns, addr string, size int) error {
	return echoOnceFrom(ctx, ns, "", addr, size)
}

func echoOnceFrom(ctx context.Context, ns, from, addr string, size int) error {
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := dialFrom(actx, ns, from, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	defer context.AfterFunc(actx, func() { _ = c.Close() })()
	dl, _ := actx.Deadline()
	_ = c.SetDeadline(dl)
	return roundTrip(c, make([]byte, size))
}
