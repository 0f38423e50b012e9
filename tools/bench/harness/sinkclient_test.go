package harness

import (
	"encoding/binary"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSink implements the download side of the sink protocol, stopping on
// the first byte from the client (no half-close needed) or after the
// request's count (when not 0).
func fakeSink(t *testing.T, c net.Conn, corrupt bool) {
	t.Helper()
	defer c.Close()
	req := make([]byte, 16)
	if _, err := io.ReadFull(c, req); err != nil {
		return
	}
	assert.Equal(t, "QTSK", string(req[:4]))
	assert.Equal(t, byte('D'), req[5])
	count := binary.BigEndian.Uint64(req[8:])
	stop := make(chan struct{})
	go func() {
		b := make([]byte, 1)
		_, _ = c.Read(b)
		close(stop)
	}()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	frame := make([]byte, 4+32<<10)
	binary.BigEndian.PutUint32(frame, 32<<10)
	for i := range frame[4:] {
		frame[4+i] = byte(i * 7)
	}
	var sent uint64
	for {
		done := count > 0 && sent >= count
		select {
		case <-stop:
			done = true
		default:
		}
		if done {
			var end [4 + sinkTrailerSize]byte
			binary.BigEndian.PutUint64(end[4:], sent)
			sum := h.Sum32()
			if corrupt {
				sum++
			}
			binary.BigEndian.PutUint32(end[12:], sum)
			_, _ = c.Write(end[:])
			return
		}
		n := uint64(32 << 10)
		if count > 0 {
			n = min(n, count-sent)
		}
		binary.BigEndian.PutUint32(frame, uint32(n))
		if _, err := c.Write(frame[:4+n]); err != nil {
			return
		}
		_, _ = h.Write(frame[4 : 4+n])
		sent += n
	}
}

func TestDownloadOne(t *testing.T) {
	t.Parallel()
	for _, corrupt := range []bool{false, true} {
		a, b := net.Pipe()
		go fakeSink(t, b, corrupt)
		s := downloadOne(a, 50*time.Millisecond, 5*time.Second, nil)
		_ = a.Close()
		if corrupt {
			assert.Contains(t, s.Error, "CRC-32C mismatch")
			continue
		}
		assert.Empty(t, s.Error)
		assert.Positive(t, s.Bytes)
		assert.Zero(t, s.Bytes%(32<<10))
		assert.GreaterOrEqual(t, s.Seconds, 0.05)
		require.Less(t, s.Seconds, 2.0)
	}
}
