package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Failover cases: how the active server goes away.
const (
	// FailoverKill: SIGKILL of the active server's process (its host's
	// kernel answers the client's packets with ICMP port unreachable).
	FailoverKill = "SIGKILL active server"
	// FailoverStop: SIGSTOP of the active server (a blackhole: nothing
	// answers, as a dead host or a cut path), SIGCONT at the end.
	FailoverStop = "SIGSTOP active server (blackhole)"
)

// Ports of the failover scenario (instance k adds 10*k; apart from the
// quictun variant's own daemons, which keep running).
const (
	foUDPPort      = 7600 // and 7601
	foServerAdmin  = 8190 // and 8191
	foClientAdmin  = 8192
	foClientListen = 6600
)

// failoverOpenEvery is how often the application opens a new tunnel.
const failoverOpenEvery = 20 * time.Millisecond

// foEvent is one tunnel of the failover timeline (results.json raw): when it
// was opened and answered (or failed), in ms from the failure.
type foEvent struct {
	OpenedMS   float64 `json:"opened_ms"`
	AnsweredMS float64 `json:"answered_ms"`
	OK         bool    `json:"ok"`
}

// failover runs two quictun servers and a client of both (--server-mode
// failover) for each quictun variant; an application opens a tunnel every
// 20 ms (a 1000 B echo each) while the active server is killed or stopped.
// Measured: from the failure to the first new tunnel's answer, that
// tunnel's own first byte, the p99 first byte of the tunnels opened in the
// 5 s after the failure, and their timeline.
func (r *Runner) failover(ctx context.Context) error {
	p := r.prof
	r.setLink(ctx, p.FailoverLink)
	rtt := 2 * linkDelay(p.FailoverLink)
	for rep := range p.Reps {
		for _, v := range r.ordered(rep) {
			q, ok := v.(*quictun)
			if !ok {
				continue // the scenario is quictun's several-server client
			}
			for _, cs := range []string{FailoverKill, FailoverStop} {
				for range p.FailoverSamples {
					if ctx.Err() != nil {
						return nil
					}
					r.failoverOne(ctx, q, rep, cs, rtt)
				}
			}
		}
	}
	return nil
}

// foSetup is one failover sample's daemons.
type foSetup struct {
	servers [2]*Proc
	client  *Proc
	local   string
}

func (s *foSetup) stop() {
	if s.client != nil {
		s.client.Stop(5 * time.Second)
	}
	for _, p := range s.servers {
		if p != nil {
			_ = syscall.Kill(-p.PID(), syscall.SIGCONT)
			p.Stop(5 * time.Second)
		}
	}
}

// qtCreds are the state directory, secret file and certificate
// fingerprint of a quictun server started by a scenario of its own.
type qtCreds struct {
	state, secret, fp string
}

// newQTCreds creates, under dir, a state directory and a random secret
// for q's server and reads the server's certificate fingerprint.
func newQTCreds(ctx context.Context, env *Env, q *quictun, dir string) (qtCreds, error) {
	c := qtCreds{state: filepath.Join(dir, "state"), secret: filepath.Join(dir, "secret")}
	if err := os.MkdirAll(c.state, 0o700); err != nil {
		return c, err
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	if err := os.WriteFile(c.secret, []byte(base64.StdEncoding.EncodeToString(raw)+"\n"), 0o600); err != nil {
		return c, err
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(fctx, q.bin(env, "quictun-server"), "fingerprint", "--state-dir", c.state).Output()
	if err != nil {
		return c, fmt.Errorf("quictun-server fingerprint: %w", err)
	}
	c.fp = strings.TrimSpace(string(out))
	return c, nil
}

// startFailover starts the two servers (one state dir: one identity and
// ticket key, as replicas share them) and the client of both.
func (r *Runner) startFailover(ctx context.Context, q *quictun) (*foSetup, error) {
	env := &r.env
	cr, err := newQTCreds(ctx, env, q, filepath.Join(env.WorkDir, q.file("failover")))
	if err != nil {
		return nil, err
	}
	state, secret, fp := cr.state, cr.secret, cr.fp
	s := &foSetup{local: q.local(foClientListen)}
	var endpoints []string
	denv := benchDaemonEnv(nil)
	for i := range s.servers {
		ep := net.JoinHostPort(env.ServerIP, strconv.Itoa(foUDPPort+i+10*q.Instance))
		endpoints = append(endpoints, ep)
		args := append([]string{"--listen-on", ep, "--state-dir", state, "--secret-file", secret,
			"--allow", fmt.Sprintf("tcp:127.0.0.1:%d", EchoPort), "--httpd-listen-on", q.local(foServerAdmin + i)}, q.ccArgs()...)
		args = append(args, q.ServerArgs...)
		name := q.file(fmt.Sprintf("failover-server-%d", i))
		if s.servers[i], err = startProcEnv(name, env.ServerNS, filepath.Join(env.LogDir, name+".log"), denv, q.bin(env, "quictun-server"), args...); err != nil {
			s.stop()
			return nil, err
		}
	}
	args := append([]string{"--listen-on", "tcp:" + s.local, "--server-endpoint", strings.Join(endpoints, ","),
		"--server-mode", "failover", "--server-failback-after", "5s", "--reconnect-max-delay", "1s",
		"--token-source", "tcp:127.0.0.1:" + strconv.Itoa(EchoPort), "--server-fingerprint", fp, "--secret-file", secret,
		"--httpd-listen-on", q.local(foClientAdmin)}, q.ccArgs()...)
	args = append(args, q.ClientArgs...)
	name := q.file("failover-client")
	if s.client, err = startProcEnv(name, env.ClientNS, filepath.Join(env.LogDir, name+".log"), denv, q.bin(env, "quictun-client"), args...); err != nil {
		s.stop()
		return nil, err
	}
	// Both servers connected: the standby is warm.
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := scrapeCounter(ctx, env.ClientNS, "http://"+q.local(foClientAdmin)+"/metrics", "quictun_client_server_connections")
		if err == nil && v >= 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("client of two servers not connected to both (%v, %v)", v, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s, nil
}

func (r *Runner) failoverOne(ctx context.Context, q *quictun, rep int, cs string, rtt time.Duration) {
	s := Sample{Scenario: ScFailover, Link: r.prof.FailoverLink.Name, Case: cs, Variant: q.Name(), Rep: rep,
		Started: time.Now().UTC(), Metrics: map[string]float64{}}
	defer func() { r.record(s) }()
	setup, err := r.startFailover(ctx, q)
	if err != nil {
		s.Error = "start: " + err.Error()
		return
	}
	defer setup.stop()
	if err := waitEcho(ctx, r.env.ClientNS, setup.local, 20*time.Second); err != nil {
		s.Error = "not healthy before: " + err.Error()
		return
	}

	type try struct {
		opened, answered time.Time
		ok               bool
	}
	var mu sync.Mutex
	var tries []try
	var wg sync.WaitGroup
	octx, stopOpening := context.WithCancel(ctx)
	wg.Go(func() {
		tick := time.NewTicker(failoverOpenEvery)
		defer tick.Stop()
		for {
			select {
			case <-octx.Done():
				return
			case <-tick.C:
			}
			wg.Go(func() {
				t := try{opened: time.Now()}
				c, err := dialIn(ctx, r.env.ClientNS, setup.local)
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(10 * time.Second))
					err = roundTrip(c, make([]byte, 1000))
					_ = c.Close()
				}
				t.answered, t.ok = time.Now(), err == nil
				mu.Lock()
				tries = append(tries, t)
				mu.Unlock()
			})
		}
	})
	time.Sleep(time.Second) // warm: tunnels on the active server
	victim := setup.servers[0]
	sig := syscall.SIGKILL
	if cs == FailoverStop {
		sig = syscall.SIGSTOP
	}
	failed := time.Now()
	_ = syscall.Kill(-victim.PID(), sig)
	time.Sleep(5 * time.Second)
	stopOpening()
	wg.Wait()

	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	var timeline []foEvent
	var firstAt time.Time
	var first try
	var after []float64
	failedN := 0
	for _, t := range tries {
		if t.opened.Before(failed.Add(-time.Second)) {
			continue
		}
		timeline = append(timeline, foEvent{OpenedMS: ms(t.opened.Sub(failed)), AnsweredMS: ms(t.answered.Sub(failed)), OK: t.ok})
		if !t.opened.After(failed) {
			continue
		}
		if !t.ok {
			failedN++
			continue
		}
		after = append(after, ms(t.answered.Sub(t.opened)))
		if firstAt.IsZero() || t.answered.Before(firstAt) {
			firstAt, first = t.answered, t
		}
	}
	slices.SortFunc(timeline, func(a, b foEvent) int {
		switch {
		case a.OpenedMS < b.OpenedMS:
			return -1
		case a.OpenedMS > b.OpenedMS:
			return 1
		}
		return 0
	})
	if raw, err := json.Marshal(timeline); err == nil {
		s.Raw = raw
	}
	s.Metrics["failed_new_tunnels"] = float64(failedN)
	if firstAt.IsZero() {
		s.Error = "no new tunnel succeeded within 5 s of the failure"
		return
	}
	s.Metrics["failover_ms"] = ms(firstAt.Sub(failed))
	fb := first.answered.Sub(first.opened)
	s.Metrics["first_byte_ms"] = ms(fb)
	if rtt > 0 {
		s.Metrics["first_byte_rtts"] = float64(fb) / float64(rtt)
	}
	slices.Sort(after)
	s.Metrics["p99_first_byte_ms"] = after[min(len(after)-1, len(after)*99/100)]
}
