// Package promtext writes metrics in Prometheus' text exposition format,
// so that /metrics needs no client library and every part that counts
// something (loop, ingest, policies) writes its lines the same way.
package promtext

import (
	"fmt"
	"io"
)

// Number is what a sample may hold.
type Number interface {
	~uint64 | ~int64 | ~int | ~float64
}

// Counter writes one counter with its HELP and TYPE lines.
func Counter[T Number](w io.Writer, name, help string, v T) { write(w, name, "counter", help, v) }

// Gauge writes one gauge with its HELP and TYPE lines.
func Gauge[T Number](w io.Writer, name, help string, v T) { write(w, name, "gauge", help, v) }

// Summary writes a summary's _sum and _count, without quantiles.
func Summary(w io.Writer, name, help string, sum float64, count uint64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s summary\n%s_sum %g\n%s_count %d\n", name, help, name, name, sum, name, count)
}

func write[T Number](w io.Writer, name, typ, help string, v T) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %v\n", name, help, name, typ, name, v)
}
