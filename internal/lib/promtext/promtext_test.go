package promtext

import (
	"strings"
	"testing"
)

func TestFamilyAndHistogram(t *testing.T) {
	var b strings.Builder
	Family(&b, "x_held", "gauge", "Held.", []Sample{{Labels: []string{"server", `a"b\c` + "\n"}, Value: 1}})
	Family(&b, "x_none", "counter", "None yet.", nil)
	Histogram(&b, "x_seconds", "Steps.", []float64{0.1, 1}, []uint64{2, 3}, 1.5, 4)
	want := `# HELP x_held Held.
# TYPE x_held gauge
x_held{server="a\"b\\c\n"} 1
# HELP x_none None yet.
# TYPE x_none counter
# HELP x_seconds Steps.
# TYPE x_seconds histogram
x_seconds_bucket{le="0.1"} 2
x_seconds_bucket{le="1"} 3
x_seconds_bucket{le="+Inf"} 4
x_seconds_sum 1.5
x_seconds_count 4
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFigures(t *testing.T) {
	var b strings.Builder
	fs := []Figure{{"hapilot_x_total", "X.", false, 3}, {"hapilot_y_open", "Y.", true, 2}}
	WriteFigures(&b, fs)
	want := "# HELP hapilot_x_total X.\n# TYPE hapilot_x_total counter\nhapilot_x_total 3\n# HELP hapilot_y_open Y.\n# TYPE hapilot_y_open gauge\nhapilot_y_open 2\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	if fs[0].Key() != "x" || fs[1].Key() != "y_open" {
		t.Errorf("keys %q %q", fs[0].Key(), fs[1].Key())
	}
}
