package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ProbeResult is latency-client's --json output of the probe command.
type ProbeResult struct {
	Target        string   `json:"target"`
	FirstPacketMS float64  `json:"first_packet_ms"`
	TotalMS       float64  `json:"total_ms"`
	ConnectMS     float64  `json:"connect_ms"`
	MinMS         float64  `json:"min_ms"`
	MeanMS        float64  `json:"mean_ms"`
	P50MS         float64  `json:"p50_ms"`
	P90MS         float64  `json:"p90_ms"`
	P99MS         float64  `json:"p99_ms"`
	MaxMS         float64  `json:"max_ms"`
	Size          int      `json:"size"`
	Number        int      `json:"number"`
	Connections   int      `json:"connections"`
	RoundTrips    int      `json:"round_trips"`
	TPS           float64  `json:"tps"`
	MbitPerS      float64  `json:"mbit_per_s"`
	Errors        int      `json:"errors"`
	ErrorMessages []string `json:"error_messages"`
}

// BulkResult is the --json output of `latency-client bulk`.
type BulkResult struct {
	Target    string  `json:"target"`
	Direction string  `json:"direction"`
	Parallel  int     `json:"parallel"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MbitPerS  float64 `json:"mbit_per_s"`
	Verified  bool    `json:"verified"`
	Errors    int     `json:"errors"`
	Streams   []struct {
		Error string `json:"error"`
	} `json:"streams"`
}

// LatencyStats are percentiles in a connrate result.
type LatencyStats struct {
	MinMS  float64 `json:"min_ms"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// ConnrateResult is the --json output of `latency-client connrate`.
type ConnrateResult struct {
	Number          int          `json:"number"`
	Size            int          `json:"size"`
	Concurrency     int          `json:"concurrency"`
	Completed       int          `json:"completed"`
	Errors          int          `json:"errors"`
	FirstError      string       `json:"first_error"`
	Seconds         float64      `json:"seconds"`
	ConnectionsPerS float64      `json:"connections_per_s"`
	Connect         LatencyStats `json:"connect"`
	FirstByte       LatencyStats `json:"first_byte"`
	Transaction     LatencyStats `json:"transaction"`
}

// lastJSONLine returns the last line of out that looks like a JSON object;
// latency-client prints one object on one line with --json.
func lastJSONLine(out []byte) ([]byte, error) {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		l := bytes.TrimSpace(lines[i])
		if len(l) > 0 && l[0] == '{' {
			return l, nil
		}
	}
	return nil, errors.New("no JSON object in latency-client output")
}

// parseJSON decodes latency-client output into v and returns the raw object.
func parseJSON(out []byte, v any) (json.RawMessage, error) {
	line, err := lastJSONLine(out)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(line, v); err != nil {
		return nil, fmt.Errorf("decode latency-client JSON: %w", err)
	}
	return json.RawMessage(line), nil
}

// ProbeMetrics returns the probe metrics recorded for a sample.
func ProbeMetrics(p ProbeResult) map[string]float64 {
	return map[string]float64{
		"first_packet_ms": p.FirstPacketMS, "total_ms": p.TotalMS, "connect_ms": p.ConnectMS, "first_echo_ms": p.ConnectMS + p.FirstPacketMS,
		"p50_ms": p.P50MS, "p90_ms": p.P90MS, "p99_ms": p.P99MS, "max_ms": p.MaxMS,
		"tps": p.TPS, "mbit_per_s": p.MbitPerS, "errors": float64(p.Errors),
	}
}

// ProbeError returns the probe's error summary, or "".
func ProbeError(p ProbeResult) string {
	if p.Errors == 0 {
		return ""
	}
	msg := fmt.Sprintf("%d connection(s) failed", p.Errors)
	if len(p.ErrorMessages) > 0 {
		msg += ": " + p.ErrorMessages[0]
	}
	return msg
}
