//go:build !unix

package transport

import "io/fs"

// ownedByMe is false off Unix (Windows), so CheckPrivate checks nothing there: Go's
// mode bits of a Windows file say only whether it is read-only, not who may
// read it (its ACL). hostcheck's "platform" finding says so at start.
func ownedByMe(fs.FileInfo) bool { return false }
