package client

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLogMemorySaysEachOutcomeOnce: a refused destination is news once
// until the server allows it again; a binding's outcome is news when it
// differs from the last one of that binding on that server.
func TestLogMemorySaysEachOutcomeOnce(t *testing.T) {
	t.Parallel()
	var m logMemory
	assert.False(t, m.allowed("tcp:a:1"), "never refused")
	assert.True(t, m.refused("tcp:a:1"))
	assert.False(t, m.refused("tcp:a:1"), "said already")
	assert.True(t, m.allowed("tcp:a:1"), "refused before: news")
	assert.False(t, m.allowed("tcp:a:1"))
	assert.True(t, m.refused("tcp:a:1"), "refused again: news")

	a, b := &server{label: "a"}, &server{label: "b"}
	assert.True(t, m.bindOutcome(bindKey{a, 0}, "bound"))
	assert.False(t, m.bindOutcome(bindKey{a, 0}, "bound"))
	assert.True(t, m.bindOutcome(bindKey{b, 0}, "bound"), "another server's")
	assert.True(t, m.bindOutcome(bindKey{a, 1}, "bound"), "another binding's")
	assert.True(t, m.bindOutcome(bindKey{a, 0}, "refused"))
	assert.True(t, m.bindOutcome(bindKey{a, 0}, ""), "an empty outcome differs too")
}

// TestLinkOf: a session's link is found while it is its member's link
// (ingress's Accepted confirms it); not once replaced, nor for a TCP
// session.
func TestLinkOf(t *testing.T) {
	t.Parallel()
	c := fakeClient(t, ModeFailover, 2, "a")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	l0 := c.setSession(c.members[0], &session{Conn: fakeConn{ctx}}, nil)
	l1 := c.setSession(c.members[1], &session{Conn: fakeConn{ctx}}, nil)
	assert.Same(t, l0, c.linkOf(l0.session))
	assert.Same(t, l1, c.linkOf(l1.session))
	c.setSession(c.members[0], &session{Conn: fakeConn{ctx}}, nil)
	assert.Nil(t, c.linkOf(l0.session), "replaced")
	assert.Nil(t, c.linkOf(&session{Conn: &tcpFake{fakeConn: fakeConn{ctx}}}), "a TCP session")
}
