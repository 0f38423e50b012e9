package transport

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLooseACL is the Windows check's judgement of an ACL (perm_windows.go
// reads the ACL; this runs everywhere).
func TestLooseACL(t *testing.T) {
	t.Parallel()
	const me, users, everyone = "S-1-5-21-1-2-3-1001", "S-1-5-32-545", "S-1-1-0"
	const read, full, sync = 0x120089, 0x1f01ff, accessSynchronize
	for _, tc := range []struct {
		name    string
		entries []aclEntry
		dir     bool
		want    []string
	}{
		{"owner, SYSTEM, Administrators only", []aclEntry{{me, full}, {sidSystem, full}, {sidAdministrators, full}}, false, nil},
		{"Users may read", []aclEntry{{me, full}, {users, read}}, false, []string{users}},
		{"Everyone may read, twice", []aclEntry{{everyone, read}, {me, full}, {everyone, full}}, false, []string{everyone}},
		{"SYNCHRONIZE alone is harmless", []aclEntry{{me, full}, {users, sync}}, false, nil},
		{"a directory others may read", []aclEntry{{me, full}, {users, read}}, true, nil},
		{"a directory others may add files to", []aclEntry{{me, full}, {users, read | 0x2}}, true, []string{users}},
		{"a directory others may re-ACL", []aclEntry{{me, full}, {users, 0x40000}}, true, []string{users}},
	} {
		assert.Equal(t, tc.want, looseACL(me, tc.entries, tc.dir), tc.name)
	}
	assert.Equal(t, `icacls "C:\q\secret" /inheritance:r /grant:r %USERNAME%:F`, icaclsFix(`C:\q\secret`, false))
	assert.Equal(t, `icacls "C:\q" /inheritance:r /grant:r %USERNAME%:(OI)(CI)F`, icaclsFix(`C:\q`, true))

	err := error(&PermissionError{What: "--secret-file", Path: `C:\q\secret`, Grantees: []string{users}, Fix: icaclsFix(`C:\q\secret`, false)})
	assert.True(t, errors.Is(err, ErrLoosePermissions))
	assert.Equal(t, `--secret-file C:\q\secret is accessible by group or others (its ACL allows S-1-5-32-545): run: icacls "C:\q\secret" /inheritance:r /grant:r %USERNAME%:F`, err.Error())
}
