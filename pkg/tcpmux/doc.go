// Package tcpmux carries quictun's streams over one TLS 1.3 connection on
// TCP, for networks where UDP (and so QUIC) is blocked. A Conn and its
// Streams offer the part of *quic.Conn and *quic.Stream that the tunnel code
// uses: open and accept streams, half-close (Close sends FIN and the stream
// stays readable), CancelRead and CancelWrite with a code the peer sees,
// deadlines, a stream ID and a Context, close of the connection with an
// application error code, the peer's address and TLS state. Errors are
// quic-go's own types (*quic.StreamError, *quic.ApplicationError,
// *quic.IdleTimeoutError), so code that matches them with errors.As works
// on either transport. There are no datagrams: UDP flows stay on their
// streams (udpflow.Sender does so whenever datagrams are not possible).
//
// # Wire format: HTTP/2 framing
//
// The multiplexer speaks HTTP/2 frames (RFC 9113) through the framer of
// golang.org/x/net/http2, with the ALPN "h2". We chose HTTP/2 over yamux or
// smux for three reasons:
//   - What an observer sees is ordinary HTTPS: a TLS 1.3 ClientHello
//     offering h2 and, inside, the HTTP/2 connection preface and frames. A
//     quictun-specific ALPN or a bare yamux stream is easy to single out on
//     exactly the networks that block UDP.
//   - HTTP/2 has what the tunnel needs and yamux lacks: a reset carries an
//     error code (RST_STREAM), both ends of a stream half-close
//     independently (END_STREAM), flow control is per stream and per
//     connection (WINDOW_UPDATE), the stream limit can be raised
//     (SETTINGS_MAX_CONCURRENT_STREAMS: the server's pre-authentication
//     budget), and GOAWAY carries a code and a reason.
//   - The framer (frame parsing, size limits) is the one net/http uses:
//     well kept and fuzzed. The stream state machine above it is ours
//     (about 900 lines), because net/http's client and server cannot express
//     a server-side half-close nor arbitrary reset codes.
//
// The departures from HTTP/2, all invisible inside TLS: both ends open
// streams (client odd IDs, server even IDs, as quictun's reverse forwards
// need); a HEADERS frame opens a stream with a fixed three-byte block
// (POST https /) that the receiver does not decode; QUIC's two half-resets
// are extension frames (HTTP/2 requires unknown frame types to be ignored):
// RESET_WRITE (type 0xf0: the sender abandons its direction, with a code)
// and STOP_SENDING (type 0xf1: the receiver asks the sender to stop; the
// sender answers with RESET_WRITE), so CancelWrite alone leaves the other
// direction open as in QUIC. RST_STREAM (used for a refused stream) ends
// both directions.
//
// # Bounds
//
// Everything a peer can make this side hold is bounded: streams by
// Config.MaxIncomingStreams (more are refused with RST_STREAM), and a
// stream the peer opened counts against that limit until the application
// has accepted it and it has ended, so streams reset while they wait in the
// accept queue still take their place there (the accounting whose absence
// is HTTP/2's "rapid reset" attack, CVE-2023-44487); buffered data by the
// receive windows (a peer that exceeds them is a flow-control error that
// closes the connection), which can start small until OpenReceiveWindows
// (Config.InitialStreamReceiveWindow, InitialConnReceiveWindow); frames by
// the maximum frame size; SETTINGS frames to 100 entries without
// duplicates, applied in one pass; queued control frames (PING and
// SETTINGS acknowledgements, window updates) by maxQueuedControlFrames (a
// peer that sends them without reading the answers is disconnected). The
// free work a peer can ask for (streams reset before they were read or
// refused over the limit; PING, SETTINGS, PRIORITY, empty DATA, window
// updates under 1 KiB, unknown frames) is charged to two token buckets per
// connection (flood.go); a peer that empties one is disconnected with
// GOAWAY ENHANCE_YOUR_CALM and *FloodError. CONTINUATION and PUSH_PROMISE
// are protocol errors: a stream's HEADERS is one frame. The handshake (TLS,
// preface, SETTINGS) must finish within Config.HandshakeTimeout; a
// connection on which nothing arrives for Config.IdleTimeout ends with
// *quic.IdleTimeoutError (PINGs every Config.KeepAlivePeriod keep a live
// one busy), and a write the peer does not take within IdleTimeout closes it.
//
// # Goroutines
//
// A Conn runs two: the reader (frames in) and the control writer (queued
// control frames and keep-alive PINGs out). Stream writes are written by the
// writing goroutine itself, one writer at a time. CloseWithError returns
// after both have ended.
package tcpmux
