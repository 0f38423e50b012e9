//go:build !linux

package app

import "os"

// upgradeSignals: none, upgrades hand sockets over as Linux alone allows
// (pkg/handover).
var upgradeSignals []os.Signal
