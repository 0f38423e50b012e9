package harness

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseProbeJSON(t *testing.T) {
	t.Parallel()
	out := []byte("The server listen on x\n" +
		`{"target":"tcp:127.0.0.1:6500","first_packet_ms":1.5,"total_ms":660.2,"connect_ms":0.3,"min_ms":0.5,"mean_ms":0.66,"p50_ms":0.6,"p90_ms":0.7,"p99_ms":1.2,"max_ms":3,"size":1000,"number":1000,"connections":1,"round_trips":1000,"tps":1514.6,"mbit_per_s":12.1,"errors":0,"per_connection":[{"index":0}]}` + "\n")
	var p ProbeResult
	raw, err := parseJSON(out, &p)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"per_connection"`)
	assert.InDelta(t, 660.2, p.TotalMS, 1e-9)
	assert.Equal(t, 1000, p.RoundTrips)
	m := ProbeMetrics(p)
	assert.InDelta(t, 1.5, m["first_packet_ms"], 1e-9)
	assert.InDelta(t, 1.8, m["first_echo_ms"], 1e-9, "connect + first round trip")
	assert.Empty(t, ProbeError(p))

	p.Errors, p.ErrorMessages = 2, []string{"read echo: EOF"}
	assert.Equal(t, "2 connection(s) failed: read echo: EOF", ProbeError(p))

	_, err = parseJSON([]byte("First packet latency: 1 ms\n"), &p)
	require.Error(t, err)
	_, err = parseJSON([]byte("{not json\n"), &p)
	require.Error(t, err)
}

func TestParseBulkAndConnrateJSON(t *testing.T) {
	t.Parallel()
	var b BulkResult
	_, err := parseJSON([]byte(`{"target":"x","direction":"up","parallel":4,"bytes":1000000,"seconds":0.5,"mbit_per_s":16,"verified":true,"errors":0,"streams":[{"index":0,"bytes":250000}]}`), &b)
	require.NoError(t, err)
	assert.Equal(t, 4, b.Parallel)
	assert.True(t, b.Verified)

	var c ConnrateResult
	_, err = parseJSON([]byte(`{"target":"x","number":500,"size":100,"concurrency":8,"half_close":false,"completed":500,"errors":0,"seconds":1.2,"connections_per_s":416.6,"connect":{"p50_ms":0.2},"first_byte":{"p50_ms":1.1,"p99_ms":9},"transaction":{"p50_ms":1.2}}`), &c)
	require.NoError(t, err)
	assert.InDelta(t, 416.6, c.ConnectionsPerS, 1e-9)
	assert.InDelta(t, 9, c.FirstByte.P99MS, 1e-9)
}

func TestParseMetric(t *testing.T) {
	t.Parallel()
	text := `# HELP quictun_client_reconnects_total Reconnects.
# TYPE quictun_client_reconnects_total counter
quictun_client_reconnects_total{reason="idle"} 2
quictun_client_reconnects_total{reason="error"} 1
quictun_client_reconnects_total_extra 99
quictun_client_session_up 1
`
	v, err := parseMetric(strings.NewReader(text), "quictun_client_reconnects_total")
	require.NoError(t, err)
	assert.InDelta(t, 3.0, v, 1e-9)
	v, err = parseMetric(strings.NewReader(text), "quictun_client_session_up")
	require.NoError(t, err)
	assert.InDelta(t, 1.0, v, 1e-9)
	v, err = parseMetric(strings.NewReader(text), `quictun_client_reconnects_total{reason="error"}`)
	require.NoError(t, err)
	assert.InDelta(t, 1.0, v, 1e-9, "one series by its labels")
	_, err = parseMetric(strings.NewReader(text), "nope")
	require.Error(t, err)
}
