package ledger

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
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
		phase agent.Phase // "" when the server should have left the ledger
		want  agent.Change
		held  time.Time // the hold on draining it leaves, if any
	}{
		{"drain", func(l *Ledger) { l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false) }, agent.PhaseDrained,
			agent.Change{ErrorRate: 0.05, BaselineP99Ms: 20, At: t0}, time.Time{}},
		{"drain then ready at full weight", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Ready(k, 8, 8, t0.Add(time.Minute), "probes clean", 0)
		}, "", agent.Change{}, time.Time{}},
		{"drain, canary weight staged, ready", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Cut(k, 2, 8, t0.Add(time.Minute), "canary weight", 0) // staged: still drained
			l.Ready(k, 2, 8, t0.Add(2*time.Minute), "probes clean", 10*time.Minute)
		}, agent.PhaseCanary, agent.Change{Weight: 2, At: t0.Add(2 * time.Minute)}, t0.Add(12 * time.Minute)},
		{"a weight staged on a drained server keeps the drain", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Cut(k, 2, 8, t0.Add(time.Minute), "canary weight", 0)
		}, agent.PhaseDrained, agent.Change{ErrorRate: 0.05, BaselineP99Ms: 20, At: t0}, time.Time{}},
		{"cut", func(l *Ledger) { l.Cut(k, 3, 8, t0, "capacity", 0) }, agent.PhaseCut, agent.Change{Weight: 3, At: t0}, time.Time{}},
		{"cut back to the configured weight", func(l *Ledger) {
			l.Cut(k, 3, 8, t0, "capacity", 0)
			l.Cut(k, 8, 8, t0.Add(time.Minute), "clean", 0)
		}, "", agent.Change{}, time.Time{}},
		{"canary promoted", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Ready(k, 2, 8, t0, "probes clean", 0)
			l.Cut(k, 8, 8, t0.Add(time.Minute), "live traffic clean", 0)
		}, "", agent.Change{}, time.Time{}},
		{"a canary's weight moves within its phase", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Ready(k, 2, 8, t0, "probes clean", 0)
			l.Cut(k, 4, 8, t0.Add(time.Minute), "half way", 0)
		}, agent.PhaseCanary, agent.Change{Weight: 4, At: t0.Add(time.Minute)}, time.Time{}},
		{"lose", func(l *Ledger) { l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false); l.Lose(k) }, "", agent.Change{}, time.Time{}},
		{"a server gone from HAProxy", func(l *Ledger) {
			l.Drain(k, t0, "5xx", 0.05, 20, 0, false, false)
			l.Keep(map[agent.Key]bool{mustKey("app/s2"): true}, t0)
		}, "", agent.Change{}, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := New("", zerolog.Nop())
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
		owner        agent.Owner
		reapply, has bool
	}{
		{"untouched", func(*Ledger) {}, "e1", ready, agent.OwnerNone, false, false},
		{"the operator's maint", func(*Ledger) {}, "e1", maint, agent.OwnerOperator, false, false},
		{"our drain in force", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e1", drained, agent.OwnerAgent, false, true},
		{"our cut in force", func(l *Ledger) { l.Cut(mustKey("app/s1"), 3, 8, t0, "", 0) }, "e1", cut, agent.OwnerAgent, false, true},
		{"a reload lost our drain", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e2", ready, agent.OwnerAgent, true, true},
		{"someone readied our drain: their word stands", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e1", ready, agent.OwnerOperator, false, false},
		{"someone put our drain in maint", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e1", maint, agent.OwnerOperator, false, false},
		{"our drain, and the resolver's maint too (0x28)", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e1", drainedDNS, agent.OwnerAgent, false, true},
		{"our cut, its name no longer resolving", func(l *Ledger) { l.Cut(mustKey("app/s1"), 3, 8, t0, "", 0) }, "e1", cutDNS, agent.OwnerAgent, false, true},
		{"a reload, then the operator's maint", func(l *Ledger) { l.Drain(mustKey("app/s1"), t0, "", 0, 0, 0, false, false) }, "e2", maint, agent.OwnerOperator, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := New("", zerolog.Nop())
			l.OperatorHold = agent.DefaultOperatorHold
			l.SetEpoch("e1")
			tc.change(l)
			l.SetEpoch(tc.epoch)
			owner, ch, reapply := l.Reconcile(mustKey("app/s1"), tc.state, t0)
			_, has := l.Changes()[mustKey("app/s1")]
			if owner != tc.owner || reapply != tc.reapply || has != tc.has || (owner == agent.OwnerAgent) != (ch != nil) {
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
	got := New(path, zerolog.Nop()).Changes()
	if len(got) != 2 || got[mustKey("app/s1")].Phase != agent.PhaseDrained || got[mustKey("app/s1")].ErrorRate != 0.05 || got[mustKey("app/s2")].Phase != agent.PhaseCut || got[mustKey("app/s2")].Weight != 3 {
		t.Fatalf("changes %+v", got)
	}
	// The next change writes version 2, which reads back the same.
	l := New(path, zerolog.Nop())
	l.Drain(mustKey("app/s4"), time.Unix(1000, 0).UTC(), "x", 0, 0, 0, false, false)
	if again := New(path, zerolog.Nop()).Changes(); len(again) != 3 || again[mustKey("app/s4")].Phase != agent.PhaseDrained {
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
	l := New(state, zerolog.Nop())
	l.Drain(mustKey("app/s1"), time.Unix(1000, 0), "x", 0, 0, 0, false, false)
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the victim was overwritten: %q", b)
	}
	if fi, err := os.Lstat(state); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		t.Fatalf("the state file is still a link: %v", err)
	}
	if got := New(state, zerolog.Nop()).Changes(); len(got) != 1 {
		t.Fatalf("state %+v", got)
	}
}

// The state file is never written larger than the agent reads back at
// start (MaxStateFile): a state that outgrew it leaves the last readable
// file, unsaved and said so, rather than a file the next start would
// set aside with every drain it named.
func TestStateFileNeverOutgrowsItsReader(t *testing.T) {
	file := filepath.Join(t.TempDir(), "state.json")
	l := New(file, zerolog.Nop())
	l.Drain(key("app", "s1"), time.Unix(1000, 0), "test", 0.5, 0, 0, false, false)
	// Enough servers seen held by the operator to outgrow the bound, put
	// in memory at once (one write each would take minutes).
	l.mu.Lock()
	name := strings.Repeat("s", 200)
	for i := 0; i*len(name) < MaxStateFile; i++ { // each is more than len(name) bytes in the file
		l.operatorSeen[key("big", fmt.Sprintf("%s%d", name, i))] = "drain"
	}
	l.mu.Unlock()
	l.Drain(key("app", "s2"), time.Unix(1001, 0), "test", 0.5, 0, 0, false, false)
	st := l.Saved()
	if st.Saved || !strings.Contains(st.Error, "over the") {
		t.Fatalf("save status %+v", st)
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Size() > MaxStateFile {
		t.Fatalf("state file %v, %v", fi, err)
	}
	if got := savedChanges(t, file); len(got) != 1 {
		t.Fatalf("the next start reads %v, want the last state it can read (s1)", got)
	}
}
