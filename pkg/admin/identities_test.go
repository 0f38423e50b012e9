package admin_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/usage"
)

// fakeIdentities records kicks.
type fakeIdentities struct {
	kicked []string
	fors   []time.Duration
}

func (f *fakeIdentities) List() []usage.Usage {
	return []usage.Usage{{Identity: "key=alice", BytesUpstream: 5}, {Identity: "other"}}
}

func (f *fakeIdentities) Get(id string) (usage.Usage, bool) {
	if id != "key=alice" {
		return usage.Usage{}, false
	}
	return usage.Usage{Identity: id, BytesUpstream: 5}, true
}

func (f *fakeIdentities) Kick(id string, d time.Duration) (int, time.Time, error) {
	f.kicked, f.fors = append(f.kicked, id), append(f.fors, d)
	return 2, time.Date(2026, 11, 28, 13, 0, 0, 0, time.UTC), nil
}

// TestIdentities: GET lists and shows identities, DELETE kicks with a
// bounded ?for=, and both sit behind the bearer token.
func TestIdentities(t *testing.T) {
	t.Parallel()
	ids := &fakeIdentities{}
	e := newEnv(t, "tok", false, func(o *admin.Options) { o.Identities = ids })
	assert.Equal(t, http.StatusUnauthorized, e.do(t, "GET", "/identities", "").Code)
	assert.Equal(t, http.StatusUnauthorized, e.do(t, "DELETE", "/identities/key=alice", "").Code)
	assert.Empty(t, ids.kicked)

	rr := e.do(t, "GET", "/identities", "Bearer tok")
	require.Equal(t, http.StatusOK, rr.Code)
	var list []usage.Usage
	require.NoError(t, json.Unmarshal(rr.Body.Bytes(), &list))
	assert.Len(t, list, 2)

	rr = e.do(t, "GET", "/identities/key=alice", "Bearer tok")
	require.Equal(t, http.StatusOK, rr.Code)
	assert.Contains(t, rr.Body.String(), `"bytesUpstream": 5`)
	assert.Equal(t, http.StatusNotFound, e.do(t, "GET", "/identities/key=nobody", "Bearer tok").Code)

	for _, bad := range []string{"x", "-1m", "9000h"} {
		assert.Equal(t, http.StatusBadRequest, e.do(t, "DELETE", "/identities/key=alice?for="+bad, "Bearer tok").Code, bad)
	}
	assert.Empty(t, ids.kicked, "a bad duration kicks no one")
	rr = e.do(t, "DELETE", "/identities/key=alice?for=10m", "Bearer tok")
	require.Equal(t, http.StatusOK, rr.Code)
	assert.Contains(t, rr.Body.String(), `"connectionsClosed": 2`)
	assert.Contains(t, rr.Body.String(), `"suspendedUntil": "2026-11-28T13:00:00Z"`)
	require.NoError(t, json.Unmarshal(e.do(t, "DELETE", "/identities/CN=bob", "Bearer tok").Body.Bytes(), &struct{}{}))
	assert.Equal(t, []string{"key=alice", "CN=bob"}, ids.kicked)
	assert.Equal(t, []time.Duration{10 * time.Minute, 0}, ids.fors)
}
