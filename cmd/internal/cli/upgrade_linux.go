package cli

import (
	"os"
	"syscall"
)

// upgradeSignals start an upgrade (see upgrader).
var upgradeSignals = []os.Signal{syscall.SIGUSR2}
