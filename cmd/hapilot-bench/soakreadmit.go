package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
	"github.com/hapilot/hapilot/internal/lab/soak"
)

// readmitFlags are soak's flags as --readmit reads them.
type readmitFlags struct {
	servers, rates                []float64
	noise                         float64
	fault                         string
	weight                        int
	healWithin, horizon, interval time.Duration
	trials                        int
	seeds                         []uint64
	seedsText                     string
	rules                         rules.Config
	workers                       int
	json                          string
}

// soakReadmit runs the re-admission cells: for each size, rate and fault,
// a server that heals, one that never does, and one whose probes pass
// while its clients still fail, each through today's probe path and the
// slow start, on the same seeds.
func soakReadmit(ctx context.Context, f readmitFlags, stdout, stderr io.Writer) error {
	faults := []float64{0.05}
	if f.fault != "" {
		var err error
		if faults, err = floats("fault", f.fault); err != nil {
			return err
		}
	}
	cases := []struct{ heal, blind bool }{{true, false}, {false, false}, {false, true}}
	var results []soak.ReadmitResult
	for _, n := range f.servers {
		for _, r := range f.rates {
			for _, flt := range faults {
				for _, cs := range cases {
					for _, mode := range []recovery.Mode{recovery.ModeProbe, recovery.ModeSlowStart} {
						c := soak.ReadmitCell{Servers: int(n), Rate: r, Noise: f.noise, Fault: flt, Weight: f.weight, Heal: cs.heal,
							HealWithin: f.healWithin, Blind: cs.blind, Horizon: f.horizon, Interval: f.interval, Mode: mode,
							Trials: f.trials, Seeds: f.seeds, Rules: f.rules}
						if err := ctx.Err(); err != nil {
							return fmt.Errorf("soak readmit: stopped: %w", err)
						}
						fmt.Fprintf(stderr, "soak readmit: N=%d %g req/s fault %g heal %v blind %v %s...\n", c.Servers, r, flt, cs.heal, cs.blind, mode)
						res, err := soak.RunReadmit(c, f.workers)
						if err != nil {
							return fmt.Errorf("soak readmit: %w", err)
						}
						results = append(results, res)
					}
				}
			}
		}
	}
	fmt.Fprintf(stdout, "soak readmit: the real loop and recovery on an injected clock, a step every %v; heal uniform in [0, %v) after the drain; horizon %v; seeds %s\n",
		f.interval, f.healWithin, f.horizon, f.seedsText)
	WriteReadmitTable(stdout, results)
	if f.json != "" {
		raw, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return fmt.Errorf("soak readmit: %w", err)
		}
		if err := os.WriteFile(f.json, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("soak readmit: writing %s: %w", f.json, err)
		}
	}
	return nil
}

// WriteReadmitTable prints one row per result.
func WriteReadmitTable(w io.Writer, results []soak.ReadmitResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cell\tfault\tcase\tpath\truns\tfull weight\theal→full median s\tp90 s\tready→full median s\t5xx while faulty /run\t5xx after heal /run\treadmits /run\tredrains /run\tprobes /run\t")
	for _, r := range results {
		full := "-\t-\t-\t-"
		if r.Case == "heals" || r.Case == "probe-blind, heals" {
			ramp := "-" // none back: no ramp to time
			if r.Full > 0 {
				ramp = fmt.Sprintf("%.1f", r.RampMedian)
			}
			full = fmt.Sprintf("%d/%d\t%s\t%s\t%s", r.Full, r.Trials, beyond(r.FullMedian), beyond(r.FullP90), ramp)
		}
		fmt.Fprintf(tw, "%s\t%.3g%%\t%s\t%s\t%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t\n", r.Cell, 100*r.Fault, r.Case, r.Path, r.Trials, full,
			r.PaidFaulty, r.PaidHealed, r.Readmits, r.Redrains, r.Probes)
	}
	tw.Flush()
}

// beyond prints a time to full weight, ">horizon" for one past it.
func beyond(s float64) string {
	if s < 0 {
		return ">horizon"
	}
	return fmt.Sprintf("%.1f", s)
}
