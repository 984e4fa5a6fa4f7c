package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/rs/zerolog"
)

// TestLedgerTransitions: each method is one transition, and the phase it
// leaves is the only thing recovery reads.
func TestLedgerTransitions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var k = mustKey("app/s1")
	tests := []struct {
		name  string
		steps func(l *Ledger)
		phase Phase // "" when the server should have left the ledger
		want  Change
		held  time.Time // the hold on draining it leaves, if any
	}{
		{"drain", func(l *Ledger) { l.Drain(k, t0, "5xx", 0.05, 20, false) }, PhaseDrained,
			Change{ErrorRate: 0.05, BaselineP99Ms: 20, At: t0}, time.Time{}},
		{"drain then ready at full weight", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Ready(k, 8, 8, t0.Add(time.Minute), "probes clean", 0)
		}, "", Change{}, time.Time{}},
		{"drain, canary weight staged, ready", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Cut(k, 2, 8, t0.Add(time.Minute), "canary weight", 0) // staged: still drained
			l.Ready(k, 2, 8, t0.Add(2*time.Minute), "probes clean", 10*time.Minute)
		}, PhaseCanary, Change{Weight: 2, At: t0.Add(2 * time.Minute)}, t0.Add(12 * time.Minute)},
		{"a weight staged on a drained server keeps the drain", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Cut(k, 2, 8, t0.Add(time.Minute), "canary weight", 0)
		}, PhaseDrained, Change{ErrorRate: 0.05, BaselineP99Ms: 20, At: t0}, time.Time{}},
		{"cut", func(l *Ledger) { l.Cut(k, 3, 8, t0, "capacity", 0) }, PhaseCut, Change{Weight: 3, At: t0}, time.Time{}},
		{"cut back to the configured weight", func(l *Ledger) {
			l.Cut(k, 3, 8, t0, "capacity", 0)
			l.Cut(k, 8, 8, t0.Add(time.Minute), "clean", 0)
		}, "", Change{}, time.Time{}},
		{"canary promoted", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Ready(k, 2, 8, t0, "probes clean", 0)
			l.Cut(k, 8, 8, t0.Add(time.Minute), "live traffic clean", 0)
		}, "", Change{}, time.Time{}},
		{"a canary's weight moves within its phase", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Ready(k, 2, 8, t0, "probes clean", 0)
			l.Cut(k, 4, 8, t0.Add(time.Minute), "half way", 0)
		}, PhaseCanary, Change{Weight: 4, At: t0.Add(time.Minute)}, time.Time{}},
		{"lose", func(l *Ledger) { l.Drain(k, t0, "5xx", 0.05, 20, false); l.Lose(k) }, "", Change{}, time.Time{}},
		{"a server gone from HAProxy", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, false)
			l.Keep(map[Key]bool{mustKey("app/s2"): true}, t0)
		}, "", Change{}, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger("", zerolog.Nop())
			l.SetEpoch("1@1")
			tc.steps(l)
			if held := l.HeldUntil(k, t0); !held.Equal(tc.held) {
				t.Fatalf("held until %v, want %v", held, tc.held)
			}
			got, ok := l.Changes()[k]
			if tc.phase == "" {
				if ok {
					t.Fatalf("still in the ledger: %+v", got)
				}
				return
			}
			want := tc.want
			want.Phase, want.Epoch, want.Reason = tc.phase, "1@1", got.Reason
			if !ok || got != want {
				t.Fatalf("change %+v, want %+v", got, want)
			}
		})
	}
}

func TestLedgerReconcile(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ready := haproxy.ServerState{Backend: "app", Server: "s1", OpState: haproxy.OpRunning, Weight: 8, Initial: 8}
	drained := ready
	drained.AdminState = haproxy.AdminForcedDrain
	maint := ready
	maint.AdminState = haproxy.AdminForcedMaint
	cut := ready
	cut.Weight = 3
	drainedDNS := drained
	drainedDNS.AdminState |= haproxy.AdminDNSMaint
	cutDNS := cut
	cutDNS.AdminState = haproxy.AdminDNSMaint
	tests := []struct {
		name         string
		change       func(l *Ledger)
		epoch        string
		state        haproxy.ServerState
		owner        Owner
		reapply, has bool
	}{
		{"untouched", func(*Ledger) {}, "e1", ready, OwnerNone, false, false},
		{"the operator's maint", func(*Ledger) {}, "e1", maint, OwnerOperator, false, false},
		{"our drain in force", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e1", drained, OwnerAgent, false, true},
		{"our cut in force", func(l *Ledger) { l.Cut(mustKey("app/s1"), 3, 8, t0, "", 0) }, "e1", cut, OwnerAgent, false, true},
		{"a reload lost our drain", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e2", ready, OwnerAgent, true, true},
		{"someone readied our drain: their word stands", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e1", ready, OwnerOperator, false, false},
		{"someone put our drain in maint", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e1", maint, OwnerOperator, false, false},
		{"our drain, and the resolver's maint too (0x28)", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e1", drainedDNS, OwnerAgent, false, true},
		{"our cut, its name no longer resolving", func(l *Ledger) { l.Cut(mustKey("app/s1"), 3, 8, t0, "", 0) }, "e1", cutDNS, OwnerAgent, false, true},
		{"a reload, then the operator's maint", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, false) }, "e2", maint, OwnerOperator, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger("", zerolog.Nop())
			l.OperatorHold = DefaultOperatorHold
			l.SetEpoch("e1")
			tc.change(l)
			l.SetEpoch(tc.epoch)
			owner, ch, reapply := l.Reconcile(mustKey("app/s1"), tc.state, t0)
			_, has := l.Changes()[mustKey("app/s1")]
			if owner != tc.owner || reapply != tc.reapply || has != tc.has || (owner == OwnerAgent) != (ch != nil) {
				t.Fatalf("owner %s change %+v reapply %v kept %v; want %s %v %v", owner, ch, reapply, has, tc.owner, tc.reapply, tc.has)
			}
		})
	}
}

// A state file written before phases (version 1, with kinds) still reads.
func TestLedgerReadsVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	v1 := `{"version": 1, "changes": {
	  "app/s1": {"kind": "drain", "at": "2026-11-01T10:00:00Z", "epoch": "1@1", "error_rate": 0.05},
	  "app/s2": {"kind": "set_weight", "weight": 3, "at": "2026-11-01T10:00:00Z", "epoch": "1@1"},
	  "app/s3": {"kind": "bogus", "at": "2026-11-01T10:00:00Z", "epoch": "1@1"}}}`
	if err := os.WriteFile(path, []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	got := NewLedger(path, zerolog.Nop()).Changes()
	if len(got) != 2 || got[mustKey("app/s1")].Phase != PhaseDrained || got[mustKey("app/s1")].ErrorRate != 0.05 || got[mustKey("app/s2")].Phase != PhaseCut || got[mustKey("app/s2")].Weight != 3 {
		t.Fatalf("changes %+v", got)
	}
	// The next change writes version 2, which reads back the same.
	l := NewLedger(path, zerolog.Nop())
	l.Drain(mustKey("app/s4"), time.Unix(1000, 0).UTC(), "x", 0, 0, false)
	if again := NewLedger(path, zerolog.Nop()).Changes(); len(again) != 3 || again[mustKey("app/s4")].Phase != PhaseDrained {
		t.Fatalf("after rewrite %+v", again)
	}
}

// A link planted beside or at the state file is never written through:
// the file is written under a fresh name and renamed into place.
func TestStateFileFollowsNoLink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.json")
	for _, link := range []string{state + ".tmp", state} {
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
	}
	l := NewLedger(state, zerolog.Nop())
	l.Drain(mustKey("app/s1"), time.Unix(1000, 0), "x", 0, 0, false)
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the victim was overwritten: %q", b)
	}
	if fi, err := os.Lstat(state); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		t.Fatalf("the state file is still a link: %v", err)
	}
	if got := NewLedger(state, zerolog.Nop()).Changes(); len(got) != 1 {
		t.Fatalf("state %+v", got)
	}
}
