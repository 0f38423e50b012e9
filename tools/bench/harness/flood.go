package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quictun/quictun/internal/procstat"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// Case names of the flood scenario besides the kinds.
const (
	// FloodNone is the quiet baseline.
	FloodNone = "no flood"
	// FloodControl sends random datagrams at the same speed to a socket in
	// the server namespace that only reads and discards them, not to the
	// tunnel server: what the flood costs the machine (CPU, kernel) without
	// the server having to handle it.
	FloodControl = "random to a discard socket"
)

// floodable is a variant whose server host side is a UDP server that the
// flood scenario can aim at.
type floodable interface {
	// FloodTarget returns the server's UDP HOST:PORT (as seen inside the
	// server namespace), its process id, and the HTTP base URL of its admin
	// server inside the server namespace ("" when it has none).
	FloodTarget(env *Env) (addr string, pid int, admin string)
}

// FloodResult is the --json output of `latency-client flood`.
type FloodResult struct {
	Target         string  `json:"target"`
	Local          string  `json:"local"`
	Kind           string  `json:"kind"`
	Size           int     `json:"size"`
	Rate           int     `json:"rate"`
	Stopped        string  `json:"stopped"`
	Seconds        float64 `json:"seconds"`
	Packets        int64   `json:"packets"`
	Bytes          int64   `json:"bytes"`
	PPS            float64 `json:"pps"`
	MbitPerS       float64 `json:"mbit_per_s"`
	SendErrors     int64   `json:"send_errors"`
	FirstSendError string  `json:"first_send_error"`
	ReplyPackets   int64   `json:"reply_packets"`
	ReplyBytes     int64   `json:"reply_bytes"`
}

// floodProc is a running `latency-client flood`.
type floodProc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// startFlood starts latency-client flood inside ns. Its stderr goes to
// logw; stop ends it and returns its report.
func startFlood(ns string, logw io.Writer, bin string, args ...string) (*floodProc, error) {
	full := append([]string{"netns", "exec", ns, bin, "flood", "--json"}, args...)
	f := &floodProc{done: make(chan struct{})}
	f.cmd = exec.Command("ip", full...)
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	f.cmd.Stdout, f.cmd.Stderr = &f.out, logw
	fmt.Fprintf(logw, "# ip %s\n", strings.Join(full, " "))
	if err := f.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start flood: %w", err)
	}
	go func() {
		f.err = f.cmd.Wait()
		close(f.done)
	}()
	return f, nil
}

// pid returns the flood's process id (ip netns exec execs the binary).
func (f *floodProc) pid() int { return f.cmd.Process.Pid }

// exited tells whether the flood has already ended.
func (f *floodProc) exited() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM (the flood then prints its report and exits), SIGKILL
// after grace, and decodes the report.
func (f *floodProc) stop(grace time.Duration) (FloodResult, json.RawMessage, error) {
	pg := f.cmd.Process.Pid
	_ = syscall.Kill(-pg, syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pg, syscall.SIGKILL)
		<-f.done
	}
	var r FloodResult
	raw, err := parseJSON(f.out.Bytes(), &r)
	if err != nil {
		return r, nil, errors.Join(err, f.err)
	}
	return r, raw, nil
}

// udpSocketDrops returns the kernel's drop counter of the UDP socket bound
// to port in namespace ns (the last column of /proc/net/udp), summed over
// the sockets on that port.
func udpSocketDrops(ns string, port int) (float64, error) {
	var b []byte
	err := netns.Do(ns, func() error {
		var err error
		// thread-self: /proc/net follows the process's namespace, not the
		// thread's.
		b, err = os.ReadFile("/proc/thread-self/net/udp")
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("read udp sockets of %s: %w", ns, err)
	}
	return parseUDPDrops(bytes.NewReader(b), port)
}

// parseUDPDrops sums the drops column of the /proc/net/udp lines whose
// local port is port.
func parseUDPDrops(r io.Reader, port int) (float64, error) {
	sc := bufio.NewScanner(r)
	want := fmt.Sprintf(":%04X", port)
	found := false
	var sum float64
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retr uid timeout inode ref pointer drops
		if len(f) < 13 || !strings.HasSuffix(f[1], want) {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("parse drops in %q: %w", sc.Text(), err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("no UDP socket on port %d", port)
	}
	return sum, nil
}

// floodServerMetrics are the server counters recorded around each case;
// the flood scenario reports their change.
var floodServerMetrics = []string{
	"quictun_server_refused_connections_total",
	"quictun_server_connections_total",
}

// serverSnapshot is the server state before or after a case.
type serverSnapshot struct {
	drops   float64            // kernel drops on the server's UDP socket; -1 unknown
	metrics map[string]float64 // floodServerMetrics that could be scraped
}

func (r *Runner) snapshot(ctx context.Context, addr, admin string) serverSnapshot {
	s := serverSnapshot{drops: -1, metrics: map[string]float64{}}
	if _, p, err := net.SplitHostPort(addr); err == nil {
		if port, err := strconv.Atoi(p); err == nil {
			if d, err := udpSocketDrops(r.env.ServerNS, port); err == nil {
				s.drops = d
			}
		}
	}
	if admin != "" {
		if body, err := getIn(ctx, r.env.ServerNS, admin+"/metrics"); err == nil {
			for _, name := range floodServerMetrics {
				if v, err := parseMetric(bytes.NewReader(body), name); err == nil {
					s.metrics[name] = v
				}
			}
		}
	}
	return s
}

// getIn fetches url from inside ns and returns the body of a 200 answer.
func getIn(ctx context.Context, ns, url string) ([]byte, error) {
	req, err := newGet(ctx, url)
	if err != nil {
		return nil, err
	}
	resp, err := httpClientIn(ns).Do(req)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", url, err)
	}
	if resp.StatusCode != 200 {
		return body, fmt.Errorf("get %s: %s", url, resp.Status)
	}
	return body, nil
}

// floodCases returns the cases of repetition rep: the quiet baseline,
// every kind and (when control is set) FloodControl, rotated so that no
// case always follows the same one.
func floodCases(kinds []string, control bool, rep int) []string {
	all := append([]string{FloodNone}, kinds...)
	if control {
		all = append(all, FloodControl)
	}
	out := make([]string, 0, len(all))
	for i := range all {
		out = append(out, all[(i+rep)%len(all)])
	}
	return out
}

// flood measures the tunnel's ping-pong latency with no flood and while
// `latency-client flood` sends garbage at the tunnel server's UDP port at
// full speed. The flood runs inside the server namespace (see the report's
// description for why), so it does not pass through the emulator.
func (r *Runner) flood(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.FloodLink)
	var targets []Variant
	for _, v := range r.ordered(0) {
		if _, ok := v.(floodable); ok {
			targets = append(targets, v)
		} else {
			r.res.Notes = append(r.res.Notes, fmt.Sprintf("flood: %s has no UDP server to flood, skipped", v.Name()))
		}
	}
	for rep := range p.Reps {
		for vi := range targets {
			v := targets[(vi+rep)%len(targets)]
			quiet := map[string]float64{}
			var flooded []*Sample
			for _, cs := range floodCases(p.FloodKinds, p.FloodControl, rep) {
				if ctx.Err() != nil {
					return nil
				}
				s := r.floodOne(ctx, v, rep, cs)
				if cs == FloodNone {
					if s.Error == "" {
						quiet = s.Metrics
					}
					r.record(s)
				} else {
					flooded = append(flooded, &s)
				}
			}
			// Ratios against the baseline of the same repetition.
			for _, s := range flooded {
				for _, m := range []string{"p50_ms", "p99_ms", "total_ms"} {
					if q, f := quiet[m], s.Metrics[m]; q > 0 && f > 0 {
						s.Metrics[strings.TrimSuffix(m, "_ms")+"_ratio"] = f / q
					}
				}
				r.record(*s)
			}
		}
	}
	return nil
}

// floodOne measures one case (a flood kind, or FloodNone) of one variant.
func (r *Runner) floodOne(ctx context.Context, v Variant, rep int, kind string) Sample {
	p := r.prof
	s := Sample{Scenario: ScFlood, Link: p.FloodLink.Name, Case: kind, Variant: v.Name(), Rep: rep, Started: time.Now().UTC(),
		Metrics: map[string]float64{}}
	addr, pid, admin := v.(floodable).FloodTarget(&r.env)
	if err := waitEcho(ctx, r.env.ClientNS, v.Echo(), recoveryLimit); err != nil {
		s.Error = "not healthy before the case: " + err.Error()
		return s
	}
	rec0 := v.Reconnects(ctx, &r.env)
	before := r.snapshot(ctx, addr, admin)

	var fl *floodProc
	if kind != FloodNone {
		target, fkind := addr, kind
		if kind == FloodControl {
			d, err := openDiscard(r.env.ServerNS, r.env.ServerIP)
			if err != nil {
				s.Error = err.Error()
				return s
			}
			defer d.close()
			target, fkind = d.addr(), "random"
		}
		var err error
		// The duration is a safety cap; the flood is stopped when the probe ends.
		fl, err = startFlood(r.env.ServerNS, r.lcLog, r.env.bin("latency-client"), "--target", target, "--kind", fkind,
			"--size", strconv.Itoa(p.FloodDatagram), "--rate", strconv.Itoa(p.FloodRate),
			"--duration", (p.FloodWarmup + floodProbeTimeout + time.Minute).String())
		if err != nil {
			s.Error = err.Error()
			return s
		}
		defer func() {
			if fl != nil {
				_, _, _ = fl.stop(5 * time.Second)
			}
		}()
		select {
		case <-ctx.Done():
			return s
		case <-time.After(p.FloodWarmup):
		}
		if fl.exited() {
			_, _, err := fl.stop(time.Second)
			s.Error = fmt.Sprintf("flood ended during the warm-up: %v", err)
			fl = nil
			return s
		}
	}
	floodCPU0 := 0.0
	if fl != nil {
		floodCPU0, _ = procstat.CPUSeconds(fl.pid())
	}
	cpu0, _ := procstat.CPUSeconds(pid)
	t0 := time.Now()

	host, port, _ := net.SplitHostPort(v.Echo())
	var pr ProbeResult
	raw, runErr, err := r.latencyClient(ctx, floodProbeTimeout, &pr, "--server-host", host, "--server-port", port,
		"--size", strconv.Itoa(p.FloodProbeSize), "--number", strconv.Itoa(p.FloodProbeNumber), "--timeout", floodProbeTimeout.String())
	var errs []string
	switch {
	case err != nil:
		errs = append(errs, "probe: "+err.Error())
	default:
		s.Raw = raw
		for k, val := range ProbeMetrics(pr) {
			s.Metrics[k] = val
		}
		if e := ProbeError(pr); e != "" {
			errs = append(errs, "probe: "+e)
		} else if runErr != nil {
			errs = append(errs, "probe: "+runErr.Error())
		}
	}
	elapsed := time.Since(t0).Seconds()
	if c, err := procstat.CPUSeconds(pid); err == nil && elapsed > 0 {
		s.Metrics["server_cpu_pct"] = 100 * (c - cpu0) / elapsed
	}

	// Health while the flood is still running.
	alive, healthz, healthzMS := r.serverHealth(ctx, pid, admin)
	s.Metrics["server_alive"] = b2f(alive)
	if admin != "" {
		s.Metrics["healthz_ok"] = b2f(healthz)
		if healthz {
			s.Metrics["healthz_ms"] = healthzMS
		}
	}
	if !alive {
		errs = append(errs, "server process exited")
	} else if admin != "" && !healthz {
		errs = append(errs, "server /healthz failed during the flood")
	}

	if fl != nil {
		if c, err := procstat.CPUSeconds(fl.pid()); err == nil && elapsed > 0 {
			s.Metrics["flood_cpu_pct"] = 100 * (c - floodCPU0) / elapsed
		}
		fr, fraw, err := fl.stop(5 * time.Second)
		fl = nil
		if err != nil {
			errs = append(errs, "flood: "+err.Error())
		} else {
			s.Metrics["flood_pps"] = fr.PPS
			s.Metrics["flood_mbit_per_s"] = fr.MbitPerS
			s.Metrics["flood_packets"] = float64(fr.Packets)
			s.Metrics["flood_send_errors"] = float64(fr.SendErrors)
			if fr.Seconds > 0 {
				s.Metrics["reply_pps"] = float64(fr.ReplyPackets) / fr.Seconds
			}
			s.Raw = mergeRaw(s.Raw, fraw)
		}
	}

	// After the flood: still up, and what the server counted.
	after := r.snapshot(ctx, addr, admin)
	if before.drops >= 0 && after.drops >= 0 {
		s.Metrics["socket_drops"] = after.drops - before.drops
	}
	for _, name := range floodServerMetrics {
		b, ok1 := before.metrics[name]
		a, ok2 := after.metrics[name]
		if ok1 && ok2 {
			s.Metrics[strings.TrimSuffix(strings.TrimPrefix(name, "quictun_server_"), "_total")] = a - b
		}
	}
	if rec0 >= 0 {
		if rec1 := v.Reconnects(ctx, &r.env); rec1 >= 0 {
			s.Metrics["tunnel_survived"] = b2f(rec1 == rec0)
		}
	}
	if len(errs) > 0 {
		s.Error = strings.Join(errs, "; ")
	}
	klog.InfoS("Measured flood case", "variant", v.Name(), "case", kind, "rep", rep, "p50Ms", s.Metrics["p50_ms"],
		"floodPPS", s.Metrics["flood_pps"], "serverAlive", alive)
	return s
}

// discard is a UDP socket that reads and drops everything.
type discard struct {
	conn *net.UDPConn
	done chan struct{}
}

// openDiscard opens a discard socket on ip inside ns.
func openDiscard(ns, ip string) (*discard, error) {
	var c *net.UDPConn
	err := netns.Do(ns, func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open discard socket in %s: %w", ns, err)
	}
	_ = c.SetReadBuffer(8 << 20) // as large as quic-go asks for
	d := &discard{conn: c, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		buf := make([]byte, 2048)
		for {
			if _, _, err := c.ReadFrom(buf); errors.Is(err, net.ErrClosed) {
				return
			}
		}
	}()
	return d, nil
}

func (d *discard) addr() string { return d.conn.LocalAddr().String() }

func (d *discard) close() {
	_ = d.conn.Close()
	<-d.done
}

// floodProbeTimeout bounds one probe of the flood scenario.
const floodProbeTimeout = 3 * time.Minute

// serverHealth tells whether the process is alive and, when it has an admin
// server, whether /healthz answered, and how fast.
func (r *Runner) serverHealth(ctx context.Context, pid int, admin string) (alive, healthz bool, ms float64) {
	alive = syscall.Kill(pid, 0) == nil && !zombie(pid)
	if admin == "" {
		return alive, false, 0
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	body, err := getIn(hctx, r.env.ServerNS, admin+"/healthz")
	return alive, err == nil && strings.TrimSpace(string(body)) == "ok", float64(time.Since(start).Microseconds()) / 1000
}

// zombie tells whether pid has exited but not been reaped yet.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// mergeRaw returns {"probe": probe, "flood": flood}.
func mergeRaw(probe, flood json.RawMessage) json.RawMessage {
	m := map[string]json.RawMessage{}
	if len(probe) > 0 {
		m["probe"] = probe
	}
	if len(flood) > 0 {
		m["flood"] = flood
	}
	b, _ := json.Marshal(m)
	return b
}

// FloodTarget implements floodable: the UDP port of quictun-server.
func (q *quictun) FloodTarget(env *Env) (string, int, string) {
	pid := 0
	if q.server != nil {
		pid = q.server.PID()
	}
	return net.JoinHostPort(env.ServerIP, strconv.Itoa(q.udpPort())), pid, "http://" + q.local(qtServerAdminPort)
}

// FloodTarget implements floodable: the UDP port of the echo service's
// kcptun-server (it has no admin server).
func (k *kcptun) FloodTarget(env *Env) (string, int, string) {
	pid := 0
	if p, ok := k.procs["echo"]; ok {
		pid = p[1].PID()
	}
	return net.JoinHostPort(env.ServerIP, strconv.Itoa(kcpEchoUDP)), pid, ""
}
