package congestion

import qc "github.com/quic-go/quic-go/congestion"

// sentState is what the delivery-rate estimator remembers of a packet in
// flight (draft-cheng-iccrg-delivery-rate-estimation, "per-packet state").
type sentState struct {
	present    bool
	appLimited bool
	// belowModel: sent while bbr sent below its model (ProbeBW's down
	// phase, ProbeRTT), when a bottleneck cannot overflow: its fate measures
	// the path's random loss.
	belowModel    bool
	bytes         int
	txInFlight    int // bytes in flight when it was sent, itself included
	delivered     int64
	deliveredTime qc.Time
	firstSentTime qc.Time
	sentTime      qc.Time
}

// maxTracked bounds the ring should a packet never be reported (the hook
// promises that it is, but a bound costs nothing).
const maxTracked = 1 << 17

// minRing is the ring's first size: an idle connection has a few packets
// in flight at most.
const minRing = 16

// ring holds sentState for consecutive packet numbers base..base+n-1.
// Packet numbers the controller does not track (ACK-only packets, numbers
// quic-go skips) are holes. Entries are removed when acknowledged or lost;
// the ring advances past removed entries at its head.
type ring struct {
	buf  []sentState
	head int
	n    int
	base int64
}

func (r *ring) push(s sentState) {
	if r.n == len(r.buf) {
		nb := make([]sentState, max(minRing, 2*len(r.buf)))
		for i := 0; i < r.n; i++ {
			nb[i] = r.buf[(r.head+i)%len(r.buf)]
		}
		r.buf, r.head = nb, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = s
	r.n++
}

// add records pn; numbers must increase (older or repeated ones are ignored).
func (r *ring) add(pn int64, s sentState) {
	if r.n == 0 {
		r.base = pn
	}
	end := r.base + int64(r.n)
	if pn < end {
		return
	}
	if pn-end > maxTracked {
		r.reset()
		r.base, end = pn, pn
	}
	for ; end < pn; end++ {
		r.push(sentState{})
	}
	s.present = true
	r.push(s)
	for r.n > maxTracked {
		r.popHead()
	}
}

func (r *ring) reset() { clear(r.buf); r.head, r.n = 0, 0 }

func (r *ring) popHead() {
	r.buf[r.head] = sentState{}
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	r.base++
}

func (r *ring) get(pn int64) *sentState {
	i := pn - r.base
	if i < 0 || i >= int64(r.n) {
		return nil
	}
	e := &r.buf[(r.head+int(i))%len(r.buf)]
	if !e.present {
		return nil
	}
	return e
}

func (r *ring) remove(e *sentState) {
	e.present = false
	for r.n > 0 && !r.buf[r.head].present {
		r.popHead()
	}
	// The buffer is kept when nothing is in flight: giving it back then
	// (42d6ccc) made bbr take 12 s instead of 0.2 s to recover from a 10 s
	// blackout with a bulk transfer in flight (bench blackout-bulk, WAN
	// 100 Mbit/s 0 % loss, 3 runs: bench/results/2026-11-27T003218Z,
	// 003655Z, 003833Z, in git history at ecc96da); why is not understood yet.
}

func (r *ring) len() int { return r.n }
