// Command quictun-client is the local end of a quictun tunnel.
package main

import (
	"os"

	"github.com/quictun/quictun/cmd/quictun-client/app"
)

func main() { os.Exit(app.Run(os.Args[1:])) }
