package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/linkem/emu"
	"github.com/quictun/quictun/tools/linkem/netns"
)

// Scenarios about congestion control: fairness against TCP Cubic and a
// blackout under load; the CPU and drop columns of every bulk result.

// usageSnap is what the harness reads before and after a bulk transfer to
// tell a saturated emulator or core from a protocol limit.
type usageSnap struct {
	At time.Time
	// Process is the harness process's CPU time: the in-process emulator,
	// the sink readers (subtracted with their own thread times) and idle
	// bookkeeping.
	Process        float64
	Client, Server float64           // tunnel processes' CPU time
	Drops          map[string]uint64 // emulator drops by cause, both directions
	TxPackets      uint64            // packets the emulator delivered, both directions
	WriteErrors    uint64
	// Late and LatenessNS: packets that left the emulator's delay line
	// late, and the sum of every packet's lateness (emu.LateThreshold).
	Late, LatenessNS uint64
	// TUNDrops: packets the kernel dropped at the namespaces' TUN devices
	// because the emulator did not read them in time (tx dropped of lem0).
	TUNDrops uint64
}

// usage reads the counters; cp and sp are the tunnel's client-side and
// server-side processes.
func (r *Runner) usage(cp, sp []int) usageSnap {
	u := usageSnap{At: time.Now(), Process: processCPU(), Client: cpuOf(cp), Server: cpuOf(sp), Drops: map[string]uint64{}}
	if r.ctl != nil {
		for _, l := range r.ctl.Links {
			st := l.Stats(u.At)
			for k, v := range st.Dropped {
				u.Drops[k] += v
			}
			u.TxPackets += st.TxPackets
			u.WriteErrors += st.WriteErrors
			u.Late += st.LatePackets
			u.LatenessNS += st.LatenessNS
		}
	}
	for _, ns := range []string{r.env.ClientNS, r.env.ServerNS} {
		if ns == "" {
			continue
		}
		if n, err := tunTxDropped(ns); err == nil {
			u.TUNDrops += n
		} else {
			klog.V(1).InfoS("Could not read the TUN drop counter", "ns", ns, "err", err)
		}
	}
	return u
}

// tunTxDropped reads the tx dropped counter of the link device in ns.
func tunTxDropped(ns string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "-n", ns, "-s", "-j", "link", "show", "dev", netns.DevName).Output()
	if err != nil {
		return 0, fmt.Errorf("ip -n %s -s -j link show dev %s: %w", ns, netns.DevName, err)
	}
	return parseTxDropped(out)
}

// parseTxDropped reads stats64.tx.dropped from `ip -s -j link show dev D`.
func parseTxDropped(out []byte) (uint64, error) {
	var links []struct {
		Stats64 *struct {
			Tx struct {
				Dropped uint64 `json:"dropped"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return 0, fmt.Errorf("decode ip -j output: %w", err)
	}
	if len(links) != 1 || links[0].Stats64 == nil {
		return 0, fmt.Errorf("ip -j output: want one link with stats64, got %q", out)
	}
	return links[0].Stats64.Tx.Dropped, nil
}

// usageMetrics turns two snapshots into sample metrics: CPU in % of one
// core over the interval (emu_cpu_pct = the harness process less the CPU
// of the threads that read the downloads, readerCPU), and emulator drop
// counts: queue (tail drop at the rate limiter, plus delay-line overflow)
// and loss (the configured random loss). tunnel tells whether the
// variant has tunnel processes.
func usageMetrics(a, b usageSnap, readerCPU float64, tunnel bool) map[string]float64 {
	m := map[string]float64{}
	el := b.At.Sub(a.At).Seconds()
	if el <= 0 {
		return m
	}
	pct := func(cpu float64) float64 { return cpu / el * 100 }
	proc := b.Process - a.Process
	m["harness_cpu_pct"] = pct(proc)
	m["reader_cpu_pct"] = pct(readerCPU)
	m["emu_cpu_pct"] = pct(max(proc-readerCPU, 0))
	if tunnel {
		m["cpu_client_pct"] = pct(b.Client - a.Client)
		m["cpu_server_pct"] = pct(b.Server - a.Server)
	}
	delta := func(causes ...string) float64 {
		var d float64
		for _, c := range causes {
			d += float64(b.Drops[c]) - float64(a.Drops[c])
		}
		return d
	}
	m["emu_queue_drops"] = delta(emu.CauseQueue.String(), emu.CauseOverflow.String())
	m["emu_loss_drops"] = delta(emu.CauseLoss.String(), emu.CauseGE.String())
	m["emu_write_errors"] = float64(b.WriteErrors) - float64(a.WriteErrors)
	m["emu_pps"] = (float64(b.TxPackets) - float64(a.TxPackets)) / el
	// Packets that left the delay line: delivered, failed to write, or
	// dropped there by a blackout.
	popped := float64(b.TxPackets) - float64(a.TxPackets) + m["emu_write_errors"] + delta(emu.CauseBlackout.String())
	if popped > 0 {
		m["emu_late_pct"] = (float64(b.Late) - float64(a.Late)) / popped * 100
		m["emu_mean_late_us"] = (float64(b.LatenessNS) - float64(a.LatenessNS)) / popped / 1e3
	}
	m["emu_tun_drops"] = float64(b.TUNDrops) - float64(a.TUNDrops)
	return m
}

// linkRateMbit is the rate of a link spec in Mbit/s (0: unlimited or unknown).
func linkRateMbit(l LinkSpec) float64 {
	v, err := emu.ParseRate(l.Params["rate"])
	if err != nil || v <= 0 {
		return 0
	}
	return float64(v) / 1e6
}

// jain is Jain's fairness index of the rates: 1 = equal shares, 1/n = one
// flow has everything.
func jain(x ...float64) float64 {
	var sum, sq float64
	for _, v := range x {
		sum += v
		sq += v * v
	}
	if sq == 0 {
		return 0
	}
	return sum * sum / (float64(len(x)) * sq)
}

// fairnessMetrics are the shares of a flow through the variant (mine) and
// of the competing direct TCP flow (against), in Mbit/s, on a link of
// rate Mbit/s (0: shares of their sum).
func fairnessMetrics(mine, against, rate float64) map[string]float64 {
	total := mine + against
	m := map[string]float64{
		"mbit_per_s": mine, "against_mbit_per_s": against, "total_mbit_per_s": total, "jain": jain(mine, against),
	}
	of := rate
	if of <= 0 {
		of = total
	}
	if of > 0 {
		m["share_pct"] = mine / of * 100
		m["against_share_pct"] = against / of * 100
	}
	return m
}

// steadyWindow is the part of two downloads' common time that follows the
// warm-up: from warm after the later start to the earlier end. ok is false
// when nothing is left.
func steadyWindow(a, b []flowPoint, warm time.Duration) (from, to time.Time, ok bool) {
	if len(a) == 0 || len(b) == 0 {
		return from, to, false
	}
	from = a[0].T
	if b[0].T.After(from) {
		from = b[0].T
	}
	from = from.Add(warm)
	to = a[len(a)-1].T
	if b[len(b)-1].T.Before(to) {
		to = b[len(b)-1].T
	}
	return from, to, to.After(from)
}

// fairness runs, for each variant, a download through it and one over
// direct TCP with the profile's FairAgainst congestion control (the
// server side's, set by route: Env.CCServerIP) on the same link, started
// together or, with FairDelay, the direct one that much later.
func (r *Runner) fairness(ctx context.Context) error {
	p := r.prof
	ip, err := r.env.CCServerIP(ctx, p.FairAgainst)
	if err != nil {
		r.res.Notes = append(r.res.Notes, fmt.Sprintf("fairness skipped: no direct TCP %s flow: %v", p.FairAgainst, err))
		klog.InfoS("Skipped the fairness scenario", "err", err)
		return nil
	}
	against := net.JoinHostPort(ip, strconv.Itoa(SinkPort))
	r.sweep(ctx, p.FairLinks, 1, func(link LinkSpec, _, rep int, v Variant) {
		if variantSelected(v.Name(), p.FairVariants) {
			r.fairOne(ctx, link, v, rep, against)
		}
	})
	return nil
}

// fairCase is the fairness scenario's case: against whom, and when the
// competing flow started.
func fairCase(against string, delay time.Duration) string {
	cs := "vs direct TCP " + against
	if delay > 0 {
		cs += ", after " + delay.String() + " alone"
	}
	return cs
}

// fairBinWidth is the width of a bin of the fairness timeline.
const fairBinWidth = 250 * time.Millisecond

// fairRaw is the raw record of a fairness sample: both downloads and
// their goodput per BinSeconds from the variant's flow's request (the
// competing flow's bins before AgainstStartS are 0).
type fairRaw struct {
	Flow          BulkDownload `json:"flow"`
	Against       BulkDownload `json:"against"`
	BinSeconds    float64      `json:"bin_s,omitempty"`
	AgainstStartS float64      `json:"against_start_s,omitempty"`
	FlowBins      []float64    `json:"flow_bins_mbit_per_s,omitempty"`
	AgainstBins   []float64    `json:"against_bins_mbit_per_s,omitempty"`
}

// fairTimeline fills the timeline of raw from both flows' arrivals.
func fairTimeline(raw *fairRaw, a, b []flowPoint) {
	if len(a) == 0 {
		return
	}
	origin, last := a[0].T, a[len(a)-1].T
	if len(b) > 0 {
		raw.AgainstStartS = max(b[0].T.Sub(origin), 0).Seconds()
		if b[len(b)-1].T.After(last) {
			last = b[len(b)-1].T
		}
	}
	raw.BinSeconds = fairBinWidth.Seconds()
	raw.FlowBins = rateBins(a, origin, last.Sub(origin), fairBinWidth)
	raw.AgainstBins = rateBins(b, origin, last.Sub(origin), fairBinWidth)
}

// fairDownloads runs the two downloads, the competing one delay after the
// variant's, which runs delay longer.
func (r *Runner) fairDownloads(ctx context.Context, v Variant, against string, delay time.Duration, myProg, otherProg *progress) (mine, other BulkDownload) {
	p := r.prof
	var wg sync.WaitGroup
	wg.Go(func() { mine = bulkDownload(ctx, r.env.ClientNS, v.Sink(), 1, delay+p.FairDuration, myProg) })
	wg.Go(func() {
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		other = bulkDownload(ctx, r.env.ClientNS, against, 1, p.FairDuration, otherProg)
	})
	wg.Wait()
	return mine, other
}

func (r *Runner) fairOne(ctx context.Context, link LinkSpec, v Variant, rep int, against string) {
	p := r.prof
	s := Sample{Scenario: ScFair, Link: link.Name, Case: fairCase(p.FairAgainst, p.FairDelay), Variant: v.Name(), Rep: rep, Started: time.Now().UTC()}
	cp, sp := v.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)
	var myProg, otherProg progress
	mine, other := r.fairDownloads(ctx, v, against, p.FairDelay, &myProg, &otherProg)
	u1 := r.usage(cp, sp)
	a, b := myProg.points(), otherProg.points()
	raw := fairRaw{Flow: mine, Against: other}
	fairTimeline(&raw, a, b)
	s.Raw, _ = json.Marshal(raw)
	// The shares are those after the warm-up: who leaves slow start first
	// decides the first seconds, and Cubic's cycle at this RTT is seconds
	// long, so whole-run averages of short runs rank luck, not controllers.
	rate := linkRateMbit(link)
	whole := fairnessMetrics(mine.MbitPerS, other.MbitPerS, rate)
	s.Metrics = whole
	if from, to, ok := steadyWindow(a, b, p.FairWarmup); ok {
		s.Metrics = fairnessMetrics(rateBetween(a, from, to), rateBetween(b, from, to), rate)
		s.Metrics["steady_s"] = to.Sub(from).Seconds()
	}
	if p.FairDelay > 0 {
		// The variant's whole run includes its time alone: no whole-run
		// shares, the yield figures instead.
		if len(b) > 0 {
			_, end, _ := steadyWindow(a, b, 0)
			maps.Copy(s.Metrics, yieldMetrics(a, b[0].T, end))
		}
	} else {
		for _, k := range []string{"share_pct", "against_share_pct"} {
			if v, ok := whole[k]; ok {
				s.Metrics["whole_"+k] = v
			}
		}
	}
	maps.Copy(s.Metrics, usageMetrics(u0, u1, mine.ReaderCPU+other.ReaderCPU, len(cp)+len(sp) > 0))
	var errs []error
	for _, b := range []struct {
		name string
		d    BulkDownload
	}{{v.Name(), mine}, {"direct TCP " + p.FairAgainst, other}} {
		for _, st := range b.d.Streams {
			if st.Error != "" {
				errs = append(errs, fmt.Errorf("%s flow: %s", b.name, st.Error))
			}
		}
	}
	s.Error = errString(errors.Join(errs...))
	r.record(s)
}

// muxEchoer is a tunnel that can carry an echo connection over the same
// tunnel connection as its sink (quictun: the sink client's File token
// source maps a local source address to the echo server).
type muxEchoer interface {
	MuxEcho() (addr, from string)
}

// serviceReconnecter counts a given service client's reconnections.
type serviceReconnecter interface {
	ServiceReconnects(ctx context.Context, env *Env, service string) float64
}

// bulkDrainLimit bounds the wait for the end of a download after its stop.
const bulkDrainLimit = 5 * time.Second

// flowingBytes is how much must arrive after a blackout for the bulk
// download to count as flowing again.
const flowingBytes = 1 << 20

// blackoutBulk cuts the link while a download and an interactive echo run
// through the same tunnel connection, on links with background loss.
func (r *Runner) blackoutBulk(ctx context.Context) error {
	p := r.prof
	r.sweep(ctx, p.BlackoutBulkLinks, len(p.BlackoutBulkDurations), func(link LinkSpec, cs, rep int, v Variant) {
		if variantSelected(v.Name(), p.BlackoutBulkVariants) {
			r.blackoutBulkOne(ctx, link, v, rep, p.BlackoutBulkDurations[cs])
		}
	})
	return nil
}

// bbTimes are the instants of a blackout-with-bulk sample.
type bbTimes struct {
	warmStart, cut, end time.Time
}

// blackoutBulkMetrics computes the recovery metrics from the download's
// arrivals and the echo's completion (zero: it did not complete).
func blackoutBulkMetrics(pts []flowPoint, t bbTimes, echoDone time.Time) map[string]float64 {
	m := map[string]float64{"echo_ok": 0}
	if !echoDone.IsZero() {
		m["echo_ok"] = 1
		m["echo_after_s"] = max(echoDone.Sub(t.end), 0).Seconds()
	}
	half := t.warmStart.Add(t.cut.Sub(t.warmStart) / 2)
	m["bulk_before_mbit_per_s"] = rateBetween(pts, half, t.cut)
	if d, ok := flowAfter(pts, t.end, 1); ok {
		m["bulk_first_byte_after_s"] = d.Seconds()
	}
	if d, ok := flowAfter(pts, t.end, flowingBytes); ok {
		m["bulk_flowing_after_s"] = d.Seconds()
		from := t.end.Add(d)
		if len(pts) > 0 && pts[len(pts)-1].T.Sub(from) >= 500*time.Millisecond {
			m["bulk_after_mbit_per_s"] = rateBetween(pts, from, pts[len(pts)-1].T)
		}
	}
	return m
}

func (r *Runner) blackoutBulkOne(ctx context.Context, link LinkSpec, v Variant, rep int, d time.Duration) {
	p := r.prof
	ns := r.env.ClientNS
	s := Sample{Scenario: ScBlackoutBulk, Link: link.Name, Case: "blackout " + d.String(), Variant: v.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	echoAddr, from := v.Echo(), ""
	if m, ok := v.(muxEchoer); ok {
		echoAddr, from = m.MuxEcho()
	}
	// Healthy before: the previous case may have left the tunnel recovering.
	if err := waitEchoFrom(ctx, ns, from, echoAddr, recoveryLimit); err != nil {
		s.Error = "not healthy before the blackout: " + err.Error()
		return
	}
	ec, err := dialFrom(ctx, ns, from, echoAddr)
	if err != nil {
		s.Error = err.Error()
		return
	}
	defer ec.Close()
	defer context.AfterFunc(ctx, func() { _ = ec.Close() })()
	buf := make([]byte, 1000)
	_ = ec.SetDeadline(time.Now().Add(10 * time.Second))
	if err := roundTrip(ec, buf); err != nil {
		s.Error = "warm-up round trip: " + err.Error()
		return
	}
	rec0 := r.sinkReconnects(ctx, v)
	cp, sp := v.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)

	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	bc, err := dialIn(dctx, ns, v.Sink())
	cancel()
	if err != nil {
		s.Error = "bulk: " + err.Error()
		return
	}
	defer bc.Close()
	defer context.AfterFunc(ctx, func() { _ = bc.Close() })()
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopBulk := func() { stopOnce.Do(func() { close(stop) }) }
	defer stopBulk()
	prog := &progress{}
	bulkDone := make(chan BulkStream, 1)
	t := bbTimes{warmStart: time.Now()}
	go func() {
		bulkDone <- download(bc, stop, 0, p.BlackoutBulkWarmup+d+p.BlackoutBulkRecovery+time.Minute, prog)
	}()
	var bulk BulkStream
	bulkEnded := false
	select {
	case <-ctx.Done():
	case bulk = <-bulkDone:
		bulkEnded = true
	case <-time.After(p.BlackoutBulkWarmup):
	}
	if bulkEnded || ctx.Err() != nil {
		s.Error = "bulk ended before the blackout: " + bulk.Error
		return
	}

	t.cut = time.Now()
	t.end = t.cut.Add(d)
	for _, l := range r.ctl.Links {
		l.Blackout(t.cut, d)
	}
	var echoDone time.Time
	var echoErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = ec.SetDeadline(t.end.Add(p.BlackoutBulkRecovery))
		if echoErr = roundTrip(ec, buf); echoErr == nil {
			echoDone = time.Now()
		}
	})
	echoFinished := make(chan struct{})
	go func() { wg.Wait(); close(echoFinished) }()

	// Wait until the echo is back and the download flows again, or the
	// recovery limit.
	deadline := t.end.Add(p.BlackoutBulkRecovery)
	var base int64 = -1
	var recovered time.Time
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-ctx.Done():
			break wait
		case bulk = <-bulkDone:
			bulkEnded = true
			break wait
		case <-tick.C:
		}
		now := time.Now()
		if now.After(deadline) {
			break
		}
		if now.Before(t.end) {
			continue
		}
		if base < 0 {
			base = prog.last()
		}
		select {
		case <-echoFinished:
		default:
			continue
		}
		if prog.last()-base < flowingBytes {
			continue
		}
		if recovered.IsZero() {
			recovered = now
		}
		// One more second: the rate once flowing again.
		if now.Sub(recovered) >= time.Second {
			break
		}
	}
	// The download survived if it was still running when the harness
	// stopped it. Its end (count and CRC-32C) is awaited for a while only:
	// on a slow lossy link the data already buffered along the path can
	// take longer to drain than is worth waiting for.
	survived := !bulkEnded && ctx.Err() == nil
	stopBulk()
	drained := true
	if !bulkEnded {
		select {
		case bulk = <-bulkDone:
		case <-time.After(bulkDrainLimit):
			drained = false
			_ = bc.Close()
			bulk = <-bulkDone
		}
	}
	_ = ec.Close() // ends an echo still waiting
	<-echoFinished
	u1 := r.usage(cp, sp)

	maps.Copy(s.Metrics, blackoutBulkMetrics(prog.points(), t, echoDone))
	maps.Copy(s.Metrics, usageMetrics(u0, u1, bulk.ReaderCPU, len(cp)+len(sp) > 0))
	s.Metrics["bulk_survived"], s.Metrics["bulk_verified"] = 0, 0
	if survived && (bulk.Error == "" || !drained) {
		s.Metrics["bulk_survived"] = 1
	}
	if bulk.Error == "" {
		s.Metrics["bulk_verified"] = 1
	}
	if rec0 >= 0 {
		if rec1 := r.sinkReconnects(ctx, v); rec1 >= 0 {
			s.Metrics["reconnects"] = rec1 - rec0
			s.Metrics["tunnel_survived"] = 0
			if rec1 == rec0 {
				s.Metrics["tunnel_survived"] = 1
			}
		}
	}
	var errs []error
	switch {
	case echoErr != nil && errors.Is(echoErr, os.ErrDeadlineExceeded):
		errs = append(errs, fmt.Errorf("echo: not answered within %v after the link returned", p.BlackoutBulkRecovery))
	case echoErr != nil:
		errs = append(errs, fmt.Errorf("echo: %w", echoErr))
	}
	if bulk.Error != "" && drained {
		errs = append(errs, fmt.Errorf("bulk: %s", bulk.Error))
	}
	if _, ok := s.Metrics["bulk_flowing_after_s"]; !ok && (bulk.Error == "" || !drained) {
		errs = append(errs, fmt.Errorf("bulk: less than %d bytes within %v after the link returned", flowingBytes, p.BlackoutBulkRecovery))
	}
	s.Error = errString(errors.Join(errs...))
	s.Raw, _ = json.Marshal(map[string]any{"bulk": bulk, "drained": drained, "cut": t.cut.UTC(), "end": t.end.UTC()})
}
