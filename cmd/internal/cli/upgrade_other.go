//go:build !linux

package cli

import "os"

// upgradeSignals: none, upgrades hand sockets over as Linux alone allows
// (pkg/handover).
var upgradeSignals []os.Signal
