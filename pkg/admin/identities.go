package admin

import (
	"net/http"
	"time"

	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/usage"
)

// Identities is the server's accounting by client identity and its kick
// (GET /identities, GET and DELETE /identities/{name}).
type Identities interface {
	// List returns every identity's usage.
	List() []usage.Usage
	// Get returns one identity's usage (false: unknown).
	Get(identity string) (usage.Usage, bool)
	// Kick closes identity's connections and suspends it for d (0: only
	// closes them); it returns how many were closed and when the
	// suspension ends.
	Kick(identity string, d time.Duration) (closed int, until time.Time, err error)
}

// MaxSuspension bounds DELETE /identities/{name}?for=: a longer ban is a
// key removed from --keys-file.
const MaxSuspension = 366 * 24 * time.Hour

// identitiesHandlers mounts the /identities endpoints on mux.
func identitiesHandlers(mux *http.ServeMux, ids Identities, protect func(http.Handler) http.Handler) {
	mux.Handle("GET /identities", protect(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, ids.List())
	})))
	mux.Handle("GET /identities/{name}", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok := ids.Get(r.PathValue("name"))
		if !ok {
			http.Error(w, "no such identity", http.StatusNotFound)
			return
		}
		writeJSON(w, u)
	})))
	mux.Handle("DELETE /identities/{name}", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		var d time.Duration
		if f := r.URL.Query().Get("for"); f != "" {
			var err error
			if d, err = time.ParseDuration(f); err != nil || d < 0 || d > MaxSuspension {
				http.Error(w, "for: a duration between 0s and 8784h, e.g. for=10m", http.StatusBadRequest)
				return
			}
		}
		closed, until, err := ids.Kick(name, d)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// The audit line: who was disconnected, for how long, by which
		// admin client.
		klog.FromContext(r.Context()).Info("Kicked identity: its connections were closed (suspended)", "identity", name,
			"suspendedFor", d, "until", until, "connectionsClosed", closed, "adminClient", r.RemoteAddr)
		writeJSON(w, struct {
			Identity          string    `json:"identity"`
			ConnectionsClosed int       `json:"connectionsClosed"`
			SuspendedUntil    time.Time `json:"suspendedUntil,omitzero"`
		}{name, closed, until})
	})))
}
