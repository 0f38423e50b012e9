package cli_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/pkg/metrics"
)

// reloadDaemon is a Reloadable whose Run performs the reloads the test asks
// for, between edits of its config file.
type reloadDaemon struct {
	cf    cli.ConfigFlags
	name  string
	count int
	rules []string
	bad   bool

	reloader *cli.Reloader
	run      func(r *cli.Reloader)
}

func (d *reloadDaemon) Config() *cli.ConfigFlags { return &d.cf }
func (d *reloadDaemon) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&d.name, "name", "default", "a name")
	fs.IntVar(&d.count, "count", 1, "a count (needs a restart)")
	fs.StringSliceVar(&d.rules, "rules", []string{"a"}, "rules")
	fs.BoolVar(&d.bad, "bad", false, "makes Validate fail")
}

func (d *reloadDaemon) Validate() error {
	if d.bad {
		return errors.New("--bad is set")
	}
	return nil
}
func (d *reloadDaemon) Run(context.Context) error { d.run(d.reloader); return nil }
func (d *reloadDaemon) Fresh() cli.Daemon         { return &reloadDaemon{} }
func (d *reloadDaemon) SetReloader(r *cli.Reloader) {
	d.reloader = r
}

type reloadResult struct {
	next    *reloadDaemon
	changed []string
}

func TestReload(t *testing.T) {
	for _, k := range []string{"QUICTUN_NAME", "QUICTUN_COUNT", "QUICTUN_RULES", "QUICTUN_BAD", "QUICTUN_CONFIG"} {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
	file := filepath.Join(t.TempDir(), "c.yaml")
	write := func(s string) { require.NoError(t, os.WriteFile(file, []byte(s), 0o600)) }
	write("name: from-file\nrules: [a, b]\n")

	var logs bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs)))
	reg := prometheus.NewRegistry()
	m := metrics.NewReload(reg, "test")
	var got []reloadResult
	var applyErr error
	apply := func(d cli.Daemon, changed []string) ([]string, error) {
		if applyErr != nil {
			return nil, applyErr
		}
		got = append(got, reloadResult{d.(*reloadDaemon), changed})
		var applied []string
		for _, c := range changed {
			if c == "rules" || c == "name" {
				applied = append(applied, c)
			}
		}
		return applied, nil
	}
	reload := func(r *cli.Reloader) { r.ReloadOnce(logger, apply, m) }
	total := func(result string) float64 { return promtest.ToFloat64(m.Total.WithLabelValues(result)) }

	d := &reloadDaemon{run: func(r *cli.Reloader) {
		// 1. Nothing changed.
		reload(r)
		require.Len(t, got, 1)
		assert.Empty(t, got[0].changed)
		assert.Equal(t, "cmdline", got[0].next.name, "the command line wins over the file")

		// 2. The file changes rules and count: rules applied, count needs a restart.
		write("name: from-file\nrules: [b, c]\ncount: 5\n")
		logs.Reset()
		reload(r)
		require.Len(t, got, 2)
		assert.Equal(t, []string{"count", "rules"}, got[1].changed)
		assert.Equal(t, []string{"b", "c"}, got[1].next.rules)
		assert.Contains(t, logs.String(), `needsRestart=["count"]`)

		// 3. The same file again: rules now run, count still differs.
		reload(r)
		assert.Equal(t, []string{"count"}, got[2].changed)

		// 4. A flag from the command line wins over the file, as at start.
		write("name: changed-in-file\nrules: [b, c]\ncount: 5\n")
		reload(r)
		assert.Equal(t, "cmdline", got[3].next.name)
		assert.Equal(t, []string{"count"}, got[3].changed)

		// 5. An invalid file is refused as a whole: no apply, failure counted.
		write("name: x\nrules: [d]\nbad: true\n")
		logs.Reset()
		reload(r)
		assert.Len(t, got, 4, "apply must not run")
		assert.Contains(t, logs.String(), "still running the previous configuration")
		assert.Contains(t, logs.String(), "--bad is set")
		assert.Equal(t, 0.0, promtest.ToFloat64(m.LastSuccessful))

		// 6. A syntax error and an unknown key too.
		write("rules: [\n")
		reload(r)
		write("nmae: typo\n")
		reload(r)
		assert.Len(t, got, 4)

		// 7. An apply error is a failure too.
		write("name: from-file\nrules: [e]\n")
		applyErr = errors.New("cannot apply")
		reload(r)
		applyErr = nil

		// 8. Fixed: success again.
		reload(r)
		require.Len(t, got, 5)
		assert.Equal(t, []string{"rules"}, got[4].changed, "count went back to its default, the running value")
		assert.Equal(t, 1.0, promtest.ToFloat64(m.LastSuccessful))
	}}
	cmd := cli.NewRootCommand("fake", d, nil)
	cmd.SetArgs([]string{"--config", file, "--name", "cmdline"})
	cmd.SetOut(&bytes.Buffer{})
	require.NoError(t, cmd.ExecuteContext(klog.NewContext(context.Background(), logger)))
	require.NotNil(t, d.reloader)
	assert.Equal(t, 5.0, total(metrics.ReloadSuccess))
	assert.Equal(t, 4.0, total(metrics.ReloadFailure))
}

func TestDiff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cur, next, added, removed []string
	}{
		{nil, nil, nil, nil},
		{[]string{"a"}, []string{"a"}, nil, nil},
		{[]string{"a"}, []string{"a", "b"}, []string{"b"}, nil},
		{[]string{"a", "b"}, []string{"b", "c"}, []string{"c"}, []string{"a"}},
		{[]string{"a"}, nil, nil, []string{"a"}},
	} {
		added, removed := cli.Diff(tc.cur, tc.next)
		assert.Equal(t, tc.added, added, "%v -> %v", tc.cur, tc.next)
		assert.Equal(t, tc.removed, removed, "%v -> %v", tc.cur, tc.next)
	}
}

func TestLogApplied(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		kv      []any
		want    []string
		notWant []string
	}{
		{"nothing changed", []any{"allowAdded", []string(nil), "keysRemoved", []string{}, "secretChanged", false, "plugin", ""},
			[]string{`"No changes to apply: the configuration and the files it names are as before"`},
			[]string{"Applied", "null", "allowAdded", "secretChanged", "note"}},
		{"only what changed", []any{"allowAdded", []string{"tcp:10.0.0.1:22"}, "allowRemoved", []string(nil), "secretChanged", true},
			[]string{`"Applied configuration changes" allowAdded=["tcp:10.0.0.1:22"] secretChanged=true note="the note"`},
			[]string{"allowRemoved", "null", "No changes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			cli.LogApplied(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logs))), "the note", tc.kv...)
			for _, w := range tc.want {
				assert.Contains(t, logs.String(), w)
			}
			for _, w := range tc.notWant {
				assert.NotContains(t, logs.String(), w)
			}
		})
	}
}
