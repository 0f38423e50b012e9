package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/config"
)

// TestMigratingConfigPair keeps docs/MIGRATING.md's config pair true: the
// quictun server and client files pass --check-config=flags (the client's
// with the fingerprint an operator pastes), and each quic-tun file is refused
// naming the key quictun does not know, as the guide says.
func TestMigratingConfigPair(t *testing.T) {
	t.Parallel()
	doc := string(readFile(t, filepath.Join(repoRoot(t), "docs", "MIGRATING.md")))
	files := map[string]string{} // first-line comment -> file holding the block
	dir := t.TempDir()
	for i, m := range regexp.MustCompile("(?s)```yaml\n(# ([^\n]+)\n.*?)```").FindAllStringSubmatch(doc, -1) {
		p := filepath.Join(dir, "block"+string(rune('a'+i))+".yaml")
		require.NoError(t, os.WriteFile(p, []byte(m[1]), 0o600))
		files[m[2]] = p
	}
	for _, tc := range []struct {
		block, daemon string
		args          []string
		unknownKey    string // the quic-tun key the check names
		wantErr       string // "" and no unknownKey: the file passes
	}{
		{"/etc/quictun/server.yaml", "quictun-server", nil, "", ""},
		{"/etc/quictun/client.yaml", "quictun-client", []string{"--server-fingerprint", pastedFingerprint}, "", ""},
		{"/etc/quictun/client.yaml", "quictun-client", nil, "", "fingerprint must be sha256:<64 hex digits>, as printed by 'quictun-server fingerprint'"}, // the guide's placeholder
		{"quictun-server.yaml (quic-tun)", "quictun-server", nil, "log-level", ""},
		{"quictun-client.yaml (quic-tun)", "quictun-client", nil, "verify-remote-endpoint", ""},
	} {
		t.Run(tc.block+" "+tc.unknownKey+tc.wantErr, func(t *testing.T) {
			t.Parallel()
			file, ok := files[tc.block]
			require.True(t, ok, "docs/MIGRATING.md has no yaml block starting with # %s", tc.block)
			out, err := checkConfig(t, tc.daemon, append([]string{"--config", file}, tc.args...)...)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			if tc.unknownKey == "" {
				require.NoError(t, err, out)
				assert.Contains(t, out, "config OK")
				return
			}
			require.ErrorIs(t, err, config.ErrUnknownKey)
			assert.Contains(t, err.Error(), `"`+tc.unknownKey+`"`)
			assert.Contains(t, err.Error(), file)
		})
	}
}
