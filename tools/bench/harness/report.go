package harness

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Metric is a column of a scenario table.
type Metric struct {
	Key, Label string
	// Higher tells whether a larger value is better (for the compare table).
	Higher bool
}

// ScenarioInfo describes how a scenario is reported.
type ScenarioInfo struct {
	Title   string
	What    string
	Metrics []Metric
	// Charts lists the metric keys drawn as charts (default: the first metric).
	Charts []string
}

// Scenarios describes each scenario for the report.
func Scenarios() map[string]ScenarioInfo {
	return map[string]ScenarioInfo{
		ScLatency: {"1. Latency (ping-pong)", "One connection, 1000 round trips of 1000 B, as quic-tun's report. Connect = the application's connect (direct: the TCP handshake across the link; a forward: on loopback; SOCKS5: until the proxy's answer); first packet = first round trip after it (includes opening the tunnel stream and the server's dial); connect to first echo = both, the wait before the application's first answer (in RTTs: over the link's round-trip time, 2 x one-way delay); total = all round trips. quictun-reverse (opt-in): a reverse tunnel, the echo server next to the client (client host's loopback), quictun-client `--remote-forward` asking its server to listen on the server host's address, the probe on the server host connecting there: its connect is local and its first echo crosses the link once each way plus the client's dial to the echo server (target: one RTT plus the dial, where direct TCP needs two RTTs).",
			[]Metric{{"first_packet_ms", "first packet ms", false}, {"connect_ms", "connect ms", false}, {"first_echo_ms", "connect to first echo ms", false},
				{"first_echo_rtts", "connect to first echo RTTs", false},
				{"total_ms", "total ms", false}, {"p99_ms", "p99 RTT ms", false}},
			[]string{"total_ms", "first_packet_ms"}},
		ScCold: {"1b. Cold start", "The tunnel's client process is restarted (SIGTERM, then started again as an operator or a boot would) and an application connects at once, retrying until the local listener is up; first byte = from the start of the successful connect to the echo of 1000 B. quictun runs with `--session-file` (as its systemd unit does), so the restarted client resumes with 0-RTT. direct: a new TCP connection (its handshake is part of the first byte). In RTTs: first byte / the link's round-trip time (2 x one-way delay). Since start: from starting the client process to the echo.",
			[]Metric{{"first_byte_ms", "first byte ms", false}, {"first_byte_rtts", "first byte RTTs", false}, {"since_start_ms", "since process start ms", false}},
			[]string{"first_byte_rtts"}},
		ScAfterIdle: {"1c. First connection after an idle spell", "Every variant is left idle for the spell (quictun: past the client's idle switch, so only its keep-alive runs, no heartbeats), then an application makes one new connection and echoes 1000 B (one attempt, no retry; all variants at the same moment). Second case: the link is cut (100 % loss both ways) from 0.5 s before that connection for the given time, as a path that died while nothing was sent; after cut = from the link's return to the echo. First byte = from the connect to the echo; direct: a new TCP connection (its handshake and, in the cut case, the SYN retransmission schedule are part of it). Reconnects: the tunnel client's QUIC reconnections during the sample.",
			[]Metric{{"first_byte_ms", "first byte ms", false}, {"first_byte_rtts", "first byte RTTs", false}, {"after_cut_ms", "after cut ms", false}, {"reconnects", "tunnel reconnects", false}},
			[]string{"first_byte_ms", "after_cut_ms"}},
		ScBulk: {"2. Bulk throughput", "Download (server to client) from `latency-client serve`'s sink for a fixed time, by the harness's own sink-protocol client (it stops with a byte, not a half-close, which kcptun does not carry); byte count and CRC-32C verified, 1 or 4 parallel connections. ×V: this variant's median over V's on the same link. " + usageText,
			append([]Metric{{"mbit_per_s", "Mbit/s", true}}, usageColumns...),
			[]string{"mbit_per_s", "cpu_client_s_per_gb"}},
		ScLoss: lossInfo(),
		ScFair: {"2b. Fairness against direct TCP Cubic", "One download through the variant and one over direct TCP (server side Cubic, set per route) start together on the same link and run for the same time. Share: each flow's goodput after the profile's warm-up (start-up excluded; the whole run's shares in the last columns) in % of the link rate (of their sum on an unlimited link); Jain: Jain's index of the two rates (1 = equal, 0.5 = one flow has everything). direct-cubic against Cubic is the reference of two equal flows. A link named `queue Q` has a rate-limiter queue of Q at its rate (emulator `queue-bytes`, tail drop), a shallow queue; the others the emulator's default, 50 ms. CPU and emulator columns as in the bulk section, over both flows. " +
			"A case `after D alone` (`bench run --fair-delay D`) starts the Cubic flow D after the variant's, which runs D longer (shares after the warm-up from the Cubic start; no whole-run shares), and measures how fast the variant yields: " +
			"before = its goodput in the second before the Cubic start, settled (1) when every 250 ms of that second is within ±40 % of it (else no yield figures); " +
			"yield s = from the Cubic start to the end of the first 250 ms window (in 50 ms steps) below half the rate before, with every window of the next 0.5 s below too; first fall s = the first such window alone; " +
			"**never** = it did not fall (yielded 0; -1 in results.json, left out of the median: `never ×N` counts such repetitions); after = its goodput from 1 s after the Cubic start to the end. Per-flow goodput every 250 ms: the timeline charts and " + fairTimelineCSV + ".",
			append([]Metric{{"mbit_per_s", "flow Mbit/s", true}, {"against_mbit_per_s", "Cubic Mbit/s", true}, {"share_pct", "flow % of link", true},
				{"against_share_pct", "Cubic % of link", true}, {"jain", "Jain", true},
				{"whole_share_pct", "flow % whole run", true}, {"whole_against_share_pct", "Cubic % whole run", true},
				{"yield_settled", "settled before", true}, {"yield_before_mbit_per_s", "flow Mbit/s before", true},
				{"yield_s", "yield s", false}, {"yield_first_s", "first fall s", false},
				{"yielded", "yielded", true}, {"yield_after_mbit_per_s", "flow Mbit/s after 1 s", false}}, usageColumns[:7]...),
			[]string{"share_pct", "against_share_pct"}},
		ScRateCap: {"2c. Rate caps the client cannot dodge (issue 35)", "The server caps the client's identity (`--rate-limit key=ID=DOWN/UP`; its own `--congestion bbr`, which the download cap paces) on a link much faster than the caps; per congestion controller of the client (`fixed` at a `--rate` far above the cap) fresh daemons, then parallel downloads, then as many uploads, through the tunnel for the profile's time each. Mbit/s: the server's own count of the identity's application bytes in that direction (GET /identities/ID, the relays' live counters) from the warm-up to the end, and in % of the cap; the download cap counts QUIC packet bytes, so its goodput runs 2-3 % below the cap. Client Mbit/s: download, what the harness received over the whole transfer (start-up and drain included); upload, what it wrote in the time, including what the local and QUIC buffers took in at first (above the cap: that is buffering, not a leak). Uploads end with a reset, so their buffered bytes are dropped, and each sample waits for the identity's tunnels to close. CPU and emulator columns as in the bulk section. The `quictun-shared` rows are one server with several identities at once (`--keys-file`, a client each, the client's default controller): two capped, one not, each running the same parallel transfers at the same time; each capped identity against its own cap, the uncapped one in % of what the caps leave of the link (the link's rate minus the caps); the server runs with `--link-rate` (the profile's, a little below the link: the uncapped identity shares what the capped ones leave of it, paced by the server) unless the run's `--quictun-server-arg=--link-rate=` takes it away; client CPU: all three clients, the CPU and emulator columns the whole run's.",
			[]Metric{{"cap_pct", "% of cap", false}, {"mbit_per_s", "Mbit/s (server count)", true}, {"cap_mbit_per_s", "cap Mbit/s", false},
				{"client_mbit_per_s", "client Mbit/s", true}, {"cpu_client_pct", "client CPU %", false}, {"cpu_server_pct", "server CPU %", false},
				{"emu_cpu_pct", "emulator CPU %", false}, {"emu_queue_drops", "emulator queue drops", false}, {"emu_late_pct", "emulator late %", false},
				{"rest_pct", "uncapped: % of the link the caps leave", true}},
			[]string{"cap_pct"}},
		ScBlackoutBulk: {"5b. Blackout under load", "A download runs and an interactive 1000 B echo connection is open through the same tunnel connection (quictun: the sink client's QUIC connection, the echo connecting from 127.0.0.2, which its File token source sends to the echo server; direct TCP and kcptun: separate connections); after the warm-up, 100 % loss both ways for the given time on top of the link's background loss, and an echo request is sent just after the cut. Echo after: seconds from the end of the cut to the echo. Bulk flowing after: seconds from the end of the cut until 1 MiB of new download data has arrived (first byte: the first of it). Before/after Mbit/s: download rate in the second half of the warm-up, and in the second after it flowed again. Bulk kept: the download connection was still up when the harness stopped it (not reset); its end is then awaited for 5 s and, when it arrives, count and CRC-32C are verified (results.json: bulk_verified; a slow lossy download may still be draining its buffers then, which is not an error). Tunnel survived: the sink client's QUIC connection was not replaced (quictun reconnect counter unchanged). Recovery is awaited for a bounded time (profile); a missing value is a recovery that did not happen within it (see errors). Emulator columns as in the bulk section, over the whole sample.",
			[]Metric{{"echo_after_s", "echo after s", false}, {"bulk_flowing_after_s", "bulk flowing after s", false}, {"bulk_first_byte_after_s", "bulk first byte after s", false},
				{"tunnel_survived", "tunnel survived", true}, {"bulk_survived", "bulk kept", true}, {"bulk_before_mbit_per_s", "before Mbit/s", true},
				{"bulk_after_mbit_per_s", "after Mbit/s", true}, {"emu_cpu_pct", "emulator CPU %", false}, {"emu_queue_drops", "emulator queue drops", false},
				{"emu_late_pct", "emulator late %", false}},
			[]string{"echo_after_s", "bulk_flowing_after_s"}},
		ScSTNShort: {"8a. Short connections (seed 000, Mars STN)", stnText + " Each sample: the given number of connections one after the other, each a 16 B request and a response of the given size. Total s: wall time of all of them, failures included; ×direct: total over direct TCP's total on the same link (the headline: 40 connections at 30 % loss, RTT 100 ms, 145 s direct vs 11.5 s through a warm tunnel, 0.08x, measured independently). Mean, median (p50), p90 and max: per connection that completed, from the start of the connect to the verified end of the response. Failures: connections not done within the profile's per-connection bound (see errors). Reconnects: the tunnel client's QUIC reconnections during the sample. Emulator loss %: packets the emulator dropped as random loss, in % of those it received, both directions (the configured loss, measured); queue drops: tail drops at its rate limiter; TUN drops: packets it did not read in time.",
			stnColumns, []string{"total_s", "p50_s"}},
		ScSTNSizes: {"8b. Short connections by request and response size (seed 000)", stnText + " Request N: the request carries N bytes (the sink protocol's upload, ended by a half-close), the response is 12 B; response N: a 16 B request, a response of N bytes. Columns as in 8a.",
			stnColumns, []string{"total_s", "p50_s"}},
		ScSTNBlackout: {"8c. New connection into a blackout (seed 000)", "The link starts at 100 % loss both ways and returns after the given time; a new short connection (16 B request, the 8a response) starts through every variant at once, together, as the cut begins, each bounded by the profile's limit from its start (as the seed's clients: 60 s). Done after s: seconds from the link's return to the verified end of the response (missing: it failed, see errors); took s: from its start to its end or failure. Direct TCP's wait is set by the kernel's SYN retransmission schedule (Linux 6.x: net.ipv4.tcp_syn_linear_timeouts retransmissions 1 s apart, then doubling, up to tcp_syn_retries; older kernels and the seed's iOS clients: 1, 3, 7, 15, 31 s), so it depends on where in that schedule the link returns. Tunnel survived: the sink client's QUIC connection was not replaced.",
			[]Metric{{"done_after_s", "done after s", false}, {"ok", "completed", true}, {"took_s", "took s", false}, {"tunnel_survived", "tunnel survived", true}},
			[]string{"done_after_s"}},
		ScFailover: {"9. Failover between two servers", "A quictun client of two servers (`--server-endpoint A,B --server-mode failover`; both servers share one state dir, as the Helm replicas share their state Secret) keeps a connection to each; an application opens a new tunnel every 20 ms, each a 1000 B echo. After 1 s the active server is SIGKILLed (its host answers with ICMP port unreachable) or SIGSTOPped (a blackhole: nothing answers). Failover ms: from the failure to the answer of the first tunnel opened after it that succeeded (detection: no heartbeat echo for `--rescue-after`, 1 s); first byte: that tunnel's own open to echo (the switch: the standby's connection is open, so one round trip plus the dial); in RTTs of the link; p99 first byte: over the tunnels opened in the 5 s after the failure that succeeded; failed: those that did not (opened before the failure was detected, they were reset when the dead server's connection was given up). results.json raw: the timeline, each tunnel's open and answer in ms from the failure.",
			[]Metric{{"failover_ms", "failover ms", false}, {"first_byte_ms", "first byte ms", false}, {"first_byte_rtts", "first byte RTTs", false},
				{"p99_first_byte_ms", "p99 first byte ms", false}, {"failed_new_tunnels", "failed new tunnels", false}},
			[]string{"failover_ms"}},
		ScEcho: {"3a. Echo TPS by message size", "Several connections in parallel, ping-pong of the given size, unlimited link. " + echoCPUText,
			append([]Metric{{"tps", "round trips/s", true}, {"mbit_per_s", "Mbit/s each way", true}, {"p99_ms", "p99 ms", false}}, echoCPUColumns...), nil},
		ScReqSize: {"3b. QPS and throughput by request size", "One connection, request = echo of the given size, unlimited link. " + echoCPUText,
			append([]Metric{{"tps", "QPS", true}, {"mbit_per_s", "Mbit/s each way", true}, {"p50_ms", "p50 ms", false}}, echoCPUColumns...), nil},
		ScConnrate: {"4. New-connection cost", "Short connections: connect, one 100 B request, echo, close; 8 in flight.",
			[]Metric{{"conns_per_s", "conns/s", true}, {"first_byte_p50_ms", "first byte p50 ms", false}, {"first_byte_p99_ms", "first byte p99 ms", false}}, nil},
		ScBlackout: {"5. Recovery after a blackout", "100 % loss both ways for the given time. In-flight: a 1000 B request sent on an open connection just after the cut started; seconds from the end of the cut to its echo. New connection: seconds from the end of the cut to the first new connection that completes a round trip. Survived: the tunnel's QUIC connection was not replaced (quictun reconnect counter unchanged).",
			[]Metric{{"inflight_after_s", "in-flight done after s", false}, {"newconn_after_s", "new conn after s", false}, {"tunnel_survived", "tunnel survived", true}},
			[]string{"inflight_after_s", "newconn_after_s"}},
		ScUDPBlocked: {"5c. UDP blocked", "Every UDP datagram between the hosts is dropped silently (a blackhole policy rule for UDP arriving on each namespace's link device, ahead of local delivery; TCP passes; the link check `UDP blocked` shows the datagrams a probe lost, `UDP back` the same after the scenario) from before the tunnel daemons start: the quictun variants are restarted under the block and run as users run them (`--transport auto` and the server's TCP listener on the address of `--listen-on`, both defaults), so the client falls back to TCP by itself; kcptun (UDP only) is left out, direct TCP is the reference. Client start: the echo client restarted, an application connects at once and retries until an echo of 1000 B comes back; since start = from the client process's start to that echo, first byte = that connection's connect to echo, failed attempts = connections before it that the client accepted but could not carry; transport TCP = the client's `quictun_client_transport{transport=\"tcp\"}` after it (1: new tunnels go over TCP). Then the latency workload (columns as in section 1) and a download of the bulk section's length (1 stream; CPU columns as there).",
			append([]Metric{{"since_start_ms", "client start to first echo ms", false}, {"first_byte_ms", "first byte ms", false},
				{"failed_attempts", "failed attempts", false}, {"transport_tcp", "transport TCP", false},
				{"first_packet_ms", "first packet ms", false}, {"first_echo_ms", "connect to first echo ms", false},
				{"total_ms", "total ms", false}, {"p99_ms", "p99 RTT ms", false}, {"mbit_per_s", "Mbit/s", true}}, usageColumns[:3]...),
			[]string{"since_start_ms", "total_ms", "mbit_per_s"}},
		ScResume: {"10. Tunnels that outlive their connection (issue 34)", resumeText, unionMetrics(resumeUpgradeColumns, resumeSurviveColumns),
			[]string{"stall_ms", "session_after_s"}},
		ScScale: {"6. Scale", "Many concurrent ping-pong connections. RSS: peak resident memory of the tunnel's client and server processes during the run (direct: the echo server).",
			[]Metric{{"p50_ms", "p50 ms", false}, {"p99_ms", "p99 ms", false}, {"rss_client_mib", "client RSS MiB", false}, {"rss_server_mib", "server RSS MiB", false}},
			[]string{"p99_ms", "rss_client_mib"}},
		ScFlood: {"7. Garbage UDP flood against the tunnel server", "One connection does 1000 round trips of 1000 B through the tunnel on the LAN link, first with no flood, then while `latency-client flood` sends 1200 B garbage datagrams at the tunnel server's UDP port as fast as one sender can (sendmmsg, one socket). Kinds: `random` bytes; `quic-initial`, QUIC v1 Initial packets with random 8–20 B connection IDs (the server's new-connection path: Retry, refusal or handshake state); `short-header`, random destination connection IDs (the stateless-reset path); control: `random to a discard socket`, the same random flood aimed not at the tunnel server but at a socket in the server namespace that only reads and drops, i.e. what the flood costs this machine (sender, kernel, reader) without the tunnel server handling it: a kind's ratio above the control's is what the tunnel server's own handling adds. " +
			"**Where the flood comes from:** inside the server namespace, aimed at the server's own address (198.18.0.2), so it does not cross the emulator. The emulator forwards at most ~144 k packets/s in userspace and would itself saturate and drop first, turning the test into one of the emulated link; from inside the namespace the flood reaches the server's socket at the sender's full speed (the table shows the rate it achieved), while the legitimate client still crosses the emulated LAN. The flood's source is 198.18.0.2, so the server's per-source limits treat it as one address. " +
			"×quiet = flooded / quiet of the same repetition (median of the per-repetition ratios). CPU % = share of one core during the probe; every process shares the machine's cores, so the flood takes CPU from the tunnel too. Socket drops: the kernel's drop counter of the server's UDP socket (receive buffer full: the server did not read fast enough). Replies/s: datagrams the server sent back to the flood (Retry, Version Negotiation, stateless resets, refusals). Refused: change of `quictun_server_refused_connections_total` (per-source handshake rate). quictun-server has no counter of the garbage it drops; the socket-drop and reply counts stand in for it.",
			[]Metric{{"p50_ms", "p50 ms", false}, {"p99_ms", "p99 ms", false}, {"total_ms", "total ms", false},
				{"p50_ratio", "p50 ×quiet", false}, {"p99_ratio", "p99 ×quiet", false}, {"total_ratio", "total ×quiet", false},
				{"flood_pps", "flood datagrams/s", true}, {"server_cpu_pct", "server CPU %", false}},
			[]string{"p50_ms", "p99_ms"}},
	}
}

// usageText explains the CPU and drop columns of the bulk scenarios.
const usageText = "CPU % = share of one core over the transfer: the tunnel's client and server processes (direct TCP has none), and the emulator: the harness process, in which tools/linkem runs, less the threads that read the downloads (each locked to its OS thread and timed); it includes the Go runtime's work for the emulator (GC of its per-packet buffers). Emulator queue drops: packets dropped by the emulator's rate limiter queue (tail drop, 50 ms at the rate) or delay-line overflow during the transfer, both directions; the configured random loss is counted apart (results.json: emu_loss_drops). Emulator overload shows as: late % = packets that left the emulator's delay line 1 ms or more after their due time, mean late µs = their mean lateness (all packets), and TUN drops = packets the kernel dropped at the namespaces' TUN devices because the emulator did not read them in time. The emulator spins (yields in a loop) during the last millisecond before each delivery to keep the delay accurate, so its CPU % is high whenever packets are in flight and is not by itself a sign of saturation; late % and TUN drops are. CPU s/GB: CPU seconds of the tunnel processes per GB carried. An emulator near 100 % of a core, or a tunnel process near it, is a machine limit, not a protocol one."

// resumeText introduces the resume scenario.
const resumeText = "quictun only: direct TCP and kcptun cannot keep a connection across any of these cases (a TCP connection dies with its endpoint process, and with its path once its retransmissions give up), so they are not run. " +
	"Each sample starts a quictun server and client of its own with `--resume-window` on both (the profile's, 10 min), the client forwarding to the echo server (no `--session-file`: every tunnel opens on a connection whose handshake is done). " +
	"**Upgrades under load**: the given number of tunnels, each an interactive ping-pong (a round trip of 1000 random bytes written and echoed back, then a pause drawn from the range the case gives, the profiles' 100-200 ms or `bench run --resume-pause`), through the client; after the warm-up, `SIGUSR2` to the server or the client, which starts the binary at its own path (the same build) and hands its sockets and tunnels over; the load goes on for the profile's time after the signal. " +
	"Reset: tunnels whose connection failed (reset, or a round trip past its 40 s deadline); verified: every tunnel's bytes came back once and in order (count and SHA-256 of all it sent against all it received; 1 = all tunnels). " +
	"Stall: the longest round trip that ended after the signal (those in flight at it included), in ms and in RTTs of the link (2 x one-way delay); the target is 1 RTT + 100 ms; longest before: the longest that ended before it (the load's own tail); p99: over all round trips, and over those after the signal. Old exit: from the signal to the old process's exit. Resumed: the tunnels re-attached as the server and the client count them (the upgraded process's counters, which start at 0), gave up: tunnels not re-attached within the window. " +
	"Load: round trips per second and Mbit/s each way of the whole load in the warm-up before the signal, with the CPU of the tunnel's client and server processes and the emulator columns over the same window (the emulator's CPU is the harness process's, which also runs the load's goroutines; the section on bulk explains the columns). " +
	"**Outages and an upgrade with a session and a transfer**: one interactive session as above and one transfer of the given size, each way (pseudo-random bytes written through the tunnel to the echo while its echo is read back; count and SHA-256 of both ways compared) or, with `bench run --resume-transfer down`, down (downloaded from the sink through a second entry point of the client, `--forward`; count and CRC-32C checked against the sink's trailer), through the client; after the warm-up either the link is cut (100 % loss both ways) for longer than the daemons' `--idle-timeout` (given in the case; the QUIC connection dies and the client reconnects, backoff up to `--reconnect-max-delay`, 10 s, and re-attaches both tunnels), or the client host's address changes (a new address added and the old one removed from its link device: its QUIC client's packets cannot leave from the old address any more, nor the server's reach it), or the server is upgraded (`SIGUSR2`, as above). " +
	"Session after / transfer flowing after: seconds from the link's return (the address change; the old server's exit) to the session's next answer and to 1 MiB more of the transfer's echo (first byte: the first of it); session longest: the session's longest round trip ending after that; before Mbit/s: the transfer's echo rate in the second half of the warm-up; reconnects: the client's QUIC reconnections in the sample (after a blackout past the idle timeout: a new connection, on which the client re-attaches both tunnels: resumed); path switches: the client's moves of its QUIC connection to a new path (after the address change its route watch sees the old address removed and moves the connection to the new one, so nothing needs re-attaching; were that to fail, the connection would be lost and the tunnels re-attached on a new one). CPU and emulator columns over the whole sample."

// resumeUpgradeColumns are the columns of the resume scenario's upgrade
// table; resumeSurviveColumns those of its outage table.
var (
	resumeUpgradeColumns = []Metric{{"tunnels", "tunnels", true}, {"tunnels_reset", "reset", false}, {"verified", "verified", true},
		{"stall_ms", "stall ms", false}, {"stall_rtts", "stall RTTs", false}, {"longest_before_ms", "longest before ms", false},
		{"rtt_p99_ms", "p99 ms", false}, {"rtt_p99_after_ms", "p99 after ms", false}, {"old_exit_ms", "old exit ms", false},
		{"resumed_server", "resumed (server)", true}, {"resumed_client", "resumed (client)", true}, {"gaveup_server", "gave up (server)", false},
		{"load_round_trips_per_s", "load round trips/s", true}, {"load_mbit_per_s_each_way", "load Mbit/s each way", true},
		{"cpu_client_pct", "client CPU %", false}, {"cpu_server_pct", "server CPU %", false}, {"emu_cpu_pct", "emulator CPU %", false},
		{"emu_queue_drops", "emulator queue drops", false}, {"emu_late_pct", "emulator late %", false}, {"emu_tun_drops", "TUN drops", false}}
	resumeSurviveColumns = []Metric{{"tunnels_reset", "reset", false}, {"verified", "session verified", true},
		{"transfer_verified", "transfer verified", true}, {"session_after_s", "session after s", false},
		{"transfer_flowing_after_s", "transfer flowing after s", false}, {"transfer_first_byte_after_s", "transfer first byte after s", false},
		{"session_longest_s", "session longest s", false}, {"old_exit_ms", "old exit ms", false},
		{"transfer_before_mbit_per_s", "before Mbit/s", true}, {"transfer_mbit_per_s", "transfer Mbit/s (whole)", true},
		{"reconnects", "reconnects", false}, {"path_switches", "path switches", false}, {"resumed_server", "resumed (server)", true},
		{"gaveup_server", "gave up (server)", false},
		{"cpu_client_pct", "client CPU %", false}, {"cpu_server_pct", "server CPU %", false}, {"emu_cpu_pct", "emulator CPU %", false},
		{"emu_queue_drops", "emulator queue drops", false}, {"emu_tun_drops", "TUN drops", false}}
)

// unionMetrics is a's metrics, then those of b not in a (by key).
func unionMetrics(a, b []Metric) []Metric {
	out := slices.Clone(a)
	for _, m := range b {
		if !slices.ContainsFunc(out, func(x Metric) bool { return x.Key == m.Key }) {
			out = append(out, m)
		}
	}
	return out
}

// writeResumeTables writes the resume scenario as two tables: the upgrade
// cases, and the outages (different columns).
func writeResumeTables(w *errWriter, rows []row, variants []string, agg map[Key]Summary) {
	var up, out []row
	for _, r := range rows {
		if strings.Contains(r.cs, "upgrade") && !strings.Contains(r.cs, "session +") { // not the upgrade under a transfer
			up = append(up, r)
		} else {
			out = append(out, r)
		}
	}
	for _, t := range []struct {
		title string
		rows  []row
		cols  []Metric
	}{{"Upgrades under load", up, resumeUpgradeColumns}, {"Outages and an upgrade with a session and a transfer", out, resumeSurviveColumns}} {
		if len(t.rows) > 0 {
			w.printf("%s:\n\n", t.title)
			writeRowTable(w, ScResume, ScenarioInfo{Metrics: t.cols}, t.rows, variants, agg, nil)
			w.printf("\n")
		}
	}
}

// stnText introduces the STN scenarios.
const stnText = "Seed 000 (Mars STN benchmark): short connections, one at a time: connect, request, response, close, no retry, as a mobile app's requests without keep-alive. The harness makes them from the client namespace against `latency-client serve`'s sink (request and response sizes may differ; byte counts and CRC-32C are verified). quictun: the tunnel is warm (its QUIC connection is up before the sample); each connection is a new TCP connection to quictun-client on loopback and a new stream. Links: the iOS Network Link Conditioner's 3G (780 kbit/s down, 330 kbit/s up, 100 ms delay each way) and Edge (240/200 kbit/s, 400 ms down, 440 ms up) profiles, and random loss each way with 50 ms one-way delay (RTT 100 ms), unlimited rate."

// stnColumns are the columns of the STN short-connection tables.
var stnColumns = []Metric{
	{"total_s", "total s", false}, {"mean_s", "mean s", false}, {"p50_s", "median s", false}, {"p90_s", "p90 s", false},
	{"max_s", "max s", false}, {"failures", "failures", false}, {"connections", "connections", true}, {"reconnects", "tunnel reconnects", false},
	{"emu_loss_pct", "emulator loss %", false}, {"emu_queue_drops", "emulator queue drops", false}, {"emu_tun_drops", "TUN drops", false},
}

// echoCPUColumns are the CPU columns of the echo scenarios (3a, 3b): the
// client, server and emulator CPU % of usageColumns.
var echoCPUColumns = usageColumns[:3:3]

const echoCPUText = "CPU % = share of one core during the sample: the tunnel's client and server processes (direct TCP has none) and the emulator (the harness process, which runs tools/linkem). The machine's cores are shared by them, latency-client and its echo server: a process near 100 % is a machine limit, not a protocol one."

// usageColumns are the CPU and drop columns shown beside bulk results.
var usageColumns = []Metric{
	{"cpu_client_pct", "client CPU %", false}, {"cpu_server_pct", "server CPU %", false},
	{"emu_cpu_pct", "emulator CPU %", false}, {"emu_queue_drops", "emulator queue drops", false},
	{"emu_late_pct", "emulator late %", false}, {"emu_mean_late_us", "emulator mean late µs", false}, {"emu_tun_drops", "TUN drops", false},
	{"cpu_client_s_per_gb", "client CPU s/GB", false}, {"cpu_server_s_per_gb", "server CPU s/GB", false},
}

// writeRowTable writes one row per (link, case, variant) and one column per
// metric; ratioTo lists variants whose mbit_per_s each row is divided by
// (columns ×V).
func writeRowTable(w *errWriter, sc string, si ScenarioInfo, rows []row, variants []string, agg map[Key]Summary, ratioTo []string) {
	var metrics []Metric
	for _, mt := range si.Metrics {
		for _, r := range rows {
			found := false
			for _, v := range variants {
				if _, ok := agg[Key{sc, r.link, r.cs, v, mt.Key}]; ok {
					found = true
				}
			}
			if found {
				metrics = append(metrics, mt)
				break
			}
		}
	}
	w.printf("| link | case | variant |")
	for i, mt := range metrics {
		w.printf(" %s |", mt.Label)
		if i == 0 {
			for _, b := range ratioTo {
				w.printf(" ×%s |", b)
			}
		}
	}
	w.printf("\n|---|---|---|%s\n", strings.Repeat("---|", len(metrics)+len(ratioTo)))
	for _, r := range rows {
		for _, v := range variants {
			cells := make([]string, 0, len(metrics)+len(ratioTo))
			has := false
			for i, mt := range metrics {
				s, ok := agg[Key{sc, r.link, r.cs, v, mt.Key}]
				has = has || ok
				cells = append(cells, fmtSummary(s, ok))
				if i == 0 {
					for _, b := range ratioTo {
						cells = append(cells, ratioCell(agg, Key{sc, r.link, r.cs, v, mt.Key}, Key{sc, r.link, r.cs, b, mt.Key}))
					}
				}
			}
			if has {
				w.printf("| %s | %s | %s | %s |\n", r.link, r.cs, v, strings.Join(cells, " | "))
			}
		}
	}
}

// ratioCell is the ratio of the medians of a and b, or "–".
func ratioCell(agg map[Key]Summary, a, b Key) string {
	x, ok1 := agg[a]
	y, ok2 := agg[b]
	if !ok1 || !ok2 || y.Median == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", x.Median/y.Median)
}

// directVariants are the direct TCP variants of a run (bulk ratio columns).
func directVariants(variants []string) []string {
	var out []string
	for _, v := range variants {
		if v == "direct" || strings.HasPrefix(v, "direct-") {
			out = append(out, v)
		}
	}
	return out
}

// writeFloodTables writes one table per variant for the flood scenario:
// the flood achieved, the latency and its ratio to the quiet baseline, and
// the server's state.
func writeFloodTables(w *errWriter, res *Results, rows []row, agg map[Key]Summary) {
	cell := func(k Key) string {
		s, ok := agg[k]
		return fmtSummary(s, ok)
	}
	// yes counts the samples in which a 0/1 metric is 1.
	yes := func(k Key) string {
		n, of := 0, 0
		for _, s := range res.Samples {
			if s.Scenario != k.Scenario || s.Link != k.Link || s.Case != k.Case || s.Variant != k.Variant {
				continue
			}
			if v, ok := s.Metrics[k.Metric]; ok {
				of++
				if v == 1 {
					n++
				}
			}
		}
		if of == 0 {
			return "–"
		}
		return fmt.Sprintf("%d/%d", n, of)
	}
	for _, v := range res.Variants {
		has := false
		for _, r := range rows {
			_, ok := agg[Key{ScFlood, r.link, r.cs, v, "p50_ms"}]
			has = has || ok
		}
		if !has {
			continue
		}
		w.printf("%s, latency:\n\n| link | flood | datagrams/s (Mbit/s) | p50 ms | p99 ms | total ms | p50 ×quiet | p99 ×quiet | total ×quiet |\n", v)
		w.printf("|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rows {
			k := func(m string) Key { return Key{ScFlood, r.link, r.cs, v, m} }
			pps := cell(k("flood_pps"))
			if s, ok := agg[k("flood_mbit_per_s")]; ok {
				pps += " (" + fmtNum(s.Median) + ")"
			}
			w.printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.link, r.cs, pps,
				cell(k("p50_ms")), cell(k("p99_ms")), cell(k("total_ms")), cell(k("p50_ratio")), cell(k("p99_ratio")), cell(k("total_ratio")))
		}
		w.printf("\n%s, server:\n\n| link | flood | replies/s | server CPU %% | flood CPU %% | socket drops | refused | server up | /healthz ok | tunnel kept |\n", v)
		w.printf("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range rows {
			k := func(m string) Key { return Key{ScFlood, r.link, r.cs, v, m} }
			w.printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.link, r.cs, cell(k("reply_pps")),
				cell(k("server_cpu_pct")), cell(k("flood_cpu_pct")), cell(k("socket_drops")), cell(k("refused_connections")),
				yes(k("server_alive")), yes(k("healthz_ok")), yes(k("tunnel_survived")))
		}
		w.printf("\n")
	}
}

// fmtNum prints 3-4 significant digits.
func fmtNum(v float64) string {
	a := math.Abs(v)
	switch {
	case v == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func fmtSummary(s Summary, ok bool) string {
	if !ok {
		return "–"
	}
	cell := fmtMedian(s)
	if s.N > 1 {
		cell += fmt.Sprintf(" (%s–%s)", fmtNum(s.Min), fmtNum(s.Max))
	}
	if s.N > 0 && s.Never > 0 {
		cell += fmt.Sprintf(", never ×%d", s.Never)
	} else if s.Never > 1 {
		cell += fmt.Sprintf(" ×%d", s.Never)
	}
	if s.Errors > 0 {
		cell += fmt.Sprintf(" ⚠%d", s.Errors)
	}
	return cell
}

// fmtMedian is the median of s, or "never" when every repetition's event
// did not happen (neverMetrics).
func fmtMedian(s Summary) string {
	if s.N == 0 && s.Never > 0 {
		return "never"
	}
	return fmtNum(s.Median)
}

type row struct{ link, cs string }

// rowsOf lists the (link, case) rows of a scenario in first-seen order.
func rowsOf(samples []Sample, sc string) []row {
	var out []row
	seen := map[row]bool{}
	for _, s := range samples {
		if s.Scenario != sc {
			continue
		}
		r := row{s.Link, s.Case}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

// WriteReport writes report.md and the charts into dir.
func WriteReport(dir string, res *Results) error {
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return fmt.Errorf("create report: %w", err)
	}
	defer f.Close()
	agg := Aggregate(res.Samples)
	w := &errWriter{w: f}
	m := res.Machine
	w.printf("# quictun benchmark report (%s profile)\n\n", res.Profile)
	w.printf("Run %s to %s UTC. Figures are measurements, not pass/fail criteria.\n\n",
		res.Started.Format("2006-01-02 15:04:05"), res.Finished.Format("15:04:05"))
	w.printf("## Machine and tools\n\n| | |\n|---|---|\n")
	w.printf("| host | %s |\n| kernel | %s |\n| CPU | %s × %d |\n| memory | %s |\n| load at start | %s |\n| harness Go | %s |\n",
		m.Hostname, m.Kernel, m.CPUModel, m.CPUs, m.MemTotal, m.Load, m.GoVersion)
	if m.TCPCongestion != "" {
		w.printf("| TCP congestion control (namespaces; direct TCP and the tunnels' loopback legs) | %s |\n", m.TCPCongestion)
	}
	tools := make([]string, 0, len(res.Tools))
	for k := range res.Tools {
		tools = append(tools, k)
	}
	sort.Strings(tools)
	for _, k := range tools {
		w.printf("| %s | %s |\n", k, res.Tools[k])
	}
	writeRuntimeRows(w, res.Runtime)
	w.printf("\n## Method\n\n")
	w.printf("- Two network namespaces (client host 198.18.0.1, server host 198.18.0.2) joined by TUN devices and the userspace link emulator `tools/linkem` running inside the harness; the same delay, loss and rate apply to each direction, except where a link lists `c2s-` (client to server, up) or `s2c-` (server to client, down) parameters.\n")
	w.printf("- Variants: %s. `direct` connects to the echo server across the link; tunnels listen on the client host's loopback and reach the echo server on the server host's loopback. All variants run on the same link in the same run, interleaved (the first variant rotates).\n", strings.Join(res.Variants, ", "))
	w.printf("- Workload: `bin/latency-client` (probe, bulk, connrate) in the client namespace against `latency-client serve` in the server namespace (quictun-reverse: the other way round, see the latency section).\n")
	w.printf("- Repetitions: %d (blackout cases may use fewer). Cells: median (min–max) over the repetitions; ⚠N = N repetitions reported an error (see the errors section).\n", res.Reps)
	w.printf("- Raw data: `results.json` (every sample with latency-client's JSON); process logs under `raw/` (not committed).\n\n")

	w.printf("### Links\n\n| link | parameters (each direction) |\n|---|---|\n")
	for _, l := range res.Links {
		if l.Name == "check" || strings.HasPrefix(l.Name, "check ") {
			continue
		}
		keys := make([]string, 0, len(l.Params))
		for k := range l.Params {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var ps []string
		for _, k := range keys {
			ps = append(ps, k+"="+l.Params[k])
		}
		w.printf("| %s | %s |\n", l.Name, strings.Join(ps, " "))
	}
	if len(res.Checks) > 0 {
		w.printf("\n## Link validation (emulator accuracy)\n\n| check | configured | measured |\n|---|---|---|\n")
		for _, c := range res.Checks {
			w.printf("| %s | %s | %s |\n", c.Name, c.Configured, c.Measured)
		}
	}
	info := Scenarios()
	for _, sc := range AllScenarios() {
		rows := rowsOf(res.Samples, sc)
		if len(rows) == 0 {
			continue
		}
		si := info[sc]
		w.printf("\n## %s\n\n%s\n\n", si.Title, si.What)
		switch sc {
		case ScFlood:
			writeFloodTables(w, res, rows, agg)
		case ScBulk:
			writeRowTable(w, sc, si, rows, res.Variants, agg, directVariants(res.Variants))
		case ScLoss:
			writeLossTables(w, res, rows, agg)
		case ScFair, ScBlackoutBulk, ScSTNBlackout:
			writeRowTable(w, sc, si, rows, res.Variants, agg, nil)
		case ScRateCap:
			writeRowTable(w, sc, si, rows, scenarioVariants(res.Samples, sc), agg, nil)
		case ScResume:
			writeResumeTables(w, rows, res.Variants, agg)
		case ScSTNShort, ScSTNSizes:
			writeRowTable(w, sc, si, rows, res.Variants, agg, directVariants(res.Variants))
		default:
			writeScenarioTable(w, sc, si, rows, res.Variants, agg)
		}
		var charts []string
		var err error
		if sc == ScLoss {
			charts, err = writeLossCharts(dir, res, rows)
		} else if sc == ScRateCap {
			charts, err = writeCharts(dir, sc, si, rows, scenarioVariants(res.Samples, sc), agg)
		} else {
			charts, err = writeCharts(dir, sc, si, rows, res.Variants, agg)
		}
		if sc == ScFair && err == nil {
			charts, err = fairTimelineLinks(w, dir, res, charts)
		}
		if err != nil {
			w.printf("\n(chart failed: %v)\n", err)
		}
		for _, c := range charts {
			w.printf("\n![%s](%s)\n", c, c)
		}
	}
	var errs []string
	for _, s := range res.Samples {
		if s.Error != "" {
			errs = append(errs, fmt.Sprintf("- %s / %s / %s / %s / rep %d: %s", s.Scenario, s.Link, s.Case, s.Variant, s.Rep, oneLine(s.Error)))
		}
	}
	if len(errs) > 0 || len(res.Notes) > 0 {
		w.printf("\n## Errors and notes\n\n")
		for _, n := range res.Notes {
			w.printf("- %s\n", n)
		}
		for _, e := range errs {
			w.printf("%s\n", e)
		}
	}
	w.printf("\n## Reproduce\n\n```\nmake build && go run ./tools/bench run --profile %s\ngo run ./tools/bench compare OLD_DIR NEW_DIR\n```\n", res.Profile)
	return w.err
}

// scenarioVariants are the variants of sc's samples, in the order first
// seen: the rate-cap scenario runs daemons of its own, not the run's
// variants.
func scenarioVariants(samples []Sample, sc string) []string {
	var out []string
	for _, s := range samples {
		if s.Scenario == sc && !slices.Contains(out, s.Variant) {
			out = append(out, s.Variant)
		}
	}
	return out
}

// writeRuntimeRows adds the daemons' environment and CPU placement to the
// machine table of the report's header.
func writeRuntimeRows(w *errWriter, rt *RuntimeInfo) {
	if rt == nil {
		return
	}
	w.printf("| daemons' Go runtime environment (every variant, inherited from the harness) | %s |\n", rt.Inherited)
	if rt.Tuned != "" {
		w.printf("| tuned variants (`--runtime-env`, named `…-env(…)`; not the headline) | %s added |\n", rt.Tuned)
	}
	w.printf("| CPU pinning | %s |\n", rt.Pinning)
}

// writeScenarioTable writes the generic table of a scenario: one row per
// (link, case, metric), one column per variant.
func writeScenarioTable(w *errWriter, sc string, si ScenarioInfo, rows []row, variants []string, agg map[Key]Summary) {
	w.printf("| link | case | metric |")
	for _, v := range variants {
		w.printf(" %s |", v)
	}
	w.printf("\n|---|---|---|%s\n", strings.Repeat("---|", len(variants)))
	for _, r := range rows {
		for _, mt := range si.Metrics {
			has := false
			cells := make([]string, 0, len(variants))
			for _, v := range variants {
				s, ok := agg[Key{sc, r.link, r.cs, v, mt.Key}]
				has = has || ok
				cells = append(cells, fmtSummary(s, ok))
			}
			if !has {
				continue
			}
			w.printf("| %s | %s | %s | %s |\n", r.link, r.cs, mt.Label, strings.Join(cells, " | "))
		}
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, a ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, a...)
	}
}

// writeCharts draws one grouped bar chart of the scenario's first metric
// per link family (the first word of the link name: LAN, WAN).
func writeCharts(dir, sc string, si ScenarioInfo, rows []row, variants []string, agg map[Key]Summary) ([]string, error) {
	keys := si.Charts
	if len(keys) == 0 {
		keys = []string{si.Metrics[0].Key}
	}
	var out []string
	for _, k := range keys {
		for _, mt := range si.Metrics {
			if mt.Key != k {
				continue
			}
			c, err := writeMetricCharts(dir, sc, si, mt, rows, variants, agg)
			out = append(out, c...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// rowHas tells whether any of variants has metric key in row r of sc.
func rowHas(agg map[Key]Summary, sc string, r row, key string, variants []string) bool {
	for _, v := range variants {
		if _, ok := agg[Key{sc, r.link, r.cs, v, key}]; ok {
			return true
		}
	}
	return false
}

func writeMetricCharts(dir, sc string, si ScenarioInfo, mt Metric, rows []row, variants []string, agg map[Key]Summary) ([]string, error) {
	families := map[string][]row{}
	var order []string
	for _, r := range rows {
		if !rowHas(agg, sc, r, mt.Key, variants) {
			continue // a case without this metric (another case's column)
		}
		fam := strings.SplitN(r.link, " ", 2)[0]
		if _, ok := families[fam]; !ok {
			order = append(order, fam)
		}
		families[fam] = append(families[fam], r)
	}
	var out []string
	for _, fam := range order {
		rs := families[fam]
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s: %s (%s)", si.Title, mt.Label, fam)
		p.Y.Label.Text = mt.Label
		labels := make([]string, len(rs))
		for i, r := range rs {
			l := strings.TrimSpace(strings.TrimPrefix(r.link, fam))
			if len(rs) > 1 && r.cs != "" && (sc != ScLatency) {
				l = strings.TrimSpace(l + " " + r.cs)
			}
			labels[i] = l
		}
		w := vg.Points(math.Max(4, math.Min(20, 300/float64(len(rs)*max(1, len(variants))))))
		drawn := 0
		top := 0.0
		for vi, v := range variants {
			vals := make(plotter.Values, len(rs))
			for i, r := range rs {
				if s, ok := agg[Key{sc, r.link, r.cs, v, mt.Key}]; ok {
					vals[i] = s.Median
					top = math.Max(top, s.Median)
					drawn++
				}
			}
			bars, err := plotter.NewBarChart(vals, w)
			if err != nil {
				return out, fmt.Errorf("bar chart: %w", err)
			}
			bars.LineStyle.Width = 0
			bars.Color = plotutil.Color(vi)
			bars.Offset = w * vg.Length(float64(vi)-float64(len(variants)-1)/2)
			p.Add(bars)
			p.Legend.Add(v, bars)
		}
		if drawn == 0 {
			continue
		}
		p.Legend.Top = true
		p.Y.Min = 0
		p.Y.Max = math.Max(top*1.3, 1e-9) // room for the legend
		p.NominalX(labels...)
		if len(labels) > 4 {
			p.X.Tick.Label.Rotation = math.Pi / 6
			p.X.Tick.Label.XAlign = -0.9
		}
		p.Add(plotter.NewGrid())
		p.BackgroundColor = color.White
		name := fmt.Sprintf("%s-%s-%s.png", sc, strings.ToLower(fam), strings.ReplaceAll(mt.Key, "_", "-"))
		if err := p.Save(9*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, name)); err != nil {
			return out, fmt.Errorf("save chart: %w", err)
		}
		out = append(out, name)
	}
	return out, nil
}

// Compare writes a table of NEW/OLD ratios of the medians present in both
// runs: the metrics shown in the report, or every metric when all is set.
func Compare(w io.Writer, oldRes, newRes *Results, all bool) error {
	a, b := Aggregate(oldRes.Samples), Aggregate(newRes.Samples)
	info := Scenarios()
	higher := map[string]bool{}
	for _, si := range info {
		for _, m := range si.Metrics {
			higher[m.Key] = m.Higher
		}
	}
	shown := map[string]bool{}
	for sc, si := range info {
		for _, m := range si.Metrics {
			shown[sc+"/"+m.Key] = true
		}
	}
	keys := make([]Key, 0, len(b))
	for k := range b {
		if _, ok := a[k]; ok && (all || shown[k.Scenario+"/"+k.Metric]) {
			keys = append(keys, k)
		}
	}
	scOrder := AllScenarios()
	sort.Slice(keys, func(i, j int) bool {
		ki, kj := keys[i], keys[j]
		if ki.Scenario != kj.Scenario {
			return slices.Index(scOrder, ki.Scenario) < slices.Index(scOrder, kj.Scenario)
		}
		if ki.Link != kj.Link || ki.Case != kj.Case {
			return ki.Link+ki.Case < kj.Link+kj.Case
		}
		if ki.Metric != kj.Metric {
			return ki.Metric < kj.Metric
		}
		return ki.Variant < kj.Variant
	})
	ew := &errWriter{w: w}
	ew.printf("Comparing OLD %s (%s) with NEW %s (%s). Ratio = NEW/OLD median; ↑ better / ↓ worse where the direction is known.\n\n",
		oldRes.Started.Format("2006-01-02T15:04Z"), oldRes.Profile, newRes.Started.Format("2006-01-02T15:04Z"), newRes.Profile)
	ew.printf("| scenario | link | case | variant | metric | old | new | new/old |\n|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		o, n := a[k], b[k]
		ratio := "–"
		if o.Median != 0 && o.N > 0 && n.N > 0 {
			r := n.Median / o.Median
			ratio = fmt.Sprintf("%.3f", r)
			if h, ok := higher[k.Metric]; ok && math.Abs(r-1) > 0.05 {
				if (r > 1) == h {
					ratio += " ↑"
				} else {
					ratio += " ↓"
				}
			}
		}
		ew.printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", k.Scenario, k.Link, k.Case, k.Variant, k.Metric, fmtMedian(o), fmtMedian(n), ratio)
	}
	if len(keys) == 0 {
		ew.printf("(no metric is present in both runs)\n")
	}
	return ew.err
}
