// Package rawsock gives quic-go a UDP socket whose sends and batched receives
// are system calls the Go scheduler is not told about (syscall.RawSyscall
// inside syscall.RawConn's Read and Write, which still park the goroutine on
// the network poller while the socket has nothing to read or no room).
//
// The socket is non-blocking (Go's poller made it so), so each call returns
// at once, and what an announced system call costs a busy daemon on one CPU
// goes away (issue 32, measured with bench loopback's redis case): the first
// one after an idle spell wakes the runtime's system monitor from its deep
// sleep (a futex call and a thread switch), which then polls every 20 us for
// a while, and a call the kernel preempts for longer than one such poll has
// its P taken away and handed to another thread (two more thread switches).
// The splice does the same for the TCP side of a tunnel.
//
// Linux on amd64 and arm64 only; Wrap returns the socket unchanged elsewhere.
package rawsock
