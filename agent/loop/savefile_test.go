package loop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/auditlog"
	"github.com/hapilot/hapilot/internal/lib/safefile"
	"github.com/rs/zerolog"
)

// savedChanges reads the state file as the next start would.
func savedChanges(t *testing.T, path string) map[agent.Key]agent.Change {
	t.Helper()
	return ledger.New(path, zerolog.Nop()).Changes()
}

// A write of the state file that fails is tried again at the next step
// until it succeeds, and the loop says meanwhile that its state is
// unsaved. The failure here is real: the state file's folder is replaced
// by a file, then put back. Before, the failed write was only logged: the
// drain of s2 never reached the file, and after a restart the agent took
// s2 for the operator's and never readmitted it.
func TestFailedSaveIsRetried(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "state.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	l.StateFile = file
	pol.plans = []agent.Plan{{drain("s2")}}

	// The folder is gone, a file in its place: every write fails.
	if err := os.Rename(dir, dir+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	l.Step(context.Background())
	if got := rt.TakeCommands(); len(got) != 1 {
		t.Fatalf("commands %q", got)
	}
	st := l.View().Status().StateFile
	if st == nil || st.Saved || st.Error == "" || !st.UnsavedSince.Equal(clk.Now()) || st.FailedWrites != 1 {
		t.Fatalf("after the failed write: %+v", st)
	}
	clk.Advance(l.Interval)
	l.Step(context.Background()) // still failing: tried, and counted
	if m := l.View().Metrics(); !m.StateUnsaved || m.StateFailedWrites != 2 {
		t.Fatalf("metrics %+v, want unsaved after 2 failed writes", m)
	}

	// The folder is back: the next step writes the drain, unasked.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir+".away", dir); err != nil {
		t.Fatal(err)
	}
	clk.Advance(l.Interval)
	l.Step(context.Background())
	if st := l.View().Status().StateFile; st == nil || !st.Saved || st.Error != "" || !st.UnsavedSince.IsZero() {
		t.Fatalf("after the folder came back: %+v", st)
	}
	if m := l.View().Metrics(); m.StateUnsaved || m.StateFailedWrites != 2 {
		t.Fatalf("metrics %+v", m)
	}
	if got := savedChanges(t, file); got[mustKey("app/s2")].Phase != agent.PhaseDrained {
		t.Fatalf("the state file holds %+v, want s2 drained", got)
	}
}

// An unreadable state file is kept aside, whole, before anything writes
// over it, and the agent starts with no record (the safe side). Before,
// the first change overwrote it and no copy was kept.
func TestUnreadableStateFileKeptAside(t *testing.T) {
	tests := []struct {
		name  string
		write func(path string) error
	}{
		{"truncated", func(p string) error {
			return os.WriteFile(p, []byte(`{"version": 2, "changes": {"app/s1": {"pha`), 0o600)
		}},
		{"version 99", func(p string) error { return os.WriteFile(p, []byte(`{"version": 99, "changes": {}}`), 0o600) }},
		{"200 MB of junk", func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := f.WriteString("junk"); err != nil {
				return err
			}
			return f.Truncate(200 << 20) // sparse: the read stops at MaxStateFile
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "state.json")
			if err := tc.write(file); err != nil {
				t.Fatal(err)
			}
			orig, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			l := ledger.New(file, zerolog.Nop())
			if n := len(l.Changes()); n != 0 {
				t.Fatalf("%d changes read from an unreadable file", n)
			}
			l.Drain(mustKey("app/s2"), time.Unix(1000, 0), "x", 0, 0, 0, false, false)
			kept, _ := filepath.Glob(file + ".bad-*")
			if len(kept) != 1 {
				t.Fatalf("kept aside: %v", kept)
			}
			if b, err := os.ReadFile(kept[0]); err != nil || !bytes.Equal(b, orig) {
				t.Fatalf("the copy kept aside differs (%d bytes, want %d): %v", len(b), len(orig), err)
			}
			if l.Saved().KeptAside != kept[0] {
				t.Fatalf("save status %+v, want it to name %s", l.Saved(), kept[0])
			}
			if got := savedChanges(t, file); got[mustKey("app/s2")].Phase != agent.PhaseDrained {
				t.Fatalf("the new state file holds %+v", got)
			}
		})
	}
}

// A state file that is not a regular file is refused by ledger.Open, at
// once: a FIFO blocked the first read before, inside the once that
// /status waits on too.
func TestOpenLedgerRefusesAFIFO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "state.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Open(fifo, zerolog.Nop()); !errors.Is(err, safefile.ErrNotRegular) || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("err %v", err)
	}
	l, _, _, _ := newLoop(fakes.NewRuntime("s1"))
	l.StateFile = fifo
	if err := l.OpenState(); err == nil {
		t.Fatal("OpenState took a FIFO")
	}
}

// A full disk, for real: a 256 KiB tmpfs holds the state file and the
// audit log, and is filled. The drain of s2 is unsaved while it is full,
// and saved at the first step after space comes back; the audit log's
// lines all parse afterwards, the torn one cut off from the next. Needs
// mount (root); skipped elsewhere.
func TestFullDiskLosesNothing(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v: %s): needs root", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	file, auditPath := filepath.Join(dir, "state.json"), filepath.Join(dir, "audit.jsonl")
	audit, err := auditlog.Open(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	l.StateFile, l.Audit = file, audit
	l.Step(context.Background())

	fill := filepath.Join(dir, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	for chunk := make([]byte, 4096); ; {
		if _, err := f.Write(chunk); err != nil {
			break // the disk is full
		}
	}
	f.Close()
	// The audit log's last page has room left: leave it 100 bytes, with
	// empty lines, so that the next record is cut short there.
	fi, err := os.Stat(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	if free := 4096 - fi.Size()%4096; free > 100 {
		pad, err := os.OpenFile(auditPath, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pad.Write(bytes.Repeat([]byte("\n"), int(free-100))); err != nil {
			t.Fatal(err)
		}
		pad.Close()
	}
	pol.plans = []agent.Plan{nil, {drain("s2")}}
	for i := 0; i < 3; i++ {
		clk.Advance(l.Interval)
		l.Step(context.Background())
	}
	if got := rt.TakeCommands(); len(got) != 1 {
		t.Fatalf("commands %q", got)
	}
	if st := l.View().Status().StateFile; st.Saved {
		t.Fatalf("saved on a full disk: %+v", st)
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	clk.Advance(l.Interval)
	l.Step(context.Background())
	if st := l.View().Status().StateFile; !st.Saved {
		t.Fatalf("unsaved once space came back: %+v", st)
	}
	if got := savedChanges(t, file); got[mustKey("app/s2")].Phase != agent.PhaseDrained {
		t.Fatalf("the state file holds %+v, want s2 drained", got)
	}
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	// A record the full disk cut short is followed by a new line: the
	// records after it are whole lines of their own.
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	torn := 0
	for _, line := range lines {
		if line != "" && !json.Valid([]byte(line)) {
			torn++
		}
	}
	if torn != 1 {
		t.Fatalf("%d torn audit lines, want the one the full disk cut", torn)
	}
	var last agent.Record
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.Cycle != 5 {
		t.Fatalf("the last audit line (%v) is not step 5's record whole: %.200s", err, lines[len(lines)-1])
	}
}

// A state file on a disk that hangs never stops the loop: the step
// drains and returns while the write waits; once the write has not
// returned for StuckWrite, the ledger says the file is unsaved; when the
// disk answers, the latest state (the drain) is what lands, and stop
// waits for it. Before, the loop wrote the file itself, inside the step.
func TestHungStateDiskNeverStopsTheLoop(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "state.json")
	rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
	l, clk, pol, _ := newLoop(rt)
	l.StateFile = file
	release, entered := make(chan struct{}), make(chan struct{}, 16)
	hung := func(path string, data []byte) error {
		entered <- struct{}{}
		<-release
		return ledger.ReplaceFile(path, data)
	}
	lg := l.theLedger()
	lg.Replace = hung
	stop := lg.WriteInBackground()
	pol.plans = []agent.Plan{{drain("s2")}}
	stepped := make(chan struct{})
	go func() { l.Step(ctx); close(stepped) }()
	select {
	case <-stepped:
	case <-time.After(30 * time.Second):
		t.Fatal("the step waited on the hung disk")
	}
	<-entered // the drain's write is in the disk's hands
	if got := rt.TakeCommands(); len(got) != 1 || got[0] != "set server app/s2 state drain" {
		t.Fatalf("commands %q", got)
	}
	if st := l.theLedger().Saved(); !st.Saved {
		t.Fatalf("unsaved before the write was stuck: %+v", st)
	}
	clk.Advance(ledger.StuckWrite + time.Second)
	if st := l.theLedger().Saved(); st.Saved || !strings.Contains(st.Error, "hung disk") {
		t.Fatalf("a stuck write reads as saved: %+v", st)
	}
	close(release)
	if st := stop(30 * time.Second); !st.Saved {
		t.Fatalf("after the disk answered: %+v", st)
	}
	if got := savedChanges(t, file); got[key("app", "s2")].Phase != agent.PhaseDrained {
		t.Fatalf("the next start reads %v", got)
	}
}

// A step writes the state file once, whatever number of transitions it
// makes: a transition marks the state dirty, and the step saves at its
// end. Here the first step sees s6 held by the operator and drains s2
// and cuts s5 (three transitions, one write carrying all of them); a
// step that changes nothing writes nothing; ctl restore's two releases
// are one write; and a step that finds three of those servers gone from
// HAProxy drops their entries in one write. Before, the ledger wrote the
// file inside every transition, and Keep once per entry it dropped.
func TestAStepWritesTheStateFileOnce(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*Loop, *int, string) {
		file := filepath.Join(t.TempDir(), "state.json")
		rt := fakes.NewRuntime("s1", "s2", "s3", "s4", "s5", "s6")
		rt.Set("s6", func(s *haproxy.ServerState) { s.AdminState = haproxy.AdminForcedMaint }) // the operator's
		l, _, pol, _ := newLoop(rt)
		l.StateFile = file
		writes := new(int)
		l.theLedger().Replace = func(path string, data []byte) error {
			*writes++
			return ledger.ReplaceFile(path, data)
		}
		pol.plans = []agent.Plan{{drain("s2"), {Kind: agent.SetWeight, Backend: "app", Server: "s5", Weight: 2}}}
		l.Step(ctx)
		if got := rt.TakeCommands(); len(got) != 2 {
			t.Fatalf("first step's commands %q", got)
		}
		return l, writes, file
	}
	t.Run("a step", func(t *testing.T) {
		l, writes, file := setup(t)
		if *writes != 1 {
			t.Fatalf("the first step's three transitions wrote the state file %d times, want 1", *writes)
		}
		st := readState(t, file)
		if c := savedChanges(t, file); c[key("app", "s2")].Phase != agent.PhaseDrained || c[key("app", "s5")].Phase != agent.PhaseCut {
			t.Fatalf("the one write lacks a transition: %v", c)
		}
		if _, ok := st.OperatorSeen[key("app", "s6")]; !ok {
			t.Fatalf("the one write lacks the operator's s6: %+v", st.OperatorSeen)
		}
		l.Step(ctx)
		if *writes != 1 {
			t.Fatalf("a step that changes nothing wrote the state file (%d writes in all)", *writes)
		}
		l.Runtimes = []agent.Runtime{fakes.NewRuntime("s1", "s3", "s4")} // s2, s5, s6 gone
		before := *writes
		l.Step(ctx)
		if n := *writes - before; n != 1 {
			t.Fatalf("a step that lost three entries wrote the state file %d times, want 1", n)
		}
		if st := readState(t, file); len(st.Changes) != 0 || len(st.OperatorSeen) != 0 {
			t.Fatalf("the gone servers' entries are still in the file: %+v", st)
		}
	})
	t.Run("ctl restore", func(t *testing.T) {
		l, writes, file := setup(t)
		before := *writes
		if _, err := l.Control().Restore(ctx, "test"); err != nil {
			t.Fatal(err)
		}
		if n := *writes - before; n != 1 {
			t.Fatalf("ctl restore's two releases wrote the state file %d times, want 1", n)
		}
		if c := savedChanges(t, file); len(c) != 0 {
			t.Fatalf("released changes still in the file: %v", c)
		}
	})
}

// readState reads the state file's layout, for what Changes does not
// show.
func readState(t *testing.T, file string) struct {
	Changes      map[agent.Key]json.RawMessage `json:"changes"`
	OperatorSeen map[agent.Key]string          `json:"operator_seen"`
} {
	t.Helper()
	var st struct {
		Changes      map[agent.Key]json.RawMessage `json:"changes"`
		OperatorSeen map[agent.Key]string          `json:"operator_seen"`
	}
	b, err := os.ReadFile(file)
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}
