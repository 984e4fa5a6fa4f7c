// Package promtext writes metrics in Prometheus' text exposition format,
// so that /metrics needs no client library and every part that counts
// something (loop, ingest, policies) writes its lines the same way.
package promtext

import (
	"fmt"
	"io"
	"strings"
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

// Sample is one labelled sample: Labels are name, value pairs.
type Sample struct {
	Labels []string
	Value  float64
}

// Family writes a metric of labelled samples under one HELP and TYPE
// (typ: counter or gauge). With no sample, the family is still declared,
// so that a scraper knows it exists.
func Family(w io.Writer, name, typ, help string, samples []Sample) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	for _, s := range samples {
		fmt.Fprintf(w, "%s%s %v\n", name, labels(s.Labels), s.Value)
	}
}

// Histogram writes a histogram: bounds are the buckets' upper bounds,
// cumulative the count at or below each.
func Histogram(w io.Writer, name, help string, bounds []float64, cumulative []uint64, sum float64, count uint64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	for i, le := range bounds {
		fmt.Fprintf(w, "%s_bucket{le=\"%v\"} %d\n", name, le, cumulative[i])
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, count, name, sum, name, count)
}

// labels formats name="value" pairs, values escaped as the format asks.
func labels(kv []string) string {
	if len(kv) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i])
		b.WriteString(`="`)
		b.WriteString(escaper.Replace(kv[i+1]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

var escaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
