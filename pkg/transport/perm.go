package transport

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrLoosePermissions is wrapped by CheckPrivate's error for a file or
// directory that group or others may access.
var ErrLoosePermissions = errors.New("accessible by group or others")

// PermissionError is returned by CheckPrivate: Path has mode Mode, which lets
// group or others at it; Fix is the chmod command that repairs it.
type PermissionError struct {
	What string // what the file is, e.g. "--secret-file" or "state dir key file"
	Path string
	Mode fs.FileMode
	Fix  string
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("%s %s is %s (mode %04o): run: %s", e.What, e.Path, ErrLoosePermissions, e.Mode.Perm(), e.Fix)
}

// Unwrap makes errors.Is(err, ErrLoosePermissions) true.
func (e *PermissionError) Unwrap() error { return ErrLoosePermissions }

// CheckPrivate refuses a secret file (or a directory of them) that is owned
// by this process's user and that group or others may read, write or enter
// (mode & 077 != 0), as ssh refuses an unprotected private key. The error
// names the chmod to run (600 for a file, 700 for a directory). Like ssh,
// files owned by another user are not checked: they are how systemd
// credentials, Docker and Kubernetes secrets reach a service user (read
// through group or other bits that this user cannot change). A path that
// does not exist is not an error here (its reader reports it); symlinks
// are followed. what names the file in the message.
func CheckPrivate(what, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 == 0 {
		return nil
	}
	fix := "chmod 600 " + path
	if fi.IsDir() {
		fix = "chmod 700 " + path
	}
	return &PermissionError{What: what, Path: path, Mode: fi.Mode(), Fix: fix}
}
