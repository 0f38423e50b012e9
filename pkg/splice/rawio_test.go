package splice

import (
	"net"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The splice makes raw system calls only on the net package's own sockets:
// a type wrapping one may do more in its Read and Write (buffered bytes).
func TestRawIOOnlyOnNetSockets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	tc := c.(*net.TCPConn)
	type wrapped struct{ *net.TCPConn }
	assert.Nil(t, newRawIO(wrapped{tc}), "a wrapper's Read and Write are called")
	if runtime.GOOS == "linux" {
		assert.NotNil(t, newRawIO(tc))
	} else {
		assert.Nil(t, newRawIO(tc))
	}
}
