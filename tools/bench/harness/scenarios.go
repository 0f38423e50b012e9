package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/quictun/quictun/internal/procstat"

	"k8s.io/klog/v2"
)

// validate measures the emulated link against its configuration.
func (r *Runner) validate(ctx context.Context) {
	cns, sns, ip := r.env.ClientNS, r.env.ServerNS, r.env.ServerIP
	add := func(c Check) {
		r.res.Checks = append(r.res.Checks, c)
		klog.InfoS("Validated link", "check", c.Name, "configured", c.Configured, "measured", c.Measured)
	}
	fail := func(name string, err error) {
		add(Check{Name: name, Measured: "error: " + err.Error()})
	}
	for _, l := range []struct {
		name, delay string
		want        float64
		n           int
	}{{"RTT LAN", LANDelay, 0.5, 500}, {"RTT WAN", WANDelay, 25, 50}} {
		r.setLink(ctx, LinkOf("check", l.delay, 0, ""))
		rtts, err := tcpPingPong(ctx, cns, sns, ip, l.n, 1000)
		if err != nil {
			fail(l.name, err)
			continue
		}
		m := float64(medianOf(rtts)) / 1e6
		add(Check{Name: l.name, Configured: l.delay + " one-way (RTT " + strconv.FormatFloat(l.want, 'g', -1, 64) + " ms)",
			Measured: fmt.Sprintf("median TCP RTT %.3f ms over %d round trips of 1000 B", m, l.n), Value: m, Expected: l.want, Unit: "ms"})
	}
	for _, loss := range []float64{0.01, 0.02} {
		r.setLink(ctx, LinkOf("check", "1ms", loss, ""))
		const n = 5000
		got, err := udpLoss(ctx, cns, sns, ip, n, 50*time.Microsecond)
		name := "loss " + pct(loss)
		if err != nil {
			fail(name, err)
			continue
		}
		add(Check{Name: name, Configured: pct(loss) + " each way", Measured: fmt.Sprintf("%.2f%% of %d UDP datagrams (one way)", got*100, n),
			Value: got * 100, Expected: loss * 100, Unit: "%"})
	}
	r.setLink(ctx, LinkOf("check", WANDelay, 0, "100mbit"))
	if bps, err := tcpBulk(ctx, cns, sns, ip, 4*time.Second); err != nil {
		fail("rate 100mbit", err)
	} else {
		add(Check{Name: "rate 100mbit", Configured: "100 Mbit/s, 12.5 ms one-way", Measured: fmt.Sprintf("TCP goodput %.1f Mbit/s over 4 s (payload; headers ~3.5%%)", bps/1e6),
			Value: bps / 1e6, Expected: 100, Unit: "Mbit/s"})
	}
	r.setLink(ctx, LinkOf("check", "0s", 0, ""))
	if bps, err := tcpBulk(ctx, cns, sns, ip, 4*time.Second); err != nil {
		fail("ceiling", err)
	} else {
		add(Check{Name: "ceiling", Configured: "no delay, loss or rate limit", Measured: fmt.Sprintf("TCP bulk %.0f Mbit/s over 4 s through the emulator", bps/1e6),
			Value: bps / 1e6, Unit: "Mbit/s"})
	}
}

func (r *Runner) scenario(ctx context.Context, name string) error {
	r.cur = name
	switch name {
	case ScLatency:
		return r.latency(ctx)
	case ScBulk:
		return r.bulk(ctx)
	case ScEcho:
		return r.echoTPS(ctx)
	case ScReqSize:
		return r.reqSize(ctx)
	case ScConnrate:
		return r.connrate(ctx)
	case ScBlackout:
		return r.blackout(ctx)
	case ScScale:
		return r.scale(ctx)
	case ScFlood:
		return r.flood(ctx)
	case ScCold:
		return r.coldstart(ctx)
	case ScAfterIdle:
		return r.afterIdle(ctx)
	case ScFair:
		return r.fairness(ctx)
	case ScLoss:
		return r.lossBulk(ctx)
	case ScRateCap:
		return r.rateCap(ctx)
	case ScBlackoutBulk:
		return r.blackoutBulk(ctx)
	case ScSTNShort:
		return r.stnShort(ctx)
	case ScSTNSizes:
		return r.stnSizes(ctx)
	case ScSTNBlackout:
		return r.stnBlackout(ctx)
	case ScFailover:
		return r.failover(ctx)
	case ScUDPBlocked:
		return r.udpBlocked(ctx)
	case ScResume:
		return r.resume(ctx)
	default:
		return fmt.Errorf("unknown scenario %q", name)
	}
}

func (r *Runner) record(s Sample) {
	if s.Error != "" {
		klog.InfoS("Sample had an error", "scenario", s.Scenario, "link", s.Link, "case", s.Case, "variant", s.Variant, "err", s.Error)
	} else {
		klog.V(1).InfoS("Recorded sample", "scenario", s.Scenario, "link", s.Link, "case", s.Case, "variant", s.Variant, "metrics", s.Metrics)
	}
	r.res.Samples = append(r.res.Samples, s)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// probe runs one latency-client probe and records it.
func (r *Runner) probe(ctx context.Context, sc string, link LinkSpec, cs string, v Variant, rep int,
	size, number, conns int, timeout time.Duration, extra func(m map[string]float64)) {
	host, port, _ := net.SplitHostPort(v.Echo())
	s := Sample{Scenario: sc, Link: link.Name, Case: cs, Variant: v.Name(), Rep: rep, Started: time.Now().UTC()}
	var p ProbeResult
	args := []string{"--server-host", host, "--server-port", port,
		"--size", strconv.Itoa(size), "--number", strconv.Itoa(number), "--connections", strconv.Itoa(conns),
		"--timeout", timeout.String()}
	if pv, ok := v.(interface{ ProbeArgs() []string }); ok {
		args = append(args, pv.ProbeArgs()...)
	}
	raw, runErr, err := r.latencyClientIn(ctx, probeNS(v, &r.env), timeout, &p, args...)
	if err != nil {
		s.Error = err.Error()
		r.record(s)
		return
	}
	s.Raw = compactRaw(raw)
	s.Metrics = ProbeMetrics(p)
	s.Error = ProbeError(p)
	if s.Error == "" && runErr != nil {
		s.Error = runErr.Error()
	}
	if extra != nil {
		extra(s.Metrics)
	}
	r.record(s)
}

// compactRaw drops per-connection detail from large probe outputs.
func compactRaw(raw json.RawMessage) json.RawMessage {
	if len(raw) < 8<<10 {
		return raw
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	delete(m, "per_connection")
	b, _ := json.Marshal(m)
	return b
}

func (r *Runner) latency(ctx context.Context) error {
	p := r.prof
	for li, link := range p.LatencyLinks {
		r.setLink(ctx, link)
		for rep := range p.Reps {
			for _, v := range r.ordered(li + rep) {
				if ctx.Err() != nil {
					return nil
				}
				r.probe(ctx, ScLatency, link, fmt.Sprintf("%d x %d B", p.LatencyNumber, p.LatencySize), v, rep,
					p.LatencySize, p.LatencyNumber, 1, 5*time.Minute, firstEchoRTTs(link))
			}
		}
	}
	return nil
}

// firstEchoRTTs adds first_echo_rtts: connect to first echo in round
// trips of the link (2 x its one-way delay), when the link has a delay.
func firstEchoRTTs(link LinkSpec) func(map[string]float64) {
	rtt := 2 * linkDelay(link)
	return func(m map[string]float64) {
		if fe, ok := m["first_echo_ms"]; ok && rtt > 0 {
			m["first_echo_rtts"] = fe * 1e6 / float64(rtt)
		}
	}
}

func (r *Runner) bulk(ctx context.Context) error {
	p := r.prof
	r.sweep(ctx, p.BulkLinks, len(p.BulkParallel), func(link LinkSpec, cs, rep int, v Variant) {
		r.bulkOne(ctx, ScBulk, link, v, rep, p.BulkParallel[cs])
	})
	return nil
}

// cpuSince takes the CPU time of the variant's echo endpoints and of the
// emulator now and returns a probe's extra, which adds their use since then
// (client, server and emulator CPU %) to the sample: throughput beside the
// CPU that bought it, so a saturated process is not read as a protocol limit.
// The harness runs only the emulator while latency-client (its own process)
// does the work, so the harness's CPU is the emulator's.
func (r *Runner) cpuSince(v Variant) func(map[string]float64) {
	cp, sp := v.EndpointPIDs("echo")
	u0 := r.usage(cp, sp)
	return func(m map[string]float64) {
		maps.Copy(m, usageMetrics(u0, r.usage(cp, sp), 0, len(cp)+len(sp) > 0))
	}
}

func cpuOf(pids []int) float64 {
	var sum float64
	for _, pid := range pids {
		if c, err := procstat.CPUSeconds(pid); err == nil {
			sum += c
		}
	}
	return sum
}

// bulkOne records one bulk download of par streams through v as a sample
// of scenario sc, with the tunnel's CPU beside its rate.
func (r *Runner) bulkOne(ctx context.Context, sc string, link LinkSpec, v Variant, rep, par int) {
	s := Sample{Scenario: sc, Link: link.Name, Case: fmt.Sprintf("%d stream(s)", par), Variant: v.Name(), Rep: rep, Started: time.Now().UTC()}
	cp, sp := v.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)
	b := bulkDownload(ctx, r.env.ClientNS, v.Sink(), par, r.prof.BulkDuration, nil)
	u1 := r.usage(cp, sp)
	s.Raw, _ = json.Marshal(b)
	s.Metrics = map[string]float64{"mbit_per_s": b.MbitPerS, "bytes": float64(b.Bytes), "seconds": b.Seconds}
	maps.Copy(s.Metrics, usageMetrics(u0, u1, b.ReaderCPU, len(cp)+len(sp) > 0))
	if gb := float64(b.Bytes) / 1e9; gb > 0 && len(cp)+len(sp) > 0 {
		s.Metrics["cpu_client_s_per_gb"] = (u1.Client - u0.Client) / gb
		s.Metrics["cpu_server_s_per_gb"] = (u1.Server - u0.Server) / gb
	}
	if b.Errors > 0 {
		s.Error = fmt.Sprintf("bulk: %d of %d stream(s) failed", b.Errors, par)
		for _, st := range b.Streams {
			if st.Error != "" {
				s.Error += ": " + st.Error
				break
			}
		}
	}
	r.record(s)
}

func (r *Runner) echoTPS(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.EchoLink)
	for si, size := range p.EchoSizes {
		n, err := ParseSize(size)
		if err != nil {
			return err
		}
		for rep := range p.Reps {
			for _, v := range r.ordered(si + rep) {
				if ctx.Err() != nil {
					return nil
				}
				r.probe(ctx, ScEcho, p.EchoLink, fmt.Sprintf("%s x %d conns", size, p.EchoConns), v, rep,
					int(n), p.EchoNumber, p.EchoConns, 5*time.Minute, r.cpuSince(v))
			}
		}
	}
	return nil
}

func (r *Runner) reqSize(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.EchoLink)
	for si, size := range p.ReqSizes {
		n, err := ParseSize(size)
		if err != nil {
			return err
		}
		number := int(min(max(p.ReqBytesBudget/n, int64(p.ReqMinNumber)), int64(p.ReqMaxNumber)))
		for rep := range p.Reps {
			for _, v := range r.ordered(si + rep) {
				if ctx.Err() != nil {
					return nil
				}
				r.probe(ctx, ScReqSize, p.EchoLink, size, v, rep, int(n), number, 1, 5*time.Minute, r.cpuSince(v))
			}
		}
	}
	return nil
}

func (r *Runner) connrate(ctx context.Context) error {
	p := r.prof
	for li, link := range p.ConnrateLinks {
		r.setLink(ctx, link)
		for rep := range p.Reps {
			for _, v := range r.ordered(li + rep) {
				if ctx.Err() != nil {
					return nil
				}
				host, port, _ := net.SplitHostPort(v.Echo())
				s := Sample{Scenario: ScConnrate, Link: link.Name, Case: fmt.Sprintf("%d conns x 100 B, concurrency 8", p.ConnrateNumber),
					Variant: v.Name(), Rep: rep, Started: time.Now().UTC()}
				var c ConnrateResult
				raw, runErr, err := r.latencyClient(ctx, 5*time.Minute, &c, "connrate", "--server-host", host, "--server-port", port,
					"--number", strconv.Itoa(p.ConnrateNumber), "--size", "100", "--concurrency", "8", "--timeout", "4m")
				if err != nil {
					s.Error = err.Error()
					r.record(s)
					continue
				}
				s.Raw = raw
				s.Metrics = map[string]float64{
					"conns_per_s": c.ConnectionsPerS, "first_byte_p50_ms": c.FirstByte.P50MS, "first_byte_p99_ms": c.FirstByte.P99MS,
					"connect_p50_ms": c.Connect.P50MS, "transaction_p50_ms": c.Transaction.P50MS, "errors": float64(c.Errors),
				}
				if c.Errors > 0 {
					s.Error = fmt.Sprintf("%d connection(s) failed: %s", c.Errors, c.FirstError)
				} else if runErr != nil {
					s.Error = runErr.Error()
				}
				r.record(s)
			}
		}
	}
	return nil
}

// blackout cuts the link for d and measures, from the end of the cut: the
// completion of a request sent on an established connection just after the
// cut started, and the first new connection that completes a round trip.
func (r *Runner) blackout(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.BlackoutLink)
	i := 0
	for _, d := range p.Blackouts {
		for rep := range p.BlackoutReps {
			i++
			for _, v := range r.ordered(i) {
				if ctx.Err() != nil {
					return nil
				}
				r.blackoutOne(ctx, v, rep, d)
			}
		}
	}
	return nil
}

const recoveryLimit = 90 * time.Second

func (r *Runner) blackoutOne(ctx context.Context, v Variant, rep int, d time.Duration) {
	s := Sample{Scenario: ScBlackout, Link: r.prof.BlackoutLink.Name, Case: "blackout " + d.String(), Variant: v.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	// Healthy before: the previous case may have left the tunnel reconnecting.
	if err := waitEcho(ctx, r.env.ClientNS, v.Echo(), recoveryLimit); err != nil {
		s.Error = "not healthy before the blackout: " + err.Error()
		return
	}
	c, err := dialIn(ctx, r.env.ClientNS, v.Echo())
	if err != nil {
		s.Error = err.Error()
		return
	}
	defer c.Close()
	stopClose := context.AfterFunc(ctx, func() { _ = c.Close() }) // cancellation ends the wait
	defer stopClose()
	buf := make([]byte, 1000)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := roundTrip(c, buf); err != nil {
		s.Error = "warm-up round trip: " + err.Error()
		return
	}
	rec0 := v.Reconnects(ctx, &r.env)

	start := time.Now()
	end := start.Add(d)
	for _, l := range r.ctl.Links {
		l.Blackout(start, d)
	}
	var wg sync.WaitGroup
	var inflight, fresh time.Duration
	var inflightErr, freshErr error
	var attempts int
	wg.Go(func() {
		_ = c.SetDeadline(end.Add(recoveryLimit))
		if err := roundTrip(c, buf); err != nil {
			inflightErr = err
			return
		}
		inflight = time.Since(end)
	})
	wg.Go(func() {
		select {
		case <-ctx.Done():
			freshErr = ctx.Err()
			return
		case <-time.After(time.Until(end)):
		}
		limit := time.Now().Add(recoveryLimit)
		for time.Now().Before(limit) && ctx.Err() == nil {
			attempts++
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := echoOnce(actx, r.env.ClientNS, v.Echo(), 1000)
			cancel()
			if err == nil {
				fresh = time.Since(end)
				freshErr = nil
				return
			}
			freshErr = err
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	wg.Wait()
	if inflightErr == nil {
		s.Metrics["inflight_after_s"] = inflight.Seconds()
		s.Metrics["inflight_ok"] = 1
	} else {
		s.Metrics["inflight_ok"] = 0
	}
	if freshErr == nil {
		s.Metrics["newconn_after_s"] = fresh.Seconds()
	}
	s.Metrics["newconn_attempts"] = float64(attempts)
	if rec0 >= 0 {
		if rec1 := v.Reconnects(ctx, &r.env); rec1 >= 0 {
			s.Metrics["reconnects"] = rec1 - rec0
			if rec1 == rec0 {
				s.Metrics["tunnel_survived"] = 1
			} else {
				s.Metrics["tunnel_survived"] = 0
			}
		}
	}
	var errs []error
	if inflightErr != nil {
		errs = append(errs, fmt.Errorf("in-flight request: %w", inflightErr))
	}
	if freshErr != nil {
		errs = append(errs, fmt.Errorf("new connection: %w", freshErr))
	}
	s.Error = errString(errors.Join(errs...))
}

func (r *Runner) scale(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.ScaleLink)
	for rep := range p.Reps {
		for _, v := range r.ordered(rep) {
			if ctx.Err() != nil {
				return nil
			}
			cp, sp := v.EndpointPIDs("echo")
			if _, ok := v.(*direct); ok && r.echo != nil {
				sp = []int{r.echo.PID()}
			}
			sampler := sampleRSS(append(append([]int(nil), cp...), sp...), 200*time.Millisecond)
			defer sampler.Stop()
			r.probe(ctx, ScScale, p.ScaleLink, fmt.Sprintf("%d conns x %d x 1000 B", p.ScaleConns, p.ScaleNumber), v, rep,
				1000, p.ScaleNumber, p.ScaleConns, 5*time.Minute, func(m map[string]float64) {
					peak := sampler.Stop()
					sum := func(pids []int) float64 {
						var t int64
						for _, pid := range pids {
							t += peak[pid]
						}
						return float64(t) / (1 << 20)
					}
					if len(cp) > 0 {
						m["rss_client_mib"] = sum(cp)
					}
					if len(sp) > 0 {
						m["rss_server_mib"] = sum(sp)
					}
				})
		}
	}
	return nil
}
