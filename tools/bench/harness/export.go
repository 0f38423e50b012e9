package harness

import "syscall"

// What the load generator (tools/bench/loadgen) shares with the harness: the
// daemons' process handling, their Go runtime settings and the machine
// description.

// StartProcEnv is StartProc with env added to the inherited environment.
func StartProcEnv(name, ns, logPath string, env []string, bin string, args ...string) (*Proc, error) {
	return startProcEnv(name, ns, logPath, env, bin, args...)
}

// DaemonEnv returns what the harness adds to the environment of a quictun
// daemon it starts: extra and nothing else (nil when empty), so the daemon
// runs with the environment its user gave (issue 32).
func DaemonEnv(extra []string) []string { return benchDaemonEnv(extra) }

// MachineInfo describes this host (CPUs, model, memory, kernel, load).
func MachineInfo() Machine { return machineInfo() }

// Kill sends SIGKILL to the process group, as a crash would end it, and
// waits for the process to be gone (no drain, no CONNECTION_CLOSE).
func (p *Proc) Kill() {
	defer p.log.Close()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}
