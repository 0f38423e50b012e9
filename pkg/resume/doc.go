// Package resume keeps a tunnel alive across the loss of the connection
// under it (issue 34, part 1). Each resumable tunnel holds, per direction,
// the bytes it sent that the peer has not confirmed (Buffer, bounded per
// tunnel and per daemon by a Budget) and counts the bytes it received; the
// counts travel out of band (ack datagrams, Table) so the data path stays a
// plain copy. When the connection dies, the tunnel parks (Pipe.Serve
// returns ErrParked) for its window; a new stream on another connection
// (an Attachment) continues it: each end resends from the offset the other
// received. Shared by both daemons: the client re-attaches, the server
// accepts the re-attachment after checking the identity that opened the
// tunnel.
package resume
