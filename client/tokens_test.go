package client

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/transport"
)

// recordingTokens is a server's token store that says when a token came.
type recordingTokens struct {
	quic.TokenStore
	put chan struct{}
}

func (r *recordingTokens) Put(key string, tok *quic.ClientToken) {
	r.TokenStore.Put(key, tok)
	select {
	case r.put <- struct{}{}:
	default:
	}
}

// TestDialPresentsServersToken: a QUIC server (quic-go, on loopback) gives
// each connection a token (NEW_TOKEN); the client's next dial to that
// server presents it, so the server takes the client's address as
// validated and both ends start from the RTT it carries (quic-go restores
// it from the token) instead of the 100 ms default. Without the client's
// token store the second dial comes unvalidated.
func TestDialPresentsServersToken(t *testing.T) {
	st, err := transport.LoadOrCreateState(t.TempDir(), "", "")
	require.NoError(t, err)
	spc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer spc.Close()
	str := &quic.Transport{Conn: spc, TokenGeneratorKey: &st.TokenKey}
	defer str.Close()
	sconf := transport.QUICConfig(transport.DefaultQUICOptions())
	verified := make(chan bool, 4)
	lconf := sconf.Clone()
	lconf.GetConfigForClient = func(ci *quic.ClientInfo) (*quic.Config, error) {
		verified <- ci.AddrVerified
		return sconf, nil
	}
	ln, err := str.ListenEarly(transport.ServerTLSConfig(st, nil), lconf)
	require.NoError(t, err)
	go func() {
		for {
			if _, err := ln.Accept(context.Background()); err != nil {
				return
			}
		}
	}()

	c := fakeClient(t, ModeFailover, 1, spc.LocalAddr().String())
	c.cfg.QUIC = transport.QUICConfig(transport.DefaultQUICOptions())
	tlsConf, err := transport.ClientTLSConfig(transport.ClientTLSOptions{ServerName: transport.ServerName, InsecureSkipVerify: true})
	require.NoError(t, err)
	require.NoError(t, c.SetTLS(tlsConf, nil))
	tokens := &recordingTokens{TokenStore: newTokenStore(), put: make(chan struct{}, 1)}
	c.servers[0].tokens = tokens
	cpc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	defer cpc.Close()
	ctr := &quic.Transport{Conn: cpc}
	defer ctr.Close()

	first, err := c.dialQUIC(t.Context(), ctr, c.members[0])
	require.NoError(t, err)
	require.False(t, <-verified, "the first dial has no token")
	select {
	case <-tokens.put:
	case <-time.After(10 * time.Second):
		t.Fatal("the server gave no token")
	}
	_ = first.CloseWithError(0, "")
	second, err := c.dialQUIC(t.Context(), ctr, c.members[0])
	require.NoError(t, err)
	defer second.CloseWithError(0, "")
	require.True(t, <-verified, "the second dial presents the first one's token")
}
