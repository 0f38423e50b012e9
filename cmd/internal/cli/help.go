package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// FlagGroup is a named section of --help.
type FlagGroup struct {
	Title string
	Names []string
}

// SetGroupedHelp makes cmd print its flags in sections; flags in no group are
// listed last under "Other".
func SetGroupedHelp(cmd *cobra.Command, groups []FlagGroup) {
	cmd.SetHelpFunc(func(c *cobra.Command, _ []string) {
		w := c.OutOrStdout()
		if c != cmd {
			// Subcommands keep cobra's default help.
			_, _ = fmt.Fprint(w, c.UsageString())
			return
		}
		writeGroupedHelp(w, c, groups)
	})
}

func writeGroupedHelp(w io.Writer, c *cobra.Command, groups []FlagGroup) {
	_, _ = fmt.Fprintf(w, "%s\n\nUsage:\n  %s [flags]\n  %s [command]\n", c.Long, c.CommandPath(), c.CommandPath())
	if c.Example != "" {
		_, _ = fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	_, _ = fmt.Fprintln(w, "\nCommands:")
	for _, sc := range c.Commands() {
		if sc.IsAvailableCommand() {
			_, _ = fmt.Fprintf(w, "  %-12s %s\n", sc.Name(), sc.Short)
		}
	}
	seen := map[string]bool{"help": true}
	fs := c.Flags()
	for _, g := range groups {
		sub := pflag.NewFlagSet(g.Title, pflag.ContinueOnError)
		for _, n := range g.Names {
			if f := fs.Lookup(n); f != nil {
				sub.AddFlag(f)
				seen[n] = true
			}
		}
		if sub.HasFlags() {
			_, _ = fmt.Fprintf(w, "\n%s:\n%s", g.Title, sub.FlagUsagesWrapped(110))
		}
	}
	rest := pflag.NewFlagSet("other", pflag.ContinueOnError)
	fs.VisitAll(func(f *pflag.Flag) {
		if !seen[f.Name] {
			rest.AddFlag(f)
		}
	})
	if rest.HasFlags() {
		_, _ = fmt.Fprintf(w, "\nOther:\n%s", rest.FlagUsagesWrapped(110))
	}
	_, _ = fmt.Fprintf(w, "\nEvery flag can also be set in the --config YAML file (same name) or as QUICTUN_<NAME> in the environment\n(e.g. QUICTUN_LISTEN_ON). Use \"%s [command] --help\" for more about a command.\n", c.CommandPath())
}
