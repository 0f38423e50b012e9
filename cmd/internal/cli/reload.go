package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/metrics"
)

// Reloadable is a Daemon that takes new settings while it runs: on SIGHUP
// the config file and QUICTUN_* environment are read again, with the same
// precedence as at start (flags given on the command line still win), into
// Options from Fresh, validated as a whole, and handed to the running daemon.
type Reloadable interface {
	Daemon
	// Fresh returns Options holding the defaults, for the config to load into.
	Fresh() Daemon
	// SetReloader is called once before Run with the Reloader to watch.
	SetReloader(r *Reloader)
}

// Apply applies what it can of a reloaded config to the running daemon and
// returns the flags it applied. changed are the flags whose effective value
// differs from the running config; an Apply also re-reads the files it
// reloads (a secret file's contents may change under the same name). It
// must change nothing when it returns an error.
type Apply func(next Daemon, changed []string) (applied []string, err error)

// Reloader loads the daemon's configuration anew and tracks what runs.
type Reloader struct {
	fresh   func() Daemon
	file    string
	cmdline map[string][]string // flags set on the command line, by name
	running map[string]string   // effective value of every flag
}

// newReloader records fs's command-line flags (call it before the config is
// loaded into fs) and returns a Reloader; track must be called once fs holds
// the effective config.
func newReloader(fs *pflag.FlagSet, fresh func() Daemon, file string) *Reloader {
	r := &Reloader{fresh: fresh, file: file, cmdline: map[string][]string{}}
	fs.Visit(func(f *pflag.Flag) { r.cmdline[f.Name] = flagValues(f) })
	return r
}

// track records fs's effective values as the running config.
func (r *Reloader) track(fs *pflag.FlagSet) { r.running = snapshot(fs) }

func flagValues(f *pflag.Flag) []string {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		return sv.GetSlice()
	}
	return []string{f.Value.String()}
}

func snapshot(fs *pflag.FlagSet) map[string]string {
	m := map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) {
		if !slices.Contains(configFlagNames, f.Name) {
			m[f.Name] = f.Value.String()
		}
	})
	return m
}

// load reads the configuration as at start into fresh Options and returns
// them, validated, with the flags whose values differ from the running ones.
func (r *Reloader) load() (Daemon, map[string]string, []string, error) {
	next := r.fresh()
	fs := pflag.NewFlagSet("reload", pflag.ContinueOnError)
	next.Config().AddFlags(fs)
	next.AddFlags(fs)
	// Logging flags are not reloaded (klog's are process-wide); they are
	// declared so that a file setting them still parses, and a change to
	// them is reported as needing a restart.
	fs.String("v", "", "")
	fs.String("vmodule", "", "")
	for name, vals := range r.cmdline {
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		var err error
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			err = sv.Replace(vals)
			f.Changed = true
		} else {
			err = fs.Set(name, vals[0])
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("--%s: %w", name, err)
		}
	}
	if err := LoadConfig(fs, r.file); err != nil {
		return nil, nil, nil, err
	}
	if err := next.Validate(); err != nil {
		return nil, nil, nil, fmt.Errorf("%w:\n%w", ErrUsage, err)
	}
	vals := snapshot(fs)
	var changed []string
	for name, v := range vals {
		if old, ok := r.running[name]; ok && old != v && (name != "v" && name != "vmodule" || v != "") {
			changed = append(changed, name)
		}
	}
	sort.Strings(changed)
	return next, vals, changed, nil
}

// ReloadOnce loads the configuration, hands it to apply, and logs and counts
// the outcome: on any error the running configuration is kept.
func (r *Reloader) ReloadOnce(logger klog.Logger, apply Apply, m *metrics.Reload) {
	next, vals, changed, err := r.load()
	var applied []string
	if err == nil {
		applied, err = apply(next, changed)
	}
	if err != nil {
		m.Failed()
		logger.Error(err, "Configuration reload failed; still running the previous configuration. Fix the file and send SIGHUP again", "config", r.file)
		return
	}
	// The applied flags now run; a change to another still needs a restart.
	for _, name := range applied {
		r.running[name] = vals[name]
	}
	var restart []string
	for _, name := range changed {
		if !slices.Contains(applied, name) {
			restart = append(restart, name)
		}
	}
	m.Succeeded(time.Now())
	if len(restart) > 0 {
		logger.Info("Configuration reloaded, but some changes take effect only after a restart", "needsRestart", restart)
		return
	}
	logger.Info("Configuration reloaded")
}

// LogApplied logs what a reload changed: the key/value pairs of kv whose
// value is not empty (nil, "", false, an empty slice), then note; or, when
// every value is empty, that nothing changed.
func LogApplied(logger klog.Logger, note string, kv ...any) {
	var changes []any
	for i := 0; i+1 < len(kv); i += 2 {
		switch v := kv[i+1].(type) {
		case nil:
			continue
		case string:
			if v == "" {
				continue
			}
		case bool:
			if !v {
				continue
			}
		case []string:
			if len(v) == 0 {
				continue
			}
		}
		changes = append(changes, kv[i], kv[i+1])
	}
	if len(changes) == 0 {
		logger.Info("No changes to apply: the configuration and the files it names are as before")
		return
	}
	logger.Info("Applied configuration changes", append(changes, "note", note)...)
}

// Diff returns the values of next not in cur, and of cur not in next (what a
// reload added and removed, for its log line), in their order. It takes
// linear time: a --keys-file may hold thousands of keys.
func Diff(cur, next []string) (added, removed []string) {
	inCur, inNext := make(map[string]bool, len(cur)), make(map[string]bool, len(next))
	for _, v := range cur {
		inCur[v] = true
	}
	for _, v := range next {
		inNext[v] = true
		if !inCur[v] {
			added = append(added, v)
		}
	}
	for _, v := range cur {
		if !inNext[v] {
			removed = append(removed, v)
		}
	}
	return added, removed
}

// Watch reloads on every SIGHUP until ctx is done.
func (r *Reloader) Watch(ctx context.Context, apply Apply, m *metrics.Reload) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP)
	defer signal.Stop(sigs)
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			logger.Info("Received SIGHUP; reloading the configuration", "config", r.file)
			r.ReloadOnce(logger, apply, m)
		}
	}
}
