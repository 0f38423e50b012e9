package resume

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fill appends n bytes of a pattern to b (as the application reader
// does) and returns them; it fails the test if the buffer has no room.
func fill(t *testing.T, b *Buffer, n int, seed byte) []byte {
	t.Helper()
	data := make([]byte, n)
	for i := range data {
		data[i] = seed + byte(i)
	}
	k, wait, err := b.Append(data)
	require.NoError(t, err)
	require.Nil(t, wait, "no room after %d of %d bytes", k, n)
	require.Equal(t, n, k)
	return data
}

// drain writes everything Peek offers (as the stream writer does).
func drain(b *Buffer) []byte {
	var out []byte
	for {
		p, _, _ := b.Peek()
		if len(p) == 0 {
			return out
		}
		out = append(out, p...)
		b.Advance(len(p))
	}
}

func TestBufferRewind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		acked   uint64 // confirmed before the rewind
		off     uint64 // what the peer says it received
		wantErr error
	}{
		{"from the start", 0, 0, nil},
		{"within the buffer", 1000, 40_000, nil},
		{"at the end (nothing to resend)", 0, 70_000, nil},
		{"at what was confirmed", 50_000, 50_000, nil},
		{"behind what was confirmed", 50_000, 49_999, ErrBehind},
		{"ahead of the bytes sent", 0, 70_001, ErrAhead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := NewBuffer(4<<20, nil)
			defer b.Close()
			data := fill(t, b, 70_000, 7)
			require.Equal(t, data, drain(b))
			require.NoError(t, b.Ack(tc.acked))
			err := b.Rewind(tc.off)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, string(data[tc.off:]), string(drain(b)), "resent bytes")
			base, sent, end := b.Offsets()
			assert.Equal(t, tc.off, base)
			assert.Equal(t, uint64(70_000), sent)
			assert.Equal(t, uint64(70_000), end)
		})
	}
}

func TestBufferAck(t *testing.T) {
	t.Parallel()
	b := NewBuffer(4<<20, nil)
	defer b.Close()
	fill(t, b, 3*ChunkSize+100, 1)
	p, _, _ := b.Peek()
	b.Advance(len(p)) // one chunk written
	require.ErrorIs(t, b.Ack(ChunkSize+1), ErrAhead, "an ack past the bytes written is not trusted")
	require.NoError(t, b.Ack(ChunkSize))
	assert.Equal(t, 3*ChunkSize, b.Held(), "the confirmed chunk is given back")
	require.NoError(t, b.Ack(10), "an old ack changes nothing")
	base, _, _ := b.Offsets()
	assert.Equal(t, uint64(ChunkSize), base)
	drain(b)
	require.NoError(t, b.Ack(3*ChunkSize+100))
	assert.Equal(t, 0, b.Held(), "a tunnel whose bytes are all confirmed holds no chunk")
	// It grows again from where it was.
	more := fill(t, b, 10, 9)
	assert.Equal(t, more, drain(b))
}

func TestBufferCaps(t *testing.T) {
	t.Parallel()
	t.Run("tunnel cap", func(t *testing.T) {
		t.Parallel()
		b := NewBuffer(2*ChunkSize, nil)
		defer b.Close()
		fill(t, b, 2*ChunkSize, 0)
		n, wait, err := b.Append([]byte{1})
		require.NoError(t, err)
		require.Zero(t, n, "at the cap nothing more is taken")
		drain(b)
		require.NoError(t, b.Ack(ChunkSize))
		select {
		case <-wait:
		default:
			t.Fatal("an ack that frees a chunk must wake the reader")
		}
		fill(t, b, ChunkSize, 0)
	})
	t.Run("daemon budget", func(t *testing.T) {
		t.Parallel()
		budget := NewBudget(3 * ChunkSize)
		a, b := NewBuffer(4<<20, budget), NewBuffer(4<<20, budget)
		fill(t, a, 2*ChunkSize, 0)
		fill(t, b, ChunkSize, 0)
		n, wait, _ := b.Append([]byte{1})
		require.Zero(t, n, "the budget is spent")
		assert.Equal(t, int64(3*ChunkSize), budget.Used())
		drain(a)
		require.NoError(t, a.Ack(2*ChunkSize))
		select {
		case <-wait:
		default:
			t.Fatal("another tunnel's ack must wake the waiting one")
		}
		fill(t, b, ChunkSize, 0)
		a.Close()
		b.Close()
		assert.Zero(t, budget.Used(), "closed buffers give back everything")
	})
}

func TestBufferEOF(t *testing.T) {
	t.Parallel()
	b := NewBuffer(ChunkSize, nil)
	defer b.Close()
	fill(t, b, 5, 0)
	b.Finish()
	p, eof, _ := b.Peek()
	require.Len(t, p, 5)
	assert.False(t, eof, "FIN after the bytes")
	b.Advance(5)
	_, eof, _ = b.Peek()
	assert.True(t, eof)
	require.NoError(t, b.Rewind(2))
	p, _, _ = b.Peek()
	assert.True(t, bytes.Equal(p, []byte{2, 3, 4}), "resent before FIN again: %v", p)
}

// TestBufferPreload: bytes written with the header before the Pipe (a
// proxy request's trailing bytes) are kept and resent like the rest, past
// the cap if need be.
func TestBufferPreload(t *testing.T) {
	t.Parallel()
	budget := NewBudget(ChunkSize)
	b := NewBuffer(ChunkSize, budget)
	big := bytes.Repeat([]byte{7}, ChunkSize+5)
	b.preload(big)
	base, sent, end := b.Offsets()
	assert.Equal(t, []uint64{0, uint64(len(big)), uint64(len(big))}, []uint64{base, sent, end})
	require.NoError(t, b.Rewind(ChunkSize))
	assert.Equal(t, big[ChunkSize:], drain(b))
	require.NoError(t, b.Ack(uint64(len(big))))
	assert.Zero(t, b.Held())
	b.Close()
	assert.Zero(t, budget.Used())
}
