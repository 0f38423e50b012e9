//go:build !unix

package resume

import (
	"os"

	"github.com/quictun/quictun/pkg/splice"
)

// importConn makes f the tunnel's connection (net.FileConn); it takes f.
func importConn(f *os.File) (splice.Conn, error) { return netFileConn(f) }
