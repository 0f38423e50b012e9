package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/net/ipv4"
)

const (
	// maxFloodDuration is the hard cap of --duration: a forgotten or
	// mistyped flood ends on its own.
	maxFloodDuration = 10 * time.Minute
	// maxFloodSize is the largest UDP payload over IPv4.
	maxFloodSize = 65507
	// minInitialSize is the smallest UDP payload a QUIC server accepts
	// for a client Initial (RFC 9000, section 14.1).
	minInitialSize = 1200
	// minShortHeaderSize leaves room for a flags byte and a 20-byte
	// connection ID, and is larger than a stateless reset must be for
	// quic-go to answer it (RFC 9000, section 10.3.3).
	minShortHeaderSize = 42
	// floodPool is the number of pre-built datagrams cycled through; each
	// one still gets fresh random connection IDs (or leading bytes) when
	// sent.
	floodPool = 256
	// floodBatch is the number of datagrams handed to one sendmmsg call.
	floodBatch = 32
	// quicVersion1 is the version written into quic-initial packets.
	quicVersion1 = 1
)

// floodKind says what the datagrams look like.
type floodKind string

const (
	// kindRandom: random bytes.
	kindRandom floodKind = "random"
	// kindInitial: QUIC v1 long-header Initial packets with random
	// destination and source connection IDs, a zero-length token and a
	// random (undecryptable) payload, so the server runs its new-connection
	// path for each one.
	kindInitial floodKind = "quic-initial"
	// kindShortHeader: QUIC short-header packets with a random destination
	// connection ID, which match no connection, so the server runs its
	// stateless-reset path.
	kindShortHeader floodKind = "short-header"
)

func (k *floodKind) String() string { return string(*k) }
func (k *floodKind) Type() string   { return "kind" }
func (k *floodKind) Set(s string) error {
	switch floodKind(s) {
	case kindRandom, kindInitial, kindShortHeader:
		*k = floodKind(s)
		return nil
	}
	return fmt.Errorf("%q: want random, quic-initial or short-header", s)
}

// floodOptions holds the flags of the flood command.
type floodOptions struct {
	target   string
	bind     string
	duration time.Duration
	rate     int
	count    int64
	size     byteSize
	kind     floodKind
	json     bool
}

func newFloodOptions() *floodOptions {
	return &floodOptions{duration: 10 * time.Second, size: minInitialSize, kind: kindRandom}
}

func (o *floodOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.target, "target", "", "UDP HOST:PORT to send to (required); nothing else is sent anywhere")
	fs.StringVar(&o.bind, "bind", "", "local IP address to send from (empty: chosen by the kernel)")
	fs.DurationVar(&o.duration, "duration", o.duration, "how long to send, at most "+maxFloodDuration.String()+"; SIGINT/SIGTERM stops earlier")
	fs.IntVar(&o.rate, "rate", 0, "datagrams per second (0 = as fast as the sender can)")
	fs.Int64Var(&o.count, "count", 0, "stop after this many datagrams (0 = no limit)")
	fs.Var(&o.size, "size", "bytes per datagram (UDP payload); at least 1200 for quic-initial, 42 for short-header")
	fs.Var(&o.kind, "kind", "datagram content: random, quic-initial (QUIC v1 Initials with random connection IDs) or short-header (random destination connection IDs)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of text")
}

func (o *floodOptions) validate() error {
	var errs []error
	if o.target == "" {
		errs = append(errs, errors.New("--target is required"))
	} else if _, port, err := net.SplitHostPort(o.target); err != nil {
		errs = append(errs, fmt.Errorf("--target must be HOST:PORT: %w", err))
	} else if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		errs = append(errs, errors.New("--target port must be in 1..65535"))
	}
	if o.bind != "" && net.ParseIP(o.bind) == nil {
		errs = append(errs, errors.New("--bind must be an IP address"))
	}
	if o.duration <= 0 || o.duration > maxFloodDuration {
		errs = append(errs, fmt.Errorf("--duration must be in (0, %s]", maxFloodDuration))
	}
	if o.rate < 0 {
		errs = append(errs, errors.New("--rate must not be negative"))
	}
	if o.count < 0 {
		errs = append(errs, errors.New("--count must not be negative"))
	}
	minSize := int64(1)
	switch o.kind {
	case kindInitial:
		minSize = minInitialSize
	case kindShortHeader:
		minSize = minShortHeaderSize
	}
	if int64(o.size) < minSize || o.size > maxFloodSize {
		errs = append(errs, fmt.Errorf("--size must be in %d..%d for --kind %s", minSize, maxFloodSize, o.kind))
	}
	return errors.Join(errs...)
}

func newFloodCommand(stdout, stderr io.Writer) *cobra.Command {
	o := newFloodOptions()
	cmd := &cobra.Command{
		Use:   "flood",
		Short: "Send garbage UDP datagrams at one address for a bounded time (a load generator for tests you own)",
		Long: `flood sends UDP datagrams to --target, and only there, for at most --duration
(hard cap ` + maxFloodDuration.String() + `), optionally --count datagrams, at --rate per second or as
fast as the sender can. It counts what it sent and the datagrams the target
sent back, and prints the counts and the achieved rate. SIGINT or SIGTERM
stops it early; the report is still printed.

Kinds: random bytes; quic-initial, QUIC v1 long-header Initial packets with
random connection IDs (a server runs its new-connection path: Retry, refusal
or a new handshake); short-header, QUIC short-header packets with random
destination connection IDs (a server runs its stateless-reset path).

Only point it at servers you are allowed to load.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return usageError{err}
			}
			r, err := runFlood(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := printFlood(stdout, r, o.json); err != nil {
				return err
			}
			if r.Packets == 0 {
				fmt.Fprintf(stderr, "Error: no datagram was sent; first error: %s\n", r.FirstSendError)
				return errMeasured
			}
			return nil
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// FloodReport is the result of a flood run; its JSON form is the --json
// output.
type FloodReport struct {
	Target    string  `json:"target"`
	Local     string  `json:"local"`
	Kind      string  `json:"kind"`
	Size      int     `json:"size"`
	Rate      int     `json:"rate"` // requested; 0 = as fast as possible
	DurationS float64 `json:"duration_s"`
	// Stopped says why sending ended: duration, count, signal (ctx
	// cancelled) or error.
	Stopped string  `json:"stopped"`
	Seconds float64 `json:"seconds"`
	Packets int64   `json:"packets"`
	Bytes   int64   `json:"bytes"`
	PPS     float64 `json:"pps"`
	// MbitPerS counts UDP payload only.
	MbitPerS float64 `json:"mbit_per_s"`
	// SendErrors counts failed sends (for example ECONNREFUSED after an
	// ICMP port unreachable); sending goes on after them.
	SendErrors     int64  `json:"send_errors"`
	FirstSendError string `json:"first_send_error,omitempty"`
	// ReplyPackets and ReplyBytes count datagrams the target sent back
	// (Retry, Version Negotiation, stateless resets, connection closes).
	ReplyPackets int64 `json:"reply_packets"`
	ReplyBytes   int64 `json:"reply_bytes"`
}

// packetFiller writes fresh random bytes of one kind into pre-built
// datagrams. Not safe for concurrent use.
type packetFiller struct {
	kind floodKind
	rng  *rand.ChaCha8
}

func newPacketFiller(kind floodKind, seed [32]byte) *packetFiller {
	return &packetFiller{kind: kind, rng: rand.NewChaCha8(seed)}
}

// build fills p completely with a datagram of f's kind.
func (f *packetFiller) build(p []byte) {
	_, _ = f.rng.Read(p)
	f.refresh(p)
}

// refresh re-randomises the part of p that makes it a new packet to the
// receiver (connection IDs, leading bytes) and re-applies the kind's fixed
// fields. It is cheap enough to run for every datagram.
func (f *packetFiller) refresh(p []byte) {
	var r [40]byte
	_, _ = f.rng.Read(r[:])
	switch f.kind {
	case kindRandom:
		copy(p, r[:min(len(p), 16)])
	case kindInitial:
		// Long header (1), fixed bit (1), type Initial (00), reserved and
		// packet-number length bits random; RFC 9000, section 17.2.2.
		p[0] = 0xc0 | r[0]&0x0f
		binary.BigEndian.PutUint32(p[1:5], quicVersion1)
		dcidLen := 8 + int(r[1]%13) // 8..20: servers require at least 8 in a client's first Initial
		p[5] = byte(dcidLen)
		copy(p[6:6+dcidLen], r[2:2+dcidLen])
		i := 6 + dcidLen
		p[i] = 8 // SCID length
		copy(p[i+1:i+9], r[22:30])
		i += 9
		p[i] = 0 // token length (varint 0)
		i++
		// Length: the rest of the datagram, as a 2-byte varint when it fits
		// in 14 bits, else a 4-byte one (RFC 9000, section 16).
		if rest := len(p) - i - 2; rest < 1<<14 {
			binary.BigEndian.PutUint16(p[i:], 0x4000|uint16(rest)) // rest < 1<<14
		} else {
			binary.BigEndian.PutUint32(p[i:], 0x80000000|uint32(len(p)-i-4)) // len(p) <= maxFloodSize
		}
	case kindShortHeader:
		// Short header (0), fixed bit (1), the rest random; RFC 9000, section 17.3.1.
		p[0] = 0x40 | r[0]&0x3f
		copy(p[1:21], r[1:21])
	}
}

// runFlood sends datagrams to o.target until o.duration has passed, o.count
// datagrams are sent or ctx is cancelled, and reports what it did. It
// returns an error only when it could not start (resolve or open the socket).
func runFlood(ctx context.Context, o *floodOptions) (*FloodReport, error) {
	var laddr *net.UDPAddr
	if o.bind != "" {
		laddr = &net.UDPAddr{IP: net.ParseIP(o.bind)}
	}
	raddr, err := net.ResolveUDPAddr("udp", o.target)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", o.target, err)
	}
	// A connected socket: the kernel sends only to raddr and delivers
	// only raddr's replies.
	conn, err := net.DialUDP("udp", laddr, raddr)
	if err != nil {
		return nil, fmt.Errorf("open UDP socket to %s: %w", raddr, err)
	}
	defer conn.Close()
	_ = conn.SetWriteBuffer(4 << 20)
	_ = conn.SetReadBuffer(4 << 20)

	r := &FloodReport{Target: raddr.String(), Local: conn.LocalAddr().String(), Kind: string(o.kind), Size: int(o.size),
		Rate: o.rate, DurationS: o.duration.Seconds()}

	// Replies are counted, not parsed.
	var replies, replyBytes atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ICMP errors surface here as ECONNREFUSED
			}
			replies.Add(1)
			replyBytes.Add(int64(n))
		}
	})

	var seed [32]byte
	for i := 0; i < len(seed); i += 8 {
		binary.LittleEndian.PutUint64(seed[i:], rand.Uint64())
	}
	fill := newPacketFiller(o.kind, seed)
	pool := make([][]byte, floodPool)
	for i := range pool {
		pool[i] = make([]byte, o.size)
		fill.build(pool[i])
	}

	// sendmmsg: about 1.7 times the datagrams per second of one write
	// per datagram on this kind of host.
	pc := ipv4.NewPacketConn(conn)
	msgs := make([]ipv4.Message, floodBatch)
	for j := range msgs {
		msgs[j].Buffers = make([][]byte, 1)
	}
	next := 0
	start := time.Now()
	deadline := start.Add(o.duration)
	r.Stopped = "duration"
send:
	for {
		now := time.Now()
		if !now.Before(deadline) {
			break
		}
		if ctx.Err() != nil {
			r.Stopped = "signal"
			break
		}
		attempted := r.Packets + r.SendErrors
		n := int64(floodBatch)
		if o.count > 0 {
			if attempted >= o.count {
				r.Stopped = "count"
				break
			}
			n = min(n, o.count-attempted)
		}
		if o.rate > 0 {
			// Pace against the start, not the previous batch, so a late
			// wake-up is made up by a fuller batch.
			due := int64(now.Sub(start).Seconds()*float64(o.rate)) + 1 - attempted
			if due <= 0 {
				at := start.Add(time.Duration(float64(attempted) / float64(o.rate) * float64(time.Second)))
				t := time.NewTimer(min(at.Sub(now), deadline.Sub(now)))
				select {
				case <-ctx.Done():
					t.Stop()
					r.Stopped = "signal"
					break send
				case <-t.C:
				}
				continue
			}
			n = min(n, due)
		}
		for j := range n {
			p := pool[next]
			next = (next + 1) % floodPool
			fill.refresh(p)
			msgs[j].Buffers[0] = p
		}
		k, err := pc.WriteBatch(msgs[:n], 0)
		r.Packets += int64(k)
		for j := range k {
			r.Bytes += int64(msgs[j].N)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				r.Stopped = "error"
				r.FirstSendError = err.Error()
				break
			}
			// The datagram at k failed (for example ECONNREFUSED after an
			// ICMP port unreachable); the rest of the batch is dropped.
			if r.SendErrors == 0 {
				r.FirstSendError = err.Error()
			}
			r.SendErrors++
		}
	}
	elapsed := time.Since(start)
	// Late replies to the last datagrams are still counted.
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
	_ = conn.Close()
	wg.Wait()
	r.Seconds = elapsed.Seconds()
	if r.Seconds > 0 {
		r.PPS = float64(r.Packets) / r.Seconds
		r.MbitPerS = float64(r.Bytes) * 8 / r.Seconds / 1e6
	}
	r.ReplyPackets, r.ReplyBytes = replies.Load(), replyBytes.Load()
	return r, nil
}

func printFlood(w io.Writer, r *FloodReport, asJSON bool) error {
	if asJSON {
		return writeJSON(w, r)
	}
	var err error
	p := func(format string, a ...any) {
		if err == nil {
			_, err = fmt.Fprintf(w, format, a...)
		}
	}
	rate := "max"
	if r.Rate > 0 {
		rate = strconv.Itoa(r.Rate) + "/s"
	}
	p("Flood: %s datagrams of %d bytes from %s to %s, rate %s, stopped by %s\n", r.Kind, r.Size, r.Local, r.Target, rate, r.Stopped)
	p("Sent: %d datagrams, %d bytes in %s s: %s datagrams/s, %s Mbit/s\n", r.Packets, r.Bytes, f3(r.Seconds), f3(r.PPS), f3(r.MbitPerS))
	p("Send errors: %d", r.SendErrors)
	if r.FirstSendError != "" {
		p(" (first: %s)", r.FirstSendError)
	}
	p("\nReplies: %d datagrams, %d bytes\n", r.ReplyPackets, r.ReplyBytes)
	return err
}
