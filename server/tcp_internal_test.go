package server

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadClientHello: the wait for a TCP connection's first TLS record
// returns the whole record however it arrives, only the header of what is
// not a handshake record of a valid length (the TLS server refuses it at
// once), and ends with ctx; helloConn then replays what was read before
// the rest of the connection.
func TestReadClientHello(t *testing.T) {
	t.Parallel()
	record := append([]byte{tlsRecordHandshake, 3, 1, 0, 6}, "hello!"...)
	for _, tc := range []struct {
		name   string
		pieces [][]byte
		want   []byte
	}{
		{"whole record", [][]byte{record}, record},
		{"record in pieces", [][]byte{record[:1], record[1:4], record[4:7], record[7:]}, record},
		{"not TLS", [][]byte{[]byte("GET / HTTP/1.1\r\n")}, []byte("GET /")},
		{"over the record size", [][]byte{{tlsRecordHandshake, 3, 1, 0xff, 0xff}}, []byte{tlsRecordHandshake, 3, 1, 0xff, 0xff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server, client := net.Pipe()
			defer func() { _ = server.Close() }()
			go func() {
				for _, p := range tc.pieces {
					if _, err := client.Write(p); err != nil {
						return
					}
				}
				_, _ = client.Write([]byte("rest"))
				_ = client.Close()
			}()
			got, err := readClientHello(context.Background(), server)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			all, err := io.ReadAll(&helloConn{Conn: server, hello: got})
			require.NoError(t, err)
			var sent []byte
			for _, p := range tc.pieces {
				sent = append(sent, p...)
			}
			assert.Equal(t, string(append(sent, "rest"...)), string(all), "replayed, then the rest")
		})
	}
	t.Run("ends with ctx", func(t *testing.T) {
		t.Parallel()
		server, client := net.Pipe()
		defer func() { _ = server.Close(); _ = client.Close() }()
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			_, _ = client.Write(record[:3]) // then stalls
			cancel()
		}()
		_, err := readClientHello(ctx, server)
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		assert.True(t, ne.Timeout())
	})
}
