package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/quictun/quictun/pkg/config"
	"github.com/quictun/quictun/pkg/version"
)

// EnvPrefix prefixes environment variables: QUICTUN_LISTEN_ON sets --listen-on.
const EnvPrefix = "QUICTUN"

// redactedFlags are never logged: a token (or a URL that may carry
// credentials) and the token parser's key. Secrets themselves are files.
var redactedFlags = []string{"token-source", "token-parser-key"}

// configFlagNames are the flags that are never read from the file or written to it.
var configFlagNames = []string{"config", "write-config", "check-config", "version"}

// ConfigFlags are the flags about configuration itself, shared by both daemons.
type ConfigFlags struct {
	ConfigFile  string
	WriteConfig bool
	// CheckConfig is "" (run), CheckAll or CheckFlags.
	CheckConfig string
}

// Values of --check-config.
const (
	// CheckAll validates the flags and reads the files the daemon reads at
	// start (secrets, keys, certificates, token file): the check for a config
	// on the host it is for. Plain --check-config means this.
	CheckAll = "all"
	// CheckFlags validates the flags only, for a config meant for another
	// host (the deploy/ tests check the shipped configs this way).
	CheckFlags = "flags"
)

// AddFlags binds the config flags to fs.
func (c *ConfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ConfigFile, "config", c.ConfigFile, "YAML config file; keys are the long flag names (e.g. listen-on: ...). Precedence: defaults < file < QUICTUN_* env < command line")
	fs.BoolVar(&c.WriteConfig, "write-config", c.WriteConfig, "print the effective config as YAML and exit")
	fs.StringVar(&c.CheckConfig, "check-config", c.CheckConfig, "validate the config and exit (non-zero on error): --check-config (=all) also reads the secret, key, certificate and token files as at start, so run it on the host the config is for; --check-config=flags checks only the flags, for a config meant for another host")
	fs.Lookup("check-config").NoOptDefVal = CheckAll
}

// Daemon is what a daemon's Options provide to the shared command.
type Daemon interface {
	Config() *ConfigFlags
	AddFlags(fs *pflag.FlagSet)
	Validate() error
	Run(ctx context.Context) error
}

// NewRootCommand builds a daemon's cobra command: flags, config loading with
// precedence defaults < file < env < command line, validation, --write-config,
// --check-config, grouped help and a version subcommand. The help sections are
// groups, then congestion control, configuration and logging.
func NewRootCommand(name string, d Daemon, groups []FlagGroup) *cobra.Command {
	cmd := &cobra.Command{
		Use:           name,
		Args:          NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			flags := cmd.Flags()
			if v, _ := flags.GetBool("version"); v {
				_, _ = fmt.Fprintln(cmd.OutOrStdout(), name, version.String())
				return nil
			}
			cf := d.Config()
			var reloader *Reloader
			if r, ok := d.(Reloadable); ok {
				reloader = newReloader(flags, r.Fresh, cf.ConfigFile)
				r.SetReloader(reloader)
			}
			if err := LoadConfig(flags, cf.ConfigFile); err != nil {
				return err
			}
			if reloader != nil {
				reloader.track(flags)
			}
			if cf.WriteConfig {
				return config.WriteYAML(cmd.OutOrStdout(), flags, configFlagNames...)
			}
			if err := d.Validate(); err != nil {
				return fmt.Errorf("%w:\n%w", ErrUsage, err)
			}
			switch strings.ToLower(cf.CheckConfig) {
			case "", "false":
			case CheckFlags:
				_, _ = fmt.Fprintln(cmd.OutOrStdout(), "config OK (flags only; files not read)")
				return nil
			case CheckAll, "true":
				// Also read the files the daemon would read at start.
				if fc, ok := d.(interface{ CheckFiles() error }); ok {
					if err := fc.CheckFiles(); err != nil {
						if errors.Is(err, fs.ErrNotExist) {
							err = errors.Join(err, errors.New("(checking a config for another host? --check-config=flags checks only the flags)"))
						}
						return fmt.Errorf("%w:\n%w", ErrUsage, err)
					}
				}
				_, _ = fmt.Fprintln(cmd.OutOrStdout(), "config OK")
				return nil
			default:
				return fmt.Errorf("%w: --check-config=%s: want all (the default) or flags", ErrUsage, cf.CheckConfig)
			}
			if klog.V(1).Enabled() {
				var b strings.Builder
				if err := config.WriteYAMLRedacted(&b, flags, redactedFlags, configFlagNames...); err == nil {
					klog.V(1).InfoS("Effective configuration", "config", b.String())
				}
			}
			procs, fromEnv := procsInForce()
			klog.InfoS("Starting "+name, "version", version.String(), "gomaxprocs", procs, "gomaxprocsFromEnv", fromEnv,
				"godebug", os.Getenv("GODEBUG"))
			return d.Run(cmd.Context())
		},
	}
	d.Config().AddFlags(cmd.Flags())
	d.AddFlags(cmd.Flags())
	AddKlogFlags(cmd.Flags())
	cmd.Flags().Bool("version", false, "print the version and exit (as the version subcommand)")
	cmd.SetFlagErrorFunc(flagError)    // the subcommands' too
	cmd.SuggestionsMinimumDistance = 2 // noArgs: "verison" means version
	_ = cmd.MarkFlagFilename("config", "yaml", "yml")
	SetGroupedHelp(cmd, append(slices.Clone(groups),
		FlagGroup{Title: "Congestion control", Names: CongestionFlagNames},
		FlagGroup{Title: "Configuration", Names: configFlagNames},
		FlagGroup{Title: "Logging", Names: []string{"v", "vmodule"}}))
	cmd.AddCommand(&cobra.Command{
		Use: "version", Short: "Print the version", Args: NoArgs,
		Run: func(c *cobra.Command, _ []string) { _, _ = fmt.Fprintln(c.OutOrStdout(), name, version.String()) },
	}, newDocsCommand(cmd), newHandoverFeaturesCommand())
	return cmd
}

// LoadConfig applies the config file and QUICTUN_* environment to the flags
// of fs that were not set on the command line (for subcommands that share the
// daemon's flags). A QUICTUN_* variable that names no flag is logged at -v 0.
//
// When no --config was given, QUICTUN_CONFIG names the file.
func LoadConfig(fs *pflag.FlagSet, file string) error {
	if f := fs.Lookup("config"); file == "" && (f == nil || !f.Changed) {
		file = os.Getenv(EnvPrefix + "_CONFIG")
	}
	for _, v := range config.UnknownEnv(fs, EnvPrefix, os.Environ(), knownEnv, configFlagNames...) {
		klog.InfoS("Ignored an environment variable that names no flag; fix its spelling: "+EnvPrefix+"_ and the long flag name in upper case with '-' as '_'", "variable", v)
	}
	if err := config.Load(fs, file, EnvPrefix, os.LookupEnv, configFlagNames...); err != nil {
		return fmt.Errorf("%w:\n%w", ErrUsage, err)
	}
	return nil
}

// knownEnv are the QUICTUN_* variables read other than as flags.
var knownEnv = []string{EnvPrefix + "_CONFIG"}

// UsageError is a mistake on the command line (a misspelled flag, a value
// that does not parse, an argument where none is taken): it is ErrUsage, but
// reads as its own message.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns ErrUsage and the error itself.
func (e *UsageError) Unwrap() []error { return []error{ErrUsage, e.Err} }

// flagError makes a flag parsing error a UsageError and, for a flag that
// does not exist, names the flag that was most likely meant.
func flagError(c *cobra.Command, err error) error {
	var ne *pflag.NotExistError
	if errors.As(err, &ne) {
		name := ne.GetSpecifiedName()
		if sh := ne.GetSpecifiedShortnames(); sh != "" {
			name = sh // -listen-on: a long name with one dash
		}
		if s := config.SuggestFlag(c.Flags(), strings.TrimLeft(name, "-")); s != "" {
			err = fmt.Errorf("%w (did you mean --%s?)", err, s)
		}
	}
	return &UsageError{Err: err}
}

// NoArgs is cobra.NoArgs as a UsageError: it refuses positional arguments,
// naming the subcommand a misspelled one most likely meant.
func NoArgs(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unexpected argument %q: flags are --name VALUE or --name=VALUE", args[0])
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg = fmt.Sprintf("unknown command %q (did you mean %s?)", args[0], s[0])
	}
	return &UsageError{Err: errors.New(msg)}
}

// Main runs cmd with args under SignalContext and returns the exit code. A
// usage error (ErrUsage) is printed as a plain message with a pointer to
// --help; any other error as a log line.
func Main(cmd *cobra.Command, args []string) int {
	ctx, stop := SignalContext(context.Background())
	defer stop()
	cmd.SetArgs(args)
	c, err := cmd.ExecuteContextC(ctx)
	switch {
	case errors.Is(err, ErrUsage):
		if c == nil {
			c = cmd
		}
		_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\nRun '%s --help' for usage.\n", c.CommandPath(), err, c.CommandPath())
	case err != nil:
		klog.ErrorS(err, cmd.Name()+" failed")
	}
	klog.Flush()
	if err != nil {
		return 1
	}
	return 0
}
