package deploy

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPromMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`quictun_client_session_up == 0`, []string{"quictun_client_session_up"}},
		{`sum by (result) (rate(quictun_client_dials_total{job=~"$job",result!="ok"}[$__rate_interval]))`, []string{"quictun_client_dials_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 1e3`, []string{"a_bucket"}},
		{`sum by (side) (rate(x_total[5m])) / on (side) group_left sum without (conn) (y)`, []string{"x_total", "y"}},
		{`label_values(quictun_build_info{job=~"$job"}, instance)`, []string{"quictun_build_info"}},
	} {
		assert.Equal(t, tc.want, promMetricNames(tc.expr), tc.expr)
	}
}
