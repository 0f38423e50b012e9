package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module writes a module of one package whose files fail to compile on one
// platform each: a type error only darwin/amd64 sees, a function without a
// body (and no assembly) only linux/arm64 sees, a test that only
// windows/amd64 compiles.
func module(t *testing.T) string {
	dir := t.TempDir()
	for name, src := range map[string]string{
		"go.mod":            "module example.com/m\n\ngo 1.26\n",
		"m.go":              "package m\n\nfunc F() int { return 1 }\n",
		"m_darwin_amd64.go": "package m\n\nvar wrong int = \"darwin/amd64\"\n",
		"m_linux_arm64.go":  "package m\n\nfunc bodiless()\n",
		"m_test.go":         "package m\n\nimport \"testing\"\n\nfunc TestF(t *testing.T) { _ = F() }\n",
		"m_windows_test.go": "package m\n\nvar _ = undefinedOnWindows\n",
		"m_linkname.go":     "package m\n\nimport _ \"unsafe\"\n\n//go:linkname nanotime runtime.nanotime\nfunc nanotime() int64\n",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
	}
	return dir
}

func TestCheck(t *testing.T) {
	t.Parallel()
	dir := module(t)
	for _, tc := range []struct {
		target string
		test   bool
		want   string // "" for no error; else a substring of the output
	}{
		// -test checks the standard library's testing packages too: seconds
		// under -race, so once
		{"linux/amd64", false, ""},
		{"darwin/amd64", false, "cannot use \"darwin/amd64\""},
		{"darwin/arm64", false, ""},
		{"linux/arm64", false, "m_linux_arm64.go:3:1: missing function body"},
		{"windows/amd64", false, ""},
		{"windows/amd64", true, "undefined: undefinedOnWindows"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			t.Parallel()
			goos, goarch, _ := strings.Cut(tc.target, "/")
			var out bytes.Buffer
			n, errs, err := check(dir, goos, goarch, tc.test, []string{"."}, &out)
			require.NoError(t, err)
			assert.Positive(t, n, "the standard library's packages are checked too")
			if tc.want == "" {
				assert.Zero(t, errs, out.String())
				return
			}
			assert.Equal(t, 1, errs, out.String())
			assert.Contains(t, out.String(), tc.want)
		})
	}
}

func TestRunUsage(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	assert.Equal(t, 2, run([]string{"-target", "darwin", "."}, &out, &errOut))
	assert.Contains(t, errOut.String(), "usage:")
	assert.Equal(t, 2, run([]string{"-target", "darwin/amd64"}, &out, &errOut), "no packages")
	assert.Equal(t, 1, run([]string{"-target", "darwin/nosucharch", "."}, &out, &errOut))
	assert.Contains(t, errOut.String(), "unknown GOARCH")
}
