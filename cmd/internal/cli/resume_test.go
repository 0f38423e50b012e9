package cli

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestResumeReload: a reload changes the window of tunnels opened
// afterwards and says so only when it changed; the buffer budget is the
// flag's.
func TestResumeReload(t *testing.T) {
	t.Parallel()
	d := NewDaemonFlags(DaemonDefaults{})
	r := d.NewResume()
	assert.Zero(t, r.Window(), "off by default")
	assert.Nil(t, r.Reload(0))
	assert.Equal(t, 10*time.Minute, r.Reload(10*time.Minute))
	assert.Equal(t, 10*time.Minute, r.Window())
	assert.Nil(t, r.Reload(10*time.Minute), "unchanged: nothing to log")
	var none *Resume
	assert.Nil(t, none.Reload(time.Minute))
}
