//go:build !unix

package testutil

// reservePort: no reservation across processes here; FreeAddr's own
// bookkeeping keeps a port to one use within the process.
func reservePort(int) bool { return true }
