package ingress

import "sync"

// recorder is an Events that keeps what tests look at: the bytes queued for
// UDP flows, drops by reason, the results of failed flows.
type recorder struct {
	NopEvents

	mu     sync.Mutex
	queued float64
	drops  map[string]int
	failed []string
}

func (r *recorder) UDPQueued(delta float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queued += delta
}

func (r *recorder) UDPDropped(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.drops == nil {
		r.drops = map[string]int{}
	}
	r.drops[reason]++
}

func (r *recorder) UDPFlowFailed(result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, result)
}

// queuedBytes, dropped and failedFlows read what was recorded.
func (r *recorder) queuedBytes() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queued
}

func (r *recorder) dropped(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.drops[reason]
}

func (r *recorder) failedFlows() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.failed...)
}
