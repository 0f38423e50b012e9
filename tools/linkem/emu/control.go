package emu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ConfigUpdate is the body of POST /config. Values are strings ("12.5ms",
// "100mbit", "1%") or JSON numbers. "both" is applied first, then the
// per-direction objects; the update is all or nothing.
type ConfigUpdate struct {
	Both map[string]any `json:"both,omitempty"`
	C2S  map[string]any `json:"c2s,omitempty"`
	S2C  map[string]any `json:"s2c,omitempty"`
}

// Stats is the body of GET /stats.
type Stats struct {
	C2S    DirStats `json:"c2s"`
	S2C    DirStats `json:"s2c"`
	Uptime string   `json:"uptime"`
}

// Control serves the control API for a pair of links.
type Control struct {
	Links map[string]*Link // keys C2S and S2C
	Clock Clock
	start time.Time
}

// NewControl returns the control API of links.
func NewControl(c2s, s2c *Link, clk Clock) *Control {
	return &Control{Links: map[string]*Link{C2S: c2s, S2C: s2c}, Clock: clk, start: clk.Now()}
}

// Handler returns the HTTP handler: GET /stats, GET /config, POST /config,
// POST /blackout?duration=5s[&dir=both|c2s|s2c].
func (c *Control) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		now := c.Clock.Now()
		writeJSON(w, http.StatusOK, Stats{
			C2S: c.Links[C2S].Stats(now), S2C: c.Links[S2C].Stats(now),
			Uptime: now.Sub(c.start).Round(time.Millisecond).String(),
		})
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, c.config())
	})
	mux.HandleFunc("POST /config", func(w http.ResponseWriter, r *http.Request) {
		var u ConfigUpdate
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&u); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("decode config: %w", err))
			return
		}
		if err := c.Apply(u); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusOK, c.config())
	})
	mux.HandleFunc("POST /blackout", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("duration"))
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("duration: want a non-negative Go duration such as 5s: %q", r.URL.Query().Get("duration")))
			return
		}
		dirs, err := dirsOf(r.URL.Query().Get("dir"))
		if err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		now := c.Clock.Now()
		for _, dir := range dirs {
			c.Links[dir].Blackout(now, d)
		}
		writeJSON(w, http.StatusOK, map[string]string{"blackout": d.String(), "dir": r.URL.Query().Get("dir")})
	})
	return mux
}

func dirsOf(s string) ([]string, error) {
	switch s {
	case "", "both":
		return []string{C2S, S2C}, nil
	case C2S, S2C:
		return []string{s}, nil
	default:
		return nil, fmt.Errorf("dir %q: want both, c2s or s2c", s)
	}
}

func (c *Control) config() map[string]map[string]string {
	return map[string]map[string]string{
		C2S: c.Links[C2S].Params().ToMap(),
		S2C: c.Links[S2C].Params().ToMap(),
	}
}

// Apply validates and applies an update to both links, all or nothing.
func (c *Control) Apply(u ConfigUpdate) error {
	both, err := stringify(u.Both)
	if err != nil {
		return err
	}
	next := map[string]Params{}
	var errs []error
	for dir, m := range map[string]map[string]any{C2S: u.C2S, S2C: u.S2C} {
		own, err := stringify(m)
		if err != nil {
			return err
		}
		p, err := c.Links[dir].Params().Apply(both)
		if err == nil {
			p, err = p.Apply(own)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dir, err))
			continue
		}
		next[dir] = p
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for dir, p := range next {
		c.Links[dir].SetParams(p)
	}
	return nil
}

func stringify(m map[string]any) (map[string]string, error) {
	out := make(map[string]string, len(m))
	for k, v := range m {
		switch v := v.(type) {
		case string:
			out[k] = v
		case float64:
			out[k] = strconv.FormatFloat(v, 'g', -1, 64)
		default:
			return nil, fmt.Errorf("%s: want a string or a number, got %T", k, v)
		}
	}
	return out, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

// Client talks to the control API over a UNIX socket.
type Client struct {
	http *http.Client
}

// NewClient returns a client of the control socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://linkem"+path, rd)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("read %s response: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode %s response: %w", path, err)
	}
	return nil
}

// Stats fetches GET /stats.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := c.do(ctx, http.MethodGet, "/stats", nil, &s)
	return s, err
}

// Config fetches GET /config.
func (c *Client) Config(ctx context.Context) (map[string]map[string]string, error) {
	var m map[string]map[string]string
	err := c.do(ctx, http.MethodGet, "/config", nil, &m)
	return m, err
}

// SetConfig posts an update and returns the resulting configuration.
func (c *Client) SetConfig(ctx context.Context, u ConfigUpdate) (map[string]map[string]string, error) {
	var m map[string]map[string]string
	err := c.do(ctx, http.MethodPost, "/config", u, &m)
	return m, err
}

// Blackout starts a blackout of d in dir ("both", "c2s" or "s2c").
func (c *Client) Blackout(ctx context.Context, d time.Duration, dir string) error {
	return c.do(ctx, http.MethodPost, "/blackout?duration="+d.String()+"&dir="+dir, nil, nil)
}
