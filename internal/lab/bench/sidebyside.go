package bench

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
)

// Intervals over seeds. Every figure of the side-by-side and per-model
// tables is the median over the seeds of a cell, with a 95% percentile
// bootstrap interval of that median: BootstrapResamples resamples of the
// seeds' values with replacement, drawn from a fixed seed so that a table
// written again from result.json is the same. With 5 seeds the interval
// cannot reach past the smallest and largest value; read it as the spread
// the seeds allow, not as a guarantee.

// BootstrapResamples is the number of bootstrap resamples.
const BootstrapResamples = 4000

// Estimate is a median with its 95% interval, and the values it came from.
type Estimate struct {
	Median float64   `json:"median"`
	Lo     float64   `json:"lo95"`
	Hi     float64   `json:"hi95"`
	Values []float64 `json:"per_seed"`
	// Missing counts seeds with no value (never detected, say).
	Missing int `json:"missing,omitempty"`
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// quantile is the linear-interpolation quantile of sorted s.
func quantile(s []float64, q float64) float64 {
	if len(s) == 1 {
		return s[0]
	}
	pos := q * float64(len(s)-1)
	i := int(math.Floor(pos))
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	f := pos - float64(i)
	return s[i]*(1-f) + s[i+1]*f
}

// Estimate1 is the median of values, with its bootstrap interval; nil
// values (a metric that did not apply in a seed) count as Missing. It is
// nil when no seed had a value.
func Estimate1(values []*float64) *Estimate {
	e := &Estimate{}
	for _, v := range values {
		if v == nil {
			e.Missing++
			continue
		}
		e.Values = append(e.Values, *v)
	}
	if len(e.Values) == 0 {
		return nil
	}
	e.Median = median(e.Values)
	rng := rand.New(rand.NewPCG(24, 1))
	meds := make([]float64, BootstrapResamples)
	buf := make([]float64, len(e.Values))
	for b := range meds {
		for i := range buf {
			buf[i] = e.Values[rng.IntN(len(e.Values))]
		}
		meds[b] = median(buf)
	}
	sort.Float64s(meds)
	e.Lo, e.Hi = quantile(meds, 0.025), quantile(meds, 0.975)
	return e
}

// Overlaps tells whether two intervals share a point: then neither cell
// is called better than the other.
func (e *Estimate) Overlaps(o *Estimate) bool {
	return e != nil && o != nil && e.Lo <= o.Hi && o.Lo <= e.Hi
}

func (e *Estimate) format(f func(float64) string) string {
	if e == nil {
		return "never"
	}
	s := f(e.Median)
	if len(e.Values) > 1 {
		s += " [" + f(e.Lo) + ", " + f(e.Hi) + "]"
	}
	if e.Missing > 0 {
		s += fmt.Sprintf(" (never in %d/%d)", e.Missing, e.Missing+len(e.Values))
	}
	return s
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f1(v float64) string { return fmt.Sprintf("%.1f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }
func fpct(v float64) string {
	return fmt.Sprintf("%.0f%%", 100*v)
}

// CellSummary is one policy in one cell over every seed: the side-by-side
// table's row, with every seed's figures.
type CellSummary struct {
	Cell    Cell     `json:"cell"`
	Variant string   `json:"variant"`
	Kind    string   `json:"kind"`
	Seeds   []uint64 `json:"seeds"`
	// Client5xx, Reduction (the cut against the same seed's static run),
	// DetectS, IsolateS, HealthyDrained (healthy servers ever drained),
	// Flips (changes of drained state over every server) and P99Ratio.
	Client5xx      *Estimate `json:"client_5xx"`
	Reduction      *Estimate `json:"reduction_5xx"`
	DetectS        *Estimate `json:"time_to_detect_s"`
	IsolateS       *Estimate `json:"time_to_isolate_s"`
	HealthyDrained *Estimate `json:"healthy_ever_drained"`
	Flips          *Estimate `json:"flips"`
	P99Ratio       *Estimate `json:"p99_ratio"`
	EndCorrect     int       `json:"end_correct_seeds"`
	HasFaulty      bool      `json:"-"`
	// ModelActions and ModelHealthyDrains, where a model decided: its
	// own actions beyond the floor that the guardrails accepted, and
	// those of them that drained a healthy server (Agent).
	ModelActions       *Estimate `json:"model_actions,omitempty"`
	ModelHealthyDrains *Estimate `json:"model_healthy_drains,omitempty"`
}

// Kind says what decided a run: HAProxy alone, a baseline, hapilot's
// rules, an emulated model or a model on a real server.
func Kind(r *RunResult) string {
	switch {
	case r.Variant == "static":
		return "HAProxy alone"
	case strings.HasPrefix(r.Variant, "haproxy-l7"):
		return "HAProxy's own detection"
	case r.Variant == "envoy":
		return "Envoy's algorithm, re-implemented in the lab"
	case r.Emulated:
		return "emulated model"
	case strings.HasPrefix(r.Variant, "llm"):
		return "model on a real server"
	}
	return "hapilot " + r.Variant
}

// SideBySide groups runs by cell and variant, over seeds, in run order.
func SideBySide(runs []*RunResult) []CellSummary {
	type key struct {
		c Cell
		v string
	}
	var order []key
	by := map[key][]*RunResult{}
	for _, r := range runs {
		k := key{r.Cell, r.Variant}
		if _, ok := by[k]; !ok {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	var out []CellSummary
	for _, k := range order {
		rs := by[k]
		cs := CellSummary{Cell: k.c, Variant: k.v, Kind: Kind(rs[0]), HasFaulty: len(rs[0].Truth.Faulty) > 0}
		var c5, red, det, iso, fp, flips, p99, mact, mhd []*float64
		for _, r := range rs {
			cs.Seeds = append(cs.Seeds, r.Config.Seed)
			c5 = append(c5, ptr(float64(r.Client.Client5xx)))
			red = append(red, r.Client.Reduction)
			p99 = append(p99, r.Client.P99Ratio)
			if r.Variant == "static" {
				continue
			}
			fp = append(fp, ptr(float64(r.Loc.FP)))
			n := 0
			for _, f := range r.Loc.Flips {
				n += f
			}
			flips = append(flips, ptr(float64(n)))
			if r.Loc.EndCorrect {
				cs.EndCorrect++
			}
			if a := r.Agent; a != nil && a.ModelHealthyDrains != nil {
				mact = append(mact, ptr(float64(len(a.ModelActions))))
				mhd = append(mhd, ptr(float64(*a.ModelHealthyDrains)))
			}
			if cs.HasFaulty {
				det = append(det, r.Loc.DetectS)
				iso = append(iso, r.Loc.ResolutionS)
			}
		}
		cs.Client5xx, cs.Reduction, cs.P99Ratio = Estimate1(c5), Estimate1(red), Estimate1(p99)
		cs.HealthyDrained, cs.Flips = Estimate1(fp), Estimate1(flips)
		cs.DetectS, cs.IsolateS = Estimate1(det), Estimate1(iso)
		if len(mact) > 0 {
			cs.ModelActions, cs.ModelHealthyDrains = Estimate1(mact), Estimate1(mhd)
		}
		out = append(out, cs)
	}
	return out
}

// WriteSideBySide prints one table per cell (scenario, fleet size,
// algorithm): every policy's median over the seeds with its 95%
// interval. The fewest 5xx is starred only where its interval overlaps no
// other policy's.
func WriteSideBySide(w io.Writer, cells []CellSummary) {
	var cur Cell
	var group []CellSummary
	flush := func() {
		if len(group) == 0 {
			return
		}
		seeds := len(group[0].Seeds)
		if seeds == 1 {
			fmt.Fprintf(w, "\n**%s** (1 seed: one run each, no interval, none called better)\n\n", cur)
		} else {
			fmt.Fprintf(w, "\n**%s** (%d seeds; median [95%% bootstrap interval of the median])\n\n", cur, seeds)
		}
		fmt.Fprintln(w, "| policy | what decides | client 5xx | 5xx cut | time to detect s | time to isolate s | healthy ever drained | flips | end state | p99× | model's own actions | of them healthy drains |")
		fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|:-:|---:|---:|---:|")
		best := -1
		for i, g := range group {
			if seeds < 2 {
				break // one seed: no interval to tell a cell apart
			}
			if best < 0 || g.Client5xx.Median < group[best].Client5xx.Median {
				best = i
			}
		}
		for i, g := range group {
			if best >= 0 && i != best && g.Client5xx.Overlaps(group[best].Client5xx) {
				best = -1
				break
			}
		}
		for i, g := range group {
			c5 := g.Client5xx.format(f0)
			if i == best && len(group) > 1 {
				c5 += " *"
			}
			det, iso, hd, fl, end := "-", "-", "-", "-", "-"
			if g.Variant != "static" {
				hd, fl = g.HealthyDrained.format(f0), g.Flips.format(f0)
				end = fmt.Sprintf("%d/%d", g.EndCorrect, len(g.Seeds))
				if g.HasFaulty {
					det, iso = g.DetectS.format(f1), g.IsolateS.format(f1)
				}
			}
			red, p99 := "-", "-"
			if g.Variant != "static" {
				red, p99 = g.Reduction.format(fpct), g.P99Ratio.format(f2)
			}
			ma, mh := "-", "-"
			if g.ModelActions != nil {
				ma, mh = g.ModelActions.format(f0), g.ModelHealthyDrains.format(f0)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", g.Variant, g.Kind, c5, red, det, iso, hd, fl, end, p99, ma, mh)
		}
		group = nil
	}
	for _, c := range cells {
		if c.Cell != cur {
			flush()
			cur = c.Cell
		}
		group = append(group, c)
	}
	flush()
	fmt.Fprintln(w, "\n`*`: the fewest client 5xx, its interval clear of every other policy's; where intervals overlap no policy is called better.")
}

// ModelSummary is one variant over the whole grid and every seed: the
// study's measures (docs/reference/metrics.md), one row per model.
type ModelSummary struct {
	Variant      string    `json:"variant"`
	Kind         string    `json:"kind"`
	Runs         int       `json:"runs"`
	Reduction    *Estimate `json:"reduction_5xx"`
	Precision    *float64  `json:"precision_micro"`
	Recall       *float64  `json:"recall_micro"`
	F1           *float64  `json:"f1_micro"`
	EverExact    *float64  `json:"ever_exact_share"`
	EndCorrect   float64   `json:"end_correct_share"`
	FlipsFaulty  *float64  `json:"flips_per_faulty_slot"`
	FlipsHealthy *float64  `json:"flips_per_healthy_slot"`
	ResolutionS  *Estimate `json:"time_to_resolution_s"`
	P95Ratio     *Estimate `json:"p95_ratio"`
	P99Ratio     *Estimate `json:"p99_ratio"`
	// Agent's record (nil for policies with no hapilot agent).
	StepsCompleted, StepsPlanned int
	CadenceS                     *Estimate `json:"median_cadence_s"`
	Misses                       int       `json:"deadline_misses"`
	PromptPerStep                *float64  `json:"prompt_tokens_per_step"`
	CompletionPerStep            *float64  `json:"completion_tokens_per_step"`
	AvoidedPer1k                 *Estimate `json:"failed_avoided_per_1k_completion_tokens"`
}

// PerModel summarises every variant but static over all runs given.
func PerModel(runs []*RunResult) []ModelSummary {
	var out []ModelSummary
	aggs := Summarise(runs)
	for _, a := range aggs {
		m := ModelSummary{Variant: a.Variant, Runs: a.Runs, Precision: a.Precision, Recall: a.Recall, F1: a.F1, EverExact: a.EverExact,
			EndCorrect: a.EndCorrect, FlipsFaulty: a.FlipsFaulty, FlipsHealthy: a.FlipsHealthy}
		var red, res, p95, p99, cad, av []*float64
		var pt, ct []float64
		for _, r := range runs {
			if r.Variant != a.Variant {
				continue
			}
			m.Kind = Kind(r)
			red, p95, p99 = append(red, r.Client.Reduction), append(p95, r.Client.P95Ratio), append(p99, r.Client.P99Ratio)
			if len(r.Truth.Faulty) > 0 {
				res = append(res, r.Loc.ResolutionS)
			}
			if g := r.Agent; g != nil {
				m.StepsCompleted += g.StepsCompleted
				m.StepsPlanned += g.StepsPlanned
				m.Misses += g.DeadlineMisses
				cad = append(cad, g.CadenceS)
				pt, ct = append(pt, g.PromptPerStep), append(ct, g.CompletionPerStep)
				if g.AvoidedPer1kTokens != nil {
					av = append(av, g.AvoidedPer1kTokens)
				}
			}
		}
		m.Reduction, m.ResolutionS, m.P95Ratio, m.P99Ratio = Estimate1(red), Estimate1(res), Estimate1(p95), Estimate1(p99)
		m.CadenceS, m.AvoidedPer1k = Estimate1(cad), Estimate1(av)
		m.PromptPerStep, m.CompletionPerStep = mean(pt), mean(ct)
		out = append(out, m)
	}
	return out
}

// WritePerModel prints the study's table, one row per policy or model over
// every cell and seed: figures from emulations and from real servers are
// told apart in the "what decides" column.
func WritePerModel(w io.Writer, ms []ModelSummary) {
	fmt.Fprintln(w, "| policy / model | what decides | runs | 5xx reduction | precision | recall | F1 | ever exact | end state | flips faulty/healthy | resolution s | p95× | p99× | steps | cadence s | misses | tokens/step p/c | avoided/1k tok |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, m := range ms {
		steps, toks := "-", "-"
		if m.StepsPlanned > 0 {
			steps = fmt.Sprintf("%d/%d", m.StepsCompleted, m.StepsPlanned)
			toks = fmt.Sprintf("%.0f/%.0f", *m.PromptPerStep, *m.CompletionPerStep)
		}
		cad, miss, av := "-", "-", "-"
		if m.StepsPlanned > 0 {
			cad, miss = m.CadenceS.format(f1), fmt.Sprint(m.Misses)
			if m.AvoidedPer1k != nil {
				av = m.AvoidedPer1k.format(f1)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %.2f | %s/%s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			m.Variant, m.Kind, m.Runs, m.Reduction.format(fpct), num(m.Precision), num(m.Recall), num(m.F1), num(m.EverExact), m.EndCorrect,
			num(m.FlipsFaulty), num(m.FlipsHealthy), m.ResolutionS.format(f1), m.P95Ratio.format(f2), m.P99Ratio.format(f2), steps, cad, miss, toks, av)
	}
	fmt.Fprintln(w, "\nMedians over runs with [95% bootstrap interval of the median]; precision, recall and F1 micro-averaged; the rest averaged over runs.")
}
