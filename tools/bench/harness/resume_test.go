package harness

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pipeEcho echoes size-byte messages on c, passing each through mangle;
// after rounds of them it closes stop (the pingPonger's round in flight
// completes, then it stops).
func pipeEcho(c net.Conn, size, rounds int, stop chan struct{}, mangle func([]byte)) {
	defer close(stop)
	buf := make([]byte, size)
	for range rounds {
		if _, err := io.ReadFull(c, buf); err != nil {
			return
		}
		mangle(buf)
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// TestPingPonger: every round's bytes come back (counts and SHA-256
// equal, every round recorded); an echo that changes one byte is caught,
// and one that closes is a failure.
func TestPingPonger(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		mangle         func([]byte)
		rounds         int
		verified, fail bool
	}{
		{"intact", func([]byte) {}, 5, true, false},
		{"one byte changed", func(b []byte) { b[7] ^= 1 }, 5, false, false},
		{"echo closed", func([]byte) {}, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := net.Pipe()
			defer a.Close()
			stop := make(chan struct{})
			if tc.rounds == 0 {
				_ = b.Close() // the round fails; stop stays open
			} else {
				go pipeEcho(b, 100, tc.rounds, stop, tc.mangle)
			}
			p := newPingPonger(a, 100, 0, time.Millisecond, 10*time.Second, 1)
			p.run(stop)
			_ = b.Close()
			assert.Equal(t, tc.verified, p.verified())
			assert.Equal(t, tc.fail, p.err != nil, "err %v", p.err)
			assert.Equal(t, tc.fail, p.failed.Load())
			if !tc.fail {
				assert.Equal(t, int64(100*tc.rounds), p.sent)
				assert.Equal(t, p.sent, p.got)
				assert.Len(t, p.rounds, tc.rounds)
				assert.Equal(t, int64(tc.rounds), p.done.Load())
			}
		})
	}
}

// TestRoundStats: rounds that end before the mark make "longest before",
// those that end at or after it (in flight at it) the stall; percentiles
// by nearest rank.
func TestRoundStats(t *testing.T) {
	t.Parallel()
	mark := time.Unix(100, 0)
	at := func(ms int64) int64 { return mark.Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	ms := func(v int64) int64 { return int64(time.Duration(v) * time.Millisecond) }
	a := &pingPonger{rounds: []rsRound{{at(-500), ms(30)}, {at(-100), ms(60)}, {at(80), ms(140)}}}
	b := &pingPonger{rounds: []rsRound{{at(-300), ms(25)}, {at(0), ms(50)}, {at(300), ms(26)}}}
	st := roundStats([]*pingPonger{a, b}, mark)
	assert.Equal(t, 6, st.rounds)
	assert.Equal(t, 3, st.roundsAfter)
	assert.Equal(t, 60*time.Millisecond, st.longestBefore)
	assert.Equal(t, 140*time.Millisecond, st.stall)
	assert.Equal(t, 50*time.Millisecond, st.p50, "nearest rank of 25 26 30 50 60 140")
	assert.Equal(t, 140*time.Millisecond, st.p99)
	assert.Equal(t, 140*time.Millisecond, st.p99After)
	assert.Equal(t, mark, st.firstAfter)
	assert.Equal(t, 2, roundsBetween([]*pingPonger{a, b}, mark.Add(-400*time.Millisecond), mark))

	m := map[string]float64{}
	stallMetrics(st, 25*time.Millisecond, m)
	assert.InDelta(t, 5.6, m["stall_rtts"], 1e-9)
	assert.Equal(t, 125.0, m["target_ms"])
	assert.Equal(t, 0.0, m["stall_ok"], "140 ms > 1 RTT + 100 ms")
	st.stall = 120 * time.Millisecond
	stallMetrics(st, 25*time.Millisecond, m)
	assert.Equal(t, 1.0, m["stall_ok"])
	stallMetrics(rsStats{}, 25*time.Millisecond, m)
	assert.Equal(t, 0.0, m["stall_ok"], "no round after the mark is no success")
}

// TestEchoTransfer: n bytes each way through an echo, SHA-256 of both
// ways equal; a changed byte or an echo that stops early is caught.
func TestEchoTransfer(t *testing.T) {
	t.Parallel()
	const n = 1<<20 + 123
	for _, tc := range []struct {
		name     string
		echo     func(c net.Conn)
		verified bool
	}{
		{"intact", func(c net.Conn) { _, _ = io.Copy(c, c) }, true},
		{"one byte changed", func(c net.Conn) {
			buf := make([]byte, 1000)
			_, _ = io.ReadFull(c, buf)
			buf[999] ^= 0x80
			_, _ = c.Write(buf)
			_, _ = io.Copy(c, c)
		}, false},
		{"echo stops", func(c net.Conn) { _, _ = io.CopyN(c, c, n/2); _ = c.Close() }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, b := net.Pipe()
			done := make(chan struct{})
			go func() { defer close(done); tc.echo(b) }()
			tr := &echoTransfer{n: n, seed: 7}
			tr.run(a, 30*time.Second)
			_ = b.Close()
			<-done
			assert.Equal(t, tc.verified, tr.verified(), "err %v", tr.err)
			if tc.verified {
				require.NoError(t, tr.err)
				assert.Equal(t, int64(n), tr.got)
				assert.Equal(t, int64(n), tr.prog.last())
			}
		})
	}
}

// TestEchoTransferDown: the down transfer reads the sink's count bytes,
// checked against its trailer (a wrong CRC-32C is caught).
func TestEchoTransferDown(t *testing.T) {
	t.Parallel()
	for _, corrupt := range []bool{false, true} {
		a, b := net.Pipe()
		go fakeSink(t, b, corrupt)
		tr := &echoTransfer{n: 100<<10 + 5, down: true}
		tr.run(a, 10*time.Second)
		assert.Equal(t, !corrupt, tr.verified(), "err %v", tr.err)
		assert.Equal(t, tr.n, tr.got)
		assert.Equal(t, tr.n, tr.prog.last())
		if corrupt {
			assert.ErrorContains(t, tr.err, "CRC-32C mismatch")
		}
	}
}

// TestUpgradedPID: the new PID is the one logged for the side asked.
func TestUpgradedPID(t *testing.T) {
	t.Parallel()
	log := `I1129 05:00:00.1 1 upgrade.go:382] "Upgrade: the new process is ready; handing the client over" pid=4242` + "\n" +
		`I1129 05:00:00.2 1 upgrade.go:382] "Upgrade: the new process is ready; handing the server over" pid=777` + "\n"
	assert.Equal(t, 777, upgradedPID(log, "server"))
	assert.Equal(t, 4242, upgradedPID(log, "client"))
	assert.Equal(t, 0, upgradedPID(`"Received SIGUSR2; upgrading: starting the new binary"`, "server"))
}

// TestAddrCommands: the address change adds the new address with a route
// each way and removes the old one; the restore undoes each step.
func TestAddrCommands(t *testing.T) {
	t.Parallel()
	mv := addrMoveCommands("c", "s", "198.18.0.1", "198.18.0.31", "198.18.0.2")
	assert.Equal(t, [][]string{
		{"-n", "c", "addr", "add", "198.18.0.31/32", "dev", "lem0"},
		{"-n", "s", "route", "add", "198.18.0.31/32", "dev", "lem0"},
		{"-n", "c", "route", "replace", "198.18.0.2/32", "dev", "lem0", "src", "198.18.0.31"},
		{"-n", "c", "addr", "del", "198.18.0.1/32", "dev", "lem0"},
	}, mv)
	assert.Equal(t, [][]string{
		{"-n", "c", "addr", "add", "198.18.0.1/32", "dev", "lem0"},
		{"-n", "c", "route", "replace", "198.18.0.2/32", "dev", "lem0"},
		{"-n", "c", "addr", "del", "198.18.0.31/32", "dev", "lem0"},
		{"-n", "s", "route", "del", "198.18.0.31/32", "dev", "lem0"},
	}, addrRestoreCommands("c", "s", "198.18.0.1", "198.18.0.31", "198.18.0.2"))
}

// TestResumeSpecValidate: the profiles' specs are valid; bad cases, load
// and a window shorter than the blackout are refused.
func TestResumeSpecValidate(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"full", "resume", "smoke"} {
		p, err := Profiles(name)
		require.NoError(t, err)
		assert.NoError(t, p.Resume.Validate(), name)
	}
	ok := smokeResumeSpec()
	for _, tc := range []struct {
		name string
		mut  func(*ResumeSpec)
		want string
	}{
		{"unknown case", func(s *ResumeSpec) { s.Cases = []string{"reboot"} }, `resume case "reboot"`},
		{"no tunnels", func(s *ResumeSpec) { s.Tunnels = 0 }, "at least 1 tunnel"},
		{"pauses reversed", func(s *ResumeSpec) { s.PauseMin = time.Second }, "pause min <= pause max"},
		{"window too short", func(s *ResumeSpec) { s.Blackout = 2 * time.Minute }, "shorter than the blackout"},
		{"no transfer", func(s *ResumeSpec) { s.Transfer = 0; s.Cases = []string{ResumeAddrChange} }, "at least 1 byte"},
		{"no transfer to upgrade under", func(s *ResumeSpec) { s.Transfer = 0; s.Cases = []string{ResumeUpgradeTransfer} }, "at least 1 byte"},
	} {
		s := ok
		tc.mut(&s)
		assert.ErrorContains(t, s.Validate(), tc.want, tc.name)
	}
	s := ok
	s.Blackout = 0
	s.Cases = []string{ResumeServerUpgrade}
	assert.NoError(t, s.Validate(), "no blackout needed without its case")
}

// TestEchoIdleTimeout: the echo server outlasts the resume blackout (the
// full profile's is 5 min, the echo server's default idle timeout).
func TestEchoIdleTimeout(t *testing.T) {
	t.Parallel()
	p, err := Profiles("full")
	require.NoError(t, err)
	assert.Equal(t, 7*time.Minute, echoIdleTimeout(p))
	p, err = Profiles("quick")
	require.NoError(t, err)
	assert.Equal(t, 5*time.Minute, echoIdleTimeout(p))
}

// TestResumeCaseLabel: the report's case names carry the load and the
// outage.
func TestResumeCaseLabel(t *testing.T) {
	t.Parallel()
	s := resumeSpec(1000, 5*time.Minute, 0, 1e9)
	assert.Equal(t, "server upgrade (SIGUSR2), 1000 tunnels, pauses 100ms-200ms", resumeCaseLabel(s, ResumeServerUpgrade))
	assert.Equal(t, "blackout 5m0s (idle timeout 90s default), session + 1 GB each way", resumeCaseLabel(s, ResumeBlackout))
	s = resumeSpec(100, 2*time.Minute, 30*time.Second, 100e6)
	assert.Equal(t, "blackout 2m0s (idle timeout 30s), session + 100 MB each way", resumeCaseLabel(s, ResumeBlackout))
	assert.Equal(t, "client address change, old address removed, session + 100 MB each way", resumeCaseLabel(s, ResumeAddrChange))
	assert.Equal(t, "server upgrade (SIGUSR2), session + 100 MB each way", resumeCaseLabel(s, ResumeUpgradeTransfer))
}

// TestRunResume runs the resume scenario (smoke profile) through quictun
// built from this tree: both upgrades, the server's upgrade under a
// transfer, the blackout past the idle timeout and the address change keep
// every tunnel, every byte verified.
func TestRunResume(t *testing.T) {
	res, _, p := runTunnelSmoke(t, "hr", nil, ScResume)
	require.Len(t, res.Samples, len(p.Resume.Cases), "quictun only, one sample per case")
	for _, smp := range res.Samples {
		assert.Empty(t, smp.Error, smp.Case)
		m := smp.Metrics
		assert.Equal(t, 0.0, m["tunnels_reset"], smp.Case)
		assert.Equal(t, 1.0, m["verified"], smp.Case)
		assert.Equal(t, "quictun", smp.Variant)
		if _, ok := m["stall_ms"]; ok {
			assert.Equal(t, float64(p.Resume.Tunnels), m["tunnels"], smp.Case)
			assert.Equal(t, 1.0, m["upgraded"], smp.Case)
			assert.Positive(t, m["load_round_trips_per_s"], smp.Case)
			assert.Contains(t, m, "cpu_server_pct", smp.Case)
			continue
		}
		assert.Equal(t, 1.0, m["transfer_verified"], smp.Case)
		assert.Contains(t, m, "session_after_s", smp.Case)
		assert.Contains(t, m, "transfer_flowing_after_s", smp.Case)
	}
}
