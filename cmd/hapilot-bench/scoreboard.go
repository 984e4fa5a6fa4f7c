package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lab/soak"
)

// family is one of the scoreboard's soak families: a cell, its healthy
// days and its faults.
type family struct {
	name, what string
	cell       func(base soak.Cell) soak.Cell
}

// families are issue 44's soak families. Each runs on nine servers at
// 0.2% (the soak's default fleet), its healthy days (where it has them)
// and its fault trials; the healthy region's upper end is max(0.5%, 3 x
// the median), the degraded region's lower one max(1%, 6 x the median):
// at a 0.2% median, the zone is 0.6% to 1.2%.
var families = []family{
	{"healthy", "33 req/s, σ 0.3 (each server's healthy rate lognormal around the median); a 5% fault", func(c soak.Cell) soak.Cell {
		c.Hetero, c.Fault = 0.3, 0.05
		return c
	}},
	{"zone-days", "33 req/s, σ 0.8: a few servers' own healthy rates lie in the zone (zone server-days), none failing", func(c soak.Cell) soak.Cell {
		c.Hetero = 0.8
		return c
	}},
	{"zone-fault", "33 req/s, σ 0.3; a fault at 0.9%, in the zone (no healthy days: the healthy family's)", func(c soak.Cell) soak.Cell {
		c.Hetero, c.Fault, c.ServerDays = 0.3, 0.009, 0
		return c
	}},
	{"grey", "33 req/s, σ 0.3; a fault at 2%, degraded but 10 x the median only (no healthy days: the healthy family's)", func(c soak.Cell) soak.Cell {
		c.Hetero, c.Fault, c.ServerDays = 0.3, 0.02, 0
		return c
	}},
	{"low-traffic", "5 req/s a server; a 5% fault", func(c soak.Cell) soak.Cell {
		c.Rate, c.Fault = 5, 0.05
		return c
	}},
	{"fleet-wide", "33 req/s; every server steps to 5% together for an hour, 0-600 s after the warm-up (no healthy days)", func(c soak.Cell) soak.Cell {
		c.FleetFault, c.ServerDays = 0.05, 0
		return c
	}},
	{"grey-latency", "33 req/s, answers lognormal around 5 ms (log-sd 0.3); one server 3 x slower from its onset (a 15 ms median: under the rules' 5 x peer test and their 50 ms floors, over the candidates' p95 test)", func(c soak.Cell) soak.Cell {
		c.Latency, c.Slow = soak.Latency{MedianMs: 5, Sigma: 0.3}, 3
		return c
	}},
	{"grey-latency-spread", "grey-latency in a fleet whose servers' own medians differ (lognormal σ 0.5 around 5 ms): a healthy server may sit at twice its peers' p95 all day; the slow server is 3 x its own", func(c soak.Cell) soak.Cell {
		c.Latency, c.Slow = soak.Latency{MedianMs: 5, Sigma: 0.3, Hetero: 0.5}, 3
		return c
	}},
	{"flapping", "33 req/s; a 5% fault on for 30 s, off for 60 s, from its onset (no healthy days)", func(c soak.Cell) soak.Cell {
		c.Fault, c.Flap, c.ServerDays = 0.05, soak.Flap{On: 30 * time.Second, Off: 60 * time.Second}, 0
		return c
	}},
}

// scoreRow is one family under one policy.
type scoreRow struct {
	Family string      `json:"family"`
	Policy string      `json:"policy"`
	Result soak.Result `json:"result"`
}

// cmdSoakScoreboard runs every family under --policy rules and the LLM
// policy behind each model, and writes the markdown table of
// docs/lab/llm-scoreboard.md.
func cmdSoakScoreboard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot-bench soak scoreboard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	emulate := fs.String("emulate", "capable", "emulated profiles of the Ollama stand-in, comma-separated (Go code, not models): "+strings.Join(ollamafake.Emulations, "|"))
	models := fs.String("model", "", "models on --ollama-host, comma-separated")
	host := fs.String("ollama-host", "", "a real Ollama serving --model")
	only := fs.String("families", "", "the families to run, comma-separated (default all): "+strings.Join(familyNames(), "|"))
	serverDays := fs.Float64("server-days", 180, "healthy server-days per family that has them, all seeds together")
	trials := fs.Int("trials", 25, "fault onsets (or incidents) per seed")
	seeds := fs.String("seeds", "1-4", "seeds, a range or a list")
	warmup := fs.Duration("warmup", 2*time.Hour, "steady healthy traffic before a fault may start")
	interval := fs.Duration("interval", 10*time.Second, "the loop's step")
	workers := fs.Int("workers", 0, "seeds run at once (0: GOMAXPROCS)")
	out := fs.String("out", "", "write the markdown table here (default: stdout)")
	jsonOut := fs.String("json", "", "write every result to this JSON file")
	render := fs.String("render", "", "run nothing: write the table of this --json file's results (the other flags as they ran, for the head lines)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	base := soak.Cell{Servers: 9, Rate: 33, Noise: 0.002, ServerDays: *serverDays, Trials: *trials, Warmup: *warmup,
		DrainFor: 30 * time.Second, Config: rules.DefaultConfig()}
	var err error
	if base.Seeds, err = parseSeeds(*seeds); err != nil {
		return err
	}
	fams, err := pickFamilies(*only)
	if err != nil {
		return err
	}
	if *interval < time.Second || *interval%time.Second != 0 {
		return fmt.Errorf("--interval %v: whole seconds, at least 1s", *interval)
	}
	if (*models == "") != (*host == "") {
		return errors.New("--model and --ollama-host go together: the models on a real Ollama")
	}
	if *render != "" {
		raw, err := os.ReadFile(*render)
		if err != nil {
			return fmt.Errorf("scoreboard: %w", err)
		}
		var rows []scoreRow
		if err := json.Unmarshal(raw, &rows); err != nil {
			return fmt.Errorf("scoreboard: %s: %w", *render, err)
		}
		return writeBoard(*out, stdout, fams, rows, base)
	}
	pols := []*soak.AgentPolicy{soak.RulesAgent(base.Config, *interval)}
	labels := []string{"rules"}
	for _, e := range splitList(*emulate) {
		if !slices.Contains(ollamafake.Emulations, e) {
			return fmt.Errorf("--emulate %q: want %s", e, strings.Join(ollamafake.Emulations, "|"))
		}
		h, m, stop, err := soak.Emulated(e, 1, *interval)
		if err != nil {
			return err
		}
		defer stop()
		a, err := llmPolicy(base.Config, m, h, *interval)
		if err != nil {
			return err
		}
		pols, labels = append(pols, a), append(labels, "llm: "+e+" (emulated)")
	}
	for _, m := range splitList(*models) {
		a, err := llmPolicy(base.Config, m, *host, *interval)
		if err != nil {
			return err
		}
		pols, labels = append(pols, a), append(labels, "llm: "+m+" (Ollama)")
	}
	var rows []scoreRow
	for _, f := range fams {
		for i, p := range pols {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("scoreboard: stopped: %w", err)
			}
			c := f.cell(base)
			c.Agent = p
			fmt.Fprintf(stderr, "scoreboard: %s, %s...\n", f.name, labels[i])
			r, err := soak.Run(c, *workers)
			if err != nil {
				return fmt.Errorf("scoreboard: %s, %s: %w", f.name, labels[i], err)
			}
			rows = append(rows, scoreRow{f.name, labels[i], r})
		}
	}
	if *jsonOut != "" {
		raw, err := json.MarshalIndent(rows, "", "  ")
		if err != nil {
			return fmt.Errorf("scoreboard: %w", err)
		}
		if err := os.WriteFile(*jsonOut, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("scoreboard: writing %s: %w", *jsonOut, err)
		}
	}
	return writeBoard(*out, stdout, fams, rows, base)
}

// writeBoard writes the tables to the file out, or to stdout.
func writeBoard(out string, stdout io.Writer, fams []family, rows []scoreRow, base soak.Cell) error {
	if out == "" {
		writeScoreboard(stdout, fams, rows, base)
		return nil
	}
	var b strings.Builder
	writeScoreboard(&b, fams, rows, base)
	if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("scoreboard: writing %s: %w", out, err)
	}
	return nil
}

// llmPolicy is --policy llm behind model on host, with the agent's
// defaults.
func llmPolicy(rc rules.Config, model, host string, interval time.Duration) (*soak.AgentPolicy, error) {
	cfg := llm.DefaultConfig()
	cfg.Model, cfg.Host = model, host
	return soak.LLMAgent(rc, cfg, interval, false)
}

func familyNames() []string {
	var out []string
	for _, f := range families {
		out = append(out, f.name)
	}
	return out
}

func pickFamilies(only string) ([]family, error) {
	if only == "" {
		return families, nil
	}
	var out []family
	for _, name := range splitList(only) {
		i := slices.IndexFunc(families, func(f family) bool { return f.name == name })
		if i < 0 {
			return nil, fmt.Errorf("--families %q: want %s", name, strings.Join(familyNames(), "|"))
		}
		out = append(out, families[i])
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// writeScoreboard writes the families, then one table row per family
// and policy.
func writeScoreboard(w io.Writer, fams []family, rows []scoreRow, base soak.Cell) {
	fmt.Fprintf(w, "Nine servers a backend at a 0.2%% median 5xx rate; %g healthy server-days a family that has them, %d fault trials (or incidents) a seed, seeds %v, %v of steady traffic before each onset; every policy on the agent path (evidence checks every second, steps every interval and at once on new evidence, the guardrails).\n\n",
		base.ServerDays, base.Trials, base.Seeds, base.Warmup)
	for _, f := range fams {
		fmt.Fprintf(w, "- **%s**: %s\n", f.name, f.what)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| family | policy | faults found [95%] | median s to find [95%] | p90 s | other drains | zone drains | model actions | of them healthy drains | model finds | model calls (a healthy server-day) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range rows {
		r := row.Result
		found, median, p90 := "-", "-", "-"
		if hasFault(r) {
			found = fmt.Sprintf("%d/%d [%.0f%%, %.0f%%]", r.Trials-r.Missed, r.Trials, 100*r.FoundLow95, 100*r.FoundHigh95)
			if r.Trials > r.Missed {
				median = fmt.Sprintf("%.1f [%.1f, %.1f]", r.DetectMedian, r.MedianLow95, r.MedianHigh95)
				p90 = fmt.Sprintf("%.1f", r.DetectP90)
			}
		}
		healthy := healthyDrains(r)
		zone := "-"
		if r.ServerDays > 0 {
			zone = fmt.Sprintf("%d in %.0f zone server-days", r.ZoneDrains, r.ZoneServerDays)
		}
		model, mHealthy, finds, calls := "-", "-", "-", "-"
		if r.ModelCalls != nil {
			model, mHealthy, finds = fmt.Sprint(*r.ModelActions), fmt.Sprint(*r.ModelHealthyDrains), fmt.Sprint(r.ModelFinds)
			if r.ModelCuts > 0 {
				model += fmt.Sprintf(" (%d weight cuts)", r.ModelCuts)
			}
			if r.ModelZoneDrains > 0 {
				mHealthy += fmt.Sprintf(" (%d zone)", r.ModelZoneDrains)
			}
			calls = fmt.Sprint(*r.ModelCalls)
			if r.CallsPerServerDay != nil {
				calls += fmt.Sprintf(" (%.2f)", *r.CallsPerServerDay)
			}
			if r.ModelFallbacks > 0 {
				calls += fmt.Sprintf("; %d steps fell back on the floor", r.ModelFallbacks)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", row.Family, row.Policy, found, median, p90, healthy, zone, model, mHealthy, finds, calls)
	}
	fmt.Fprintln(w)
	writeVerdicts(w, rows)
}

// healthyDrains is a result's drains of servers that were not failing:
// of healthy-region servers on its healthy days (per 1,000 healthy
// server-days, with the 95% upper end), of the other servers in its fault
// trials, or in its fleet-wide incidents.
func healthyDrains(r soak.Result) string {
	var parts []string
	if r.ServerDays > 0 {
		parts = append(parts, fmt.Sprintf("%d in %.0f server-days (≤ %.1f per 1,000, 95%%)", r.FalseDrains, r.HealthyServerDays, r.High95))
	}
	if hasFault(r) {
		parts = append(parts, fmt.Sprintf("%d of other servers in the trials", r.FaultFalseDrains))
	}
	if r.FleetFaultPer1000 != nil {
		parts = append(parts, fmt.Sprintf("%d in %.0f incident-h (≤ %.0f per 1,000, 95%%); %d before the onsets", r.FleetFaultDrains, r.IncidentHours, r.FleetFaultHigh95, r.FaultFalseDrains))
	}
	return strings.Join(parts, "; ")
}

// writeVerdicts compares each LLM row with its family's rules row on
// issue 44's terms: every fault the rules find, no later than 1.2 times
// their median, and no more healthy drains, each within the 95%
// intervals (overlapping intervals are within them).
func writeVerdicts(w io.Writer, rows []scoreRow) {
	rulesOf := map[string]soak.Result{}
	for _, row := range rows {
		if row.Policy == "rules" {
			rulesOf[row.Family] = row.Result
		}
	}
	fmt.Fprintln(w, "| family | policy | faults found, against the rules' | median time, against the rules' | other drains, against the rules' |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, row := range rows {
		rr, ok := rulesOf[row.Family]
		if row.Policy == "rules" || !ok {
			continue
		}
		r := row.Result
		found, median := "-", "-"
		if hasFault(r) {
			found = fmt.Sprintf("%d against %d of %d: %s", r.Trials-r.Missed, rr.Trials-rr.Missed, r.Trials, compare(
				float64(r.Trials-r.Missed), float64(rr.Trials-rr.Missed), r.FoundHigh95 >= rr.FoundLow95, true))
			if r.Trials > r.Missed && rr.Trials > rr.Missed {
				ratio := r.DetectMedian / rr.DetectMedian
				verdict := "within 1.2x"
				switch {
				case ratio > 1.2 && r.MedianLow95 > 1.2*rr.MedianHigh95:
					verdict = "later than 1.2x"
				case ratio > 1.2:
					verdict = "over 1.2x, within the intervals"
				case r.MedianHigh95 < rr.MedianLow95:
					verdict = "sooner, beyond the intervals"
				case ratio < 1:
					verdict = "sooner, within the intervals"
				}
				median = fmt.Sprintf("%.2fx: %s", ratio, verdict)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", row.Family, row.Policy, found, median, drainVerdict(r, rr))
	}
}

// compare says whether a (the LLM's) is above, level with or below b
// (the rules'); ok is whether the intervals overlap.
func compare(a, b float64, ok, moreIsBetter bool) string {
	switch {
	case a == b:
		return "level"
	case (a > b) == moreIsBetter:
		return "more"
	case ok:
		return "fewer, within the intervals"
	}
	return "fewer, beyond the intervals"
}

// drainVerdict compares the other drains (of healthy and zone servers
// on healthy days, of other servers in the trials, in incidents) of an
// LLM row with the rules', by Poisson intervals.
func drainVerdict(r, rr soak.Result) string {
	a := r.FalseDrains + r.ZoneDrains + r.FaultFalseDrains + r.FleetFaultDrains
	b := rr.FalseDrains + rr.ZoneDrains + rr.FaultFalseDrains + rr.FleetFaultDrains
	if a <= b {
		return fmt.Sprintf("%d against %d: no more", a, b)
	}
	loA, _ := soak.PoissonInterval(a, 0.05)
	_, hiB := soak.PoissonInterval(b, 0.05)
	if loA <= hiB {
		return fmt.Sprintf("%d against %d: more, within the intervals", a, b)
	}
	return fmt.Sprintf("%d against %d: more, beyond the intervals", a, b)
}

// hasFault tells whether a result's trials had a failing server: a 5xx
// fault, a slow one or a slow tail (a fleet-wide incident is none).
func hasFault(r soak.Result) bool { return r.Fault > 0 || r.Slow > 0 || r.Tail > 0 }
