// Package harness runs the quictun benchmark: it brings up the linkem
// two-namespace topology in-process, starts the endpoints of each variant
// (direct TCP, kcptun, quictun) as processes inside the namespaces, drives
// bin/latency-client through the scenarios of a profile with the variants
// interleaved on the same link, and writes results.json, report.md and
// charts. Benchmarks report figures; they do not assert timings.
package harness
