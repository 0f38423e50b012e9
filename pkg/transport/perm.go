package transport

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// ErrLoosePermissions is wrapped by CheckPrivate's error for a secret file
// that group or others may access, or a directory of secrets they may write.
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

// CheckPrivate refuses a secret file owned by this process's user that
// group or others may read, write or execute (mode & 077), as ssh refuses an
// unprotected private key, and a directory of secrets owned by this user
// that group or others may write (mode & 022: they could replace a key), as
// sshd's StrictModes does; a directory others can only read or enter shows
// file names, and each secret file in it is checked on its own. The error
// names the chmod to run (600 for a file, 700 for a directory). Like ssh,
// paths owned by another user are not checked: that is how systemd
// credentials, Docker and Kubernetes secrets reach a service user (read
// through group or other bits that this user cannot change). A path that
// does not exist is not an error here (its reader reports it); symlinks are
// followed. what names the path in the message. On Windows nothing is
// checked (perm_windows.go): its mode bits do not show the file's ACL.
func CheckPrivate(what, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	loose, fix := fs.FileMode(0o077), "chmod 600 "+path
	if fi.IsDir() {
		loose, fix = 0o022, "chmod 700 "+path
	}
	if !ownedByMe(fi) || fi.Mode().Perm()&loose == 0 {
		return nil
	}
	return &PermissionError{What: what, Path: path, Mode: fi.Mode(), Fix: fix}
}
