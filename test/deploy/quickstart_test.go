package deploy

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestQuickStartFiles: the README quick start creates its secret with mode
// 0600 (the daemons refuse a secret others can read), and the secret and
// server state it leaves in the checkout are ignored by git.
func TestQuickStartFiles(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	readme := string(readFile(t, root+"/README.md"))
	for _, want := range []string{"(umask 077; head -c 32 /dev/urandom | base64 > secret)", "--state-dir ./server-state --secret-file secret"} {
		assert.True(t, strings.Contains(readme, want), "README.md quick start lacks %q", want)
	}

	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git not installed")
	}
	if err := exec.Command(git, "-C", root, "rev-parse", "--git-dir").Run(); err != nil {
		t.Skip("not a git checkout")
	}
	for _, p := range []string{"secret", "server-state/key.pem", "server-state/session-ticket.key"} {
		out, err := exec.Command(git, "-C", root, "check-ignore", "-v", p).CombinedOutput()
		require.NoError(t, err, "%s is not ignored by git: %s", p, out)
		assert.True(t, strings.Contains(string(out), ".gitignore"), string(out))
	}
}
