package soak

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
)

func readmitCell(mode recovery.Mode, heal, blind bool) ReadmitCell {
	return ReadmitCell{Servers: 9, Rate: 33, Noise: 0.002, Fault: 0.05, Weight: 16, Heal: heal, HealWithin: 10 * time.Minute,
		Blind: blind, Horizon: 30 * time.Minute, Interval: 10 * time.Second, Mode: mode, Trials: 20, Seeds: []uint64{1, 2}, Rules: rules.DefaultConfig()}
}

func TestReadmitSmoke(t *testing.T) {
	for _, m := range []recovery.Mode{recovery.ModeProbe, recovery.ModeSlowStart} {
		for _, c := range []ReadmitCell{readmitCell(m, true, false), readmitCell(m, false, false), readmitCell(m, false, true)} {
			r, err := RunReadmit(c, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%+v", r)
		}
	}
}
