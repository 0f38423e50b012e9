package cli

import (
	"bytes"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// WriteFlagDocs writes cmd's flag reference as Markdown: its --help text,
// exactly as the binary prints it, under a header saying how it is made.
// `make docs` writes docs/flags-server.md and docs/flags-client.md with it (the
// hidden docs subcommand), and each daemon's tests fail when the file differs.
func WriteFlagDocs(w io.Writer, cmd *cobra.Command) error {
	cmd.InitDefaultCompletionCmd() // as Execute does, so that the command list matches --help
	var help bytes.Buffer
	out := cmd.OutOrStdout()
	cmd.SetOut(&help)
	cmd.HelpFunc()(cmd, nil)
	cmd.SetOut(out)
	_, err := fmt.Fprintf(w, "# %[1]s flags\n\n"+
		"Generated from `%[1]s --help` by `make docs`: do not edit; `make test` fails when this file is stale.\n"+
		"Every flag is also a key of the `--config` YAML file (its long name) and a `QUICTUN_<NAME>` environment\n"+
		"variable; [configuration.md](configuration.md) explains them by topic.\n\n```text\n%[2]s```\n",
		cmd.Name(), help.String())
	return err
}

// newDocsCommand is the hidden `docs` subcommand of root: the flag reference
// on standard output.
func newDocsCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use: "docs", Short: "Print the flag reference as Markdown (make docs)", Args: NoArgs, Hidden: true,
		RunE: func(c *cobra.Command, _ []string) error { return WriteFlagDocs(c.OutOrStdout(), root) },
	}
}
