package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// The rate-cap scenario (issue 35): the server caps the client's identity
// with --rate-limit ID=DOWN/UP, and downloads, then uploads, run through
// the tunnel on a link much faster than the caps, once per congestion
// controller the client offers. The download cap is enforced in the
// server's sender and the upload cap by the server reading no faster than
// it, so none of the client's controllers should get past either. The
// figure is the server's own count of the identity's bytes (GET
// /identities/ID: the relays' live counters) over the window after the
// warm-up, against the cap.

// RateCapSpec sizes the rate-cap scenario.
type RateCapSpec struct {
	Link LinkSpec
	// DownMbit and UpMbit are the identity's caps (--rate-limit
	// ID=<DownMbit>Mbit/<UpMbit>Mbit).
	DownMbit, UpMbit float64
	// ClientCC lists the client's --congestion values, one instance of
	// daemons each; the server runs ServerCC (the download cap needs bbr
	// or cubic there). "fixed" sends at FixedRate.
	ClientCC  []string
	ServerCC  string
	FixedRate string
	// Parallel transfers of Duration each per direction; the rate is
	// measured from Warmup after their start to Duration.
	Parallel         int
	Duration, Warmup time.Duration
	// Shared, if set, adds a run per repetition with all these
	// identities on one server at once (ratecap_shared.go), Parallel
	// transfers each per direction, measured from SharedWarmup to
	// SharedDuration.
	Shared                       []SharedIdentity
	SharedDuration, SharedWarmup time.Duration
	// SharedLinkRate is the shared run's server --link-rate ("": none), a
	// little below the link's: the uncapped identity shares what the caps
	// leave of it. --quictun-server-arg=--link-rate= runs without it.
	SharedLinkRate string
}

// rateCapSpec is the profiles' rate-cap scenario: 20/5 Mbit/s caps on the
// 100 Mbit/s WAN link, four transfers per direction.
func rateCapSpec(d, warm time.Duration) RateCapSpec {
	return RateCapSpec{
		Link: LinkOf("WAN", WANDelay, 0, "100mbit"), DownMbit: 20, UpMbit: 5,
		ClientCC: []string{"bbr", "cubic", "fixed"}, ServerCC: "bbr", FixedRate: "100Mbit",
		Parallel: 4, Duration: d, Warmup: warm,
		Shared: sharedIdentities(), SharedDuration: 2*d + 2*warm, SharedWarmup: 2 * warm, SharedLinkRate: "90Mbit",
	}
}

// rateCapInstance is the quictun instance number of the first rate-cap
// daemons (their ports must not collide with the run's variants').
const rateCapInstance = 30

// rateCapDrainLimit bounds the wait for the identity's tunnels to end
// after a sample, so the next one does not share the cap with them.
const rateCapDrainLimit = 20 * time.Second

// The directions of the scenario (cases).
const (
	rateCapDown = "download"
	rateCapUp   = "upload"
)

// quictunWanted tells whether the run's variant selection includes a
// quictun variant (or selects everything).
func quictunWanted(sel []string) bool {
	return len(sel) == 0 || slices.ContainsFunc(sel, func(s string) bool { return s == "quictun" || strings.HasPrefix(s, "quictun-") })
}

// rateCap runs the scenario: for each repetition and client controller
// (the first rotating), fresh daemons with the cap, a download sample and
// an upload sample.
func (r *Runner) rateCap(ctx context.Context) error {
	p := r.prof.RateCap
	skip := func(why string) error {
		r.res.Notes = append(r.res.Notes, "ratecap skipped: "+why)
		klog.InfoS("Skipped the rate-cap scenario", "reason", why)
		return nil
	}
	switch {
	case !quictunWanted(r.opts.Variants):
		return skip("no quictun variant selected")
	case !QuictunAvailable(r.opts.BinDir):
		return skip("quictun binaries not built")
	case !binHasFlag(ctx, r.env.bin("quictun-server"), "--rate-limit"):
		return skip("quictun-server has no --rate-limit")
	case len(p.ClientCC) == 0:
		return skip("the profile names no client congestion controller")
	}
	builds := []string{""}
	if r.opts.BinDirB != "" {
		builds = append(builds, r.opts.BinDirB) // quictun-b, interleaved
	}
	r.setLink(ctx, p.Link)
	for rep := range r.prof.Reps {
		for k := range len(p.ClientCC) * len(builds) {
			if ctx.Err() != nil {
				return nil
			}
			j := (k + rep) % (len(p.ClientCC) * len(builds))
			i, bin := j/len(builds), builds[j%len(builds)]
			q := r.rateCapVariant(p.ClientCC[i], i, bin)
			err := q.Start(ctx, &r.env)
			if err == nil {
				for _, dir := range []string{rateCapDown, rateCapUp} {
					r.record(r.rateCapOne(ctx, q, dir, rep))
				}
			}
			q.Stop()
			if err != nil {
				r.record(Sample{Scenario: ScRateCap, Link: p.Link.Name, Case: rateCapCase(p, rateCapDown), Variant: q.Name(), Rep: rep,
					Started: time.Now().UTC(), Error: "start: " + err.Error()})
			}
		}
		if len(p.Shared) > 0 && ctx.Err() == nil {
			r.rateCapShared(ctx, rep)
		}
	}
	return nil
}

// rateCapVariant is the quictun instance whose client runs cc against a
// server that caps it; binDir, if set, holds the daemons (quictun-b's,
// --bin-b: labelled quictun-b-client-CC, its own ports).
func (r *Runner) rateCapVariant(cc string, k int, binDir string) *quictun {
	p := r.prof.RateCap
	sargs := append(slices.Clone(r.opts.ServerArgs), "--congestion", p.ServerCC)
	cargs := append(slices.Clone(r.opts.ClientArgs), "--congestion", cc)
	if cc == "fixed" {
		cargs = append(cargs, "--rate", p.FixedRate)
	}
	q := &quictun{ServerArgs: sargs, ClientArgs: cargs, Instance: rateCapInstance + k, Label: "quictun-client-" + cc,
		RateLimit: fmt.Sprintf("%gMbit/%gMbit", p.DownMbit, p.UpMbit)}
	if binDir != "" {
		q.BinDir, q.Label, q.Instance = binDir, "quictun-b-client-"+cc, rateCapInstance+10+k
	}
	return q
}

// rateCapCase names a direction's case with its cap.
func rateCapCase(p RateCapSpec, dir string) string {
	c := p.DownMbit
	if dir == rateCapUp {
		c = p.UpMbit
	}
	return fmt.Sprintf("%s, cap %g Mbit/s, %d streams", dir, c, p.Parallel)
}

// rateCapOne measures one direction through q: Parallel transfers for
// Duration, the identity's bytes read from the server at Warmup and at
// Duration after their start.
func (r *Runner) rateCapOne(ctx context.Context, q *quictun, dir string, rep int) Sample {
	p := r.prof.RateCap
	s := Sample{Scenario: ScRateCap, Link: p.Link.Name, Case: rateCapCase(p, dir), Variant: q.Name(), Rep: rep, Started: time.Now().UTC(),
		Metrics: map[string]float64{}}
	capMbit := p.DownMbit
	if dir == rateCapUp {
		capMbit = p.UpMbit
	}
	admin := "http://" + q.local(qtServerAdminPort) + "/identities/" + q.Identity()
	cp, sp := q.EndpointPIDs("sink")
	u0 := r.usage(cp, sp)
	var tr rateCapTransfer
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() { tr = r.rateCapTransfers(ctx, q.Sink(), dir, p.Parallel, p.Duration) })
	a, b, readErr := identityWindow(ctx, r.env.ServerNS, admin, start.Add(p.Warmup), start.Add(p.Duration))
	wg.Wait()
	u1 := r.usage(cp, sp)
	errs := append([]error{readErr}, tr.errs...)
	if readErr == nil {
		maps.Copy(s.Metrics, rateCapMetrics(dir, a, b, capMbit))
	}
	s.Metrics["client_mbit_per_s"] = tr.mbit
	s.Raw, _ = json.Marshal(tr.raw)
	maps.Copy(s.Metrics, usageMetrics(u0, u1, tr.cpu, true))
	if err := waitIdentityIdle(ctx, r.env.ServerNS, admin, rateCapDrainLimit); err != nil {
		errs = append(errs, err)
	}
	s.Error = errString(errors.Join(errs...))
	return s
}

// rateCapTransfer is what Parallel transfers in one direction give a
// sample: the harness's own rate, its record (Raw), the streams' errors
// and the CPU time of the harness threads that moved the bytes.
type rateCapTransfer struct {
	mbit float64
	raw  any
	errs []error
	cpu  float64
}

// rateCapTransfers runs par transfers of d through sink in direction dir.
func (r *Runner) rateCapTransfers(ctx context.Context, sink, dir string, par int, d time.Duration) rateCapTransfer {
	if dir == rateCapDown {
		down := bulkDownload(ctx, r.env.ClientNS, sink, par, d, nil)
		return rateCapTransfer{mbit: down.MbitPerS, raw: down, errs: streamErrors(down.Streams), cpu: down.ReaderCPU}
	}
	up := bulkUpload(ctx, r.env.ClientNS, sink, par, d)
	return rateCapTransfer{mbit: up.MbitPerS, raw: up, errs: streamErrors(up.Streams), cpu: up.WriterCPU}
}

// identityWindow reads the identity's figures at url (namespace ns) at
// from and at to.
func identityWindow(ctx context.Context, ns, url string, from, to time.Time) (a, b identityUsage, err error) {
	a, aErr := identityAt(ctx, ns, url, from)
	b, bErr := identityAt(ctx, ns, url, to)
	return a, b, errors.Join(aErr, bErr)
}

// streamErrors are the errors of transfer streams.
func streamErrors(st []BulkStream) []error {
	var errs []error
	for i, s := range st {
		if s.Error != "" {
			errs = append(errs, fmt.Errorf("stream %d: %s", i, s.Error))
		}
	}
	return errs
}

// identityUsage is what the scenario reads of GET /identities/ID.
type identityUsage struct {
	At              time.Time `json:"-"`
	BytesUpstream   int64     `json:"bytesUpstream"`
	BytesDownstream int64     `json:"bytesDownstream"`
	ActiveTunnels   int64     `json:"activeTunnels"`
}

// rateCapMetrics: the identity's rate in the direction between two
// readings of its bytes, and that rate in % of the cap.
func rateCapMetrics(dir string, a, b identityUsage, capMbit float64) map[string]float64 {
	el := b.At.Sub(a.At).Seconds()
	if el <= 0 {
		return nil
	}
	n := b.BytesDownstream - a.BytesDownstream
	if dir == rateCapUp {
		n = b.BytesUpstream - a.BytesUpstream
	}
	mbit := float64(n) * 8 / el / 1e6
	m := map[string]float64{"mbit_per_s": mbit, "cap_mbit_per_s": capMbit, "window_s": el}
	if capMbit > 0 {
		m["cap_pct"] = mbit / capMbit * 100
	}
	return m
}

// identityAt reads the identity's figures from the server's admin API at
// url (namespace ns) at time at.
func identityAt(ctx context.Context, ns, url string, at time.Time) (identityUsage, error) {
	select {
	case <-ctx.Done():
		return identityUsage{}, ctx.Err()
	case <-time.After(time.Until(at)):
	}
	return getIdentity(ctx, ns, url)
}

func getIdentity(ctx context.Context, ns, url string) (identityUsage, error) {
	var u identityUsage
	req, err := newGet(ctx, url)
	if err != nil {
		return u, err
	}
	resp, err := httpClientIn(ns).Do(req)
	u.At = time.Now()
	if err != nil {
		return u, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return u, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
		return u, fmt.Errorf("GET %s: decode: %w", url, err)
	}
	return u, nil
}

// waitIdentityIdle waits until the identity has no open tunnel.
func waitIdentityIdle(ctx context.Context, ns, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		u, err := getIdentity(ctx, ns, url)
		if err == nil && u.ActiveTunnels == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the identity's tunnels still open %v after the sample (%d; %v)", limit, u.ActiveTunnels, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// BulkUpload is the outcome of parallel uploads of a fixed duration.
type BulkUpload struct {
	Target   string `json:"target"`
	Parallel int    `json:"parallel"`
	// Bytes the harness wrote (what the local buffers took included).
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MbitPerS float64 `json:"mbit_per_s"`
	// WriterCPU is the CPU time of the harness threads that wrote (as a
	// download's ReaderCPU), so the emulator's share can be told apart.
	WriterCPU float64      `json:"writer_cpu_s"`
	Streams   []BulkStream `json:"streams"`
}

// bulkUpload runs par parallel uploads of duration d to the sink at addr
// from namespace ns (see uploadFor).
func bulkUpload(ctx context.Context, ns, addr string, par int, d time.Duration) BulkUpload {
	res := BulkUpload{Target: addr, Parallel: par, Streams: make([]BulkStream, par), Seconds: d.Seconds()}
	var wg sync.WaitGroup
	for i := range par {
		wg.Go(func() { res.Streams[i] = uploadFor(ctx, ns, addr, d) })
	}
	wg.Wait()
	for _, s := range res.Streams {
		res.Bytes += s.Bytes
		res.WriterCPU += s.ReaderCPU
	}
	if d > 0 {
		res.MbitPerS = float64(res.Bytes) * 8 / d.Seconds() / 1e6
	}
	return res
}

// uploadFor sends the sink protocol's unbounded upload on a new
// connection for d, then resets the connection (linger 0): what the
// local buffers still hold is dropped rather than drained at the cap, so
// it cannot leak into the next sample. It runs locked to its OS thread
// and reports that thread's CPU time (as ReaderCPU).
func uploadFor(ctx context.Context, ns, addr string, d time.Duration) (s BulkStream) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	defer func() { s.ReaderCPU = threadCPU() - cpu0 }()
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	c, err := dialIn(dctx, ns, addr)
	cancel()
	if err != nil {
		s.Error = err.Error()
		return s
	}
	defer func() {
		if l, ok := c.(interface{ SetLinger(int) error }); ok {
			_ = l.SetLinger(0)
		}
		_ = c.Close()
	}()
	defer context.AfterFunc(ctx, func() { _ = c.Close() })()
	s.start = time.Now()
	_ = c.SetWriteDeadline(s.start.Add(d))
	if _, err := c.Write(sinkRequest(sinkUp, 0)); err != nil {
		s.Error = fmt.Sprintf("write request: %v", err)
		return s
	}
	chunk := make([]byte, sinkMaxFrame)
	for {
		n, err := c.Write(chunk)
		s.Bytes += int64(n)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				s.Error = fmt.Sprintf("write: %v", err)
			}
			break
		}
	}
	s.end = time.Now()
	s.Seconds = s.end.Sub(s.start).Seconds()
	return s
}
