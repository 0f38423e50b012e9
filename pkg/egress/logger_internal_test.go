package egress

import (
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"
)

// TestStreamLoggerMadeAtFirstUse: a stream's logger (streamID, then key
// and clientSubject) is made only when a line is logged at a level in
// force, and carries the values known then, in the order they were
// learned; a line at a level not in force makes nothing.
func TestStreamLoggerMadeAtFirstUse(t *testing.T) {
	t.Parallel()
	var lines []string
	base := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: 2})
	s := &stream{base: base, streamID: 8}
	s.logV(4).Info("Not logged")
	require.False(t, s.logMade, "a level not in force makes no logger")
	require.Empty(t, lines)

	s.keyName, s.logKey = "ci", true
	s.peer.subject, s.logSubject = "CN=runner", true
	s.logV(2).Info("Logged", "code", "ok")
	require.True(t, s.logMade)
	require.Equal(t, []string{`"level"=2 "msg"="Logged" "streamID"=8 "key"="ci" "clientSubject"="CN=runner" "code"="ok"`}, lines)

	lines = nil
	fresh := &stream{base: base, streamID: 9, keyName: "ci", logKey: true}
	fresh.newLogger().Info("From another goroutine")
	require.False(t, fresh.logMade, "newLogger keeps nothing")
	require.Equal(t, []string{`"level"=0 "msg"="From another goroutine" "streamID"=9 "key"="ci"`}, lines)
}
