// Package tunnel keeps the registry of open tunnels of one endpoint: what the
// admin API lists, what a graceful drain waits for, and what DELETE closes.
package tunnel
