package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// writeRun writes a run's result.json, report.md and charts into its
// directory.
func writeRun(r *RunResult) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.Dir, "result.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md bytes.Buffer
	r.writeMarkdown(&md)
	if err := os.WriteFile(filepath.Join(r.Dir, "report.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	for name, draw := range map[string]func(io.Writer){"5xx.svg": r.chart5xx, "states.svg": r.chartStates, "latency.svg": r.chartLatency} {
		var svg bytes.Buffer
		draw(&svg)
		if err := os.WriteFile(filepath.Join(r.Dir, name), svg.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (r *RunResult) servers() []string {
	var out []string
	for _, b := range r.Config.Backends {
		out = append(out, b.Server)
	}
	return out
}

func (r *RunResult) title() string {
	t := fmt.Sprintf("%s, %s", r.Cell, r.Variant)
	if r.Emulated {
		t += " (emulated model)"
	}
	return t
}

// seconds is how many whole per-second buckets the run has: the load
// keeps one more for answers due at its very end, too small to plot.
func (r *RunResult) seconds() int {
	iv, _ := time.ParseDuration(r.Config.Interval)
	return int((time.Duration(r.Config.Steps) * iv).Seconds())
}

func (r *RunResult) chart5xx(w io.Writer) {
	n := r.seconds()
	var pol, st []float64
	for i, s := range r.Series.PerSecond {
		if i < n {
			pol = append(pol, float64(s.Err5xx+s.Failed))
		}
	}
	for i, s := range r.Series.StaticPerSecond {
		if i < n {
			st = append(st, float64(s.Err5xx+s.Failed))
		}
	}
	lines := []Line{{Name: r.Variant, Y: pol, Color: palette[0]}}
	if r.Variant != "static" {
		lines = append(lines, Line{Name: "static", Y: st, Color: "#999", Dashed: true})
	}
	var marks []Mark
	for _, a := range r.Series.Actions {
		marks = append(marks, Mark{X: a.AtS, Label: strings.TrimPrefix(a.Command, "set server ")})
	}
	LineChart(w, "client 5xx per second: "+r.title(), "seconds from the load's start", "client 5xx / s", 1, lines, marks)
}

func (r *RunResult) chartStates(w io.Writer) {
	StateChart(w, "server states (HAProxy's view): "+r.title(), r.Series.States, r.servers(), set(r.Truth.Faulty),
		float64(r.seconds()), r.Config.Weight)
}

func (r *RunResult) chartLatency(w io.Writer) {
	var p50, p95, p99 []float64
	for i, s := range r.Series.PerSecond {
		if i < r.seconds() {
			p50, p95, p99 = append(p50, s.P50Ms), append(p95, s.P95Ms), append(p99, s.P99Ms)
		}
	}
	var marks []Mark
	for _, a := range r.Series.Actions {
		marks = append(marks, Mark{X: a.AtS, Label: strings.TrimPrefix(a.Command, "set server ")})
	}
	LineChart(w, "client latency per second: "+r.title(), "seconds from the load's start", "ms",
		1, []Line{{Name: "p50", Y: p50}, {Name: "p95", Y: p95}, {Name: "p99", Y: p99}}, marks)
}

// writeMarkdown is report.md: the run against its static pair.
func (r *RunResult) writeMarkdown(w io.Writer) {
	fmt.Fprintf(w, "# %s\n\n", r.title())
	if r.Emulated {
		fmt.Fprintf(w, "The model is an **emulation** (%s) served by hapilot's Ollama stand-in, not a language model.\n\n", r.Config.Model)
	}
	fmt.Fprintf(w, "Scenario: %s.  \nExpected: %s.  \nFaulty: %s; out of rotation at the end: %s.\n\n",
		r.Truth.About, r.Truth.Expect, list(r.Truth.Faulty), list(r.Truth.EndFaulty))
	fmt.Fprintf(w, "%d steps of %s, %.0f req/s open loop, seed %d, telemetry %s, server pool %d (maxconn %d), weight %d.\n\n",
		r.Config.Steps, r.Config.Interval, r.Config.Rate, r.Config.Seed, r.Config.Telemetry, r.Config.Capacity, r.Config.Capacity, r.Config.Weight)
	if g := r.Config.Calibration; g != nil {
		verdict := "passed: the model acts"
		if !g.Passed {
			verdict = "failed (" + g.Why + "): the rules act instead"
		}
		fmt.Fprintf(w, "Capability gate: precision %.2f, recall %.2f, %d healthy servers drained in calibration; %s.\n\n", g.Precision, g.Recall, g.Collateral, verdict)
	}
	if len(r.Config.AgentArgs) > 0 {
		fmt.Fprintf(w, "Agent flags: `%s`\n\n", strings.Join(r.Config.AgentArgs, " "))
	}
	if r.Config.StudyLoop {
		fmt.Fprintln(w, "Agent: the study's loop, built by the lab (bench.StudyLoop): no calibration gate, rules' floor, evidence check, confirmation, hold, anomaly gate or deadline.")
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "| | requests | client 5xx | mean ms | p50 ms | p95 ms | p99 ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, row := range []struct {
		name string
		c    Client
	}{{"static", r.Static}, {r.Variant, r.Client}} {
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f |\n", row.name, row.c.Requests, row.c.Client5xx, row.c.MeanMs, row.c.P50Ms, row.c.P95Ms, row.c.P99Ms)
		if r.Variant == "static" {
			break
		}
	}
	fmt.Fprintln(w)
	if r.Variant != "static" {
		fmt.Fprintln(w, "| metric | value |")
		fmt.Fprintln(w, "|---|---|")
		for _, kv := range r.metricRows() {
			fmt.Fprintf(w, "| %s | %s |\n", kv[0], kv[1])
		}
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Agent commands:")
		fmt.Fprintln(w)
		if len(r.Series.Actions) == 0 {
			fmt.Fprintln(w, "- none")
		}
		for _, a := range r.Series.Actions {
			fmt.Fprintf(w, "- %.1f s: `%s`\n", a.AtS, a.Command)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "![client 5xx](5xx.svg)\n![server states](states.svg)\n![latency](latency.svg)")
}

func (r *RunResult) metricRows() [][2]string {
	l, c := r.Loc, r.Client
	rows := [][2]string{
		{"5xx reduction vs static", pct(c.Reduction)},
		{"latency mean / p50 / p95 / p99 vs static", fmt.Sprintf("%s / %s / %s / %s", times(c.MeanRatio), times(c.P50Ratio), times(c.P95Ratio), times(c.P99Ratio))},
		{"drain precision / recall / F1", fmt.Sprintf("%s / %s / %s (tp %d, fp %d, fn %d)", num(l.Precision), num(l.Recall), num(l.F1), l.TP, l.FP, l.FN)},
		{"ever-drained exact match", yesNo(l.EverExact)},
		{"end-state correct", yesNo(&l.EndCorrect)},
		{"drained at the end", list(l.DrainedAtEnd)},
		{"flips per faulty / healthy slot", num(l.FlipsFaulty) + " / " + num(l.FlipsHealthy)},
		{"time to resolution", secs(l.ResolutionS)},
	}
	if r.Truth.HealS > 0 {
		rows = append(rows, [2]string{"back in rotation after the heal", secs(l.ReadmitS)})
	}
	if a := r.Agent; a != nil {
		rows = append(rows,
			[2]string{"time to action", secs(a.TimeToActionS)},
			[2]string{"steps completed", fmt.Sprintf("%d of %d", a.StepsCompleted, a.StepsPlanned)},
			[2]string{"median cadence", secs(a.CadenceS)},
			[2]string{"deadline misses", fmt.Sprint(a.DeadlineMisses)},
			[2]string{"tokens per step (prompt / completion)", fmt.Sprintf("%.0f / %.0f", a.PromptPerStep, a.CompletionPerStep)},
			[2]string{"failed requests avoided per 1,000 completion tokens", num(a.AvoidedPer1kTokens)},
		)
	}
	return rows
}

func list(v []string) string {
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, ", ")
}

func pct(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**v)
}

func times(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f×", *v)
}

func num(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

func secs(v *float64) string {
	if v == nil {
		return "never"
	}
	return fmt.Sprintf("%.1f s", *v)
}

func yesNo(v *bool) string {
	switch {
	case v == nil:
		return "-"
	case *v:
		return "yes"
	}
	return "no"
}
