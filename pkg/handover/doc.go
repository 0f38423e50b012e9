// Package handover is the protocol by which a running quictun-server or
// quictun-client hands its sockets and its resumable tunnels to its
// successor during an upgrade (issue 34, parts 2 and 3). The old process creates a UNIX socket pair
// (SOCK_SEQPACKET: each message keeps its bounds) and passes one end to
// the child it starts, as an inherited descriptor named by EnvFD; nobody
// else can connect to it. Descriptors travel as SCM_RIGHTS.
//
// The exchange, each message at most MaxMessage bytes:
//
//	old -> new  listeners   the server's UDP socket, TCP fallback and admin listeners; a client's local entry points and admin listener (fds)
//	new -> old  ready       the new process built its server; the old one commits
//	old -> new  released    (a server) the old process no longer reads the sockets: the new one serves them now
//	old -> new  tunnel      one per resumable tunnel: its state and its application socket (one fd)
//	old -> new  data        the tunnel's unconfirmed bytes, in pieces
//	old -> new  end         the number of tunnels sent
//	old -> new  saved       (after released) the old process saved its last accounting totals
//	new -> old  done        the number imported
//
// A server sends released as soon as it stopped reading its UDP socket,
// before it has the tunnels ready: its successor answers the clients'
// handshakes while it takes them (a re-attachment that comes before its
// tunnel waits for it). The two processes never read the socket at the
// same time: released is sent only once the old process's reads ended. A
// child that receives a tunnel or the end where released may come serves
// after the import, as before released existed.
//
// A client sends each tunnel as soon as it is exported (SendEach) and its
// successor, connected already, re-attaches each as it arrives, while the
// rest come: the messages are the same as when every tunnel is exported
// first, so either build reads the other's.
//
// Every message starts with "QH", the Version and its type. The receiver
// checks each bound (Limits) before it takes anything, and on any error
// closes every descriptor it received: it holds nothing it was not meant
// to.
package handover
