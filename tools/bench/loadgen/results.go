package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quictun/quictun/tools/bench/harness"
)

// Results is what a run measured; results.json holds it.
type Results struct {
	Version       int    `json:"version"`
	Command       string `json:"command"`
	ServerCommand string `json:"server_command"`
	// ServerVersion is `quictun-server version` (the build measured).
	ServerVersion string          `json:"server_version,omitempty"`
	Started       time.Time       `json:"started"`
	Finished      time.Time       `json:"finished"`
	Machine       harness.Machine `json:"machine"`
	// LoadBefore and LoadAfter are /proc/loadavg's three averages: the other
	// processes on the machine share its cores with the server.
	LoadBefore      string  `json:"loadavg_before"`
	LoadAfter       string  `json:"loadavg_after"`
	Clients         int     `json:"clients"`
	Concurrency     int     `json:"concurrency"`
	TunnelClients   int     `json:"tunnel_clients"`
	IdleSeconds     float64 `json:"idle_seconds"`
	QuietSeconds    float64 `json:"quiet_seconds"`
	ClientKeepAlive string  `json:"client_keepalive"`

	// Baseline is the server with no client.
	Baseline Snapshot  `json:"baseline"`
	Connect  *Connect  `json:"connect,omitempty"`
	Loadgen  *Loadgen  `json:"loadgen,omitempty"`
	Idle     *Idle     `json:"idle,omitempty"`
	Tunnels  *Tunnels  `json:"tunnels,omitempty"`
	Restarts []Restart `json:"restarts,omitempty"`
	// ResumeStop is the disconnect before the resume phase.
	ResumeStop *Disconnect `json:"resume_stop,omitempty"`
	Resume     *Connect    `json:"resume,omitempty"`
	Leave      *Leave      `json:"leave,omitempty"`
	Errors     []string    `json:"errors,omitempty"`
	Notes      []string    `json:"notes,omitempty"`

	// source is where LoadResults read it (for the scale report).
	source string
}

// Snapshot is the server at one moment: /proc and its /metrics.
type Snapshot struct {
	RSSBytes          int64   `json:"rss_bytes"`
	Goroutines        float64 `json:"goroutines"`
	HeapInuseBytes    float64 `json:"heap_inuse_bytes"`
	ActiveConnections float64 `json:"active_connections"`
	// ReplayCacheEntries are stream-header nonces the server holds for its
	// replay window (2 minutes) after the connections that sent them left.
	ReplayCacheEntries float64 `json:"replay_cache_entries"`
	// CPUCores is the server's CPU as a fraction of one core over a few
	// seconds before the snapshot (the baseline only).
	CPUCores float64 `json:"cpu_cores,omitempty"`
	// LiveHeapBytes (heap allocated right after a collection the load
	// generator asked for, after RSSBytes was read) and StackInuseBytes
	// (goroutine stacks, then): baseline and idle only.
	LiveHeapBytes   float64 `json:"live_heap_bytes,omitempty"`
	StackInuseBytes float64 `json:"stack_inuse_bytes,omitempty"`
}

// Connect is a phase that brings every client up at a bounded concurrency.
// A handshake counts once the client is ready: handshake complete and its
// hello (the shared-secret proof) accepted.
type Connect struct {
	Seconds float64 `json:"seconds"`
	Handshakes
	// P50Millis, P99Millis and MaxMillis: from a client's start to ready.
	P50Millis float64 `json:"p50_ms"`
	P99Millis float64 `json:"p99_ms"`
	MaxMillis float64 `json:"max_ms"`
	// ClientRescues is the clients' path rescues so far by result (the
	// first connect only): clients whose echoes came later than
	// RescueAfter, which keeps them busy instead of idle.
	ClientRescues map[string]float64 `json:"client_rescues,omitempty"`
}

// Handshakes is what a phase of many handshakes (a connect, a restart) cost
// and how the server took it; inlined in the phase's JSON.
type Handshakes struct {
	Full         int `json:"full_handshakes"`
	ZeroRTT      int `json:"zero_rtt_handshakes"`
	Rejected0RTT int `json:"zero_rtt_rejected"`
	// DialErrors are failed attempts (in a restart, most while the server
	// was down).
	DialErrors int `json:"dial_errors"`
	// PerSecond is the handshakes (in a restart, the clients back) over the
	// phase's wall time (the spread of their return).
	PerSecond float64 `json:"handshakes_per_second"`
	// ServerCPUSeconds is the server's CPU over the phase (in a restart,
	// the new server's from its start until all were back).
	ServerCPUSeconds   float64 `json:"server_cpu_seconds"`
	PerServerCPUSecond float64 `json:"handshakes_per_server_cpu_second"`
	LoadgenCPUSeconds  float64 `json:"loadgen_cpu_seconds"`
	// ServerRefused and ServerPreauthRejections are the server's
	// quictun_server_refused_connections_total and
	// quictun_server_preauth_rejections_total by label, since it started.
	ServerRefused           map[string]float64 `json:"server_refused,omitempty"`
	ServerPreauthRejections map[string]float64 `json:"server_preauth_rejections,omitempty"`
}

// Loadgen is this process with every client connected.
type Loadgen struct {
	RSSBytes            int64   `json:"rss_bytes"`
	Goroutines          int     `json:"goroutines"`
	RSSPerClientBytes   float64 `json:"rss_per_client_bytes"`
	GoroutinesPerClient float64 `json:"goroutines_per_client"`
}

// Idle is the server while every client is connected and idle.
type Idle struct {
	Seconds          float64  `json:"seconds"`
	Snapshot         Snapshot `json:"snapshot"`
	ServerCPUSeconds float64  `json:"server_cpu_seconds"`
	// ServerCores is the server's CPU as a fraction of one core.
	ServerCores float64 `json:"server_cores"`
	// ServerCPUPerClientMicrosPerSecond is the server's CPU over its
	// baseline's (no client), per client: µs of CPU per client per second.
	ServerCPUPerClientMicrosPerSecond float64 `json:"server_cpu_per_client_us_per_second"`
	LoadgenCores                      float64 `json:"loadgen_cores"`
	// OtherCores is the rest of the machine's busy CPU (/proc/stat) meanwhile.
	OtherCores         float64 `json:"other_cores"`
	RSSPerClientBytes  float64 `json:"rss_per_client_bytes"`
	HeapPerClientBytes float64 `json:"heap_inuse_per_client_bytes"`
	// LiveHeapPerClientBytes and StackPerClientBytes: what RSS is made of
	// without the garbage a collection would free (Snapshot.LiveHeapBytes).
	LiveHeapPerClientBytes float64 `json:"live_heap_per_client_bytes,omitempty"`
	StackPerClientBytes    float64 `json:"stack_per_client_bytes,omitempty"`
	GoroutinesPerClient    float64 `json:"goroutines_per_client"`
	ServerConnections      float64 `json:"server_connections"`
	ClientsReady           int     `json:"clients_ready"`
}

// Tunnels is the tunnel phase: one echo exchange per tunnel client.
type Tunnels struct {
	Tried       int      `json:"tried"`
	OK          int      `json:"ok"`
	Seconds     float64  `json:"seconds"`
	P50Millis   float64  `json:"p50_ms"`
	MaxMillis   float64  `json:"max_ms"`
	FirstErrors []string `json:"first_errors,omitempty"`
}

// Restart is one server restart; every time is from the signal.
type Restart struct {
	Signal string `json:"signal"`
	// ExitSeconds: until the old process was gone; ServerUpSeconds: until the
	// new one answered on its admin listener.
	ExitSeconds      float64 `json:"exit_seconds"`
	ServerUpSeconds  float64 `json:"server_up_seconds"`
	FirstBackSeconds float64 `json:"first_back_seconds"`
	P50BackSeconds   float64 `json:"p50_back_seconds"`
	P90BackSeconds   float64 `json:"p90_back_seconds"`
	AllBackSeconds   float64 `json:"all_back_seconds"`
	// NotBack counts clients not reconnected within the phase timeout.
	NotBack int `json:"not_back"`
	Handshakes
	ServerConnections float64 `json:"server_connections"`
	// ServerDropped is the new server's
	// quictun_server_dropped_datagrams_total by reason: unknown_connection_id
	// counts the old connections' packets it could not answer with a
	// stateless reset (quic-go answers only packets over 42 bytes).
	ServerDropped map[string]float64 `json:"server_dropped,omitempty"`
	// UDPRcvbufErrors: as in Disconnect, from the signal until all were back.
	UDPRcvbufErrors float64 `json:"udp_rcvbuf_errors"`
	// ClientRescues and ClientTCPDials are the clients' path rescues and
	// TCP fallback connections (by result) from the signal until all were
	// back.
	ClientRescues  map[string]float64 `json:"client_rescues,omitempty"`
	ClientTCPDials map[string]float64 `json:"client_tcp_dials,omitempty"`
}

// Disconnect is every client stopping (each closes its connection).
type Disconnect struct {
	StopSeconds        float64 `json:"stop_seconds"`
	ServerEmptySeconds float64 `json:"server_empty_seconds"`
	// ServerEnded is how the server saw the connections end
	// (quictun_server_connections_total by result): shutdown is the
	// client's close; idle_timeout a close that never arrived.
	ServerEnded map[string]float64 `json:"server_ended,omitempty"`
	// ServerDropped is the server's dropped datagrams meanwhile, by reason.
	ServerDropped map[string]float64 `json:"server_dropped,omitempty"`
	// UDPRcvbufErrors is the increase of /proc/net/snmp's Udp RcvbufErrors
	// meanwhile: datagrams the kernel dropped for a full socket receive
	// buffer, any socket of this network namespace.
	UDPRcvbufErrors float64 `json:"udp_rcvbuf_errors"`
	// ClientRescues is the clients' path rescues (a new socket probed after
	// RescueAfter without an echo) since the run began, by result, counted
	// as they stopped: a busy machine delays echoes into rescues.
	ClientRescues map[string]float64 `json:"client_rescues,omitempty"`
}

// Leave is the server after every client disconnected.
type Leave struct {
	*Disconnect
	Snapshot               Snapshot `json:"snapshot"`
	GoroutinesOverBaseline float64  `json:"goroutines_over_baseline"`
	// GCAfterLeave tells whether the server collected garbage after the
	// clients left and before Snapshot (else the heap holds garbage).
	GCAfterLeave          bool    `json:"gc_after_leave"`
	RSSOverBaselineBytes  int64   `json:"rss_over_baseline_bytes"`
	HeapOverBaselineBytes float64 `json:"heap_inuse_over_baseline_bytes"`
	// LiveHeapOverBaselineBytes is the heap allocated right after the
	// collection, over the baseline's (without GCWait only).
	LiveHeapOverBaselineBytes float64 `json:"live_heap_over_baseline_bytes,omitempty"`
	// Later is the memory read again --leave-wait after the clients left.
	Later *Later `json:"later,omitempty"`
}

// Later is the server's memory a while after every client left: past the
// replay cache's window, with time for Go's scavenger to return free pages.
type Later struct {
	Seconds                   float64  `json:"seconds"`
	Snapshot                  Snapshot `json:"snapshot"`
	GoroutinesOverBaseline    float64  `json:"goroutines_over_baseline"`
	RSSOverBaselineBytes      int64    `json:"rss_over_baseline_bytes"`
	LiveHeapOverBaselineBytes float64  `json:"live_heap_over_baseline_bytes"`
}

// save writes results.json and report.md into dir.
func (r *Results) save(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	r.WriteReport(f)
	return f.Close()
}

// LoadResults reads a results.json (or the one in a directory).
func LoadResults(path string) (*Results, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		path = filepath.Join(path, "results.json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// WriteReport writes the run as a Markdown table of every figure.
func (r *Results) WriteReport(w io.Writer) {
	fmt.Fprintf(w, "# quictun-server under %d clients\n\n", r.Clients)
	fmt.Fprintf(w, "- command: `%s`\n- server: `%s`\n", r.Command, r.ServerCommand)
	if r.ServerVersion != "" {
		fmt.Fprintf(w, "- server version: %s\n", r.ServerVersion)
	}
	fmt.Fprintf(w, "- machine: %d CPUs, %s, %s; load average before %s, after %s\n", r.Machine.CPUs, r.Machine.CPUModel,
		r.Machine.MemTotal, r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(w, "- %s to %s; concurrency %d, idle %gs (after %gs quiet), %d tunnel clients, client keep-alive %s\n\n",
		r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339), r.Concurrency, r.IdleSeconds, r.QuietSeconds, r.TunnelClients, r.ClientKeepAlive)
	fmt.Fprintln(w, "| phase | figure | value |")
	fmt.Fprintln(w, "| --- | --- | --- |")
	row := func(phase, figure, value string) { fmt.Fprintf(w, "| %s | %s | %s |\n", phase, figure, value) }
	b := r.Baseline
	row("0 baseline", "server RSS / goroutines / heap in use", fmt.Sprintf("%s / %.0f / %s", mib(float64(b.RSSBytes)), b.Goroutines, mib(b.HeapInuseBytes)))
	row("0 baseline", "server CPU, % of one core", fmt.Sprintf("%.2f %%", 100*b.CPUCores))
	if c := r.Connect; c != nil {
		connectRows(row, "1 connect", "full", c)
		row("1 connect", "clients' path rescues", counts(c.ClientRescues))
	}
	if l := r.Loadgen; l != nil {
		row("1 connect", "load generator RSS / goroutines per client", fmt.Sprintf("%s / %.1f", kib(l.RSSPerClientBytes), l.GoroutinesPerClient))
	}
	if i := r.Idle; i != nil {
		row("2 idle", "server connections / clients ready", fmt.Sprintf("%.0f / %d", i.ServerConnections, i.ClientsReady))
		row("2 idle", "server RSS per client", fmt.Sprintf("%s (RSS %s)", kib(i.RSSPerClientBytes), mib(float64(i.Snapshot.RSSBytes))))
		row("2 idle", "server heap in use per client", kib(i.HeapPerClientBytes))
		if i.LiveHeapPerClientBytes > 0 {
			row("2 idle", "server live heap / goroutine stacks per client (after a collection)", kib(i.LiveHeapPerClientBytes)+" / "+kib(i.StackPerClientBytes))
		}
		row("2 idle", "server goroutines per client", fmt.Sprintf("%.2f (%.0f)", i.GoroutinesPerClient, i.Snapshot.Goroutines))
		row("2 idle", "server CPU, % of one core", fmt.Sprintf("%.2f %% over %.0f s", 100*i.ServerCores, i.Seconds))
		row("2 idle", "server CPU per idle client (over the baseline's)", fmt.Sprintf("%.2f µs/s", i.ServerCPUPerClientMicrosPerSecond))
		row("2 idle", "load generator / other processes, cores", fmt.Sprintf("%.3f / %.3f", i.LoadgenCores, i.OtherCores))
	}
	if t := r.Tunnels; t != nil {
		row("3 tunnels", "echoes ok / tried", fmt.Sprintf("%d / %d in %.2f s (p50 %.1f ms, max %.1f ms)", t.OK, t.Tried, t.Seconds, t.P50Millis, t.MaxMillis))
	}
	for _, rs := range r.Restarts {
		p := "4 restart " + strings.ToUpper("SIG"+rs.Signal)
		row(p, "old server gone / new one up", fmt.Sprintf("%.2f s / %.2f s", rs.ExitSeconds, rs.ServerUpSeconds))
		row(p, "clients back: first / p50 / p90 / all", fmt.Sprintf("%.2f / %.2f / %.2f / %.2f s", rs.FirstBackSeconds, rs.P50BackSeconds, rs.P90BackSeconds, rs.AllBackSeconds))
		row(p, "not back / dial errors / 0-RTT rejected", fmt.Sprintf("%d / %d / %d", rs.NotBack, rs.DialErrors, rs.Rejected0RTT))
		row(p, "handshakes full / 0-RTT", fmt.Sprintf("%d / %d", rs.Full, rs.ZeroRTT))
		row(p, "handshakes/s over the return; per server CPU-second", fmt.Sprintf("%.0f; %.0f (server %.2f s, load generator %.2f s CPU)",
			rs.PerSecond, rs.PerServerCPUSecond, rs.ServerCPUSeconds, rs.LoadgenCPUSeconds))
		row(p, "server refusals", refusals(rs.ServerRefused, rs.ServerPreauthRejections))
		row(p, "new server's dropped datagrams; kernel UDP receive-buffer drops", fmt.Sprintf("%s; %.0f", counts(rs.ServerDropped), rs.UDPRcvbufErrors))
		row(p, "clients' path rescues; TCP fallback connections", fmt.Sprintf("%s; %s", counts(rs.ClientRescues), counts(rs.ClientTCPDials)))
	}
	if d := r.ResumeStop; d != nil {
		disconnectRows(row, "5 resume", d)
	}
	if c := r.Resume; c != nil {
		connectRows(row, "5 resume", "0-RTT", c)
	}
	if l := r.Leave; l != nil && l.Disconnect != nil {
		disconnectRows(row, "6 leave", l.Disconnect)
		gc := "no collection since they left"
		if l.GCAfterLeave {
			gc = "after a collection"
		}
		row("6 leave", "goroutines / RSS / heap over baseline", fmt.Sprintf("%+.0f / %s / %s (%s)", l.GoroutinesOverBaseline,
			mib(float64(l.RSSOverBaselineBytes)), mib(l.HeapOverBaselineBytes), gc))
		if l.GCAfterLeave && l.Snapshot.LiveHeapBytes > 0 {
			row("6 leave", "live heap over baseline (after a collection)", mib(l.LiveHeapOverBaselineBytes))
		}
		row("6 leave", "replay cache entries (kept for 2 min)", fmt.Sprintf("%.0f", l.Snapshot.ReplayCacheEntries))
		if lt := l.Later; lt != nil {
			p := fmt.Sprintf("6 leave, %.0f s later", lt.Seconds)
			row(p, "goroutines / RSS / live heap over baseline (after a collection)", fmt.Sprintf("%+.0f / %s / %s",
				lt.GoroutinesOverBaseline, mib(float64(lt.RSSOverBaselineBytes)), mib(lt.LiveHeapOverBaselineBytes)))
			row(p, "replay cache entries", fmt.Sprintf("%.0f", lt.Snapshot.ReplayCacheEntries))
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "\nError: %s\n", e)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
}

func connectRows(row func(string, string, string), phase, kind string, c *Connect) {
	row(phase, "handshakes full / 0-RTT / 0-RTT rejected / dial errors", fmt.Sprintf("%d / %d / %d / %d", c.Full, c.ZeroRTT, c.Rejected0RTT, c.DialErrors))
	row(phase, kind+" handshakes/s (wall)", fmt.Sprintf("%.0f in %.2f s", c.PerSecond, c.Seconds))
	row(phase, "start to ready: p50 / p99 / max", fmt.Sprintf("%.1f / %.1f / %.1f ms", c.P50Millis, c.P99Millis, c.MaxMillis))
	row(phase, kind+" handshakes per server CPU-second (one core)", fmt.Sprintf("%.0f (server %.2f s, load generator %.2f s CPU)", c.PerServerCPUSecond, c.ServerCPUSeconds, c.LoadgenCPUSeconds))
	row(phase, "server refusals", refusals(c.ServerRefused, c.ServerPreauthRejections))
}

func disconnectRows(row func(string, string, string), phase string, d *Disconnect) {
	row(phase, "clients stopped / server empty after", fmt.Sprintf("%.2f s / %.2f s", d.StopSeconds, d.ServerEmptySeconds))
	row(phase, "how the server saw them end", counts(d.ServerEnded))
	row(phase, "server's dropped datagrams meanwhile; kernel UDP receive-buffer drops", fmt.Sprintf("%s; %.0f", counts(d.ServerDropped), d.UDPRcvbufErrors))
	row(phase, "clients' path rescues since the run began", counts(d.ClientRescues))
}

// refusals lists the non-zero refusal counters, or "none".
func refusals(refused, preauth map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(refused)) {
		parts = append(parts, "refused "+k+"="+strconv.FormatFloat(refused[k], 'f', 0, 64))
	}
	for _, k := range slices.Sorted(maps.Keys(preauth)) {
		parts = append(parts, "preauth "+k+"="+strconv.FormatFloat(preauth[k], 'f', 0, 64))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// counts lists non-zero counters by label, or "none".
func counts(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+strconv.FormatFloat(m[k], 'f', 0, 64))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }
func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// loadavg is /proc/loadavg's three load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// udpRcvbufErrors is /proc/net/snmp's Udp RcvbufErrors (0 if unreadable).
func udpRcvbufErrors() float64 {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0
	}
	return parseRcvbufErrors(string(b))
}

// parseRcvbufErrors reads RcvbufErrors from the Udp lines of /proc/net/snmp
// (a line of names, then one of values).
func parseRcvbufErrors(snmp string) float64 {
	var names []string
	for line := range strings.SplitSeq(snmp, "\n") {
		rest, ok := strings.CutPrefix(line, "Udp: ")
		if !ok {
			continue
		}
		if names == nil {
			names = strings.Fields(rest)
			continue
		}
		for i, v := range strings.Fields(rest) {
			if i < len(names) && names[i] == "RcvbufErrors" {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	return 0
}

// machineBusy is the machine's busy CPU seconds so far, every CPU's
// (/proc/stat: all but idle and iowait).
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, s := range f[1:min(len(f), 9)] { // user nice system idle iowait irq softirq steal
		v, _ := strconv.ParseFloat(s, 64)
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy / 100 // USER_HZ
}
