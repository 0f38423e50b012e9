// Command quictun-server is the remote end of a quictun tunnel.
package main

import (
	"os"

	"github.com/quictun/quictun/cmd/quictun-server/app"
)

func main() { os.Exit(app.Run(os.Args[1:])) }
