package cli

import "golang.org/x/sys/windows"

// errAddrInUse is the error of a listen on an address another socket holds
// (Winsock's, not Go's syscall.EADDRINUSE).
var errAddrInUse error = windows.WSAEADDRINUSE
