package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func FuzzDecodeSinkRequest(f *testing.F) {
	f.Add(sinkRequest{direction: dirUp, count: 0}.encode())
	f.Add(sinkRequest{direction: dirDown, count: 1 << 30}.encode())
	f.Add([]byte("QTSK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeSinkRequest(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to the same bytes, reserved bytes
		// aside.
		again, err := decodeSinkRequest(r.encode())
		require.NoError(t, err)
		require.Equal(t, r, again)
		require.Equal(t, b[:6], r.encode()[:6])
		require.Equal(t, b[8:], r.encode()[8:])
	})
}
