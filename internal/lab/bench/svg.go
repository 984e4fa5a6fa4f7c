package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// Hand-written SVG: the charts are a few lines and boxes, and a plotting
// library would be the project's largest dependency for them.

const (
	chartW, chartH = 760, 300
	padL, padR     = 60, 150
	padT, padB     = 34, 40
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// Line is one series of a line chart.
type Line struct {
	Name   string
	Color  string
	Dashed bool
	Y      []float64 // one point per X step
}

// Mark is a vertical marker (an agent action).
type Mark struct {
	X     float64
	Label string
}

// LineChart draws lines over x = 0, dx, 2dx, ...
func LineChart(w io.Writer, title, xLabel, yLabel string, dx float64, lines []Line, marks []Mark) {
	n := 0
	ymax := 0.0
	for _, l := range lines {
		n = max(n, len(l.Y))
		for _, y := range l.Y {
			ymax = math.Max(ymax, y)
		}
	}
	ymax = niceCeil(ymax)
	xmax := math.Max(dx*float64(n), dx)
	px := func(x float64) float64 { return padL + x/xmax*float64(chartW-padL-padR) }
	py := func(y float64) float64 { return float64(chartH-padB) - y/ymax*float64(chartH-padT-padB) }
	header(w, title)
	axes(w, xLabel, yLabel, xmax, ymax, px, py)
	for i, m := range mergeMarks(marks) {
		x := px(m.X)
		fmt.Fprintf(w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="3,3"/>`+"\n", x, padT, x, chartH-padB)
		if i < 12 { // labels beyond a dozen would overlap into noise
			fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="9" fill="#555" transform="rotate(90 %.1f %d)">%s</text>`+"\n", x+2, padT+2, x+2, padT+2, esc(m.Label))
		}
	}
	for i, l := range lines {
		color := l.Color
		if color == "" {
			color = palette[i%len(palette)]
		}
		var pts []string
		for j, y := range l.Y {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(j)*dx), py(y)))
		}
		dash := ""
		if l.Dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
		fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/><text x="%d" y="%d" font-size="11">%s</text>`+"\n",
			chartW-padR+10, padT+8+16*i, chartW-padR+30, padT+8+16*i, color, dash, chartW-padR+34, padT+12+16*i, esc(l.Name))
	}
	fmt.Fprintln(w, "</svg>")
}

// mergeMarks joins the labels of marks within 0.1 s of each other, so
// that drains sent in one step read as one line.
func mergeMarks(marks []Mark) []Mark {
	var out []Mark
	for _, m := range marks {
		if n := len(out); n > 0 && m.X-out[n-1].X < 0.1 {
			out[n-1].Label += "; " + m.Label
			continue
		}
		out = append(out, m)
	}
	return out
}

// stateColors: ready green, drained red, maint grey, a reduced weight amber.
func stateColor(c scenario.StateChange, full int) string {
	switch {
	case c.State == "drain":
		return "#d62728"
	case c.State == "maint" || c.State == "down":
		return "#7f7f7f"
	case c.Weight < full:
		return "#ff9f1c"
	}
	return "#2ca02c"
}

// StateChart draws each server's state over the run as a band.
func StateChart(w io.Writer, title string, states map[string][]scenario.StateChange, servers []string, faulty map[string]bool, endS float64, full int) {
	rowH := 22
	const left = 100 // room for "srv10 (faulty)"
	h := padT + padB + 16 + rowH*len(servers)
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">`+"\n", chartW, h)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", padL, esc(title))
	px := func(x float64) float64 { return left + math.Min(x, endS)/endS*float64(chartW-left-padR) }
	for i, s := range servers {
		y := padT + i*rowH
		label := s
		if faulty[s] {
			label += " (faulty)"
		}
		fmt.Fprintf(w, `<text x="%d" y="%d" font-size="11" text-anchor="end">%s</text>`+"\n", left-4, y+15, esc(label))
		ch := states[s]
		for j, c := range ch {
			to := endS
			if j+1 < len(ch) {
				to = ch[j+1].At.Seconds()
			}
			fmt.Fprintf(w, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s weight %d from %.1f s</title></rect>`+"\n",
				px(c.At.Seconds()), y+3, math.Max(px(to)-px(c.At.Seconds()), 0.5), rowH-6, stateColor(c, full), c.State, c.Weight, c.At.Seconds())
		}
	}
	ly := padT + rowH*len(servers) + 18
	for i, l := range []struct{ name, color string }{{"ready", "#2ca02c"}, {"reduced weight", "#ff9f1c"}, {"drain", "#d62728"}, {"maint/down", "#7f7f7f"}} {
		x := left + i*120
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d" font-size="11">%s</text>`+"\n", x, ly-10, l.color, x+16, ly, l.name)
	}
	fmt.Fprintf(w, `<text x="%d" y="%d" font-size="11">seconds from the load's start, 0 to %.0f</text>`+"\n", left, ly+18, endS)
	fmt.Fprintln(w, "</svg>")
}

// Bars is a grouped bar chart: one group per category, one bar per series.
func Bars(w io.Writer, title, yLabel string, categories []string, series []string, value func(cat, ser string) (float64, bool)) {
	ymax, ymin := 0.0, 0.0
	for _, c := range categories {
		for _, s := range series {
			if v, ok := value(c, s); ok {
				ymax, ymin = math.Max(ymax, v), math.Min(ymin, v)
			}
		}
	}
	ymax = niceCeil(ymax)
	if ymin < 0 {
		ymin = -niceCeil(-ymin)
	}
	span := ymax - ymin
	if span == 0 {
		span = 1
	}
	py := func(y float64) float64 { return float64(chartH-padB) - (y-ymin)/span*float64(chartH-padT-padB) }
	header(w, title)
	fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="black"/>`+"\n", padL, py(0), chartW-padR, py(0))
	for _, t := range []float64{ymin, ymin + span/2, ymax} {
		fmt.Fprintf(w, `<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>`+"\n", padL-4, py(t)+3, trimFloat(t))
	}
	fmt.Fprintf(w, `<text x="14" y="%d" font-size="11" transform="rotate(-90 14 %d)">%s</text>`+"\n", chartH/2+40, chartH/2+40, esc(yLabel))
	groupW := float64(chartW-padL-padR) / float64(max(len(categories), 1))
	barW := groupW * 0.8 / float64(max(len(series), 1))
	for i, c := range categories {
		x0 := float64(padL) + float64(i)*groupW + groupW*0.1
		for j, s := range series {
			v, ok := value(c, s)
			if !ok {
				continue
			}
			y0, y1 := py(0), py(v)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				x0+float64(j)*barW, math.Min(y0, y1), barW*0.9, math.Abs(y1-y0), palette[j%len(palette)], esc(c), esc(s), trimFloat(v))
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>`+"\n", x0+groupW*0.4, chartH-padB+14, esc(c))
	}
	for j, s := range series {
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d" font-size="11">%s</text>`+"\n",
			chartW-padR+10, padT+16*j, palette[j%len(palette)], chartW-padR+26, padT+10+16*j, esc(s))
	}
	fmt.Fprintln(w, "</svg>")
}

func header(w io.Writer, title string) {
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">`+"\n", chartW, chartH)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="20" font-size="14">%s</text>`+"\n", padL, esc(title))
}

func axes(w io.Writer, xLabel, yLabel string, xmax, ymax float64, px, py func(float64) float64) {
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(w, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", padL, padT, padL, chartH-padB)
	for i := 0; i <= 4; i++ {
		y := ymax * float64(i) / 4
		fmt.Fprintf(w, `<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>`+"\n", padL-4, py(y)+3, trimFloat(y))
		x := xmax * float64(i) / 4
		fmt.Fprintf(w, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>`+"\n", px(x), chartH-padB+14, trimFloat(x))
	}
	fmt.Fprintf(w, `<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>`+"\n", (padL+chartW-padR)/2, chartH-6, esc(xLabel))
	fmt.Fprintf(w, `<text x="14" y="%d" font-size="11" transform="rotate(-90 14 %d)">%s</text>`+"\n", chartH/2+40, chartH/2+40, esc(yLabel))
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

func esc(s string) string { return html.EscapeString(s) }
