package loop

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/rs/zerolog"
)

// Two agents, two HAProxies with the same server names, one state file
// (the per-user `--state-file auto`): what the first agent drained on
// its HAProxy is not re-applied by the second to its own, nor adopted,
// nor restored there; it is listed as not taken up, with the reason. On
// the first HAProxy, after a reload, a restarted agent re-applies it
// while recent, and judges the server afresh once it is not. Before, the
// second agent drained its healthy s2 at its first step, "lost to a
// reload".
func TestStateFileReappliedOnlyOnItsHAProxyWhileRecent(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "state.json")
	newRT := func(addr string) *fakes.Runtime {
		rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
		rt.SetAddr(addr)
		return rt
	}
	rtA := newRT("/run/haproxy-a/admin.sock")
	first, _, pol, _ := newLoop(rtA)
	first.StateFile = file
	pol.plans = []agent.Plan{{drain("s2")}}
	first.Step(ctx)
	if got := rtA.TakeCommands(); !reflect.DeepEqual(got, []string{"set server app/s2 state drain"}) {
		t.Fatalf("the first agent sent %q", got)
	}
	s2 := agent.Key{Backend: "app", Server: "s2"}
	if c := first.View().Ledger()[s2]; c.Site != "/run/haproxy-a/admin.sock node " {
		t.Fatalf("the change's site %q", c.Site)
	}

	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// start is a restarted agent on rt with a copy of the first agent's
	// state file, its clock ahead by age; it runs one step.
	start := func(rt *fakes.Runtime, age time.Duration) (*Loop, []string) {
		l, clk, _, _ := newLoop(rt)
		l.StateFile = filepath.Join(t.TempDir(), "state.json")
		if err := os.WriteFile(l.StateFile, orig, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := l.OpenState(); err != nil {
			t.Fatal(err)
		}
		clk.Advance(age)
		l.Step(ctx)
		return l, rt.TakeCommands()
	}
	notTakenUp := func(l *Loop, want string) {
		t.Helper()
		st := l.View().Status().StateFile
		if st == nil || len(st.NotReapplied) != 1 || st.NotReapplied[0].Server != s2 || !strings.Contains(st.NotReapplied[0].Why, want) {
			t.Fatalf("not re-applied: %+v, want s2: %q", st, want)
		}
		if _, ok := l.View().Ledger()[s2]; ok {
			t.Fatalf("the change is still the agent's: %v", l.View().Ledger())
		}
	}

	t.Run("another HAProxy, its s2 healthy", func(t *testing.T) {
		rtB := newRT("/run/haproxy-b/admin.sock")
		rtB.Reload() // another process: another pid
		l, cmds := start(rtB, 0)
		if len(cmds) != 0 {
			t.Fatalf("the second agent sent %q to its own HAProxy", cmds)
		}
		notTakenUp(l, "made on another HAProxy (/run/haproxy-a/admin.sock node ), not this one (/run/haproxy-b/admin.sock node )")
		// The file keeps it, as it was, for the first HAProxy's agent.
		if c, ok := savedChanges(t, l.StateFile)[s2]; !ok || c.Site != "/run/haproxy-a/admin.sock node " {
			t.Fatalf("the first agent's change is gone from the file: %+v", c)
		}
	})
	t.Run("another HAProxy, its s2 drained by its operator", func(t *testing.T) {
		rtB := newRT("/run/haproxy-b/admin.sock")
		rtB.Reload()
		rtB.Set("s2", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedDrain })
		l, cmds := start(rtB, 0)
		if len(cmds) != 0 {
			t.Fatalf("sent %q", cmds)
		}
		notTakenUp(l, "made on another HAProxy")
		if v := l.View().Status().Backends[0].Servers[1]; v.Server != "s2" || v.Owner != agent.OwnerOperator {
			t.Fatalf("s2 reads as %+v, want the operator's", v)
		}
		// Nor does the offline restore ready it.
		got, err := RestoreFromState(ctx, l.StateFile, []agent.Runtime{rtB}, time.Hour, time.Unix(2000, 0), zerolog.Nop())
		if err != nil || len(got) != 1 || !strings.Contains(got[0].Error, "made on another HAProxy") {
			t.Fatalf("restore %+v: %v", got, err)
		}
		if cmds := rtB.TakeCommands(); len(cmds) != 0 {
			t.Fatalf("restore sent %q", cmds)
		}
	})
	t.Run("another HAProxy, without s2", func(t *testing.T) {
		rtB := fakes.NewRuntime("s1", "s3", "s4")
		rtB.SetAddr("/run/haproxy-b/admin.sock")
		l, cmds := start(rtB, 0)
		if len(cmds) != 0 {
			t.Fatalf("sent %q", cmds)
		}
		notTakenUp(l, "made on another HAProxy")
		if _, ok := savedChanges(t, l.StateFile)[s2]; !ok {
			t.Fatal("the first agent's change is gone from the file")
		}
	})
	t.Run("the same HAProxy, reloaded, recent", func(t *testing.T) {
		rtA.Reload()
		_, cmds := start(rtA, agent.DefaultReapplyWithin-time.Minute)
		if !reflect.DeepEqual(cmds, []string{"set server app/s2 state drain"}) {
			t.Fatalf("sent %q, want the drain re-applied", cmds)
		}
	})
	t.Run("the same HAProxy, reloaded, stale", func(t *testing.T) {
		rtA.Reload()
		l, cmds := start(rtA, agent.DefaultReapplyWithin+time.Minute)
		if len(cmds) != 0 {
			t.Fatalf("sent %q", cmds)
		}
		notTakenUp(l, "beyond --reapply-within 30m0s")
	})
}
