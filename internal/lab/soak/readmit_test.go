package soak

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
)

func readmitCell(mode recovery.Mode, heal, blind bool) ReadmitCell {
	return ReadmitCell{Servers: 9, Rate: 33, Noise: 0.002, Fault: 0.05, Weight: 16, Heal: heal, HealWithin: 10 * time.Minute,
		Blind: blind, Horizon: 30 * time.Minute, Interval: 10 * time.Second, Mode: mode, Trials: max(5, int(20*scale)), Seeds: []uint64{1, 2}, Rules: rules.DefaultConfig()}
}

// TestReadmit: through the real loop and recovery, the slow start brings
// a healed server back to full weight sooner than the probe path, never
// lets back a server whose probes fail, and sends one whose probes pass
// while its clients fail back to drain within the SPRT's error bound for
// each try.
func TestReadmit(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of simulation")
	}
	run := func(c ReadmitCell) ReadmitResult {
		t.Helper()
		r, err := RunReadmit(c, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s %s: %+v", r.Path, r.Case, r)
		return r
	}
	probe, slow := run(readmitCell(recovery.ModeProbe, true, false)), run(readmitCell(recovery.ModeSlowStart, true, false))
	if slow.Full != slow.Trials || slow.FullMedian <= 0 || (probe.FullMedian > 0 && slow.FullMedian >= probe.FullMedian) {
		t.Errorf("healed: slow start %d/%d at full weight, median %.1f s; probe path median %.1f s", slow.Full, slow.Trials, slow.FullMedian, probe.FullMedian)
	}
	for _, m := range []recovery.Mode{recovery.ModeProbe, recovery.ModeSlowStart} {
		// A burst of a still-failing server passes with p < 1e-4.
		if r := run(readmitCell(m, false, false)); r.Readmits > 0.05 || r.Probes == 0 {
			t.Errorf("%s: a server whose probes fail was let back %.2f times a run (%.0f probes)", m, r.Readmits, r.Probes)
		}
	}
	c := readmitCell(recovery.ModeSlowStart, false, true)
	r := run(c)
	// Each try begins at the ramp's first weight among the others at
	// full weight: chunks of that share of the backend's traffic a step.
	cfg := recovery.DefaultConfig()
	w0 := max(1, int(float64(c.Weight)*cfg.RampShare+0.5))
	chunk := c.Rate * float64(c.Servers) * float64(w0) / float64(w0+(c.Servers-1)*c.Weight) * c.Interval.Seconds()
	test, err := cfg.RampTest(c.Fault, c.Noise)
	if err != nil {
		t.Fatal(err)
	}
	bound := test.ErrorBound(c.Fault, chunk)
	if r.Readmits == 0 || r.PaidFaulty/r.Readmits > bound || r.Redrains < r.Readmits-1 {
		t.Errorf("probe-blind: %.2f 5xx over %.2f tries a run (%.2f redrains), bound %.1f a try", r.PaidFaulty, r.Readmits, r.Redrains, bound)
	}
}
