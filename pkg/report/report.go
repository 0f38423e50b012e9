package report

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Totals is an identity's bytes so far (Source).
type Totals struct {
	Identity                       string
	BytesUpstream, BytesDownstream int64
}

// Events are what a Reporter reports (the daemon's metrics).
type Events interface {
	// Batch reports a batch's fate: sent, retried (a failed attempt, to be
	// tried again), rejected (the endpoint refused it for good: 4xx) or
	// dropped (the queue was full).
	Batch(result string)
	// Queued reports the batches waiting.
	Queued(n int)
}

// Results of Events.Batch.
const (
	ResultSent     = "sent"
	ResultRetried  = "retried"
	ResultRejected = "rejected"
	ResultDropped  = "dropped"
)

// Results lists Events.Batch's results, for pre-creating metric labels.
func Results() []string { return []string{ResultSent, ResultRetried, ResultRejected, ResultDropped} }

// Config are a Reporter's settings.
type Config struct {
	// URL receives the batches (POST, application/json).
	URL string
	// BearerToken, if set, is sent as "Authorization: Bearer ...".
	BearerToken string
	// Interval is the longest an identity's bytes wait (default 1m).
	Interval time.Duration
	// Threshold sends a batch early once one identity has this many bytes
	// unreported (0: 100 MB).
	Threshold int64
	// MaxQueued bounds the batches waiting (default 64).
	MaxQueued int
	// Server names this server in each batch (its replica ID).
	Server string
	// Source returns every identity's totals (usage.Ledger.Snapshot).
	Source func() []Totals
	Events Events
	// Client posts the batches (nil: a client with a 10 s timeout).
	Client *http.Client
}

// Defaults of Config.
const (
	DefaultInterval  = time.Minute
	DefaultThreshold = 100e6
	DefaultMaxQueued = 64
	// retryMin and retryMax bound the backoff between attempts.
	retryMin, retryMax = time.Second, time.Minute
)

// Batch is what is posted: the bytes each identity moved between From and
// To. ID is unique per batch (a retried batch keeps it), so a receiver can
// drop a batch it has seen: delivery is at least once.
type Batch struct {
	ID         string      `json:"id"`
	Server     string      `json:"server"`
	From       time.Time   `json:"from"`
	To         time.Time   `json:"to"`
	Identities []Increment `json:"identities"`
}

// Increment is one identity's bytes in a Batch.
type Increment struct {
	Identity        string `json:"identity"`
	BytesUpstream   int64  `json:"bytesUpstream"`
	BytesDownstream int64  `json:"bytesDownstream"`
}

// Reporter batches and posts usage. Create it with New, then Run once.
type Reporter struct {
	cfg    Config
	prefix string
	seq    int
	// last are the totals as of the last batch; lastAt its end.
	last   map[string]Totals
	lastAt time.Time

	mu    sync.Mutex
	queue []Batch
	wake  chan struct{} // size 1: the sender has work
	// tick is how often the totals are checked; retry the first backoff.
	tick, retry time.Duration
}

// New checks cfg and returns a Reporter whose first batch counts from the
// totals Source returns now (what earlier runs reported is not sent again).
func New(cfg Config) (*Reporter, error) {
	if cfg.URL == "" || cfg.Source == nil || cfg.Events == nil {
		return nil, errors.New("report: URL, Source and Events are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = DefaultThreshold
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = DefaultMaxQueued
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	r := &Reporter{cfg: cfg, prefix: hex.EncodeToString(b), last: map[string]Totals{}, lastAt: time.Now(),
		wake: make(chan struct{}, 1), tick: time.Second, retry: retryMin}
	for _, t := range cfg.Source() {
		r.last[t.Identity] = t
	}
	return r, nil
}

// Run checks the totals every second and posts batches until ctx is done;
// then it makes a last batch and tries, for at most 5 s, to post what is
// queued. It returns when its sender has stopped.
func (r *Reporter) Run(ctx context.Context) {
	sendCtx, stopSend := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	// flushed is closed once the last batch is queued: the sender ends when
	// the queue is empty after that, not when ctx ends (it would race the
	// last collect and drop the final batch).
	flushed := make(chan struct{})
	go func() { defer close(done); r.send(sendCtx, klog.FromContext(ctx), flushed) }()
	t := time.NewTicker(r.tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.collect(time.Now(), true)
			close(flushed)
			timer := time.AfterFunc(5*time.Second, stopSend)
			<-done
			timer.Stop()
			stopSend()
			return
		case now := <-t.C:
			r.collect(now, false)
		}
	}
}

// collect queues a batch of what moved since the last one, if the
// interval is over (or force) and something moved, or if an identity has
// Threshold bytes unreported.
func (r *Reporter) collect(now time.Time, force bool) {
	due := force || now.Sub(r.lastAt) >= r.cfg.Interval
	var incs []Increment
	cur := r.cfg.Source()
	for _, t := range cur {
		prev := r.last[t.Identity]
		inc := Increment{Identity: t.Identity, BytesUpstream: t.BytesUpstream - prev.BytesUpstream,
			BytesDownstream: t.BytesDownstream - prev.BytesDownstream}
		if inc.BytesUpstream == 0 && inc.BytesDownstream == 0 {
			continue
		}
		if inc.BytesUpstream+inc.BytesDownstream >= r.cfg.Threshold {
			due = true
		}
		incs = append(incs, inc)
	}
	if !due || len(incs) == 0 {
		if due {
			r.lastAt = now
		}
		return
	}
	for _, t := range cur {
		r.last[t.Identity] = t
	}
	r.seq++
	b := Batch{ID: fmt.Sprintf("%s-%d", r.prefix, r.seq), Server: r.cfg.Server, From: r.lastAt.UTC(), To: now.UTC(), Identities: incs}
	r.lastAt = now
	r.enqueue(b)
}

// enqueue adds b, dropping the oldest batch when the queue is full.
func (r *Reporter) enqueue(b Batch) {
	r.mu.Lock()
	if len(r.queue) >= r.cfg.MaxQueued {
		r.queue = r.queue[1:]
		r.cfg.Events.Batch(ResultDropped)
	}
	r.queue = append(r.queue, b)
	n := len(r.queue)
	r.mu.Unlock()
	r.cfg.Events.Queued(n)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// send posts the queued batches in order until ctx ends, retrying a failed
// one with backoff; once flushed is closed (the last batch queued) it returns
// when the queue is empty.
func (r *Reporter) send(ctx context.Context, logger klog.Logger, flushed <-chan struct{}) {
	delay := r.retry
	for {
		r.mu.Lock()
		var b Batch
		queued := len(r.queue) > 0
		if queued {
			b = r.queue[0]
		}
		r.mu.Unlock()
		if !queued {
			select {
			case <-flushed:
				return
			default:
			}
			select {
			case <-r.wake:
				continue
			case <-flushed:
				continue
			case <-ctx.Done():
				return
			}
		}
		err := r.post(ctx, b)
		var perm *permanentError
		switch {
		case err == nil:
			r.cfg.Events.Batch(ResultSent)
		case errors.As(err, &perm):
			r.cfg.Events.Batch(ResultRejected)
			logger.Info("The usage report endpoint refused a batch; dropped it", "url", r.cfg.URL, "batch", b.ID, "err", err)
		default:
			r.cfg.Events.Batch(ResultRetried)
			logger.V(2).Info("Could not post a usage report; retrying", "url", r.cfg.URL, "batch", b.ID, "delay", delay, "err", err)
			select {
			case <-time.After(delay):
				delay = min(2*delay, retryMax)
				continue
			case <-ctx.Done():
				return
			}
		}
		delay = r.retry
		r.mu.Lock()
		if len(r.queue) > 0 && r.queue[0].ID == b.ID {
			r.queue = r.queue[1:]
		}
		n := len(r.queue)
		r.mu.Unlock()
		r.cfg.Events.Queued(n)
	}
}

// permanentError is an answer that retrying cannot change (4xx but 408, 429).
type permanentError struct{ status int }

func (e *permanentError) Error() string { return fmt.Sprintf("status %d", e.status) }

// post sends one batch.
func (r *Reporter) post(ctx context.Context, b Batch) error {
	body, err := json.Marshal(b)
	if err != nil {
		return &permanentError{}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if r.cfg.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.BearerToken)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusRequestTimeout && resp.StatusCode != http.StatusTooManyRequests:
		return &permanentError{status: resp.StatusCode}
	}
	return fmt.Errorf("status %d", resp.StatusCode)
}
