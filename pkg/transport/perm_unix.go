//go:build unix

package transport

import (
	"io/fs"
	"os"
	"syscall"
)

// checkPrivate is CheckPrivate's check on Unix: the mode bits of a path
// this process's effective user owns.
func checkPrivate(what, path string, fi fs.FileInfo) error {
	loose, fix := fs.FileMode(0o077), "chmod 600 "+path
	if fi.IsDir() {
		loose, fix = 0o022, "chmod 700 "+path
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&loose == 0 {
		return nil
	}
	return &PermissionError{What: what, Path: path, Mode: fi.Mode(), Fix: fix}
}

// makePrivate does nothing on Unix: the daemon creates its files with mode
// 0600 and its directories with 0700.
func makePrivate(string, bool) error { return nil }
