package harness

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// Seed 000 (Mars STN benchmark): short connections made one at a time,
// each connect, one request, one response, close, as a mobile app's
// requests without keep-alive. The harness makes them itself, in the
// client namespace, over latency-client's sink protocol, which lets
// request and response sizes differ (the echo of `latency-client
// connrate` answers with the request's size), bounds every connection
// (a direct TCP connection at 50 % loss may never complete) and keeps
// every connection's time.

// shortTx is the shape of one short connection over the sink protocol:
// Up > 0 uploads Up bytes (request: 16 B header and Up bytes, then a
// half-close; response: the 12 B trailer); otherwise it downloads Down
// bytes (request: the 16 B header; response: Down bytes in frames of up
// to 64 KiB with a 4 B header each, an end frame and the trailer).
type shortTx struct {
	Up, Down int64
}

func (t shortTx) String() string {
	if t.Up > 0 {
		return "request " + fmtBytes(t.Up)
	}
	return "response " + fmtBytes(t.Down)
}

// fmtBytes writes n as the sizes of the profiles are written.
func fmtBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// shortConn makes one short connection to the sink at addr from namespace
// ns and returns the time from the start of the dial to the verified end
// of the response (the connection is then closed). The whole connection
// is bounded by timeout; beyond it, it fails.
func shortConn(ctx context.Context, ns, addr string, tx shortTx, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := func() error {
		c, err := dialIn(ctx, ns, addr)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		defer c.Close()
		defer context.AfterFunc(ctx, func() { _ = c.Close() })()
		_ = c.SetDeadline(start.Add(timeout))
		if tx.Up > 0 {
			return sinkUpload(c, tx.Up)
		}
		return sinkDownload(c, tx.Down)
	}()
	el := time.Since(start)
	if err != nil && (ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded)) {
		if cerr := context.Cause(ctx); cerr != nil && !errors.Is(cerr, context.DeadlineExceeded) {
			return el, cerr // the run was cancelled
		}
		return el, fmt.Errorf("not done within %v: %w", timeout, err)
	}
	return el, err
}

// sinkUpload sends n bytes with the sink protocol, half-closes and checks
// the server's trailer (count and CRC-32C).
func sinkUpload(c io.ReadWriter, n int64) error {
	chunk := make([]byte, min(n, sinkMaxFrame))
	for i := range chunk {
		chunk[i] = byte(i*131 + i>>8) // not a power-of-two period
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	if _, err := c.Write(sinkRequest(sinkUp, uint64(n))); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	for left := n; left > 0; {
		b := chunk[:min(left, int64(len(chunk)))]
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("write request: %w", err)
		}
		_, _ = h.Write(b)
		left -= int64(len(b))
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return errors.New("connection cannot half-close")
	}
	if err := cw.CloseWrite(); err != nil {
		return fmt.Errorf("half-close: %w", err)
	}
	tr := make([]byte, sinkTrailerSize)
	if _, err := io.ReadFull(c, tr); err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if cnt := binary.BigEndian.Uint64(tr); cnt != uint64(n) {
		return fmt.Errorf("server received %d bytes, client sent %d", cnt, n)
	}
	if crc := binary.BigEndian.Uint32(tr[8:]); crc != h.Sum32() {
		return fmt.Errorf("CRC-32C mismatch: server %08x, client %08x", crc, h.Sum32())
	}
	return nil
}

// sinkDownload asks for n bytes with the sink protocol and checks them.
func sinkDownload(c io.ReadWriter, n int64) error {
	if _, err := c.Write(sinkRequest(sinkDown, uint64(n))); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	got, err := readSinkDownload(bufio.NewReader(c), nil)
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if got != n {
		return fmt.Errorf("asked for %d bytes, received %d", n, got)
	}
	return nil
}

// nearestRank is the p-quantile (0 < p <= 1) of sorted by the
// nearest-rank method: always one of the values.
func nearestRank(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// shortStats summarises a run of short connections: the times of those
// that completed (mean, median, p90, max in seconds), how many failed,
// and the wall time of them all, failures included.
func shortStats(done []time.Duration, failed int, total time.Duration) map[string]float64 {
	m := map[string]float64{
		"connections": float64(len(done) + failed), "ok": float64(len(done)), "failures": float64(failed),
		"total_s": total.Seconds(),
	}
	if len(done) == 0 {
		return m
	}
	s := slices.Clone(done)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	m["mean_s"] = (sum / time.Duration(len(s))).Seconds()
	m["p50_s"] = nearestRank(s, 0.5).Seconds()
	m["p90_s"] = nearestRank(s, 0.9).Seconds()
	m["max_s"] = s[len(s)-1].Seconds()
	return m
}

// shortRaw is what results.json keeps of a run of short connections.
type shortRaw struct {
	Target string `json:"target"`
	// PerConnectionMS: every connection's time in order, failures
	// included (the time until they failed).
	PerConnectionMS []float64      `json:"per_connection_ms"`
	Failed          []int          `json:"failed,omitempty"` // indexes into PerConnectionMS
	Errors          map[string]int `json:"errors,omitempty"` // distinct messages (at most maxShortErrors), with counts
}

const maxShortErrors = 8

func (r *shortRaw) add(d time.Duration, err error) {
	r.PerConnectionMS = append(r.PerConnectionMS, float64(d.Microseconds())/1e3)
	if err == nil {
		return
	}
	r.Failed = append(r.Failed, len(r.PerConnectionMS)-1)
	if r.Errors == nil {
		r.Errors = map[string]int{}
	}
	msg := err.Error()
	if _, ok := r.Errors[msg]; ok || len(r.Errors) < maxShortErrors {
		r.Errors[msg]++
	}
}

// warmLimit bounds the wait for a tunnel to carry a connection before a
// sample.
const warmLimit = 90 * time.Second

// warm waits until a short connection through v's sink completes, so a
// tunnel sample starts with its QUIC connection up (a warm tunnel, as the
// headline's). Direct TCP needs nothing.
func (r *Runner) warm(ctx context.Context, v Variant, tx shortTx) error {
	if _, ok := v.(*direct); ok {
		return nil
	}
	limit := time.Now().Add(warmLimit)
	var last error
	for time.Now().Before(limit) && ctx.Err() == nil {
		if _, last = shortConn(ctx, r.env.ClientNS, v.Sink(), tx, 10*time.Second); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("no short connection through %s within %v: %w", v.Sink(), warmLimit, errors.Join(last, ctx.Err()))
}

// sinkReconnects counts the reconnections of v's sink client (-1: none).
func (r *Runner) sinkReconnects(ctx context.Context, v Variant) float64 {
	if sr, ok := v.(serviceReconnecter); ok {
		return sr.ServiceReconnects(ctx, &r.env, "sink")
	}
	return -1
}

// shortRun records one sample: n short connections of shape tx through v,
// one after the other.
func (r *Runner) shortRun(ctx context.Context, sc string, link LinkSpec, cs string, tx shortTx, n int, v Variant, rep int) {
	s := Sample{Scenario: sc, Link: link.Name, Case: cs, Variant: v.Name(), Rep: rep, Started: time.Now().UTC()}
	defer func() { r.record(s) }()
	if err := r.warm(ctx, v, shortTx{Down: 1}); err != nil {
		s.Error = "tunnel not warm: " + err.Error()
		return
	}
	rec0 := r.sinkReconnects(ctx, v)
	cp, sp := v.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)
	raw := shortRaw{Target: v.Sink()}
	var done []time.Duration
	var firstErr error
	start := time.Now()
	for range n {
		if ctx.Err() != nil {
			break
		}
		d, err := shortConn(ctx, r.env.ClientNS, v.Sink(), tx, r.prof.STNConnTimeout)
		if ctx.Err() != nil {
			break // cancelled: not a measurement
		}
		raw.add(d, err)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
		} else {
			done = append(done, d)
		}
	}
	total := time.Since(start)
	failed := len(raw.Failed)
	u1 := r.usage(cp, sp)
	s.Metrics = shortStats(done, failed, total)
	maps.Copy(s.Metrics, emuLoss(u0, u1))
	if rec0 >= 0 {
		if rec1 := r.sinkReconnects(ctx, v); rec1 >= 0 {
			s.Metrics["reconnects"] = rec1 - rec0
		}
	}
	s.Raw, _ = json.Marshal(raw)
	var errs []error
	if got := len(raw.PerConnectionMS); got < n {
		errs = append(errs, fmt.Errorf("run stopped after %d of %d connections", got, n))
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("%d of %d connection(s) failed, first: %w", failed, len(raw.PerConnectionMS), firstErr))
	}
	s.Error = errString(errors.Join(errs...))
}

// stnShort runs the short connections of each STN link.
func (r *Runner) stnShort(ctx context.Context) error {
	p := r.prof
	size, err := ParseSize(p.STNResponse)
	if err != nil {
		return fmt.Errorf("STNResponse: %w", err)
	}
	tx := shortTx{Down: size}
	links := make([]LinkSpec, len(p.STNLinks))
	number := map[string]int{}
	for i, l := range p.STNLinks {
		links[i] = l.Link
		number[l.Link.Name] = cmp.Or(l.Number, p.STNNumber)
	}
	r.sweep(ctx, links, 1, func(link LinkSpec, _, rep int, v Variant) {
		n := number[link.Name]
		r.shortRun(ctx, ScSTNShort, link, fmt.Sprintf("%d x 16 B / %s", n, fmtBytes(size)), tx, n, v, rep)
	})
	return nil
}

// stnShapes are the sweep's shapes: each request size, then each response
// size.
func stnShapes(req, resp []string) ([]shortTx, error) {
	var out []shortTx
	for _, s := range req {
		n, err := ParseSize(s)
		if err != nil {
			return nil, fmt.Errorf("request size: %w", err)
		}
		out = append(out, shortTx{Up: n})
	}
	for _, s := range resp {
		n, err := ParseSize(s)
		if err != nil {
			return nil, fmt.Errorf("response size: %w", err)
		}
		out = append(out, shortTx{Down: n})
	}
	return out, nil
}

// stnSizes runs the request- and response-size sweeps.
func (r *Runner) stnSizes(ctx context.Context) error {
	p := r.prof
	txs, err := stnShapes(p.STNRequestSizes, p.STNResponseSizes)
	if err != nil {
		return err
	}
	r.sweep(ctx, p.STNSweepLinks, len(txs), func(link LinkSpec, cs, rep int, v Variant) {
		r.shortRun(ctx, ScSTNSizes, link, fmt.Sprintf("%d x %s", p.STNSweepNumber, txs[cs]), txs[cs], p.STNSweepNumber, v, rep)
	})
	return nil
}

// stnBlackout starts, for every variant at the same time, a new short
// connection into a blackout of each duration, and records how long after
// the link returned each one completed.
func (r *Runner) stnBlackout(ctx context.Context) error {
	p := r.prof
	if len(p.STNBlackouts) == 0 {
		return nil
	}
	size, err := ParseSize(p.STNResponse)
	if err != nil {
		return fmt.Errorf("STNResponse: %w", err)
	}
	tx := shortTx{Down: size}
	if syn, err := synSettings(r.env.ClientNS); err == nil {
		r.res.Notes = append(r.res.Notes, "stn-blackout: direct TCP's SYN retransmissions in the client namespace: "+syn)
	}
	r.setLink(ctx, p.STNBlackoutLink)
	for _, d := range p.STNBlackouts {
		for rep := range p.Reps {
			if ctx.Err() != nil {
				return nil
			}
			r.stnBlackoutOne(ctx, tx, d, rep)
		}
	}
	return nil
}

// blackoutOutcome turns a connection started at start into a link that
// returned at end into metrics: whether it completed, and how long after
// end (never negative: it cannot complete in the dark, but the first
// packets may be delivered just as the link returns).
func blackoutOutcome(start, end time.Time, took time.Duration, err error) map[string]float64 {
	m := map[string]float64{"ok": 0, "took_s": took.Seconds()}
	if err == nil {
		m["ok"] = 1
		m["done_after_s"] = max(start.Add(took).Sub(end), 0).Seconds()
	}
	return m
}

func (r *Runner) stnBlackoutOne(ctx context.Context, tx shortTx, d time.Duration, rep int) {
	p := r.prof
	vars := r.ordered(rep)
	samples := make([]Sample, len(vars))
	rec0 := make([]float64, len(vars))
	for i, v := range vars {
		samples[i] = Sample{Scenario: ScSTNBlackout, Link: p.STNBlackoutLink.Name, Case: "blackout " + d.String(), Variant: v.Name(), Rep: rep,
			Started: time.Now().UTC(), Metrics: map[string]float64{}}
		if err := r.warm(ctx, v, shortTx{Down: 1}); err != nil {
			samples[i].Error = "tunnel not warm before the blackout: " + err.Error()
		}
		rec0[i] = r.sinkReconnects(ctx, v)
	}
	start := time.Now()
	end := start.Add(d)
	for _, l := range r.ctl.Links {
		l.Blackout(start, d)
	}
	var wg sync.WaitGroup
	for i, v := range vars {
		if samples[i].Error != "" {
			continue
		}
		wg.Go(func() {
			took, err := shortConn(ctx, r.env.ClientNS, v.Sink(), tx, p.STNBlackoutTimeout)
			samples[i].Metrics = blackoutOutcome(start, end, took, err)
			samples[i].Error = errString(err)
		})
	}
	wg.Wait()
	// Let the blackout end before the next case (a failed connection can
	// end before it).
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(end)):
	}
	for i, v := range vars {
		if rec0[i] < 0 || samples[i].Metrics == nil {
			continue
		}
		if rec1 := r.sinkReconnects(ctx, v); rec1 >= 0 {
			samples[i].Metrics["reconnects"] = rec1 - rec0[i]
			samples[i].Metrics["tunnel_survived"] = 0
			if rec1 == rec0[i] {
				samples[i].Metrics["tunnel_survived"] = 1
			}
		}
	}
	for _, s := range samples {
		r.record(s)
	}
}

// synSettings reads the sysctls that schedule SYN retransmissions in ns.
func synSettings(ns string) (string, error) {
	var parts []string
	err := netns.Do(ns, func() error {
		for _, name := range []string{"tcp_syn_retries", "tcp_syn_linear_timeouts"} {
			b, err := os.ReadFile("/proc/sys/net/ipv4/" + name)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue // older kernels have no linear timeouts
				}
				return err
			}
			parts = append(parts, "net.ipv4."+name+"="+strings.TrimSpace(string(b)))
		}
		return nil
	})
	return strings.Join(parts, ", "), err
}

// emuLoss is what the emulator dropped between two snapshots, both
// directions: emu_loss_pct, the random loss in % of the packets it
// received (checks the configured loss on the few packets of short
// connections), emu_queue_drops and emu_tun_drops (see usageMetrics).
func emuLoss(a, b usageSnap) map[string]float64 {
	m := usageMetrics(a, b, 0, false)
	out := map[string]float64{"emu_queue_drops": m["emu_queue_drops"], "emu_tun_drops": m["emu_tun_drops"]}
	var drops float64
	for c, n := range b.Drops {
		drops += float64(n) - float64(a.Drops[c])
	}
	if rx := float64(b.TxPackets) - float64(a.TxPackets) + m["emu_write_errors"] + drops; rx > 0 {
		out["emu_loss_pct"] = m["emu_loss_drops"] / rx * 100
	}
	return out
}
