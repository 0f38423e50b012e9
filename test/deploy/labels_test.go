package deploy

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/client"
	"github.com/quictun/quictun/pkg/admin"
	"github.com/quictun/quictun/pkg/metrics"
	"github.com/quictun/quictun/pkg/proto"
	"github.com/quictun/quictun/server"
)

// docSection returns the section of the document at path (relative to the
// repository root) that starts with heading.
func docSection(t *testing.T, path, heading string) string {
	t.Helper()
	readme := string(readFile(t, filepath.Join(repoRoot(t), path)))
	start := strings.Index(readme, heading)
	require.GreaterOrEqual(t, start, 0, "%s has no %q", path, heading)
	section := readme[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	return section
}

// metricRows maps each metric of the metrics table (docs/operations.md) to its row.
func metricRows(t *testing.T) map[string]string {
	t.Helper()
	rows := map[string]string{}
	tick := regexp.MustCompile("`(quictun_[a-z0-9_]+|_[a-z0-9_]+)`")
	for _, line := range strings.Split(docSection(t, metricsDoc, "## Metrics and admin API"), "\n") {
		if !strings.HasPrefix(line, "| `quictun_") {
			continue
		}
		first := strings.SplitN(strings.TrimPrefix(line, "|"), "|", 2)[0]
		prefix := ""
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if strings.HasPrefix(name, "_") {
				name = prefix + name[1:]
			} else if parts := strings.SplitN(name, "_", 3); len(parts) == 3 {
				prefix = parts[0] + "_" + parts[1] + "_"
			}
			rows[name] = line
		}
	}
	return rows
}

// TestEveryLabelValueDocumented: every label value the daemons' metrics
// (and their reload and admin metrics) create (they pre-create each series they can emit, so that rates start
// at zero) is written, in backticks, in that metric's row of docs/operations.md; stream
// results that are protocol codes are in docs/how-it-works.md's list of codes, each
// with its meaning.
func TestEveryLabelValueDocumented(t *testing.T) {
	t.Parallel()
	rows := metricRows(t)
	codes := docSection(t, "docs/how-it-works.md", "## Security model")
	for _, c := range proto.AllCodes() {
		assert.True(t, strings.Contains(codes, "`"+c.String()+"`"), "docs/how-it-works.md's list of codes (Security model) lacks %s", c)
	}
	reg := prometheus.NewRegistry()
	server.NewMetrics(reg)
	metrics.NewReload(reg, "server")
	metrics.NewAdminRefused(reg, "server", admin.RefusedReasons())
	cl := prometheus.NewRegistry()
	client.NewMetrics(cl)
	metrics.NewReload(cl, "client")
	metrics.NewAdminRefused(cl, "client", admin.RefusedReasons())
	checked := 0
	for _, g := range []prometheus.Gatherer{reg, cl} {
		fams, err := g.Gather()
		require.NoError(t, err)
		for _, f := range fams {
			row, ok := rows[f.GetName()]
			if !assert.True(t, ok, "docs/operations.md has no row for %s", f.GetName()) {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					v := "`" + l.GetValue() + "`"
					if strings.Contains(row, v) {
						checked++
						continue
					}
					isCode := false
					for _, c := range proto.AllCodes() {
						isCode = isCode || c.String() == l.GetValue()
					}
					assert.True(t, isCode && strings.Contains(row, "code"),
						"docs/operations.md's row of %s does not document %s=%s", f.GetName(), l.GetName(), v)
					checked++
				}
			}
		}
	}
	assert.Greater(t, checked, 40, "label values checked")
}
