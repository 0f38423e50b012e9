//go:build !windows

package cli

import "syscall"

// errAddrInUse is the error of a listen on an address another socket holds.
var errAddrInUse error = syscall.EADDRINUSE
