package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// Aggregate is one variant over every cell of a sweep: precision, recall
// and F1 micro-averaged (true and false positives summed over runs), the
// rest averaged over runs.
type Aggregate struct {
	Variant        string   `json:"variant"`
	Runs           int      `json:"runs"`
	MeanReduction  *float64 `json:"mean_reduction_5xx"`
	MinReduction   *float64 `json:"min_reduction_5xx"`
	Precision      *float64 `json:"precision_micro"`
	Recall         *float64 `json:"recall_micro"`
	F1             *float64 `json:"f1_micro"`
	EverExact      *float64 `json:"ever_exact_share"`
	EndCorrect     float64  `json:"end_correct_share"`
	FlipsFaulty    *float64 `json:"flips_per_faulty_slot"`
	FlipsHealthy   *float64 `json:"flips_per_healthy_slot"`
	MaxResolutionS *float64 `json:"max_time_to_resolution_s"`
	MaxP99Ratio    *float64 `json:"max_p99_ratio"`
}

// Summarise aggregates runs per variant, in the order first seen.
func Summarise(runs []*RunResult) []Aggregate {
	var order []string
	by := map[string][]*RunResult{}
	for _, r := range runs {
		if r.Variant == "static" {
			continue
		}
		if _, ok := by[r.Variant]; !ok {
			order = append(order, r.Variant)
		}
		by[r.Variant] = append(by[r.Variant], r)
	}
	var out []Aggregate
	for _, v := range order {
		a := Aggregate{Variant: v, Runs: len(by[v])}
		var tp, fp, fn, end int
		var red, exact, ff, fh []float64
		for _, r := range by[v] {
			tp, fp, fn = tp+r.Loc.TP, fp+r.Loc.FP, fn+r.Loc.FN
			if r.Loc.EndCorrect {
				end++
			}
			if r.Client.Reduction != nil {
				red = append(red, *r.Client.Reduction)
				if a.MinReduction == nil || *r.Client.Reduction < *a.MinReduction {
					a.MinReduction = ptr(*r.Client.Reduction)
				}
			}
			if r.Loc.EverExact != nil {
				exact = append(exact, b2f(*r.Loc.EverExact))
			}
			if r.Loc.FlipsFaulty != nil {
				ff = append(ff, *r.Loc.FlipsFaulty)
			}
			if r.Loc.FlipsHealthy != nil {
				fh = append(fh, *r.Loc.FlipsHealthy)
			}
			if s := r.Loc.ResolutionS; len(r.Truth.Faulty) > 0 {
				if s == nil {
					a.MaxResolutionS = ptr(-1.0) // never resolved somewhere: flagged below
				} else if a.MaxResolutionS == nil || (*a.MaxResolutionS >= 0 && *s > *a.MaxResolutionS) {
					a.MaxResolutionS = ptr(*s)
				}
			}
			if p := r.Client.P99Ratio; p != nil && (a.MaxP99Ratio == nil || *p > *a.MaxP99Ratio) {
				a.MaxP99Ratio = ptr(*p)
			}
		}
		a.MeanReduction, a.EverExact, a.FlipsFaulty, a.FlipsHealthy = mean(red), mean(exact), mean(ff), mean(fh)
		a.EndCorrect = float64(end) / float64(len(by[v]))
		if tp+fp > 0 {
			a.Precision = ptr(float64(tp) / float64(tp+fp))
		}
		if tp+fn > 0 {
			a.Recall = ptr(float64(tp) / float64(tp+fn))
			a.F1 = ptr(2 * float64(tp) / float64(2*tp+fp+fn))
		}
		out = append(out, a)
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// WriteTable prints one row per run in the layout of the study's result
// tables, then one row per variant over all cells. "detect s" is timed
// from the faults' onset (the load's start, or half way in paper-late),
// "action s" and "resolution s" from the load's start.
func WriteTable(w io.Writer, runs []*RunResult) {
	fmt.Fprintln(w, "| cell | policy | 5xx | reduction | precision | recall | F1 | ever exact | end state | flips faulty/healthy | detect s | action s | resolution s | p95× | p99× | steps | cadence s | misses | tokens/step p/c | avoided/1k tok |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|:-:|:-:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		name := r.Variant
		if r.Emulated {
			name += " (emulated)"
		}
		res, det := "-", "-"
		if len(r.Truth.Faulty) > 0 {
			res, det = secsShort(r.Loc.ResolutionS), secsShort(r.Loc.DetectS)
		}
		row := []string{r.Cell.String(), name, fmt.Sprint(r.Client.Client5xx), pct(r.Client.Reduction),
			num(r.Loc.Precision), num(r.Loc.Recall), num(r.Loc.F1), yesNo(r.Loc.EverExact), yesNo(&r.Loc.EndCorrect),
			num(r.Loc.FlipsFaulty) + "/" + num(r.Loc.FlipsHealthy), det, "-", res, times(r.Client.P95Ratio), times(r.Client.P99Ratio),
			"-", "-", "-", "-", "-"}
		if a := r.Agent; a != nil {
			row[11] = secsShort(a.TimeToActionS)
			row[15] = fmt.Sprintf("%d/%d", a.StepsCompleted, a.StepsPlanned)
			row[16] = num(a.CadenceS)
			row[17] = fmt.Sprint(a.DeadlineMisses)
			row[18] = fmt.Sprintf("%.0f/%.0f", a.PromptPerStep, a.CompletionPerStep)
			row[19] = num(a.AvoidedPer1kTokens)
		}
		if r.Variant == "static" {
			for _, i := range []int{4, 5, 6, 7, 8, 9, 10, 12} {
				row[i] = "-" // no agent: nothing to localise
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	aggs := Summarise(runs)
	if len(aggs) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| policy, all cells | runs | mean reduction | min reduction | precision (micro) | recall (micro) | F1 (micro) | ever exact | end state | flips faulty/healthy | max resolution s | max p99× |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, a := range aggs {
		res := "-"
		if a.MaxResolutionS != nil {
			res = secsShort(a.MaxResolutionS)
			if *a.MaxResolutionS < 0 {
				res = "never (in some run)"
			}
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %.2f | %s/%s | %s | %s |\n", a.Variant, a.Runs, pct(a.MeanReduction), pct(a.MinReduction),
			num(a.Precision), num(a.Recall), num(a.F1), num(a.EverExact), a.EndCorrect, num(a.FlipsFaulty), num(a.FlipsHealthy), res, times(a.MaxP99Ratio))
	}
}

func secsShort(v *float64) string {
	if v == nil {
		return "never"
	}
	return fmt.Sprintf("%.1f", *v)
}

// WriteSummary writes summary.md, summary.json and summary.svg into dir.
func WriteSummary(dir, command string, runs []*RunResult) error {
	var md bytes.Buffer
	fmt.Fprintf(&md, "# hapilot-bench bench\n\n`%s`\n\n", command)
	for _, r := range runs {
		if r.Emulated {
			fmt.Fprint(&md, "Rows marked (emulated) ran an **emulated model** (Go code behind hapilot's Ollama stand-in), not a language model.\n\n")
			break
		}
	}
	if SideBySideWanted(runs) {
		fmt.Fprint(&md, "## Side by side\n")
		WriteSideBySide(&md, SideBySide(runs))
		fmt.Fprint(&md, "\n## Per policy and model, over every cell and seed\n\n")
		WritePerModel(&md, PerModel(runs))
		fmt.Fprint(&md, "\n## Every run\n\n")
	}
	WriteTable(&md, runs)
	fmt.Fprintln(&md, "\n![5xx reduction](summary.svg)")
	if err := os.WriteFile(filepath.Join(dir, "summary.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	b, err := json.MarshalIndent(struct {
		Command    string         `json:"command"`
		Runs       []*RunResult   `json:"runs"`
		Aggregate  []Aggregate    `json:"aggregate"`
		SideBySide []CellSummary  `json:"side_by_side"`
		PerModel   []ModelSummary `json:"per_model"`
	}{command, runs, Summarise(runs), SideBySide(runs), PerModel(runs)}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var cats, sers []string
	val := map[[2]string]float64{}
	for _, r := range runs {
		if r.Variant == "static" || r.Client.Reduction == nil {
			continue
		}
		c := strings.TrimPrefix(r.Cell.String(), r.Cell.Scenario+" ")
		if !slices.Contains(cats, c) {
			cats = append(cats, c)
		}
		if !slices.Contains(sers, r.Variant) {
			sers = append(sers, r.Variant)
		}
		val[[2]string{c, r.Variant}] = 100 * *r.Client.Reduction
	}
	var svg bytes.Buffer
	Bars(&svg, "client 5xx reduction vs static, %", "% fewer client 5xx", cats, sers, func(c, s string) (float64, bool) {
		v, ok := val[[2]string{c, s}]
		return v, ok
	})
	return os.WriteFile(filepath.Join(dir, "summary.svg"), svg.Bytes(), 0o644)
}

// SideBySideWanted tells whether runs hold more than one seed, a
// baseline beside static (envoy, haproxy-l7) or more than one model: the
// side-by-side and per-model tables are then written.
func SideBySideWanted(runs []*RunResult) bool {
	seeds := map[uint64]bool{}
	models := map[string]bool{}
	for _, r := range runs {
		seeds[r.Config.Seed] = true
		if r.Variant == "envoy" || strings.HasPrefix(r.Variant, "haproxy-l7") {
			return true
		}
		if strings.HasPrefix(r.Variant, "llm") {
			models[r.Variant] = true
		}
	}
	return len(seeds) > 1 || len(models) > 1
}

// Reread loads every result.json under dir (a sweep's or a run's output)
// and writes its reports again: charts and tables change, the
// measurements do not.
func Reread(dir string) ([]*RunResult, error) {
	var runs []*RunResult
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "result.json" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		r := &RunResult{}
		if err := json.Unmarshal(b, r); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		r.Dir = filepath.Dir(path)
		runs = append(runs, r)
		return writeRun(r)
	})
	if err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("no result.json under %s", dir)
	}
	SortRuns(runs)
	return runs, nil
}

// Command is the command recorded in dir's summary.json, or fallback.
func Command(dir, fallback string) string {
	var s struct{ Command string }
	if b, err := os.ReadFile(filepath.Join(dir, "summary.json")); err == nil && json.Unmarshal(b, &s) == nil && s.Command != "" {
		return s.Command
	}
	return fallback
}

// SortRuns puts runs in the order a sweep runs them: cell by cell, static
// first, then rules, lua and the models (protected before unprotected).
func SortRuns(runs []*RunResult) {
	rank := func(r *RunResult) string {
		p := map[string]string{"static": "0", "rules": "1", "lua": "2", "envoy": "05"}[r.Variant]
		if strings.HasPrefix(r.Variant, "haproxy-l7") {
			p = "01" + r.Variant
		}
		if p == "" {
			e := slices.Index(ollamafake.Emulations, strings.Split(strings.TrimPrefix(r.Variant, "llm/"), "/")[0])
			p = fmt.Sprintf("3%02d%v", e+1, strings.HasSuffix(r.Variant, "/unprotected"))
		}
		return p
	}
	sort.SliceStable(runs, func(i, j int) bool {
		a, b := runs[i], runs[j]
		switch {
		case a.Cell.Scenario != b.Cell.Scenario:
			return a.Cell.Scenario < b.Cell.Scenario
		case a.Cell.Servers != b.Cell.Servers:
			return a.Cell.Servers < b.Cell.Servers
		case a.Cell.Algo != b.Cell.Algo:
			return a.Cell.Algo > b.Cell.Algo // roundrobin first
		case rank(a) != rank(b):
			return rank(a) < rank(b)
		}
		return a.Config.Seed < b.Config.Seed
	})
}

// WriteTelemetryTable prints one row per run, the telemetry paths side by
// side: time to isolation, 5xx, its cut against HAProxy alone, healthy
// servers drained, HAProxy's CPU per response and, with HAProxy's
// retries, the attempts retried and the retried responses' p99.
func WriteTelemetryTable(w io.Writer, runs []*RunResult) {
	fmt.Fprintln(w, "| scenario | telemetry | policy | isolated s | client 5xx | 5xx cut | healthy drained | HAProxy CPU µs/resp | retried attempts | retried p99 ms |")
	fmt.Fprintln(w, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		iso, healthy := "-", "-"
		if r.Variant != "static" {
			healthy = fmt.Sprint(r.Loc.FP)
			if len(r.Truth.Faulty) > 0 {
				iso = secsShort(r.Loc.ResolutionS)
			}
		}
		retriedP99 := "-"
		if r.Client.RetriedResponses > 0 {
			retriedP99 = fmt.Sprintf("%.1f", r.Client.RetriedP99Ms)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %s | %s | %.1f | %d | %s |\n", r.Cell, r.Config.Telemetry, r.Variant, iso,
			r.Client.Client5xx, pct(r.Client.Reduction), healthy, r.HAProxy.CPUPerResponseUs, r.HAProxy.RetriedAttempts, retriedP99)
	}
}
