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

// makePrivate gives path an ACL of its own (not inherited) that lets only
// this process's user, SYSTEM and Administrators in (a directory passes it on
// to what it will hold), as CheckPrivate wants: on Windows, files and
// directories the daemon creates otherwise inherit their parent's ACL (on
// C:\ or ProgramData, Users may read).
func makePrivate(path string, dir bool) error {
	user, err := windows.GetCurrentProcessToken().GetTokenUser()
	if err != nil {
		return err
	}
	system, err := windows.CreateWellKnownSid(windows.WinLocalSystemSid)
	if err != nil {
		return err
	}
	admins, err := windows.CreateWellKnownSid(windows.WinBuiltinAdministratorsSid)
	if err != nil {
		return err
	}
	inherit := uint32(windows.NO_INHERITANCE)
	if dir {
		inherit = windows.SUB_CONTAINERS_AND_OBJECTS_INHERIT
	}
	var access []windows.EXPLICIT_ACCESS
	for _, sid := range []*windows.SID{user.User.Sid, system, admins} {
		access = append(access, windows.EXPLICIT_ACCESS{
			AccessPermissions: windows.GENERIC_ALL, AccessMode: windows.GRANT_ACCESS, Inheritance: inherit,
			Trustee: windows.TRUSTEE{TrusteeForm: windows.TRUSTEE_IS_SID, TrusteeValue: windows.TrusteeValueFromSID(sid)},
		})
	}
	acl, err := windows.ACLFromEntries(access, nil)
	if err != nil {
		return err
	}
	if err := windows.SetNamedSecurityInfo(path, windows.SE_FILE_OBJECT,
		windows.DACL_SECURITY_INFORMATION|windows.PROTECTED_DACL_SECURITY_INFORMATION, nil, nil, acl, nil); err != nil {
		return fmt.Errorf("make %s private: %w", path, err)
	}
	return nil
}
