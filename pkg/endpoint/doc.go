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
// The package imports only the standard library.
package endpoint
