package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// rsLoad is a set of pingPongers through one client listener.
type rsLoad struct {
	ps   []*pingPonger
	stop chan struct{}
	wg   sync.WaitGroup
}

// startRSLoad dials n tunnels through addr in ns and starts a pingPonger
// on each; ioLimit bounds a round trip.
func startRSLoad(ctx context.Context, ns, addr string, s ResumeSpec, n int, ioLimit time.Duration) (*rsLoad, error) {
	l := &rsLoad{stop: make(chan struct{})}
	seed := uint64(time.Now().UnixNano())
	for i := range n {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		c, err := dialIn(dctx, ns, addr)
		cancel()
		if err != nil {
			l.end()
			return nil, fmt.Errorf("tunnel %d of %d: %w", i+1, n, err)
		}
		l.ps = append(l.ps, newPingPonger(c, s.Size, s.PauseMin, s.PauseMax, ioLimit, seed+uint64(i)))
	}
	for _, p := range l.ps {
		l.wg.Go(func() { p.run(l.stop) })
	}
	return l, nil
}

// end stops the load (rounds in flight complete), waits for it and closes
// the connections; idempotent.
func (l *rsLoad) end() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	for _, p := range l.ps {
		_ = p.c.Close()
	}
}

// waitMoving waits until every tunnel completed a round, none failing.
func (l *rsLoad) waitMoving(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		idle, failed := 0, 0
		for _, p := range l.ps {
			if p.failed.Load() {
				failed++
			} else if p.done.Load() == 0 {
				idle++
			}
		}
		switch {
		case failed > 0:
			return fmt.Errorf("%d of %d tunnels failed before the event", failed, len(l.ps))
		case idle == 0:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%d of %d tunnels without a round trip within %v", idle, len(l.ps), limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// verify counts the tunnels that failed (reset or stalled past their
// deadline) and those whose bytes did not all come back unchanged, and
// sums the bytes sent, into m; it returns the first failure.
func (l *rsLoad) verify(m map[string]float64) error {
	var reset, bad int
	var sent int64
	var first error
	for _, p := range l.ps {
		sent += p.sent
		if p.err != nil {
			reset++
			if first == nil {
				first = p.err
			}
		}
		if !p.verified() {
			bad++
		}
	}
	m["tunnels"] = float64(len(l.ps))
	m["tunnels_reset"] = float64(reset)
	m["tunnels_unverified"] = float64(bad)
	m["bytes_each_way"] = float64(sent)
	m["verified"] = 0
	if bad == 0 {
		m["verified"] = 1
	}
	if first == nil && bad > 0 {
		first = fmt.Errorf("%d tunnel(s) got back other bytes than they sent", bad)
	}
	return first
}

// stallMetrics adds the round-trip figures around mark to m; rtt is the
// link's round-trip time (the target is rtt + 100 ms).
func stallMetrics(st rsStats, rtt time.Duration, m map[string]float64) {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	m["rounds"] = float64(st.rounds)
	m["longest_before_ms"] = ms(st.longestBefore)
	m["stall_ms"] = ms(st.stall)
	m["rtt_p50_ms"], m["rtt_p99_ms"], m["rtt_p99_after_ms"] = ms(st.p50), ms(st.p99), ms(st.p99After)
	if rtt > 0 {
		m["stall_rtts"] = float64(st.stall) / float64(rtt)
		m["target_ms"] = ms(rtt + 100*time.Millisecond)
		m["stall_ok"] = 0
		if st.roundsAfter > 0 && st.stall <= rtt+100*time.Millisecond {
			m["stall_ok"] = 1
		}
	}
}

// resumeUpgradeOne runs one upgrade sample: Tunnels tunnels under load
// through fresh daemons, SIGUSR2 to the server or the client after the
// warm-up, the load going on for After.
func (r *Runner) resumeUpgradeOne(ctx context.Context, q *quictun, rep int, cs string) {
	sp := r.prof.Resume
	s := Sample{Scenario: ScResume, Link: sp.Link.Name, Case: resumeCaseLabel(sp, cs), Variant: q.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	setup, err := r.startResume(ctx, q, nil)
	if err != nil {
		s.Error = "start: " + err.Error()
		return
	}
	defer setup.stop()
	load, err := startRSLoad(ctx, r.env.ClientNS, setup.local, sp, sp.Tunnels, upgradeLimit)
	if err != nil {
		s.Error = "load: " + err.Error()
		return
	}
	defer load.end()
	if err := load.waitMoving(ctx, 30*time.Second); err != nil {
		s.Error = "load: " + err.Error()
		return
	}
	cpids, spids := []int{setup.client.PID()}, []int{setup.server.PID()}
	u0 := r.usage(cpids, spids)
	sleepCtx(ctx, sp.Warmup)
	u1 := r.usage(cpids, spids)
	// The load before the signal: CPU and emulator columns, round trips.
	maps.Copy(s.Metrics, usageMetrics(u0, u1, 0, true))
	el := u1.At.Sub(u0.At).Seconds()
	n := roundsBetween(load.ps, u0.At, u1.At)
	s.Metrics["load_round_trips_per_s"] = float64(n) / el
	s.Metrics["load_mbit_per_s_each_way"] = float64(n) * float64(sp.Size) * 8 / el / 1e6

	side, p, log, admin := "server", setup.server, setup.serverLog, setup.serverAdmin
	ns := r.env.ServerNS
	if cs == ResumeClientUpgrade {
		side, p, log, admin, ns = "client", setup.client, setup.clientLog, setup.clientAdmin, r.env.ClientNS
	}
	mark := time.Now()
	pid, exit, uerr := upgrade(ctx, p, log, side)
	if pid != 0 {
		setup.adopted = append(setup.adopted, pid)
	}
	s.Metrics["old_exit_ms"] = float64(exit) / 1e6
	sleepCtx(ctx, time.Until(mark.Add(sp.After)))
	load.end()
	lerr := load.verify(s.Metrics)
	stallMetrics(roundStats(load.ps, mark), 2*linkDelay(sp.Link), s.Metrics)
	resumeCounters(ctx, r.env.ServerNS, setup.serverAdmin, "server", s.Metrics)
	resumeCounters(ctx, r.env.ClientNS, setup.clientAdmin, "client", s.Metrics)
	if v, err := scrapeCounter(ctx, ns, "http://"+admin+"/metrics", `quictun_`+side+`_upgrades_total{result="success"}`); err == nil {
		s.Metrics["upgraded"] = v
	}
	s.Error = errString(errors.Join(uerr, lerr))
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// resumeSurviveOne runs one blackout or address-change sample: an
// interactive session and a transfer each way through fresh daemons; after
// the warm-up the link is cut or the client's address changes; measured:
// from the link's return (the change) to the session's next answer and to
// the transfer flowing again (1 MiB more), and that both survived intact.
func (r *Runner) resumeSurviveOne(ctx context.Context, q *quictun, rep int, cs string) {
	sp := r.prof.Resume
	s := Sample{Scenario: ScResume, Link: sp.TransferLink.Name, Case: resumeCaseLabel(sp, cs), Variant: q.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	var extra []string
	if cs == ResumeBlackout && sp.IdleTimeout > 0 {
		extra = []string{"--idle-timeout", sp.IdleTimeout.String()}
	}
	setup, err := r.startResume(ctx, q, extra)
	if err != nil {
		s.Error = "start: " + err.Error()
		return
	}
	defer setup.stop()
	ns := r.env.ClientNS
	limit := sp.Blackout + sp.Recovery + sp.TransferLimit
	session, err := startRSLoad(ctx, ns, setup.local, sp, 1, limit)
	if err != nil {
		s.Error = "session: " + err.Error()
		return
	}
	defer session.end()
	taddr := setup.local
	if sp.TransferDown {
		taddr = setup.sink
	}
	tx, err := startTransfer(ctx, ns, taddr, sp)
	if err != nil {
		s.Error = "transfer: " + err.Error()
		return
	}
	defer tx.abort()
	tr := tx.tr
	if err := session.waitMoving(ctx, 30*time.Second); err != nil {
		s.Error = "session: " + err.Error()
		return
	}
	deltas := clientDeltas(ctx, ns, setup.clientAdmin)
	cpids, spids := []int{setup.client.PID()}, []int{setup.server.PID()}
	u0 := r.usage(cpids, spids)
	sleepCtx(ctx, sp.TransferWarmup)
	cut := time.Now()
	s.Metrics["transfer_before_mbit_per_s"] = rateBetween(tr.prog.points(), cut.Add(-sp.TransferWarmup/2), cut)
	end, eerr := r.resumeEvent(ctx, cs, cut, setup, s.Metrics)
	if cs == ResumeAddrChange {
		defer r.restoreClientAddr(ctx)
	}
	if eerr != nil {
		s.Error = eerr.Error()
		return
	}
	recovered := r.awaitRecovery(ctx, session, tr, end, sp.Recovery)
	if !recovered {
		_ = tx.c.Close() // stuck: do not wait for its deadline
	}
	tx.stop(ctx)
	session.end()
	u1 := r.usage(cpids, spids)
	maps.Copy(s.Metrics, usageMetrics(u0, u1, 0, true))
	serr := surviveMetrics(session, tr, end, s.Metrics)
	if !recovered && ctx.Err() == nil {
		serr = errors.Join(fmt.Errorf("session and transfer not both moving within %v after the link returned: the harness closed the transfer", sp.Recovery), serr)
	}
	s.Error = errString(serr)
	deltas(s.Metrics)
	resumeCounters(ctx, r.env.ServerNS, setup.serverAdmin, "server", s.Metrics)
	resumeCounters(ctx, ns, setup.clientAdmin, "client", s.Metrics)
	s.Raw, _ = json.Marshal(map[string]any{"cut": cut.UTC(), "end": end.UTC(), "transfer_s": tr.end.Sub(tr.start).Seconds(),
		"sent": tr.sent, "got": tr.got})
}

// rsTransferRun is a transfer running on its own goroutine.
type rsTransferRun struct {
	tr   *echoTransfer
	c    net.Conn
	done chan struct{}
}

// startTransfer dials addr in ns and starts the spec's transfer on it.
func startTransfer(ctx context.Context, ns, addr string, sp ResumeSpec) (*rsTransferRun, error) {
	c, err := dialIn(ctx, ns, addr)
	if err != nil {
		return nil, err
	}
	x := &rsTransferRun{tr: &echoTransfer{n: sp.Transfer, seed: uint64(time.Now().UnixNano()), down: sp.TransferDown},
		c: c, done: make(chan struct{})}
	go func() { defer close(x.done); x.tr.run(c, sp.TransferLimit) }()
	return x, nil
}

// stop waits for the transfer's end (its deadline bounds it), or closes
// its connection once ctx is done; the transfer's fields are read after.
func (x *rsTransferRun) stop(ctx context.Context) {
	select {
	case <-x.done:
	case <-ctx.Done():
		_ = x.c.Close()
		<-x.done
	}
}

// abort ends the transfer at once and waits for it (idempotent).
func (x *rsTransferRun) abort() {
	_ = x.c.Close()
	<-x.done
}

// clientDeltas reads the client's reconnect and path-switch counters now;
// the function returned adds their change since to m.
func clientDeltas(ctx context.Context, ns, admin string) func(m map[string]float64) {
	names := map[string]string{"reconnects": "quictun_client_reconnects_total", "path_switches": "quictun_client_path_switches_total"}
	before := map[string]float64{}
	for k, n := range names {
		before[k] = scrapeOr(ctx, ns, admin, n)
	}
	return func(m map[string]float64) {
		for k, n := range names {
			if v := scrapeOr(ctx, ns, admin, n); v >= 0 && before[k] >= 0 {
				m[k] = v - before[k]
			}
		}
	}
}

// resumeEvent cuts the link from cut for the blackout, moves the client's
// address, or upgrades setup's server (its old process's exit in m), and
// returns when the link is back (the change or the upgrade done).
func (r *Runner) resumeEvent(ctx context.Context, cs string, cut time.Time, setup *rsSetup, m map[string]float64) (time.Time, error) {
	if cs == ResumeUpgradeTransfer {
		pid, exit, err := upgrade(ctx, setup.server, setup.serverLog, "server")
		if pid != 0 {
			setup.adopted = append(setup.adopted, pid)
		}
		m["old_exit_ms"] = float64(exit) / 1e6
		return time.Now(), err
	}
	if cs == ResumeAddrChange {
		err := ipCommands(ctx, addrMoveCommands(r.env.ClientNS, r.env.ServerNS, netns.ClientIP, rsNewClientIP, r.env.ServerIP))
		if err != nil {
			return time.Now(), fmt.Errorf("change the client's address: %w", err)
		}
		return time.Now(), nil
	}
	d := r.prof.Resume.Blackout
	for _, l := range r.ctl.Links {
		l.Blackout(cut, d)
	}
	end := cut.Add(d)
	sleepCtx(ctx, time.Until(end))
	return end, nil
}

// awaitRecovery waits until the session answered after end and the
// transfer got flowingBytes more (or all it was due), and tells whether
// that happened within limit from end; a failed session ends the wait.
func (r *Runner) awaitRecovery(ctx context.Context, session *rsLoad, tr *echoTransfer, end time.Time, limit time.Duration) bool {
	p := session.ps[0]
	for from := p.done.Load(); time.Since(end) < limit && ctx.Err() == nil && !p.failed.Load(); {
		_, flowing := flowAfter(tr.prog.points(), end, flowingBytes)
		if (flowing || tr.prog.last() >= tr.n) && p.done.Load() > from {
			return true
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	return false
}

// surviveMetrics adds the recovery figures and the verification of the
// session and the transfer to m, and returns what failed.
func surviveMetrics(session *rsLoad, tr *echoTransfer, end time.Time, m map[string]float64) error {
	lerr := session.verify(m)
	st := roundStats(session.ps, end)
	if !st.firstAfter.IsZero() {
		m["session_after_s"] = st.firstAfter.Sub(end).Seconds()
	}
	m["session_longest_s"] = st.stall.Seconds()
	pts := tr.prog.points()
	if d, ok := flowAfter(pts, end, 1); ok {
		m["transfer_first_byte_after_s"] = d.Seconds()
	}
	if d, ok := flowAfter(pts, end, flowingBytes); ok {
		m["transfer_flowing_after_s"] = d.Seconds()
	}
	m["transfer_bytes_each_way"] = float64(tr.got)
	m["transfer_verified"] = 0
	if tr.verified() {
		m["transfer_verified"] = 1
	}
	if s := tr.end.Sub(tr.start).Seconds(); s > 0 {
		m["transfer_mbit_per_s"] = float64(tr.got) * 8 / s / 1e6
	}
	var terr error
	switch {
	case tr.err != nil:
		terr = fmt.Errorf("transfer (%d B sent, %d B back of %d): %w", tr.sent, tr.got, tr.n, tr.err)
		m["tunnels_reset"]++
	case !tr.verified():
		terr = fmt.Errorf("transfer: %d B sent, %d B back, SHA-256 differs", tr.sent, tr.got)
	}
	if lerr != nil {
		lerr = fmt.Errorf("session: %w", lerr)
	}
	if _, ok := m["session_after_s"]; !ok && lerr == nil {
		lerr = errors.New("session: no answer after the link returned")
	}
	return errors.Join(lerr, terr)
}

// scrapeOr reads a counter from the admin listener at admin, -1 on error.
func scrapeOr(ctx context.Context, ns, admin, name string) float64 {
	v, err := scrapeCounter(ctx, ns, "http://"+admin+"/metrics", name)
	if err != nil {
		return -1
	}
	return v
}
