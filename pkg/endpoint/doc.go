// Package endpoint parses tunnel destinations ("tcp:HOST:PORT",
// "unix:/path") and decides, through an AllowList, which of them the server
// may dial.
//
// The allow-list is the server's main defence against being used as an open
// proxy: IP literals are matched against CIDR rules after IPv4-mapped IPv6
// addresses are unmapped, host names are resolved once and every resolved
// address must be allowed (the caller then dials the returned IP, so a second
// resolution cannot rebind the name), and unix paths are cleaned before they
// are matched, so "../" cannot escape a directory rule.
//
// Deny rules (ParseRules) win over allow rules. Some destinations are refused
// whatever the rules say: the server's own listeners (WithSelf), the
// unspecified addresses, and cloud metadata addresses unless an allow rule
// names them exactly. CheckDial applies these to the address a dialer
// actually connects to, for destinations dialed by name. Every refusal wraps
// ErrForbidden, and RefusalReason names it for metrics.
//
// The package imports only the standard library.
package endpoint
