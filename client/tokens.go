package client

import "github.com/quic-go/quic-go"

// newTokenStore keeps the tokens of one server (each server has its own:
// quic-go keys them by the TLS server name, the same for every server).
// A quic-go server gives one (NEW_TOKEN) on each connection, sealed with
// its token key, which an upgrade's new process and a restart keep (the
// state directory): the next connection presents it in its first packet,
// and both ends start from the RTT it carries (the server's smoothed RTT
// when it gave it, the client's when it took it) instead of quic-go's
// 100 ms default, which paced a new connection's initial window (40 KB
// of resent bytes after a server upgrade) over 100 ms instead of the
// path's 25 ms; the server also takes the client's address as validated
// (no 3x amplification limit on what it sends before the handshake
// completes).
func newTokenStore() quic.TokenStore {
	return quic.NewLRUTokenStore(1, 4)
}

// withTokens is conf with tokens as its token store (conf itself when
// either is nil).
func withTokens(conf *quic.Config, tokens quic.TokenStore) *quic.Config {
	if conf == nil || tokens == nil {
		return conf
	}
	conf = conf.Clone()
	conf.TokenStore = tokens
	return conf
}
