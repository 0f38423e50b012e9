package cli_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/quictun/quictun/cmd/internal/cli"
	"github.com/quictun/quictun/internal/testutil"
	"github.com/quictun/quictun/pkg/config"
	"github.com/quictun/quictun/pkg/transport"
	"github.com/quictun/quictun/pkg/version"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fileWriter returns a function writing files (mode 0600) into a temp dir.
func fileWriter(t *testing.T) func(name, content string) string {
	dir := t.TempDir()
	return func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
}

func TestReadSecretFile(t *testing.T) {
	t.Parallel()
	write := fileWriter(t)
	dir := filepath.Dir(write("placeholder", ""))
	for _, tc := range []struct {
		name    string
		path    string
		want    string
		wantErr string
	}{
		{"trimmed", write("ok", "  0123456789abcdef\n\n"), "0123456789abcdef", ""},
		{"inner spaces kept", write("inner", "0123 4567 89ab cdef"), "0123 4567 89ab cdef", ""},
		{"too short after trimming", write("short", "0123456789abcde \n"), "", "at least 16 bytes"},
		{"empty", write("empty", "\n"), "", "at least 16 bytes"},
		{"missing", filepath.Join(dir, "missing"), "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := cli.ReadSecretFile("secret-file", tc.path, 16)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.Contains(t, err.Error(), "--secret-file", "names the flag")
				assert.NotContains(t, err.Error(), "0123456789abcde", "never prints the secret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, string(got))
		})
	}
}

func TestListenAdmin(t *testing.T) {
	t.Parallel()
	ln, err := cli.ListenAdmin("", "")
	require.NoError(t, err)
	assert.Nil(t, ln, "empty address disables the admin server")

	_, err = cli.ListenAdmin("0.0.0.0:0", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--httpd-token-file")

	for _, tc := range []struct{ addr, token string }{
		{"127.0.0.1:0", ""},
		{"127.0.0.1:0", "tok"},
		{"0.0.0.0:0", "tok"}, // non-loopback with a token is allowed (bound to all interfaces)
	} {
		ln, err := cli.ListenAdmin(tc.addr, tc.token)
		require.NoError(t, err, tc.addr)
		require.NotNil(t, ln)
		require.NoError(t, ln.Close())
	}

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = busy.Close() }()
	_, err = cli.ListenAdmin(busy.Addr().String(), "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin listener")
	assert.ErrorIs(t, err, syscall.EADDRINUSE)
	assert.Contains(t, err.Error(), "set --httpd-listen-on to a free address for this one (127.0.0.1:0 picks a free port and logs it)",
		"a port in use names the flag to set")
}

func TestNewRegistry(t *testing.T) {
	t.Parallel()
	mfs, err := cli.NewRegistry().Gather()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	assert.True(t, names["quictun_build_info"])
	assert.True(t, names["go_goroutines"])
	// process_* metrics exist only where procfs is readable (Linux).
	assert.True(t, names["process_open_fds"] || names["process_cpu_seconds_total"])
}

func TestAddKlogFlags(t *testing.T) {
	t.Parallel()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	cli.AddKlogFlags(fs)
	var names []string
	fs.VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	assert.ElementsMatch(t, []string{"v", "vmodule"}, names, "only -v and --vmodule, no klog file flags")
	require.Error(t, fs.Set("v", "loud"), "klog validates the value")
	assert.Equal(t, "0", fs.Lookup("v").Value.String())
	require.NoError(t, fs.Parse([]string{"-v=2", "--vmodule=server=4"}), "-v is a shorthand, as klog's own flag is")
	assert.Equal(t, "2", fs.Lookup("v").Value.String())
	assert.Equal(t, "server=4", fs.Lookup("vmodule").Value.String())
	require.NoError(t, fs.Set("v", "0"))
	require.NoError(t, fs.Set("vmodule", ""))
}

// Commands built and configured in parallel (the deploy tests do) each read
// their own -v: reading a flag must not touch klog's process-wide level while
// another command sets it (a data race under -race otherwise).
func TestKlogFlagsParallel(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
				cli.AddKlogFlags(fs)
				assert.NoError(t, fs.Set("v", strconv.Itoa(i%2)))
				assert.Equal(t, strconv.Itoa(i%2), fs.Lookup("v").Value.String())
				fs.VisitAll(func(f *pflag.Flag) { _ = f.Value.String() })
			}
		}()
	}
	wg.Wait()
}

// fakeDaemon records what the root command does with it.
type fakeDaemon struct {
	cf       cli.ConfigFlags
	name     string
	count    int
	list     []string
	on       bool
	wait     time.Duration
	validErr error
	ran      bool
	runCtx   context.Context
}

func (d *fakeDaemon) Config() *cli.ConfigFlags { return &d.cf }
func (d *fakeDaemon) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&d.name, "name", "default", "a name")
	fs.IntVar(&d.count, "count", 1, "a count")
	fs.StringSliceVar(&d.list, "list", []string{"d1"}, "a list")
	fs.BoolVar(&d.on, "on", false, "a switch")
	fs.DurationVar(&d.wait, "wait", time.Second, "a duration")
}
func (d *fakeDaemon) Validate() error { return d.validErr }
func (d *fakeDaemon) Run(ctx context.Context) error {
	d.ran, d.runCtx = true, ctx
	return nil
}

func execute(t *testing.T, d *fakeDaemon, args ...string) (string, error) {
	t.Helper()
	cmd := cli.NewRootCommand("fake", d, []cli.FlagGroup{{Title: "Things", Names: []string{"name"}}})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestRootCommand(t *testing.T) {
	// Not parallel: t.Setenv.
	for _, k := range []string{"QUICTUN_NAME", "QUICTUN_COUNT"} {
		t.Setenv(k, "") // restored when the test ends
		require.NoError(t, os.Unsetenv(k))
	}
	t.Run("runs a valid config", func(t *testing.T) {
		d := &fakeDaemon{}
		_, err := execute(t, d, "--name", "x")
		require.NoError(t, err)
		assert.True(t, d.ran)
		assert.NotNil(t, d.runCtx)
		assert.Equal(t, "x", d.name)
	})
	t.Run("validation error is a usage error and does not run", func(t *testing.T) {
		d := &fakeDaemon{validErr: errors.New("--name is bad")}
		_, err := execute(t, d)
		require.ErrorIs(t, err, cli.ErrUsage)
		assert.Contains(t, err.Error(), "--name is bad")
		assert.False(t, d.ran)
	})
	t.Run("check-config validates and does not run", func(t *testing.T) {
		d := &fakeDaemon{}
		out, err := execute(t, d, "--check-config")
		require.NoError(t, err)
		assert.Equal(t, "config OK\n", out)
		assert.False(t, d.ran)

		d = &fakeDaemon{validErr: errors.New("nope")}
		_, err = execute(t, d, "--check-config")
		require.ErrorIs(t, err, cli.ErrUsage)

		d = &fakeDaemon{}
		out, err = execute(t, d, "--check-config=flags")
		require.NoError(t, err)
		assert.Equal(t, "config OK (flags only; files not read)\n", out)
		assert.False(t, d.ran)

		_, err = execute(t, d, "--check-config=everything")
		require.ErrorIs(t, err, cli.ErrUsage)
		assert.Contains(t, err.Error(), "want all (the default) or flags")
		assert.False(t, d.ran)
	})
	t.Run("write-config skips validation and writes flags only", func(t *testing.T) {
		d := &fakeDaemon{validErr: errors.New("nope")}
		out, err := execute(t, d, "--write-config", "--count", "7")
		require.NoError(t, err)
		assert.False(t, d.ran)
		assert.Contains(t, out, "count: 7")
		assert.Contains(t, out, "name: default")
		for _, skipped := range []string{"config:", "write-config:", "check-config:", "help:"} {
			assert.NotContains(t, out, "\n"+skipped, "config flags are not written")
		}
	})
	t.Run("unknown key names file and line", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "bad.yaml")
		require.NoError(t, os.WriteFile(file, []byte("name: a\n\nnmae: b\n"), 0o600))
		d := &fakeDaemon{}
		_, err := execute(t, d, "--config", file)
		require.ErrorIs(t, err, cli.ErrUsage)
		require.ErrorIs(t, err, config.ErrUnknownKey)
		assert.Contains(t, err.Error(), file+":3")
		assert.Contains(t, err.Error(), `"nmae"`)
		assert.False(t, d.ran)
	})
	t.Run("missing config file", func(t *testing.T) {
		_, err := execute(t, &fakeDaemon{}, "--config", filepath.Join(t.TempDir(), "nope.yaml"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("positional arguments rejected", func(t *testing.T) {
		d := &fakeDaemon{}
		_, err := execute(t, d, "extra")
		require.Error(t, err)
		assert.False(t, d.ran)
	})
	t.Run("version", func(t *testing.T) {
		d := &fakeDaemon{}
		out, err := execute(t, d, "version")
		require.NoError(t, err)
		assert.Equal(t, "fake "+version.String()+"\n", out)
		assert.False(t, d.ran)
	})
	t.Run("--version flag", func(t *testing.T) {
		// The README's install check: quictun-client --version.
		d := &fakeDaemon{}
		out, err := execute(t, d, "--version")
		require.NoError(t, err)
		assert.Equal(t, "fake "+version.String()+"\n", out)
		assert.False(t, d.ran)
	})
	t.Run("hidden docs subcommand", func(t *testing.T) {
		out, err := execute(t, &fakeDaemon{}, "docs")
		require.NoError(t, err)
		help, err := execute(t, &fakeDaemon{}, "--help")
		require.NoError(t, err)
		assert.Contains(t, out, "# fake flags\n")
		assert.Contains(t, out, "```text\n"+help+"```\n", "the flag reference is --help, verbatim")
		assert.NotContains(t, help, "docs ", "hidden from the command list")
	})
	t.Run("grouped help", func(t *testing.T) {
		out, err := execute(t, &fakeDaemon{}, "--help")
		require.NoError(t, err)
		things := strings.Index(out, "Things:")
		other := strings.Index(out, "Other:")
		require.NotEqual(t, -1, things, out)
		require.NotEqual(t, -1, other, out)
		assert.Less(t, things, other)
		assert.Contains(t, out[things:other], "--name")
		assert.NotContains(t, out[things:other], "--count")
		assert.Contains(t, out[other:], "--count")
		assert.Contains(t, out, "QUICTUN_")
		assert.Contains(t, out, "version")
	})
}

// TestPrecedence is the precedence table of both daemons, run once on a
// fake one (each daemon's app keeps one smoke case with its own flags):
// defaults < --config file < QUICTUN_* environment < command line, for
// strings, ints, lists, bools and durations.
func TestPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte("name: from-file\ncount: 2\nlist: [f1, f2]\nwait: 3s\n"), 0o600))
	type want struct {
		name  string
		count int
		list  []string
		on    bool
		wait  time.Duration
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		args    []string
		want    want
		wantErr string
	}{
		{"defaults", nil, nil, want{"default", 1, []string{"d1"}, false, time.Second}, ""},
		{"file", nil, []string{"--config", file}, want{"from-file", 2, []string{"f1", "f2"}, false, 3 * time.Second}, ""},
		{"env over file", map[string]string{"QUICTUN_NAME": "from-env"}, []string{"--config", file},
			want{"from-env", 2, []string{"f1", "f2"}, false, 3 * time.Second}, ""},
		{"env without file", map[string]string{"QUICTUN_NAME": "from-env"}, nil, want{"from-env", 1, []string{"d1"}, false, time.Second}, ""},
		{"flag over env and file", map[string]string{"QUICTUN_NAME": "from-env"}, []string{"--config", file, "--name", "from-flag"},
			want{"from-flag", 2, []string{"f1", "f2"}, false, 3 * time.Second}, ""},
		{"flag over file", nil, []string{"--config", file, "--count", "5"}, want{"from-file", 5, []string{"f1", "f2"}, false, 3 * time.Second}, ""},
		{"env list, bool and duration over file", map[string]string{"QUICTUN_LIST": "e1,e2", "QUICTUN_ON": "true", "QUICTUN_WAIT": "5s"},
			[]string{"--config", file}, want{"from-file", 2, []string{"e1", "e2"}, true, 5 * time.Second}, ""},
		{"flag list over env list", map[string]string{"QUICTUN_LIST": "e1,e2"}, []string{"--list", "x"}, want{"default", 1, []string{"x"}, false, time.Second}, ""},
		{"bad env value names the variable", map[string]string{"QUICTUN_WAIT": "soon"}, nil, want{}, "QUICTUN_WAIT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnvFor(t, "QUICTUN_NAME", "QUICTUN_COUNT", "QUICTUN_LIST", "QUICTUN_ON", "QUICTUN_WAIT", "QUICTUN_CONFIG")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			d := &fakeDaemon{}
			_, err := execute(t, d, tc.args...)
			if tc.wantErr != "" {
				require.ErrorIs(t, err, cli.ErrUsage)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.False(t, d.ran)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, want{d.name, d.count, d.list, d.on, d.wait})
		})
	}
}

func TestSignalContext(t *testing.T) {
	// Not parallel: it installs a process-wide signal handler.
	t.Run("stop without a signal", func(t *testing.T) {
		ctx, stop := cli.SignalContext(context.Background())
		assert.NoError(t, ctx.Err())
		stop()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
	})
	t.Run("parent cancel", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		ctx, stop := cli.SignalContext(parent)
		defer stop()
		cancel()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
	})
	t.Run("first SIGTERM cancels", func(t *testing.T) {
		ctx, stop := cli.SignalContext(context.Background())
		defer stop()
		self, err := os.FindProcess(os.Getpid())
		require.NoError(t, err)
		require.NoError(t, self.Signal(syscall.SIGTERM))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("context not cancelled by SIGTERM")
		}
	})
}

func TestMainExitCodes(t *testing.T) {
	// Not parallel: Main installs a process-wide signal handler.
	clearEnvFor(t, "QUICTUN_NAME", "QUICTUN_COUNT")
	d := &fakeDaemon{}
	cmd := cli.NewRootCommand("fake", d, nil)
	cmd.SetOut(&bytes.Buffer{})
	assert.Equal(t, 0, cli.Main(cmd, []string{"--check-config"}))
	assert.False(t, d.ran)

	d = &fakeDaemon{validErr: errors.New("bad")}
	cmd = cli.NewRootCommand("fake", d, nil)
	cmd.SetOut(&bytes.Buffer{})
	assert.Equal(t, 1, cli.Main(cmd, nil), "a validation error exits 1")

	d = &fakeDaemon{}
	cmd = cli.NewRootCommand("fake", d, nil)
	cmd.SetOut(&bytes.Buffer{})
	assert.Equal(t, 0, cli.Main(cmd, []string{"--name", "n"}))
	assert.True(t, d.ran)
	require.NotNil(t, d.runCtx)
	assert.ErrorIs(t, d.runCtx.Err(), context.Canceled, "the signal context is released when Main returns")

	cmd = cli.NewRootCommand("fake", &fakeDaemon{}, nil)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	assert.Equal(t, 1, cli.Main(cmd, []string{"--no-such-flag"}))
}

func clearEnvFor(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		t.Setenv(k, "")
		require.NoError(t, os.Unsetenv(k))
	}
}

func TestValidateHostPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value               string
		requireHost, zeroOK bool
		wantErr             string
	}{
		{"127.0.0.1:7500", true, false, ""},
		{"[::1]:7500", true, false, ""},
		{"server.example.com:65535", true, false, ""},
		{":7500", false, false, ""},
		{":7500", true, false, "missing host"},
		{"127.0.0.1:0", false, true, ""},
		{"127.0.0.1:0", false, false, "port must be a number from 1 to 65535"},
		{"127.0.0.1:", false, true, "port must be a number"},
		{"127.0.0.1:65536", false, false, "port must be a number"},
		{"127.0.0.1:http", false, false, "port must be a number"},
		{"127.0.0.1:-1", false, false, "port must be a number"},
		{"garbage", false, false, "missing port"},
		{"::1:7500", false, false, "too many colons"},
		{"", false, false, "missing port"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			t.Parallel()
			err := cli.ValidateHostPort("listen-on", tc.value, tc.requireHost, tc.zeroOK)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "--listen-on", "names the flag")
		})
	}
}

func TestValidateAdmin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		listen, tokenFile, wantErr string
	}{
		{"", "", ""},
		{"127.0.0.1:8086", "", ""},
		{"[::1]:0", "", ""},
		{"localhost:8086", "", ""},
		{"0.0.0.0:8086", "", "--httpd-token-file"},
		{"10.1.2.3:8086", "", "--httpd-token-file"},
		{":8086", "", "--httpd-token-file"},
		{"0.0.0.0:8086", "/etc/quictun/admin-token", ""},
		{"127.0.0.1", "", "--httpd-listen-on"},
		{"127.0.0.1:99999", "", "--httpd-listen-on"},
	} {
		t.Run(tc.listen+"/"+tc.tokenFile, func(t *testing.T) {
			t.Parallel()
			err := cli.ValidateAdmin(tc.listen, tc.tokenFile)
			if tc.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// checkingDaemon also checks files, like the real daemons.
type checkingDaemon struct {
	fakeDaemon
	checks  int
	fileErr error
}

func (d *checkingDaemon) CheckFiles() error {
	d.checks++
	return d.fileErr
}

func TestCheckFilesOnlyForCheckConfig(t *testing.T) {
	clearEnvFor(t, "QUICTUN_NAME", "QUICTUN_COUNT")
	run := func(d *checkingDaemon, args ...string) (string, error) {
		cmd := cli.NewRootCommand("fake", d, nil)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		err := cmd.ExecuteContext(context.Background())
		return out.String(), err
	}
	d := &checkingDaemon{}
	out, err := run(d, "--check-config")
	require.NoError(t, err)
	assert.Equal(t, "config OK\n", out)
	assert.Equal(t, 1, d.checks)

	d = &checkingDaemon{fileErr: errors.New("--secret-file: too short")}
	out, err = run(d, "--check-config")
	require.ErrorIs(t, err, cli.ErrUsage)
	assert.Contains(t, err.Error(), "too short")
	assert.NotContains(t, out, "config OK")

	d = &checkingDaemon{fileErr: errors.New("unused")}
	_, err = run(d)
	require.NoError(t, err, "a normal start reads the files itself, in Run")
	assert.Zero(t, d.checks)
	assert.True(t, d.ran)

	d = &checkingDaemon{fileErr: errors.New("unused")}
	_, err = run(d, "--write-config")
	require.NoError(t, err)
	assert.Zero(t, d.checks)

	d = &checkingDaemon{fakeDaemon: fakeDaemon{validErr: errors.New("invalid")}}
	_, err = run(d, "--check-config")
	require.Error(t, err)
	assert.Zero(t, d.checks, "files are read only for a valid config")
}

func TestCheckCommand(t *testing.T) {
	t.Parallel()
	cmd := cli.NewCheckCommand(&fakeDaemon{}, nil)
	assert.NotNil(t, cmd.Flags().Lookup("name"), "check takes the daemon's flags")
	assert.NotNil(t, cmd.Flags().Lookup("config"))
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(nil)
	err := cmd.Execute()
	report := out.String()
	assert.Contains(t, report, "udp-buffers")
	// The result depends on this host; the exit status must match the report.
	if regexp.MustCompile(`(?m)^(warn|error) `).MatchString(report) {
		require.ErrorIs(t, err, cli.ErrUsage, report)
	} else {
		require.NoError(t, err, report)
	}
	cmd = cli.NewCheckCommand(&fakeDaemon{}, nil)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"extra"})
	assert.Error(t, cmd.Execute(), "no positional arguments")
}

func TestConfigFileFromEnvironment(t *testing.T) {
	clearEnvFor(t, "QUICTUN_NAME", "QUICTUN_COUNT")
	file := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte("name: from-file\n"), 0o600))
	t.Setenv("QUICTUN_CONFIG", file)
	d := &fakeDaemon{}
	_, err := execute(t, d)
	require.NoError(t, err)
	assert.Equal(t, "from-file", d.name)
}

func TestReadKeysFile(t *testing.T) {
	t.Parallel()
	write := fileWriter(t)
	keys, err := cli.ReadKeysFile("keys-file", write("ok", "# rotation 2026-11\nv2   0123456789abcdef-new\n\n  v1 0123456789abcdef-old  \n"))
	require.NoError(t, err)
	require.Len(t, keys, 2)
	assert.Equal(t, "v2", keys[0].Name)
	assert.Equal(t, "0123456789abcdef-new", string(keys[0].Secret))
	assert.Equal(t, "v1", keys[1].Name)
	for _, tc := range []struct{ name, content, wantErr string }{
		{"no name", "0123456789abcdef\n", ":1: want NAME SECRET"},
		{"three fields", "a b c\n", ":1: want NAME SECRET"},
		{"short", "# c\nv1 short\n", ":2: secret must be at least 16 bytes"},
		{"bad name", "v/1 0123456789abcdef\n", `key name "v/1"`},
		{"same secret twice", "a 0123456789abcdef\nb 0123456789abcdef\n", "the same secret"},
		{"same name twice", "a 0123456789abcdef\na 0123456789abcdeg\n", "the same name"},
		{"empty", "# nothing\n", "no key in the file"},
	} {
		_, err := cli.ReadKeysFile("keys-file", write(tc.name, tc.content))
		require.ErrorContains(t, err, tc.wantErr, tc.name)
		assert.Contains(t, err.Error(), "--keys-file", tc.name)
		assert.NotContains(t, err.Error(), "0123456789abcde", "never prints a secret: %s", tc.name)
	}
	loose := write("loose", "a 0123456789abcdef\n")
	require.NoError(t, os.Chmod(loose, 0o644))
	_, err = cli.ReadKeysFile("keys-file", loose)
	require.ErrorContains(t, err, "chmod 600")
}

// TestCheckStartFiles is the table of file checks both daemons'
// --check-config run (each app keeps the cases of its own flags).
func TestCheckStartFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), mode))
		return p
	}
	good := write("secret", "0123456789abcdef0123\n", 0o600)
	short := write("short", "tooshort\n", 0o600)
	garbage := write("garbage.pem", "not a certificate", 0o600)
	loose := write("loose-secret", "0123456789abcdef0123\n", 0o644)
	keys := write("keys", "alice 0123456789abcdef0123\n", 0o600)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	looseDir, looseKeyDir := filepath.Join(dir, "loose"), filepath.Join(dir, "loose-key")
	for _, d := range []string{a, b, looseDir, looseKeyDir} {
		_, err := transport.LoadOrCreateState(d, "", "")
		require.NoError(t, err)
	}
	require.NoError(t, os.Chmod(looseDir, 0o770))
	looseStateKey := filepath.Join(looseKeyDir, transport.ResetKeyFileName)
	require.NoError(t, os.Chmod(looseStateKey, 0o640))
	keyPEM, err := os.ReadFile(filepath.Join(a, transport.KeyFileName))
	require.NoError(t, err)
	looseKey := write("loose-key.pem", string(keyPEM), 0o640)
	missing := filepath.Join(dir, "not-on-this-host")
	certA, keyA, keyB := filepath.Join(a, transport.CertFileName), filepath.Join(a, transport.KeyFileName), filepath.Join(b, transport.KeyFileName)
	for _, tc := range []struct {
		name    string
		files   cli.StartFiles
		wantErr []string
	}{
		{"good secret and keys file", cli.StartFiles{SecretFile: good, KeysFile: keys}, nil},
		{"missing files are errors", cli.StartFiles{SecretFile: missing, KeysFile: missing, HTTPDTokenFile: missing, CAFlag: "ca-file", CAFile: missing, CertFile: missing, KeyFile: missing},
			[]string{"--secret-file: open " + missing, "--keys-file: open " + missing, "--httpd-token-file: open " + missing, "--ca-file", "--cert-file/--key-file"}},
		{"missing state dir is created at start", cli.StartFiles{StateDir: missing}, nil},
		{"missing session file is written later", cli.StartFiles{SessionFile: missing}, nil},
		{"good state dir", cli.StartFiles{StateDir: a}, nil},
		{"state dir readable by others", cli.StartFiles{StateDir: looseDir},
			[]string{"--state-dir " + looseDir + " is accessible by group or others (mode 0770): run: chmod 700 " + looseDir}},
		{"state key readable by group", cli.StartFiles{StateDir: looseKeyDir}, []string{"--state-dir key file " + looseStateKey, "chmod 600 " + looseStateKey}},
		{"secret readable by others", cli.StartFiles{SecretFile: loose},
			[]string{"--secret-file " + loose + " is accessible by group or others (mode 0644): run: chmod 600 " + loose}},
		{"session file readable by others", cli.StartFiles{SessionFile: loose}, []string{"--session-file", "chmod 600 " + loose}},
		{"key file readable by group", cli.StartFiles{CertFile: certA, KeyFile: looseKey}, []string{"--key-file " + looseKey, "chmod 600 " + looseKey}},
		{"good CA and key pair", cli.StartFiles{CAFlag: "client-ca-file", CAFile: certA, CertFile: certA, KeyFile: keyA}, nil},
		{"short secret", cli.StartFiles{SecretFile: short}, []string{"--secret-file", "at least 16 bytes"}},
		{"short admin token", cli.StartFiles{HTTPDTokenFile: short}, []string{"--httpd-token-file"}},
		{"CA not PEM", cli.StartFiles{CAFlag: "client-ca-file", CAFile: garbage}, []string{"--client-ca-file", "no PEM certificates"}},
		{"key of another certificate", cli.StartFiles{CertFile: certA, KeyFile: keyB}, []string{"--cert-file/--key-file"}},
		{"everything at once", cli.StartFiles{SecretFile: short, KeysFile: garbage, HTTPDTokenFile: short, CAFlag: "ca-file", CAFile: garbage, CertFile: garbage, KeyFile: garbage, StateDir: looseDir},
			[]string{"--secret-file", "--keys-file", "--httpd-token-file", "--ca-file", "--cert-file/--key-file", "--state-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := errors.Join(cli.CheckStartFiles(tc.files)...)
			testutil.RequireErrorContains(t, err, tc.wantErr)
			if err != nil {
				assert.NotContains(t, err.Error(), "tooshort", "never prints a secret")
			}
		})
	}
}
