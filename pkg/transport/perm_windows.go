//go:build windows

package transport

import (
	"fmt"
	"io/fs"
	"unsafe"

	"golang.org/x/sys/windows"
)

// checkPrivate is CheckPrivate's check on Windows: the allow entries of the
// path's ACL, when this process's user (or Administrators, the owner of
// what an elevated administrator creates) owns it. Go's mode bits of a
// Windows file say only whether it is read-only.
func checkPrivate(what, path string, fi fs.FileInfo) error {
	sd, err := windows.GetNamedSecurityInfo(path, windows.SE_FILE_OBJECT,
		windows.OWNER_SECURITY_INFORMATION|windows.DACL_SECURITY_INFORMATION)
	if err != nil {
		return fmt.Errorf("%s: read the ACL of %s: %w", what, path, err)
	}
	owner, _, err := sd.Owner()
	if err != nil {
		return fmt.Errorf("%s: read the owner of %s: %w", what, path, err)
	}
	user, err := windows.GetCurrentProcessToken().GetTokenUser()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !owner.Equals(user.User.Sid) && owner.String() != sidAdministrators {
		return nil // another user's (a service's credentials): not ours to judge
	}
	dacl, _, err := sd.DACL()
	if err != nil {
		return fmt.Errorf("%s: read the ACL of %s: %w", what, path, err)
	}
	fix := icaclsFix(path, fi.IsDir())
	if dacl == nil { // no ACL at all: everyone may do anything
		return &PermissionError{What: what, Path: path, Mode: fi.Mode(), Grantees: []string{"everyone (no ACL)"}, Fix: fix}
	}
	var entries []aclEntry
	for i := range uint32(dacl.AceCount) {
		var ace *windows.ACCESS_ALLOWED_ACE
		if err := windows.GetAce(dacl, i, &ace); err != nil {
			return fmt.Errorf("%s: read the ACL of %s: %w", what, path, err)
		}
		if ace.Header.AceType != windows.ACCESS_ALLOWED_ACE_TYPE || ace.Header.AceFlags&windows.INHERIT_ONLY_ACE != 0 {
			continue // a deny entry, or one only for what the directory will hold
		}
		sid := (*windows.SID)(unsafe.Pointer(&ace.SidStart))
		entries = append(entries, aclEntry{SID: sid.String(), Mask: uint32(ace.Mask)})
	}
	if loose := looseACL(owner.String(), entries, fi.IsDir()); len(loose) > 0 {
		return &PermissionError{What: what, Path: path, Mode: fi.Mode(), Grantees: loose, Fix: fix}
	}
	return nil
}
