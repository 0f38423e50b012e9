// Package admin serves the operator HTTP endpoints of a quictun endpoint:
// /metrics, /healthz, /readyz, the tunnel and connection lists, and
// /debug/pprof when enabled. Without the bearer token it answers only
// requests that name a loopback or the listener's own address in Host and
// that no web page of another origin sent (guard.go: DNS rebinding).
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quictun/quictun/pkg/congestion"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/tunnel"
)

// Options configure the admin server.
type Options struct {
	Gatherer prometheus.Gatherer
	// Ready reports readiness for /readyz.
	Ready func() bool
	// Registry lists and closes tunnels (GET/DELETE /tunnels).
	Registry *tunnel.Registry
	// Conns lists the connections and their statistics (GET /connections).
	Conns func() []transport.ConnStats
	// Identities, if set, serves the accounting by client identity and the
	// kick (GET /identities, GET and DELETE /identities/{name}).
	Identities Identities
	// EnablePprof mounts /debug/pprof.
	EnablePprof bool
	// BearerToken, when set, is required on every request except /healthz and /readyz.
	BearerToken string
	// ListenAddr is the admin listener's own address (nil: unknown). A
	// request without the valid bearer token is answered only if its Host
	// names a loopback name or address or this address's IP (not a
	// wildcard's), and is refused when its Origin header says a web page sent
	// it (any Origin on a method that changes state, another host's on GET,
	// HEAD and OPTIONS); /healthz and /readyz are exempt. This stops DNS
	// rebinding (issue 21).
	ListenAddr net.Addr
	// Refused, when set, is told of each request refused by that rule, by
	// reason (RefusedHost, RefusedOrigin): the daemon's metrics
	// (metrics.NewAdminRefused).
	Refused func(reason string)
}

// congestionState is a connection's congestion controller in /connections.
type congestionState struct {
	Algorithm             string  `json:"algorithm"`
	State                 string  `json:"state"`
	CongestionWindow      int     `json:"congestionWindowBytes"`
	PacingRate            float64 `json:"pacingRateBytesPerSecond"`
	BandwidthEstimate     float64 `json:"bandwidthEstimateBytesPerSecond"`
	MinRTTSeconds         float64 `json:"minRttSeconds"`
	InflightCap           int     `json:"inflightCapBytes"`
	LossRateLastRoundTrip float64 `json:"lossRateLastRoundTrip"`
	// RandomLossRate is bbr's estimate of the path's random loss (loss
	// that is not congestion), measured on packets sent below its model.
	RandomLossRate float64 `json:"randomLossRate"`
	// PacketLossRate is bbr's share of all packets lost over about the
	// last 100, random or not: above 2 % (and without a recent congestive
	// round) the last packet before the sender runs dry is sent again.
	PacketLossRate float64 `json:"packetLossRate"`
	// RoundTrips counts bbr's round trips, CongestiveRoundTrips those whose
	// loss it took for congestion (each capped bytes in flight).
	RoundTrips           int64 `json:"roundTrips,omitempty"`
	CongestiveRoundTrips int64 `json:"congestiveRoundTrips,omitempty"`
}

func congestionStateOf(s *congestion.Stats) *congestionState {
	if s == nil {
		return nil
	}
	return &congestionState{
		Algorithm: string(s.Algorithm), State: s.State, CongestionWindow: s.CongestionWindowBytes,
		PacingRate: s.PacingRateBytesPerSecond, BandwidthEstimate: s.BandwidthBytesPerSecond,
		MinRTTSeconds: s.MinRTT.Seconds(), InflightCap: s.InflightCap, LossRateLastRoundTrip: s.LossRate,
		RandomLossRate: s.RandomLoss, PacketLossRate: s.PacketLoss, RoundTrips: s.RoundTrips, CongestiveRoundTrips: s.CongestiveRoundTrips,
	}
}

// Handler returns the admin HTTP handler: the endpoints behind the bearer
// token (when set) and the Host and Origin rule of Options.ListenAddr.
//
//nolint:funlen // the route table: one line per endpoint reads better as one list
func Handler(o Options) http.Handler {
	mux := http.NewServeMux()
	g := newGuard(o)
	protect := func(h http.Handler) http.Handler {
		if o.BearerToken == "" {
			return h
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !g.validToken(r) {
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	mux.Handle("GET /metrics", protect(promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{
		MaxRequestsInFlight: 4, ErrorHandling: promhttp.ContinueOnError,
	})))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { writeIndex(w, o) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if o.Ready != nil && !o.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	if o.Registry != nil {
		mux.Handle("GET /tunnels", protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, o.Registry.List(time.Now()))
		})))
		mux.Handle("DELETE /tunnels/{id}", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, found, err := o.Registry.Lookup(r.PathValue("id"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if !found || !o.Registry.Abort(id, proto.CodeShutdown) {
				http.Error(w, "no such tunnel", http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})))
	}
	if o.Conns != nil {
		mux.Handle("GET /connections", protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			// quicFields are a QUIC connection's figures, absent for a
			// TCP fallback connection.
			type quicFields struct {
				SmoothedRTTSeconds float64 `json:"smoothedRttSeconds"`
				MinRTTSeconds      float64 `json:"minRttSeconds"`
				LatestRTTSeconds   float64 `json:"latestRttSeconds"`
				RTTVarianceSeconds float64 `json:"rttVarianceSeconds"`
				CongestionWindow   uint64  `json:"congestionWindowBytes"`
				BytesSent          uint64  `json:"bytesSent"`
				BytesReceived      uint64  `json:"bytesReceived"`
				BytesLost          uint64  `json:"bytesLost"`
				PacketsSent        uint64  `json:"packetsSent"`
				PacketsReceived    uint64  `json:"packetsReceived"`
				PacketsLost        uint64  `json:"packetsLost"`
				// TailCopiesSent counts copies of tail packets (bbr on a lossy path).
				TailCopiesSent uint64 `json:"tailCopiesSent"`
				// Congestion is quictun's controller's state; absent with reno (quic-go's own).
				Congestion *congestionState `json:"congestion,omitempty"`
			}
			type conn struct {
				ID             string `json:"id"`
				Transport      string `json:"transport"`
				RemoteAddress  string `json:"remoteAddress"`
				LocalAddress   string `json:"localAddress"`
				ClientIdentity string `json:"clientIdentity,omitempty"`
				ClientSubject  string `json:"clientSubject,omitempty"`
				*quicFields
			}
			cs := o.Conns()
			out := make([]conn, 0, len(cs))
			for _, c := range cs {
				e := conn{ID: c.Label, Transport: c.Transport, RemoteAddress: c.RemoteAddress, LocalAddress: c.LocalAddress,
					ClientIdentity: c.ClientIdentity, ClientSubject: c.ClientSubject}
				if c.Transport != transport.TransportTCP {
					s := c.Stats
					e.quicFields = &quicFields{
						SmoothedRTTSeconds: s.SmoothedRTT.Seconds(), MinRTTSeconds: s.MinRTT.Seconds(),
						LatestRTTSeconds: s.LatestRTT.Seconds(), RTTVarianceSeconds: s.MeanDeviation.Seconds(),
						CongestionWindow: uint64(s.CongestionWindow), BytesSent: s.BytesSent, BytesReceived: s.BytesReceived,
						BytesLost: s.BytesLost, PacketsSent: s.PacketsSent, PacketsReceived: s.PacketsReceived, PacketsLost: s.PacketsLost,
						TailCopiesSent: s.TailCopiesSent, Congestion: congestionStateOf(c.Congestion),
					}
				}
				out = append(out, e)
			}
			writeJSON(w, out)
		})))
	}
	if o.Identities != nil {
		identitiesHandlers(mux, o.Identities, protect)
	}
	if o.EnablePprof {
		mux.Handle("/debug/pprof/", protect(http.HandlerFunc(pprof.Index)))
		mux.Handle("/debug/pprof/cmdline", protect(http.HandlerFunc(pprof.Cmdline)))
		mux.Handle("/debug/pprof/profile", protect(http.HandlerFunc(pprof.Profile)))
		mux.Handle("/debug/pprof/symbol", protect(http.HandlerFunc(pprof.Symbol)))
		mux.Handle("/debug/pprof/trace", protect(http.HandlerFunc(pprof.Trace)))
	}
	return g.wrap(mux)
}

// writeIndex answers GET / with the endpoints this admin server serves, so
// that a first look at the port is not a bare 404. It names paths only.
func writeIndex(w http.ResponseWriter, o Options) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	auth := ""
	if o.BearerToken != "" {
		auth = " (bearer token)"
	}
	lines := []string{"quictun admin API", "",
		"GET /metrics              Prometheus metrics" + auth,
		"GET /healthz              liveness: ok while the process serves",
		"GET /readyz               readiness: ok, or 503 while not ready (draining; a client not connected)"}
	if o.Registry != nil {
		lines = append(lines, "GET /tunnels              open tunnels, JSON"+auth,
			"DELETE /tunnels/{id}      reset one tunnel"+auth)
	}
	if o.Conns != nil {
		lines = append(lines, "GET /connections          connections and their QUIC figures, JSON"+auth)
	}
	if o.EnablePprof {
		lines = append(lines, "GET /debug/pprof/         Go profiles"+auth)
	}
	lines = append(lines, "", "Metrics and endpoints: docs/operations.md")
	_, _ = fmt.Fprintln(w, strings.Join(lines, "\n"))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Serve serves h on ln until ctx is cancelled, then shuts down within 5 s.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		// Requests log with ctx's logger; they are not cancelled with it (Shutdown lets them finish).
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running (a long pprof profile, a slow scraper) are cut off.
		_ = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("admin server: %w", serr)
	}
	return nil
}

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
