package deploy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// TestReadmeMetrics guards the metrics-table parser the other checks rely on.
func TestReadmeMetrics(t *testing.T) {
	t.Parallel()
	m := readmeMetrics(t)
	for _, name := range []string{
		"quictun_client_session_up", "quictun_server_streams_total",
		"quictun_quic_min_rtt_seconds", "quictun_quic_lost_bytes_total", "quictun_build_info",
	} {
		assert.True(t, m[name], "documented metric %s not parsed", name)
	}
}

// dashboardExprs returns every "expr" and templating "query" string of a dashboard.
func dashboardExprs(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, y := range x {
			if s, ok := y.(string); ok && (k == "expr" || (k == "query" && strings.Contains(s, "("))) {
				*out = append(*out, s)
				continue
			}
			dashboardExprs(y, out)
		}
	case []any:
		for _, y := range x {
			dashboardExprs(y, out)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	t.Parallel()
	var d map[string]any
	require.NoError(t, json.Unmarshal(readFile(t, deployPath(t, "grafana", "quictun-dashboard.json")), &d))
	assert.Equal(t, "quictun", d["uid"])
	assert.NotEmpty(t, d["title"])

	panels, ok := d["panels"].([]any)
	require.True(t, ok, "panels is not a list")
	ids := map[float64]bool{}
	titles := map[string]bool{}
	for _, p := range panels {
		pm := p.(map[string]any)
		id := pm["id"].(float64)
		assert.False(t, ids[id], "panel id %v used twice", id)
		ids[id] = true
		title, _ := pm["title"].(string)
		assert.NotEmpty(t, title)
		titles[title] = true
		if pm["type"] == "row" {
			continue
		}
		targets, _ := pm["targets"].([]any)
		assert.NotEmpty(t, targets, "panel %q has no queries", title)
		gp := pm["gridPos"].(map[string]any)
		assert.LessOrEqual(t, gp["x"].(float64)+gp["w"].(float64), 24.0, "panel %q wider than the grid", title)
	}
	// What the dashboard must show (issue 4).
	for _, want := range []string{
		"Session up", "Reconnects", "Client streams by result", "Server streams by result", "Active streams",
		"Client bytes", "Server bytes", "RTT (client)", "Congestion window", "Packets lost",
		"Server dial duration p50 / p99",
	} {
		assert.True(t, titles[want], "no panel %q", want)
	}

	var exprs []string
	dashboardExprs(d, &exprs)
	require.NotEmpty(t, exprs)
	readme := readmeMetrics(t)
	for _, e := range exprs {
		names := promMetricNames(e)
		assert.NotEmpty(t, names, "expression reads no metric: %s", e)
		for _, n := range names {
			assert.True(t, knownMetric(readme, n), "dashboard expression uses %s, which docs/operations.md does not list: %s", n, e)
		}
		assert.Equal(t, strings.Count(e, "("), strings.Count(e, ")"), "unbalanced parentheses: %s", e)
		assert.Equal(t, strings.Count(e, "{"), strings.Count(e, "}"), "unbalanced braces: %s", e)
	}
}

// ruleFile is the Prometheus rule file format (what promtool check rules reads).
type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	raw := readFile(t, deployPath(t, "prometheus", "alerts.yml"))
	var rf ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true) // promtool rejects unknown fields too
	require.NoError(t, dec.Decode(&rf))
	require.NotEmpty(t, rf.Groups)

	readme := readmeMetrics(t)
	alerts := map[string]string{}
	groups := map[string]bool{}
	for _, g := range rf.Groups {
		require.NotEmpty(t, g.Name)
		assert.False(t, groups[g.Name], "group %s defined twice", g.Name)
		groups[g.Name] = true
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: a rule without alert name (recording rules are not expected here)", g.Name)
			assert.NotContains(t, alerts, r.Alert, "alert %s defined twice", r.Alert)
			alerts[r.Alert] = r.Expr
			assert.NotEmpty(t, r.Expr, r.Alert)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				assert.NoError(t, err, "alert %s: for", r.Alert)
			}
			assert.Contains(t, []string{"critical", "warning", "info"}, r.Labels["severity"], "alert %s: severity", r.Alert)
			assert.NotEmpty(t, r.Annotations["summary"], "alert %s: summary", r.Alert)
			assert.NotEmpty(t, r.Annotations["description"], "alert %s: description", r.Alert)
			for _, text := range r.Annotations {
				assert.Equal(t, strings.Count(text, "{{"), strings.Count(text, "}}"), "alert %s: template braces in %q", r.Alert, text)
			}
			for _, n := range promMetricNames(r.Expr) {
				assert.True(t, knownMetric(readme, n), "alert %s uses %s, which docs/operations.md does not list", r.Alert, n)
			}
			assert.Equal(t, strings.Count(r.Expr, "("), strings.Count(r.Expr, ")"), "alert %s: unbalanced parentheses", r.Alert)
		}
	}
	// The alerts issue 4 asks for, by what they watch.
	for alert, metric := range map[string]string{
		"QuictunTunnelDown":                "quictun_client_session_up == 0",
		"QuictunReconnectStorm":            "quictun_client_reconnects_total[10m]",
		"QuictunHighRTT":                   "quictun_quic_smoothed_rtt_seconds",
		"QuictunHighPacketLoss":            "quictun_quic_packets_lost_total",
		"QuictunRefusedDestinationsRising": "quictun_server_refused_destinations_total",
		"QuictunServerDrainingStuck":       "quictun_server_draining",
	} {
		if assert.Contains(t, alerts, alert) {
			assert.Contains(t, alerts[alert], metric, alert)
		}
	}
}
