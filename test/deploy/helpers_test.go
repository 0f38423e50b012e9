package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	clientapp "github.com/quictun/quictun/cmd/quictun-client/app"
	serverapp "github.com/quictun/quictun/cmd/quictun-server/app"
)

// repoRoot is the repository root, found from this file's location.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func deployPath(t *testing.T, parts ...string) string {
	t.Helper()
	return filepath.Join(append([]string{repoRoot(t), "deploy"}, parts...)...)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// lookTool returns the path of a tool or skips the test, naming what is missing.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (%v); deploy/helm/check.sh or docs/operations.md's Deployment section says how to get it", name, err)
	}
	return p
}

// checkConfig runs a daemon's command in-process with args plus
// --check-config=flags and returns its error and output. It loads the YAML
// strictly (unknown keys are errors), applies QUICTUN_* variables and validates
// every flag; it does not read the files the config names, which belong to the
// host the config is for (plain --check-config reads them).
func checkConfig(t *testing.T, daemon string, args ...string) (string, error) {
	t.Helper()
	var cmd *cobra.Command
	switch daemon {
	case "quictun-server":
		cmd = serverapp.NewCommand()
	case "quictun-client":
		cmd = clientapp.NewCommand()
	default:
		t.Fatalf("unknown daemon %q", daemon)
	}
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--check-config=flags"))
	err := cmd.Execute()
	return out.String(), err
}

// yamlScalar returns the scalar value of a top-level key in YAML text ("key: value" lines).
func yamlScalar(t *testing.T, yamlText []byte, key string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `:\s*"?([^"\s#]+)"?`).FindSubmatch(yamlText)
	require.NotNil(t, m, "key %s not found", key)
	return string(m[1])
}

// metricsDoc is the document whose "Metrics and admin API" section lists
// every metric (it left README.md in issue 33).
const metricsDoc = "docs/operations.md"

// readmeMetrics returns the metric names listed in docs/operations.md's metrics table,
// expanding the shorthand "`quictun_quic_smoothed_rtt_seconds`, `_min_rtt_seconds`".
func readmeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	readme := string(readFile(t, filepath.Join(repoRoot(t), metricsDoc)))
	start := strings.Index(readme, "## Metrics and admin API")
	require.GreaterOrEqual(t, start, 0, "%s has no \"Metrics and admin API\" section", metricsDoc)
	section := readme[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	names := map[string]bool{}
	tick := regexp.MustCompile("`([a-z_:][a-z0-9_:]*)`")
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `quictun_") {
			continue
		}
		first := strings.SplitN(strings.TrimPrefix(line, "|"), "|", 2)[0]
		prefix := ""
		for _, m := range tick.FindAllStringSubmatch(first, -1) {
			name := m[1]
			if strings.HasPrefix(name, "_") {
				require.NotEmpty(t, prefix, "metrics row %q: shorthand before a full name", line)
				name = prefix + name[1:]
			} else {
				parts := strings.SplitN(name, "_", 3)
				if len(parts) == 3 {
					prefix = parts[0] + "_" + parts[1] + "_"
				}
			}
			names[name] = true
		}
	}
	require.NotEmpty(t, names, "no metrics found in %s", metricsDoc)
	return names
}

// knownMetric reports whether name is a documented metric, a histogram series of one,
// or one of the Go and process collectors' metrics (docs/operations.md: "exported too").
func knownMetric(readme map[string]bool, name string) bool {
	if readme[name] || strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if readme[strings.TrimSuffix(name, suffix)] && strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\[\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "e": true,
	}
)

// promMetricNames returns the metric names a PromQL expression (or a Grafana
// label_values query) reads: identifiers that are not functions, keywords, label
// names or durations.
func promMetricNames(expr string) []string {
	if q, ok := strings.CutPrefix(strings.TrimSpace(expr), "label_values("); ok {
		// Grafana's label_values(selector, label): only the selector names a metric.
		if i := strings.LastIndex(q, ","); i >= 0 {
			expr = q[:i]
		}
	}
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	seen := map[string]bool{}
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		id := e[loc[0]:loc[1]]
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.' || e[loc[0]-1] == '$') {
			continue // 1e3, 0.5, $var
		}
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promKeywords[strings.ToLower(id)] {
			continue // a function call or an operator keyword
		}
		seen[id] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// pastedFingerprint stands for the fingerprint an operator pastes over the
// example client config's all-zero placeholder, which the client refuses.
const pastedFingerprint = "sha256:680a65adfc1de69fc250f772ec7ced1db266e84482e689a1a784fd7e41131e7a"
