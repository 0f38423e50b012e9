package transport

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
)

// ErrLoosePermissions is wrapped by CheckPrivate's error for a secret file
// that group or others may access, or a directory of secrets they may write.
var ErrLoosePermissions = errors.New("accessible by group or others")

// PermissionError is returned by CheckPrivate: Path lets others at it (on
// Unix its Mode has group or other bits; on Windows its ACL allows Grantees);
// Fix is the command that repairs it.
type PermissionError struct {
	What string // what the file is, e.g. "--secret-file" or "state dir key file"
	Path string
	Mode fs.FileMode
	// Grantees are the SIDs other than the owner, SYSTEM and Administrators
	// the file's ACL allows in (Windows).
	Grantees []string
	Fix      string
}

func (e *PermissionError) Error() string {
	if len(e.Grantees) > 0 {
		return fmt.Sprintf("%s %s is %s (its ACL allows %s): run: %s", e.What, e.Path, ErrLoosePermissions, strings.Join(e.Grantees, ", "), e.Fix)
	}
	return fmt.Sprintf("%s %s is %s (mode %04o): run: %s", e.What, e.Path, ErrLoosePermissions, e.Mode.Perm(), e.Fix)
}

// Unwrap makes errors.Is(err, ErrLoosePermissions) true.
func (e *PermissionError) Unwrap() error { return ErrLoosePermissions }

// CheckPrivate refuses a secret file owned by this process's user that
// others may read, write or execute, as ssh refuses an unprotected private
// key, and a directory of secrets owned by this user that others may write
// (they could replace a key), as sshd's StrictModes does; a directory others
// can only read or enter shows file names, and each secret file in it is
// checked on its own. On Unix "others" are group and other (mode & 077 for a
// file, & 022 for a directory; the fix is chmod 600 or 700); on Windows any
// allow entry of the ACL for someone other than the owner, SYSTEM and
// Administrators, as OpenSSH for Windows checks a key (the fix is icacls).
// Like ssh, paths owned by another user are not checked: that is how systemd
// credentials, Docker and Kubernetes secrets reach a service user (read
// through group or other bits that this user cannot change). A path that
// does not exist is not an error here (its reader reports it); symlinks are
// followed. what names the path in the message.
func CheckPrivate(what, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return checkPrivate(what, path, fi)
}

// aclEntry is an allow entry of a Windows ACL: whom (a SID in its string
// form) it allows which access (mask).
type aclEntry struct {
	SID  string
	Mask uint32
}

// Well-known SIDs a private file's ACL may allow besides its owner.
const (
	sidSystem         = "S-1-5-18"
	sidAdministrators = "S-1-5-32-544"
)

// Windows access rights (winnt.h) that let a grantee change a directory's
// contents or its ACL.
const (
	accessSynchronize   = 0x00100000
	accessDirWriteRight = 0x2 | 0x4 | 0x40 | 0x10000 | 0x40000 | 0x80000 | 0x10000000 | 0x40000000 // add file, add subdirectory, delete child, DELETE, WRITE_DAC, WRITE_OWNER, GENERIC_ALL, GENERIC_WRITE
)

// looseACL returns the grantees of entries other than owner, SYSTEM and
// Administrators that may use a file (any right but SYNCHRONIZE), or for a
// directory change it, each once, in order.
func looseACL(owner string, entries []aclEntry, dir bool) []string {
	var out []string
	for _, e := range entries {
		if e.SID == owner || e.SID == sidSystem || e.SID == sidAdministrators || slices.Contains(out, e.SID) {
			continue
		}
		if (dir && e.Mask&accessDirWriteRight != 0) || (!dir && e.Mask&^accessSynchronize != 0) {
			out = append(out, e.SID)
		}
	}
	return out
}

// icaclsFix is the command that makes path private to its user on Windows:
// no inherited entries, full control for the user only.
func icaclsFix(path string, dir bool) string {
	grant := "%USERNAME%:F"
	if dir {
		grant = "%USERNAME%:(OI)(CI)F"
	}
	return fmt.Sprintf(`icacls "%s" /inheritance:r /grant:r %s`, path, grant)
}
