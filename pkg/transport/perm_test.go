package transport

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckPrivate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte("0123456789abcdef"), 0o600))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	sub := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.Mkdir(p, 0o700))
		require.NoError(t, os.Chmod(p, mode))
		return p
	}
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(file("target", 0o644), link))
	for _, tc := range []struct {
		name, path, fix string
	}{
		{"0600 file", file("ok", 0o600), ""},
		{"0400 file", file("ro", 0o400), ""},
		{"missing", filepath.Join(dir, "missing"), ""},
		{"0700 dir", sub("okdir", 0o700), ""},
		{"0755 dir: names only, files checked on their own", sub("readable", 0o755), ""},
		{"0710 dir", sub("groupx", 0o710), ""},
		{"0644 file", file("world", 0o644), "chmod 600 "},
		{"0640 file", file("group", 0o640), "chmod 600 "},
		{"0602 file", file("otherw", 0o602), "chmod 600 "},
		{"0775 dir", sub("groupw", 0o775), "chmod 700 "},
		{"0757 dir", sub("otherwdir", 0o757), "chmod 700 "},
		{"symlink to 0644", link, "chmod 600 "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := CheckPrivate("--secret-file", tc.path)
			if tc.fix == "" {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrLoosePermissions)
			assert.Contains(t, err.Error(), "--secret-file "+tc.path+" is accessible by group or others")
			assert.Contains(t, err.Error(), "run: "+tc.fix+tc.path)
		})
	}
}

// TestLoadOrCreateStateRefusesLooseState: an existing state dir or key file
// that group or others may read is refused, with the chmod to run; a state
// it creates passes its own check.
func TestLoadOrCreateStateRefusesLooseState(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	_, err := LoadOrCreateState(dir, "", "")
	require.NoError(t, err)
	require.NoError(t, CheckState(dir, ""))

	require.NoError(t, os.Chmod(dir, 0o775))
	_, err = LoadOrCreateState(dir, "", "")
	require.ErrorIs(t, err, ErrLoosePermissions)
	assert.Contains(t, err.Error(), "chmod 700 "+dir)
	require.NoError(t, os.Chmod(dir, 0o700))

	key := filepath.Join(dir, TicketKeyFileName)
	require.NoError(t, os.Chmod(key, 0o644))
	_, err = LoadOrCreateState(dir, "", "")
	require.ErrorIs(t, err, ErrLoosePermissions)
	assert.Contains(t, err.Error(), "chmod 600 "+key)
	require.NoError(t, os.Chmod(key, 0o600))

	// --cert-file/--key-file: the key file is checked, the cert is public.
	other := filepath.Join(t.TempDir(), "other")
	require.NoError(t, os.Chmod(filepath.Join(dir, CertFileName), 0o644))
	require.NoError(t, os.Chmod(filepath.Join(dir, KeyFileName), 0o640))
	_, err = LoadOrCreateState(other, filepath.Join(dir, CertFileName), filepath.Join(dir, KeyFileName))
	require.ErrorIs(t, err, ErrLoosePermissions)
	assert.Contains(t, err.Error(), "--key-file")
}
