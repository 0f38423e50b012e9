// Package report posts each client identity's usage to an HTTP endpoint
// (--usage-report-url), so a billing or panel system needs no scraping:
// every Interval, or sooner once an identity has moved Threshold bytes
// unreported, the bytes each identity moved since the last batch go into
// one JSON batch. Batches wait in a bounded queue (the oldest is dropped,
// and counted, when it is full) and are posted in order by one goroutine,
// retried with backoff; nothing here is on the data path, which only
// keeps its counters (pkg/usage reads them).
package report
