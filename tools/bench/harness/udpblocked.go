package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// The UDP-blocked scenario: every UDP datagram between the two hosts is
// dropped, silently (as a middlebox does), from before the tunnel daemons
// start; TCP passes. quictun runs as users run it (--transport auto, the
// server's TCP listener on the address of --listen-on, both defaults), so
// its client falls back to TCP by itself. kcptun, UDP only, is left out;
// direct TCP is the reference.

// udpBlockedStartCase is the case of the client-start sample.
const udpBlockedStartCase = "client start, first 1000 B echo"

// udpProbeDatagrams is how many datagrams the block's check sends.
const udpProbeDatagrams = 50

// udpBlockCommands make namespace ns drop every UDP datagram arriving on
// its link device: a blackhole rule ahead of local delivery, whose rule
// moves from preference 0 (which nothing can precede) to 100, as e2e's
// blockUDP does. The harness's TUN device sees only the link's traffic.
func udpBlockCommands(ns string) [][]string {
	return [][]string{
		{"-n", ns, "rule", "add", "pref", "100", "lookup", "local"},
		{"-n", ns, "rule", "del", "pref", "0"},
		{"-n", ns, "rule", "add", "pref", "50", "iif", netns.DevName, "ipproto", "udp", "blackhole"},
	}
}

// udpUnblockCommands undo udpBlockCommands.
func udpUnblockCommands(ns string) [][]string {
	return [][]string{
		{"-n", ns, "rule", "del", "pref", "50"},
		{"-n", ns, "rule", "add", "pref", "0", "lookup", "local"},
		{"-n", ns, "rule", "del", "pref", "100"},
	}
}

// setUDPBlocked blocks (or unblocks) UDP in both namespaces.
func (r *Runner) setUDPBlocked(ctx context.Context, blocked bool) error {
	cmds := udpUnblockCommands
	if blocked {
		cmds = udpBlockCommands
	}
	var errs []error
	for _, ns := range []string{r.env.ClientNS, r.env.ServerNS} {
		errs = append(errs, ipCommands(ctx, cmds(ns)))
	}
	return errors.Join(errs...)
}

// udpBlocked runs the scenario: UDP blocked, the quictun variants
// restarted under the block, then per repetition and variant the echo
// client's start to its first echo (quictun), the latency workload and a
// bulk download; at the end UDP returns and the tunnel variants are
// restarted for the scenarios after it.
func (r *Runner) udpBlocked(ctx context.Context) error {
	p := r.prof
	link := p.UDPBlockedLink
	r.setLink(ctx, link)
	if err := r.setUDPBlocked(ctx, true); err != nil {
		return fmt.Errorf("block UDP: %w", err)
	}
	defer r.udpUnblock(ctx)
	r.checkUDPBlocked(ctx, true)
	// The probe's own Mbit/s would share the download's column.
	echoRTTs := firstEchoRTTs(link)
	rtts := func(m map[string]float64) { echoRTTs(m); delete(m, "mbit_per_s") }
	failed := map[string]error{}
	for _, v := range r.vars {
		if q, ok := v.(*quictun); ok {
			failed[q.Name()] = r.restart(ctx, q)
		}
	}
	for rep := range p.Reps {
		for _, v := range r.ordered(rep) {
			if ctx.Err() != nil {
				return nil
			}
			switch q := v.(type) {
			case *direct:
			case *quictun:
				if err := failed[q.Name()]; err != nil {
					r.record(Sample{Scenario: ScUDPBlocked, Link: link.Name, Case: udpBlockedStartCase, Variant: q.Name(), Rep: rep,
						Started: time.Now().UTC(), Error: "start with UDP blocked: " + err.Error()})
					continue
				}
				r.udpBlockedStart(ctx, link, q, rep)
			default:
				continue // kcptun is UDP only; SOCKS5 and reverse ride on quictun
			}
			r.probe(ctx, ScUDPBlocked, link, fmt.Sprintf("%d x %d B", p.LatencyNumber, p.LatencySize), v, rep,
				p.LatencySize, p.LatencyNumber, 1, 5*time.Minute, rtts)
			r.bulkOne(ctx, ScUDPBlocked, link, v, rep, 1)
		}
	}
	return nil
}

// udpUnblock lets UDP through again and restarts every tunnel variant
// (kcptun and a reverse tunnel sat through the block unmeasured), so the
// scenarios after this one find them fresh, quictun on QUIC; a failure is
// a note. A
// cancelled run skips it: no scenario follows, the teardown removes the
// namespaces with their rules.
func (r *Runner) udpUnblock(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	if err := r.setUDPBlocked(ctx, false); err != nil {
		r.res.Notes = append(r.res.Notes, "udp-blocked: unblock UDP: "+err.Error())
		return
	}
	r.checkUDPBlocked(ctx, false)
	for _, v := range r.vars {
		if err := r.restart(ctx, v); err != nil {
			r.res.Notes = append(r.res.Notes, fmt.Sprintf("udp-blocked: restart %s after UDP returned: %v", v.Name(), err))
		}
	}
}

// checkUDPBlocked sends UDP datagrams across the link and records, as a
// link check, how many were lost (the block holds: all of them; after it:
// none).
func (r *Runner) checkUDPBlocked(ctx context.Context, blocked bool) {
	c := Check{Name: "UDP blocked", Configured: "every UDP datagram between the hosts dropped, TCP passes", Expected: 100, Unit: "%"}
	if !blocked {
		c = Check{Name: "UDP back", Configured: "the udp-blocked scenario's block removed", Unit: "%"}
	}
	loss, err := udpLoss(ctx, r.env.ClientNS, r.env.ServerNS, r.env.ServerIP, udpProbeDatagrams, 0)
	if err != nil {
		c.Measured = "error: " + err.Error()
	} else {
		c.Value = loss * 100
		c.Measured = fmt.Sprintf("%.0f%% of %d UDP datagrams lost (one way)", c.Value, udpProbeDatagrams)
	}
	klog.InfoS("Validated link", "check", c.Name, "configured", c.Configured, "measured", c.Measured)
	r.res.Checks = append(r.res.Checks, c)
}

// udpBlockedStart restarts q's echo client (UDP blocked) and times its
// first echo: since_start_ms from the process's start, retrying
// connections the client could not carry yet (failed_attempts), and
// transport_tcp, the client's quictun_client_transport{transport="tcp"}
// after it (1: new tunnels go over TCP).
func (r *Runner) udpBlockedStart(ctx context.Context, link LinkSpec, q *quictun, rep int) {
	s := Sample{Scenario: ScUDPBlocked, Link: link.Name, Case: udpBlockedStartCase, Variant: q.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	if err := q.RestartClient(ctx, &r.env); err != nil {
		s.Error = "restart: " + err.Error()
		return
	}
	m, err := firstEcho(ctx, r.env.ClientNS, q.Echo(), time.Now(), 2*linkDelay(link), true)
	s.Metrics = m
	if err != nil {
		s.Error = err.Error()
		return
	}
	tcp, err := scrapeCounter(ctx, r.env.ClientNS, "http://"+q.local(qtEchoAdminPort)+"/metrics", `quictun_client_transport{transport="tcp"}`)
	if err != nil {
		s.Error = "transport: " + err.Error()
		return
	}
	s.Metrics["transport_tcp"] = tcp
}
