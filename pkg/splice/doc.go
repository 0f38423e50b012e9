// Package splice copies bytes both ways between a TCP (or UNIX) connection and a
// QUIC stream, mapping half-close and reset across:
//
//	EOF from the connection  -> stream.Close (FIN), the other direction goes on
//	EOF from the stream      -> CloseWrite on the connection (FIN), the other direction goes on
//	error or reset anywhere  -> CancelRead+CancelWrite(code) on the stream, RST on the connection
//
// Exactly two goroutines per Pipe, both owned by Run, which returns only when
// both have ended.
package splice
