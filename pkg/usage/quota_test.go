package usage

import (
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseQuota(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, id string
		want   Quota
		err    string
	}{
		{"key=alice=100GiB/30d", "key=alice", Quota{Bytes: 100 << 30, Window: 30 * 24 * time.Hour}, ""},
		{"CN=a,key=b=1.5TB/7d", "CN=a,key=b", Quota{Bytes: 1.5e12, Window: 7 * 24 * time.Hour}, ""},
		{"key=a=10MB/1h", "key=a", Quota{Bytes: 10e6, Window: time.Hour}, ""},
		{"key=a=100GiB", "", Quota{}, "want BYTES/WINDOW"},
		{"key=a=100/30d", "", Quota{}, "a positive number and a unit"},
		{"key=a=100GiB/30m", "", Quota{}, "whole days (d) or hours (h)"},
		{"key=a=100GiB/400d", "", Quota{}, "from 1h to 366d"},
		{"100GiB/30d", "", Quota{}, "want IDENTITY=BYTES/WINDOW"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			id, q, err := ParseQuota(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.id, id)
			assert.Equal(t, tc.want, q)
		})
	}
}

// TestQuotaRollingWindow: an identity reaches its quota once its window
// holds that many bytes (reported once per crossing), and is under it again
// once the window has rolled past them; others are not affected.
func TestQuotaRollingWindow(t *testing.T) {
	t.Parallel()
	clk := newClock()
	l, err := New(Config{Now: clk.Now})
	require.NoError(t, err)
	q := Quota{Bytes: 1000, Window: 30 * time.Hour} // buckets of an hour
	l.SetQuotas(map[string]Quota{"key=alice": q}, Quota{})
	var crossings []string
	h := Hooks{OverQuota: func(id string, used int64, _ Quota) { crossings = append(crossings, id) }}
	alice, bob := l.Get("key=alice"), l.Get("key=bob")
	var up, down, bobUp, bobDown atomic.Int64
	defer alice.Track(&up, &down)()
	defer bob.Track(&bobUp, &bobDown)()
	l.tickAll(clk.Now(), h)
	up.Add(600)
	bobUp.Add(1 << 30)
	clk.Add(time.Second)
	l.tickAll(clk.Now(), h)
	assert.False(t, alice.OverQuota())
	clk.Add(10 * time.Hour)
	down.Add(400)
	l.tickAll(clk.Now(), h)
	assert.True(t, alice.OverQuota(), "600 + 400 in the window")
	assert.False(t, bob.OverQuota(), "bob has no quota")
	l.tickAll(clk.Now().Add(time.Second), h)
	assert.Equal(t, []string{"key=alice"}, crossings, "reported once")
	u, _ := l.Identity("key=alice")
	assert.Equal(t, int64(1000), u.QuotaUsedBytes)
	assert.True(t, u.OverQuota)

	clk.Add(21 * time.Hour) // the first 600 bytes left the 30 h window
	l.tickAll(clk.Now(), h)
	assert.False(t, alice.OverQuota(), "the window rolled")
	l.SetQuotas(nil, Quota{})
	l.tickAll(clk.Now(), h)
	assert.False(t, alice.OverQuota())
}

// TestQuotaSurvivesRestart: the window's buckets are kept with the totals.
func TestQuotaSurvivesRestart(t *testing.T) {
	t.Parallel()
	clk := newClock()
	path := filepath.Join(t.TempDir(), "usage.json")
	q := map[string]Quota{"key=alice": {Bytes: 1000, Window: 30 * 24 * time.Hour}}
	l, err := New(Config{Path: path, Now: clk.Now})
	require.NoError(t, err)
	l.SetQuotas(q, Quota{})
	var up, down atomic.Int64
	done := l.Get("key=alice").Track(&up, &down)
	l.tickAll(clk.Now(), Hooks{})
	up.Add(900)
	l.tickAll(clk.Now(), Hooks{})
	done()
	require.NoError(t, l.Save())

	clk.Add(time.Hour)
	l2, err := New(Config{Path: path, Now: clk.Now})
	require.NoError(t, err)
	l2.SetQuotas(q, Quota{})
	var up2, down2 atomic.Int64
	defer l2.Get("key=alice").Track(&up2, &down2)()
	l2.tickAll(clk.Now(), Hooks{})
	assert.False(t, l2.Get("key=alice").OverQuota(), "the loaded total is not counted again")
	up2.Add(100)
	l2.tickAll(clk.Now(), Hooks{})
	assert.True(t, l2.Get("key=alice").OverQuota(), "900 before the restart + 100 after")
}

// TestHookedQuota: a quota from an auth hook's answer applies to an
// identity without a --quota of its own, survives a reload, gives way to
// the default when an answer carries none, and is bounded in number.
func TestHookedQuota(t *testing.T) {
	t.Parallel()
	l, err := New(Config{})
	require.NoError(t, err)
	def := Quota{Bytes: 1 << 30, Window: 24 * time.Hour}
	own := Quota{Bytes: 5 << 30, Window: 24 * time.Hour}
	l.SetQuotas(map[string]Quota{"key=ruled": own}, def)
	hooked := Quota{Bytes: 100 << 30, Window: 30 * 24 * time.Hour}
	l.SetHookedQuota("key=carol", hooked, true)
	l.SetHookedQuota("key=ruled", hooked, true)
	assert.Equal(t, hooked, l.quotas.of("key=carol"))
	assert.Equal(t, own, l.quotas.of("key=ruled"), "the operator's --quota wins")
	assert.Equal(t, def, l.quotas.of("key=dave"))
	l.SetQuotas(nil, def)
	assert.Equal(t, hooked, l.quotas.of("key=carol"), "a reload keeps the hook's quota")
	l.SetHookedQuota("key=carol", Quota{}, false)
	assert.Equal(t, def, l.quotas.of("key=carol"), "an answer without a quota: the default again")
	for i := range MaxHooked + 1 {
		l.SetHookedQuota("key=user-"+strconv.Itoa(i), hooked, true)
	}
	assert.LessOrEqual(t, l.HookedQuotas(), MaxHooked, "bounded")
	assert.Greater(t, l.HookedQuotas(), MaxHooked*8/10)
}
