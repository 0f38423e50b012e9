package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/quictun/quictun/tools/linkem/netns"
)

// dialIn opens a TCP connection from inside namespace ns.
func dialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	return dialFrom(ctx, ns, "", addr)
}

// dialFrom opens a TCP connection from local IP from ("": any) inside
// namespace ns.
func dialFrom(ctx context.Context, ns, from, addr string) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(ns, func() error {
		var d net.Dialer
		if from != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
		}
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		if from != "" {
			return nil, fmt.Errorf("dial %s from %s in %s: %w", addr, from, ns, err)
		}
		return nil, fmt.Errorf("dial %s in %s: %w", addr, ns, err)
	}
	return c, nil
}

// httpClientIn returns an HTTP client whose connections are made in ns.
func httpClientIn(ns string) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return dialIn(ctx, ns, addr)
			},
		},
	}
}

// roundTrip writes size bytes and reads the echo.
func roundTrip(c net.Conn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	return nil
}

// tcpPingPong measures n round trips of size bytes on a fresh TCP pair
// between the namespaces, without any other process, to validate the link.
func tcpPingPong(ctx context.Context, cns, sns, serverIP string, n, size int) ([]time.Duration, error) {
	c, s, err := tcpPair(ctx, cns, sns, serverIP)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	defer s.Close()
	defer context.AfterFunc(ctx, func() { _ = c.Close(); _ = s.Close() })()
	deadline := time.Now().Add(2 * time.Minute)
	_ = c.SetDeadline(deadline)
	_ = s.SetDeadline(deadline)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	})
	defer wg.Wait()
	buf := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := roundTrip(c, buf); err != nil {
			_ = c.Close()
			return rtts, err
		}
		rtts = append(rtts, time.Since(start))
	}
	return rtts, nil
}

func tcpPair(ctx context.Context, cns, sns, serverIP string) (net.Conn, net.Conn, error) {
	var ln net.Listener
	if err := netns.Do(sns, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(serverIP, "0"))
		return err
	}); err != nil {
		return nil, nil, fmt.Errorf("listen in %s: %w", sns, err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		acc <- res{c, err}
	}()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := dialIn(dctx, cns, ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		<-acc
		return nil, nil, err
	}
	r := <-acc
	if r.err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("accept: %w", r.err)
	}
	return c, r.c, nil
}

// tcpBulk sends client->server for d on a fresh TCP pair and returns the
// goodput in bit/s.
func tcpBulk(ctx context.Context, cns, sns, serverIP string, d time.Duration) (float64, error) {
	c, s, err := tcpPair(ctx, cns, sns, serverIP)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	defer s.Close()
	defer context.AfterFunc(ctx, func() { _ = c.Close(); _ = s.Close() })()
	var received int64
	var first, last time.Time
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 256<<10)
		_ = s.SetReadDeadline(time.Now().Add(d + 30*time.Second))
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if first.IsZero() {
					first = time.Now()
				}
				received += int64(n)
				last = time.Now()
			}
			if err != nil {
				return
			}
		}
	})
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(d)
	_ = c.SetWriteDeadline(deadline)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, fmt.Errorf("bulk write: %w", err)
			}
			break
		}
	}
	_ = c.(*net.TCPConn).CloseWrite()
	wg.Wait()
	if !last.After(first) {
		return 0, errors.New("bulk: nothing received")
	}
	return float64(received*8) / last.Sub(first).Seconds(), nil
}

// udpLoss sends n datagrams client->server, gap apart, and returns the
// fraction that did not arrive.
func udpLoss(ctx context.Context, cns, sns, serverIP string, n int, gap time.Duration) (float64, error) {
	var srv net.PacketConn
	if err := netns.Do(sns, func() (err error) {
		srv, err = net.ListenPacket("udp", net.JoinHostPort(serverIP, "0"))
		return err
	}); err != nil {
		return 0, fmt.Errorf("listen udp: %w", err)
	}
	defer srv.Close()
	var conn net.Conn
	if err := netns.Do(cns, func() (err error) {
		conn, err = net.Dial("udp", srv.LocalAddr().String())
		return err
	}); err != nil {
		return 0, fmt.Errorf("dial udp: %w", err)
	}
	defer conn.Close()
	got := make(chan int, 1)
	go func() {
		buf := make([]byte, 2048)
		k := 0
		for {
			_ = srv.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if _, _, err := srv.ReadFrom(buf); err != nil {
				got <- k
				return
			}
			k++
		}
	}()
	msg := make([]byte, 200)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		if _, err := conn.Write(msg); err != nil {
			return 0, fmt.Errorf("udp write: %w", err)
		}
		if gap > 0 && i%10 == 9 {
			time.Sleep(10 * gap)
		}
	}
	k := <-got
	return float64(n-k) / float64(n), nil
}

func medianOf(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func newGet(ctx context.Context, url string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("build request %s: %w", url, err)
	}
	return req, nil
}
