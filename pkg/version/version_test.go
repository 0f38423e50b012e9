package version_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/quictun/quictun/pkg/version"
)

func TestString(t *testing.T) {
	t.Parallel()
	s := version.String()
	assert.Equal(t, version.Version+" (revision "+version.Revision+", "+runtime.Version()+")", s)
	assert.NotEmpty(t, version.Version)
	assert.NotEmpty(t, version.Revision)
}

func TestCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(version.NewCollector())
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	expected := `
# HELP quictun_build_info A metric with a constant '1' value labelled by version, revision and goversion.
# TYPE quictun_build_info gauge
quictun_build_info{goversion="` + runtime.Version() + `",revision="` + version.Revision + `",version="` + version.Version + `"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(expected), "quictun_build_info"))

	// Each call returns a fresh collector, so two registries do not share state.
	reg2 := prometheus.NewRegistry()
	require.NoError(t, reg2.Register(version.NewCollector()))
	assert.Equal(t, 1, testutil.CollectAndCount(version.NewCollector()))
}
