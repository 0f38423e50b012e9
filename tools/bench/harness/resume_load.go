package harness

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The load of the resume scenario, apart from the network so that it can be
// tested on pipes: interactive tunnels (pingPonger) and a transfer each way
// through an echo (echoTransfer), every byte counted and hashed.

// rsRound is one round trip of a pingPonger: when it ended and how long it
// took (UNIX ns, ns).
type rsRound struct {
	end, d int64
}

// pingPonger is one interactive tunnel to an echo: a round trip of size
// random bytes (written, then read back), then a pause drawn uniformly from
// [pauseMin, pauseMax], until stop. Every byte sent and received is counted
// and hashed (SHA-256), every round recorded.
type pingPonger struct {
	c                  net.Conn
	size               int
	pauseMin, pauseMax time.Duration
	// ioLimit bounds one round trip (its deadline).
	ioLimit time.Duration
	rng     *rand.Rand

	sent, got   int64
	sentH, gotH [sha256.Size]byte
	err         error
	// rounds are read while it runs (roundsBetween): under mu.
	mu     sync.Mutex
	rounds []rsRound
	// done counts completed rounds; read while it runs.
	done   atomic.Int64
	failed atomic.Bool
}

// newPingPonger is a pingPonger on c; seed makes its bytes and pauses.
func newPingPonger(c net.Conn, size int, pauseMin, pauseMax, ioLimit time.Duration, seed uint64) *pingPonger {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return &pingPonger{c: c, size: size, pauseMin: pauseMin, pauseMax: pauseMax, ioLimit: ioLimit,
		rng: rand.New(rand.NewChaCha8(s))}
}

func (p *pingPonger) pause() time.Duration {
	if p.pauseMax <= p.pauseMin {
		return p.pauseMin
	}
	return p.pauseMin + time.Duration(p.rng.Int64N(int64(p.pauseMax-p.pauseMin)))
}

// run does rounds until stop is closed (a round in flight completes) or an
// error; the first round starts after a random part of pauseMax, so that
// many tunnels spread their rounds.
func (p *pingPonger) run(stop <-chan struct{}) {
	sh, gh := sha256.New(), sha256.New()
	defer func() {
		copy(p.sentH[:], sh.Sum(nil))
		copy(p.gotH[:], gh.Sum(nil))
		p.failed.Store(p.err != nil)
	}()
	buf, back := make([]byte, p.size), make([]byte, p.size)
	t := time.NewTimer(time.Duration(p.rng.Int64N(int64(p.pauseMax) + 1)))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for i := range buf {
			buf[i] = byte(p.rng.Uint32())
		}
		if p.err = p.round(buf, back, sh, gh); p.err != nil {
			return
		}
		t.Reset(p.pause())
	}
}

// round writes buf, reads its echo into back and records the round.
func (p *pingPonger) round(buf, back []byte, sh, gh hash.Hash) error {
	start := time.Now()
	_ = p.c.SetDeadline(start.Add(p.ioLimit))
	if _, err := p.c.Write(buf); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	sh.Write(buf)
	p.sent += int64(len(buf))
	n, err := io.ReadFull(p.c, back)
	gh.Write(back[:n])
	p.got += int64(n)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	end := time.Now()
	p.mu.Lock()
	p.rounds = append(p.rounds, rsRound{end: end.UnixNano(), d: int64(end.Sub(start))})
	p.mu.Unlock()
	p.done.Add(1)
	return nil
}

// verified tells whether every byte sent came back once, in order: no
// error, equal counts and hashes.
func (p *pingPonger) verified() bool {
	return p.err == nil && p.sent == p.got && p.sentH == p.gotH
}

// rsStats are the round-trip figures of a set of pingPongers around a
// mark (an upgrade's signal, a blackout's end): the longest round that
// ended before it and the longest that ended at or after it (the stall:
// rounds in flight at the mark count after it), and percentiles over all
// rounds and over those after the mark.
type rsStats struct {
	rounds, roundsAfter  int
	longestBefore, stall time.Duration
	p50, p99, p99After   time.Duration
	firstAfter           time.Time
}

// roundStats computes rsStats over the rounds of ps.
func roundStats(ps []*pingPonger, mark time.Time) rsStats {
	var st rsStats
	var all, after []int64
	m := mark.UnixNano()
	for _, p := range ps {
		p.mu.Lock()
		rounds := slices.Clone(p.rounds)
		p.mu.Unlock()
		for _, r := range rounds {
			all = append(all, r.d)
			if r.end < m {
				st.longestBefore = max(st.longestBefore, time.Duration(r.d))
				continue
			}
			after = append(after, r.d)
			st.stall = max(st.stall, time.Duration(r.d))
			if e := time.Unix(0, r.end); st.firstAfter.IsZero() || e.Before(st.firstAfter) {
				st.firstAfter = e
			}
		}
	}
	st.rounds, st.roundsAfter = len(all), len(after)
	st.p50, st.p99 = percentile(all, 50), percentile(all, 99)
	st.p99After = percentile(after, 99)
	return st
}

// roundsBetween counts the rounds of ps that ended in [from, to).
func roundsBetween(ps []*pingPonger, from, to time.Time) int {
	n := 0
	for _, p := range ps {
		p.mu.Lock()
		for _, r := range p.rounds {
			if r.end >= from.UnixNano() && r.end < to.UnixNano() {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

// percentile is the q-th percentile (nearest rank) of v, sorted in place;
// 0 for none.
func percentile(v []int64, q int) time.Duration {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return time.Duration(v[min(len(v)-1, len(v)*q/100)])
}

// echoTransfer sends n pseudo-random bytes through an echo and reads them
// back at the same time, hashing both (SHA-256) and recording the
// arrivals; with down, it downloads n bytes from the sink instead (count
// and CRC-32C checked against the sink's trailer: the sink's bytes are
// random, so there is no SHA-256 to compare).
type echoTransfer struct {
	n           int64
	seed        uint64
	down        bool
	sent, got   int64
	sentH, gotH [sha256.Size]byte
	err         error
	prog        progress
	start, end  time.Time
}

// transferChunk is the size of the transfer's writes and reads.
const transferChunk = 64 << 10

// run transfers through c within limit from its start; c is closed at the
// end (it ends a side still blocked after the other failed).
func (t *echoTransfer) run(c net.Conn, limit time.Duration) {
	t.start = time.Now()
	_ = c.SetDeadline(t.start.Add(limit))
	t.prog.add(t.start, 0)
	if t.down {
		t.err = t.download(c)
		t.end = time.Now()
		_ = c.Close()
		return
	}
	var wg sync.WaitGroup
	var werr, rerr error
	wg.Go(func() {
		if werr = t.write(c); werr != nil {
			_ = c.Close()
		}
	})
	rerr = t.read(c)
	t.end = time.Now()
	_ = c.Close()
	wg.Wait()
	if werr != nil {
		werr = fmt.Errorf("write: %w", werr)
	}
	if rerr != nil {
		rerr = fmt.Errorf("read: %w", rerr)
	}
	t.err = errors.Join(werr, rerr)
}

func (t *echoTransfer) write(c net.Conn) error {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], t.seed)
	src := rand.NewChaCha8(s)
	h := sha256.New()
	defer func() { copy(t.sentH[:], h.Sum(nil)) }()
	buf := make([]byte, transferChunk)
	for t.sent < t.n {
		b := buf[:min(int64(len(buf)), t.n-t.sent)]
		_, _ = src.Read(b)
		n, err := c.Write(b)
		h.Write(b[:n])
		t.sent += int64(n)
		if err != nil {
			return err
		}
	}
	return nil
}

func (t *echoTransfer) read(c net.Conn) error {
	h := sha256.New()
	defer func() { copy(t.gotH[:], h.Sum(nil)) }()
	buf := make([]byte, transferChunk)
	for t.got < t.n {
		n, err := c.Read(buf[:min(int64(len(buf)), t.n-t.got)])
		h.Write(buf[:n])
		t.got += int64(n)
		if n > 0 {
			t.prog.add(time.Now(), t.got)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// download asks the sink for n bytes and reads them (readSinkDownload
// checks the count and CRC-32C).
func (t *echoTransfer) download(c net.Conn) error {
	if _, err := c.Write(sinkRequest(sinkDown, uint64(t.n))); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	got, err := readSinkDownload(bufio.NewReaderSize(c, 256<<10), func(total int64) {
		t.got = total
		t.prog.add(time.Now(), total)
	})
	t.got = got
	return err
}

// verified tells whether all n bytes went and came back unchanged (down:
// arrived, count and CRC-32C as the sink sent them).
func (t *echoTransfer) verified() bool {
	if t.down {
		return t.err == nil && t.got == t.n
	}
	return t.err == nil && t.sent == t.n && t.got == t.n && t.sentH == t.gotH
}
