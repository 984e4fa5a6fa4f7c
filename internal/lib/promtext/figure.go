package promtext

import (
	"io"
	"strings"
)

// Figure is one counter or gauge, named once for /metrics and for
// /status and the live page (its Key). Each part that counts something
// lists its own figures; the daemon only gathers them.
type Figure struct {
	Metric, Help string
	Gauge        bool
	V            uint64
}

// Key is the figure's name in /status: the metric's without hapilot_
// and _total.
func (f Figure) Key() string {
	return strings.TrimSuffix(strings.TrimPrefix(f.Metric, "hapilot_"), "_total")
}

// WriteFigures writes each figure as its type says.
func WriteFigures(w io.Writer, fs []Figure) {
	for _, f := range fs {
		if f.Gauge {
			Gauge(w, f.Metric, f.Help, f.V)
		} else {
			Counter(w, f.Metric, f.Help, f.V)
		}
	}
}
