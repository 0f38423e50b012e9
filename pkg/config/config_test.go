package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testFlags returns a flag set shaped like quictun-client's.
func testFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.String("config", "", "YAML config file")
	fs.String("server-endpoint", "127.0.0.1:7500", "QUIC server HOST:PORT")
	fs.StringSlice("listen-on", []string{"tcp:127.0.0.1:6500"}, "local listeners")
	fs.StringArray("allow", nil, "destination allow-list rules\n(one per entry)")
	fs.Duration("drain-timeout", 30*time.Second, "how long to drain on shutdown")
	fs.Bool("insecure-no-auth", false, "disable client authentication")
	fs.Int("max-streams", 100, "maximum concurrent streams")
	fs.IntSlice("ports", []int{1, 2}, "some ports")
	fs.StringToString("labels", map[string]string{}, "extra labels")
	fs.Float64("ratio", 0.5, "a ratio")
	fs.String("name", "", "a free-form name")
	return fs
}

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestPrecedence(t *testing.T) {
	t.Parallel()
	const file = "server-endpoint: a:7500\ndrain-timeout: 10s\n"
	tests := []struct {
		name     string
		file     string
		env      map[string]string
		args     []string
		want     string
		wantTime time.Duration
	}{
		{"default", "", nil, nil, "127.0.0.1:7500", 30 * time.Second},
		{"file", file, nil, nil, "a:7500", 10 * time.Second},
		{"env beats file", file, map[string]string{"QUICTUN_SERVER_ENDPOINT": "b:7500"}, nil, "b:7500", 10 * time.Second},
		{"flag beats env and file", file, map[string]string{"QUICTUN_SERVER_ENDPOINT": "b:7500", "QUICTUN_DRAIN_TIMEOUT": "1m"},
			[]string{"--server-endpoint", "c:7500"}, "c:7500", time.Minute},
		{"env without file", "", map[string]string{"QUICTUN_SERVER_ENDPOINT": "b:7500"}, nil, "b:7500", 30 * time.Second},
		{"flag equal to default still wins", file, nil, []string{"--server-endpoint=127.0.0.1:7500", "--drain-timeout=30s"}, "127.0.0.1:7500", 30 * time.Second},
		{"empty env is a value", file, map[string]string{"QUICTUN_SERVER_ENDPOINT": ""}, nil, "", 10 * time.Second},
		{"other prefix ignored", file, map[string]string{"OTHER_SERVER_ENDPOINT": "x"}, nil, "a:7500", 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := testFlags()
			require.NoError(t, fs.Parse(tc.args))
			path := ""
			if tc.file != "" {
				path = writeConfig(t, tc.file)
			}
			require.NoError(t, Load(fs, path, "QUICTUN", envMap(tc.env), "config"))
			got, err := fs.GetString("server-endpoint")
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			d, err := fs.GetDuration("drain-timeout")
			require.NoError(t, err)
			assert.Equal(t, tc.wantTime, d)
		})
	}
}

func TestSlices(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		file       string
		env        map[string]string
		args       []string
		wantListen []string
		wantAllow  []string
	}{
		{"defaults", "", nil, nil, []string{"tcp:127.0.0.1:6500"}, []string{}},
		{"file sequences", "listen-on:\n  - tcp:0.0.0.0:1\n  - unix:/run/a.sock\nallow: [\"tcp:10.0.0.0/8:*\", \"x,y\"]\n", nil, nil,
			[]string{"tcp:0.0.0.0:1", "unix:/run/a.sock"}, []string{"tcp:10.0.0.0/8:*", "x,y"}},
		{"file scalar is comma separated", "listen-on: tcp:0.0.0.0:1,tcp:0.0.0.0:2\n", nil, nil,
			[]string{"tcp:0.0.0.0:1", "tcp:0.0.0.0:2"}, []string{}},
		{"file empty list", "listen-on: []\n", nil, nil, []string{}, []string{}},
		{"env replaces file, no append", "listen-on: [tcp:0.0.0.0:1]\n", map[string]string{"QUICTUN_LISTEN_ON": "tcp:0.0.0.0:3,tcp:0.0.0.0:4"}, nil,
			[]string{"tcp:0.0.0.0:3", "tcp:0.0.0.0:4"}, []string{}},
		{"flag replaces file", "listen-on: [tcp:0.0.0.0:1]\n", nil, []string{"--listen-on=tcp:0.0.0.0:9"},
			[]string{"tcp:0.0.0.0:9"}, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := testFlags()
			require.NoError(t, fs.Parse(tc.args))
			path := ""
			if tc.file != "" {
				path = writeConfig(t, tc.file)
			}
			require.NoError(t, Load(fs, path, "QUICTUN", envMap(tc.env), "config"))
			got, err := fs.GetStringSlice("listen-on")
			require.NoError(t, err)
			assert.Equal(t, tc.wantListen, got)
			allow, err := fs.GetStringArray("allow")
			require.NoError(t, err)
			assert.Equal(t, tc.wantAllow, allow)
		})
	}
}

func TestOtherTypes(t *testing.T) {
	t.Parallel()
	fs := testFlags()
	path := writeConfig(t, "insecure-no-auth: true\nmax-streams: 7\nports: [3, 4]\nlabels: {a: \"1\", b: \"2\"}\nratio: 0.25\nname: ~\n")
	require.NoError(t, Load(fs, path, "QUICTUN", nil))
	b, _ := fs.GetBool("insecure-no-auth")
	assert.True(t, b)
	n, _ := fs.GetInt("max-streams")
	assert.Equal(t, 7, n)
	ports, _ := fs.GetIntSlice("ports")
	assert.Equal(t, []int{3, 4}, ports)
	labels, _ := fs.GetStringToString("labels")
	assert.Equal(t, map[string]string{"a": "1", "b": "2"}, labels)
	r, _ := fs.GetFloat64("ratio")
	assert.InDelta(t, 0.25, r, 0)
	assert.False(t, fs.Changed("name"), "null leaves the flag alone")
	assert.True(t, fs.Changed("max-streams"))
	assert.True(t, fs.Changed("ports"))
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		file    string
		env     map[string]string
		wantErr error
		wantSub []string
	}{
		{"unknown key", "server-endpoint: a:1\n\nsever-endpoint: b:1\n", nil, ErrUnknownKey,
			[]string{`c.yaml:3: unknown key "sever-endpoint"`, `did you mean "server-endpoint"`}},
		{"unknown key far", "bogus: 1\n", nil, ErrUnknownKey, []string{`c.yaml:1: unknown key "bogus"`}},
		{"skipped key", "config: other.yaml\n", nil, ErrForbiddenKey, []string{`c.yaml:1:`, `"config"`}},
		{"help key", "help: true\n", nil, ErrForbiddenKey, []string{`"help"`}},
		{"duplicate", "name: a\nname: b\n", nil, ErrDuplicateKey, []string{`c.yaml:2: duplicate key "name" (first on line 1)`}},
		{"bad duration", "drain-timeout: 3x\n", nil, ErrInvalidValue, []string{`c.yaml:1:`, `"drain-timeout"`, `3x`}},
		{"bad bool", "insecure-no-auth: maybe\n", nil, ErrInvalidValue, []string{`"insecure-no-auth"`}},
		{"bad int in list", "ports: [1, x]\n", nil, ErrInvalidValue, []string{`"ports"`}},
		{"list for scalar", "name: [a, b]\n", nil, ErrInvalidValue, []string{`list is only allowed`}},
		{"map for scalar", "name: {a: b}\n", nil, ErrInvalidValue, []string{`mapping is only allowed`}},
		{"nested list", "listen-on: [[a]]\n", nil, ErrInvalidValue, []string{`scalars`}},
		{"alias", "name: &x a\nserver-endpoint: *x\n", nil, ErrInvalidValue, []string{`aliases`}},
		{"merge key", "<<: {name: a}\n", nil, ErrUnknownKey, []string{`"<<"`}},
		{"not a mapping", "- a\n- b\n", nil, ErrSyntax, []string{`top level must be a mapping`}},
		{"two documents", "name: a\n---\nname: b\n", nil, ErrSyntax, []string{`one YAML document`}},
		{"syntax", "name: a\n  b: c\n", nil, ErrSyntax, []string{`c.yaml`, `line 2`}},
		{"tab indent", "name:\n\t- a\n", nil, ErrSyntax, []string{`c.yaml`}},
		{"shorthand not a key", "n: a\n", nil, ErrUnknownKey, []string{`"n"`}},
		{"bad env", "", map[string]string{"QUICTUN_DRAIN_TIMEOUT": "soon"}, ErrInvalidValue,
			[]string{`environment QUICTUN_DRAIN_TIMEOUT`, `--drain-timeout`, `"soon"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := testFlags()
			fs.StringP("short", "n", "", "has a shorthand")
			fs.BoolP("help", "h", false, "help")
			err := Load(fs, writeConfig(t, tc.file), "QUICTUN", envMap(tc.env), "config")
			require.ErrorIs(t, err, tc.wantErr)
			for _, s := range tc.wantSub {
				assert.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestLoadReportsAllProblems(t *testing.T) {
	t.Parallel()
	fs := testFlags()
	err := Load(fs, writeConfig(t, "bogus: 1\ndrain-timeout: x\nmax-streams: y\n"), "QUICTUN",
		envMap(map[string]string{"QUICTUN_RATIO": "z"}), "config")
	require.ErrorIs(t, err, ErrUnknownKey)
	require.ErrorIs(t, err, ErrInvalidValue)
	for _, s := range []string{":1:", ":2:", ":3:", "QUICTUN_RATIO"} {
		assert.Contains(t, err.Error(), s)
	}
}

func TestLoadFileProblems(t *testing.T) {
	t.Parallel()
	fs := testFlags()
	err := Load(fs, filepath.Join(t.TempDir(), "missing.yaml"), "QUICTUN", nil)
	require.ErrorIs(t, err, os.ErrNotExist)

	big := writeConfig(t, "name: "+strings.Repeat("a", MaxFileSize)+"\n")
	require.ErrorIs(t, Load(fs, big, "QUICTUN", nil), ErrSyntax)

	for _, empty := range []string{"", "# only a comment\n", "~\n", "---\n"} {
		require.NoError(t, Load(testFlags(), writeConfig(t, empty), "QUICTUN", nil), "%q", empty)
	}
}

func TestEnvSkipped(t *testing.T) {
	t.Parallel()
	fs := testFlags()
	fs.Bool("help", false, "help")
	env := map[string]string{"QUICTUN_CONFIG": "x.yaml", "QUICTUN_HELP": "true"}
	require.NoError(t, Load(fs, "", "QUICTUN", envMap(env), "config"))
	assert.False(t, fs.Changed("config"))
	assert.False(t, fs.Changed("help"))
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "QUICTUN_SERVER_ENDPOINT", EnvName("QUICTUN", "server-endpoint"))
	assert.Equal(t, "WEB_LISTEN_ADDRESS", EnvName("", "web.listen-address"))
}

func TestWriteYAMLRoundTrip(t *testing.T) {
	t.Parallel()
	src := testFlags()
	require.NoError(t, src.Parse([]string{
		"--server-endpoint", "true", // a string that YAML would read as a bool
		"--listen-on", "tcp:0.0.0.0:1,unix:/run/a b.sock",
		"--allow", "x,y", "--allow", "null",
		"--drain-timeout", "1m30s",
		"--insecure-no-auth",
		"--max-streams", "-3",
		"--ports", "8,9",
		"--labels", "k=v,a=b: c",
		"--ratio", "1e-3",
		"--name", "line1\nline2 # not a comment",
	}))
	var out bytes.Buffer
	require.NoError(t, WriteYAML(&out, src, "config"))
	text := out.String()
	assert.NotContains(t, text, "\nconfig:")
	assert.Contains(t, text, "# destination allow-list rules\n# (one per entry)\nallow:")
	assert.True(t, strings.HasPrefix(text, "# QUIC server HOST:PORT\nserver-endpoint:"), "flag order kept:\n%s", text)

	dst := testFlags()
	require.NoError(t, Load(dst, writeConfig(t, text), "QUICTUN", nil, "config"), text)
	src.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		assert.Equal(t, f.Value.String(), dst.Lookup(f.Name).Value.String(), "flag %s round trip:\n%s", f.Name, text)
	})
}

func TestWriteYAMLDefaultsRoundTrip(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, WriteYAML(&out, testFlags()))
	dst := testFlags()
	require.NoError(t, Load(dst, writeConfig(t, out.String()), "", nil), out.String())
	testFlags().VisitAll(func(f *pflag.Flag) {
		assert.Equal(t, f.Value.String(), dst.Lookup(f.Name).Value.String(), f.Name)
	})
}

func TestWriteYAMLRedacted(t *testing.T) {
	t.Parallel()
	fs := testFlags()
	require.NoError(t, fs.Set("name", "s3cret"))
	fs.Bool("old", false, "old flag")
	require.NoError(t, fs.MarkDeprecated("old", "use new"))
	var out bytes.Buffer
	require.NoError(t, WriteYAMLRedacted(&out, fs, []string{"name"}, "config"))
	assert.NotContains(t, out.String(), "s3cret")
	assert.Contains(t, out.String(), "# name: "+RedactedValue)
	assert.NotContains(t, out.String(), "old")

	dst := testFlags()
	require.NoError(t, Load(dst, writeConfig(t, out.String()), "", nil, "config"))
	assert.False(t, dst.Changed("name"))

	var empty bytes.Buffer
	require.NoError(t, WriteYAML(&empty, pflag.NewFlagSet("e", pflag.ContinueOnError)))
	assert.Equal(t, "{}\n", empty.String())
	require.NoError(t, Load(testFlags(), writeConfig(t, empty.String()), "", nil))
}

func FuzzLoad(f *testing.F) {
	var buf bytes.Buffer
	fs := testFlags()
	_ = fs.Parse([]string{"--allow", "a", "--labels", "k=v"})
	if err := WriteYAML(&buf, fs, "config"); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.String())
	f.Add("server-endpoint: a:7500\nlisten-on: [a, b]\n")
	f.Add("labels: {a: b}\nname: &x y\nratio: *x\n")
	f.Add("- 1\n")
	f.Add("drain-timeout: 3x\n---\n")
	f.Fuzz(func(t *testing.T, data string) {
		fs := testFlags()
		env := envMap(map[string]string{"QUICTUN_MAX_STREAMS": "5"})
		err := load(fs, "fuzz.yaml", []byte(data), "QUICTUN", env, []string{"config"})
		if err == nil {
			// What loaded cleanly writes out and loads back to the same values.
			var out bytes.Buffer
			require.NoError(t, WriteYAML(&out, fs, "config"))
			again := testFlags()
			require.NoError(t, load(again, "out.yaml", out.Bytes(), "", nil, []string{"config"}), out.String())
			fs.VisitAll(func(fl *pflag.Flag) {
				require.Equal(t, fl.Value.String(), again.Lookup(fl.Name).Value.String(), fl.Name)
			})
		}
	})
}

func TestUnknownEnv(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("server-endpoint", "", "")
	fs.String("listen-on", "", "")
	fs.String("config", "", "")
	environ := []string{
		"QUICTUN_SERVER_ENDPOINT=a:1", // a flag
		"QUICTUN_SERVER_ENDPONT=b:2",  // typo
		"QUICTUN_LISTENON=x",          // typo
		"QUICTUN_CONFIG=/etc/c.yaml",  // extra
		"QUICTUN_NOTHING_LIKE_IT=1",   // unknown, no suggestion
		"QUICTUN_HELP=1",              // help is never read
		"PATH=/bin", "QUICTUNNEL_X=1", // other prefixes
	}
	got := UnknownEnv(fs, "QUICTUN", environ, []string{"QUICTUN_CONFIG"}, "config")
	assert.Equal(t, []string{
		"QUICTUN_HELP",
		"QUICTUN_LISTENON (did you mean QUICTUN_LISTEN_ON?)",
		"QUICTUN_NOTHING_LIKE_IT",
		"QUICTUN_SERVER_ENDPONT (did you mean QUICTUN_SERVER_ENDPOINT?)",
	}, got)
	for _, g := range got {
		assert.NotContains(t, g, "b:2", "values are never returned")
	}
}

func TestSuggestFlag(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	for _, n := range []string{"listen-on", "listen-non-loopback", "allow", "allow-for", "server-endpoint", "secret"} {
		fs.String(n, "", "")
	}
	fs.String("hidden-flag", "", "")
	require.NoError(t, fs.MarkHidden("hidden-flag"))
	for _, tc := range []struct{ typed, want string }{
		{"lisen-on", "listen-on"},
		{"alow", "allow"},
		{"allow-fro", "allow-for"},
		{"server", "server-endpoint"}, // the one flag it starts
		{"listen", ""},                // two flags start so
		{"se", ""},                    // too short to be a prefix
		{"hiden-flag", ""},            // hidden flags are not suggested
		{"nothing-like-it", ""},
	} {
		assert.Equal(t, tc.want, SuggestFlag(fs, tc.typed), tc.typed)
	}
}
