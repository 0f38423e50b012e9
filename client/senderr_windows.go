package client

import "golang.org/x/sys/windows"

// transientSendErrors are senderr_other.go's, as Winsock names them: Go's
// syscall.ENETUNREACH and the like are not what a Windows socket returns.
var transientSendErrors = []error{
	windows.WSAENETUNREACH, windows.WSAEHOSTUNREACH, windows.WSAEADDRNOTAVAIL,
	windows.WSAENETDOWN, windows.WSAEHOSTDOWN, windows.WSAENOBUFS, windows.WSAEACCES,
}
