//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// auditRecords reads an audit log's step records.
func auditRecords(t *testing.T, path string) []agent.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []agent.Record
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r agent.Record
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Type == agent.EventStep {
			out = append(out, r)
		}
	}
	return out
}

// The paper fault (srv3 and srv6 fail 5%) in observe mode: HAProxy's
// server states never change, and the audit log holds would-drains of
// exactly the faulty servers, with the rules' reason.
func TestObserveModeOnPaperFault(t *testing.T) {
	t.Parallel()
	ports, err := haproxyproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	gauges := []string{`hapilot_would_action{backend="app",server="srv3",kind="drain"} 1`, `hapilot_would_action{backend="app",server="srv6",kind="drain"} 1`}
	// Scraped every 4 s from 24 s, until a scrape finds both faulty
	// servers condemned: a cold start finds them 12-17 s in on a quiet
	// machine, later beside make test's other e2e runs (one scrape at
	// 28 s once found srv3 not yet condemned), and the scrapes before
	// that one are not judged.
	var mu sync.Mutex
	var status, metrics string
	var scrapeErr error
	found := false
	at := map[time.Duration]func(*scenario.Env){}
	for sec := 24; sec <= 40; sec += 4 {
		at[time.Duration(sec)*time.Second] = func(*scenario.Env) {
			mu.Lock()
			done := found
			mu.Unlock()
			if done {
				return
			}
			st, err1 := httpText("http://" + addr + "/status")
			m, err2 := httpText("http://" + addr + "/metrics")
			mu.Lock()
			defer mu.Unlock()
			status, metrics, scrapeErr = st, m, errors.Join(err1, err2)
			found = scrapeErr == nil && strings.Contains(m, gauges[0]+"\n") && strings.Contains(m, gauges[1]+"\n")
			t.Logf("scrape at %d s: both faulty servers condemned: %v", sec, found)
		}
	}
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 42 * time.Second,
		Policy: "rules", AgentArgs: []string{"--mode", "observe"}, StatusListen: addr, At: at})
	mu.Lock()
	defer mu.Unlock()
	if scrapeErr != nil {
		t.Fatal(scrapeErr)
	}
	// /status: the mode, and the would-drains among the decisions.
	var st loop.Status
	if err := json.Unmarshal([]byte(status), &st); err != nil {
		t.Fatal(err)
	}
	// Each says it was observed, what it would have sent, and that
	// nothing was: no applied action.
	wouldSt := map[string]bool{}
	for _, d := range st.Decisions {
		if d.WouldKind == agent.WouldDrain {
			if d.Outcome != agent.OutcomeObserved || d.WouldApply == nil || d.Applied != (agent.Action{}) {
				t.Errorf("would-drain decision: outcome %q, would_apply %v, applied %+v", d.Outcome, d.WouldApply, d.Applied)
				continue
			}
			wouldSt[d.WouldApply.Server] = true
		}
	}
	if strings.Contains(status, "0001-01-01") {
		t.Errorf("/status writes a zero time")
	}
	if st.Mode != agent.ModeObserve || len(st.Changes) != 0 || !wouldSt["srv3"] || !wouldSt["srv6"] || len(wouldSt) != 2 {
		t.Errorf("/status: mode %s, changes %v, would-drains %v", st.Mode, st.Changes, wouldSt)
	}
	// per server, for alerting on "would drain srv3"
	for _, m := range append([]string{`hapilot_mode{mode="observe"} 1`, `hapilot_would_actions_total{kind="cut"} 0`, "hapilot_actions_applied_total 0"}, gauges...) {
		if !strings.Contains(metrics, m+"\n") {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	// Two would-drains at least (a run of them counts once; a pause in
	// the run, a step that did not find the server, counts it again).
	var n float64
	if _, err := fmt.Sscanf(metrics[strings.Index(metrics, `hapilot_would_actions_total{kind="drain"} `)+len(`hapilot_would_actions_total{kind="drain"} `):], "%g", &n); err != nil || n < 2 {
		t.Errorf("hapilot_would_actions_total{kind=\"drain\"} %v (%v), want 2 or more", n, err)
	}
	if len(out.DrainedAt) != 0 || len(out.Flips) != 0 {
		t.Fatalf("observe mode changed HAProxy: drained %v, flips %v", out.DrainedAt, out.Flips)
	}
	for _, st := range out.Final {
		if st.AdminState != 0 || st.Weight != st.Initial {
			t.Errorf("%s/%s ends %s at weight %d of %d", st.Backend, st.Server, st.Label(), st.Weight, st.Initial)
		}
	}
	would := map[string]bool{}
	commands := 0
	for _, r := range auditRecords(t, out.AuditLog) {
		commands += len(r.Commands)
		for _, w := range r.Would {
			if w.Kind != agent.WouldDrain || w.Why != "observe mode" || w.Action.Reason == "" {
				t.Errorf("would-action %+v", w)
			}
			would[w.Action.Server] = true
		}
	}
	var got []string
	for s := range would {
		got = append(got, s)
	}
	sort.Strings(got)
	t.Logf("would-drains: %v; commands sent: %d", got, commands)
	if !reflect.DeepEqual(got, []string{"srv3", "srv6"}) || commands != 0 {
		t.Fatalf("would-drains of %v and %d commands, want srv3 and srv6 and none", got, commands)
	}
}

// hapilot ctl against a `hapilot run` process on the paper fault: release
// one drain (it stays ready, the operator's), pause for a while, SIGKILL
// and restart (the agent still owns its other drain, and its pause), then
// restore (the last drain undone, and not drained again).
func TestCtlReleasePauseKillRestore(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var steps []string // what each hook saw, for the failure message
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		steps = append(steps, "FAIL "+strings.TrimSpace(sprintf(format, args...)))
	}
	ctlRun := func(env *scenario.Env, args ...string) (string, error) {
		sock := "unix:" + filepath.Join(filepath.Dir(env.AuditLog), "ctl-rules.sock")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		b, err := exec.CommandContext(ctx, agentBinary, append([]string{"ctl", "--socket", sock}, args...)...).CombinedOutput()
		mu.Lock()
		steps = append(steps, strings.Join(args, " ")+": "+string(b))
		mu.Unlock()
		return string(b), err
	}
	srv3, srv6 := fleet.BackendName+"/srv3", fleet.BackendName+"/srv6"
	base := coldDrain // both drains are in by then
	sec := func(n int) time.Duration { return base + time.Duration(n)*time.Second }
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: sec(30),
		Policy: "rules", AgentBinary: agentBinary, AgentArgs: noTailGuard,
		KillAgentAt: sec(8), RestartAgentAt: sec(10),
		At: map[time.Duration]func(*scenario.Env){
			sec(3): func(env *scenario.Env) {
				if o, err := ctlRun(env, "release", fleet.BackendName+"/srv1"); err == nil || !strings.Contains(o, "not the agent's change") {
					fail("release of a healthy server: %v %s", err, o)
				}
				if o, err := ctlRun(env, "release", srv3); err != nil || !strings.Contains(o, "released "+srv3) {
					fail("release: %v %s", err, o)
				}
			},
			sec(5): func(env *scenario.Env) {
				if o, err := ctlRun(env, "pause", "--for", "10s"); err != nil || !strings.Contains(o, "paused (every backend") {
					fail("pause: %v %s", err, o)
				}
			},
			// After the SIGKILL at sec(8) and the restart at sec(10).
			sec(13): func(env *scenario.Env) {
				o, err := ctlRun(env, "-o", "json", "status")
				if err != nil || !strings.Contains(o, `"backend": "*"`) || !strings.Contains(o, `"holder": "agent"`) {
					fail("status after restart: %v %s", err, o)
				}
				if o, err := ctlRun(env, "list", "-o", "json"); err != nil || !strings.Contains(o, `"server": "`+srv6+`"`) || strings.Contains(o, srv3) {
					fail("list after restart: %v %s", err, o)
				}
			},
			// The pause ended at sec(15).
			sec(18): func(env *scenario.Env) {
				if o, err := ctlRun(env, "-o", "json", "status"); err != nil || strings.Contains(o, `"backend": "*"`) {
					fail("status after the pause: %v %s", err, o)
				}
				if o, err := ctlRun(env, "restore"); err != nil || !strings.Contains(o, "1 server(s) brought back") {
					fail("restore: %v %s", err, o)
				}
			},
		}})
	mu.Lock()
	defer mu.Unlock()
	failed := false
	for _, s := range steps {
		failed = failed || strings.HasPrefix(s, "FAIL")
	}
	for _, s := range []string{"srv3", "srv6"} {
		if at, ok := out.DrainedAt[s]; !ok || at > base {
			t.Errorf("%s drained at %v (%v): the test proves nothing", s, at, ok)
		}
		// Drained once, brought back once (release, restore), never again.
		if st := finalState(out, s); st.Drain() || out.Flips[s] != 2 {
			t.Errorf("%s ends %s after %d flips (timeline %v)", s, st.Label(), out.Flips[s], out.Timeline[s])
		}
	}
	if len(out.DrainedAt) != 2 {
		t.Errorf("drained %v", out.DrainedAt)
	}
	log := out.AgentLog()
	for _, want := range []string{"released by the operator", "paused: the agent observes", "servers held at start", "pause over"} {
		if !strings.Contains(log, want) {
			t.Errorf("agent log lacks %q", want)
			failed = true
		}
	}
	if failed || t.Failed() {
		t.Errorf("ctl steps:\n%s", strings.Join(steps, "\n"))
	}
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// Two backends on the same servers (srv3 and srv6 fail 5%), half the
// traffic each: app2 is out of scope (its block says enabled false) and
// keeps every server; app has max-drained 1, so one of its two faulty
// servers is drained and the other refused with max_drained's reason.
func TestScopeAndCapOnTwoBackends(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := filepath.Join(dir, "scope.conf")
	if err := os.WriteFile(conf, []byte("backend.app2.enabled false\nbackend.app.max-drained 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Each backend takes half the traffic, 25 req/s a server: from a cold
	// start a fault brings its evidence at half coldDrain's rate, so both
	// of app's faulty servers are condemned within twice coldDrain (in 30
	// s, once, only srv6 was, at 19.5 s, and no refusal was made).
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 2 * coldDrain,
		Policy: "rules", AgentArgs: append([]string{"--config", conf}, noTailGuard...),
		EditHAProxy: func(cfg string) string {
			i := strings.Index(cfg, "\nbackend "+fleet.BackendName+"\n")
			be := cfg[i+1:]
			if j := strings.Index(be, "\n\n"); j >= 0 {
				be = be[:j+1] // up to the SPOE agents' backend
			}
			second := strings.Replace(be, "backend "+fleet.BackendName+"\n", "backend app2\n", 1)
			cfg = strings.Replace(cfg, "    default_backend "+fleet.BackendName+"\n",
				"    use_backend app2 if { rand(2) -m int 1 }\n    default_backend "+fleet.BackendName+"\n", 1)
			return cfg + "\n" + second
		}})
	drained := map[string]bool{}
	for _, st := range out.Final {
		if st.Drain() || st.Maint() {
			drained[st.Backend+"/"+st.Server] = true
		}
	}
	var refusedCap, refusedScope []string
	for _, r := range auditRecords(t, out.AuditLog) {
		for _, v := range r.Verdicts {
			switch v.Code {
			case agent.RefusedMaxDrained:
				refusedCap = append(refusedCap, v.Proposed.Server+": "+v.Reason)
			case agent.RefusedOutOfScope:
				refusedScope = append(refusedScope, v.Proposed.Key().String())
			}
		}
	}
	t.Logf("drained %v; max_drained refusals %d (first: %v); out_of_scope refusals %d", drained, len(refusedCap), first(refusedCap), len(refusedScope))
	if len(drained) != 1 || !(drained["app/srv3"] || drained["app/srv6"]) {
		t.Fatalf("drained %v, want one of app/srv3 and app/srv6 only", drained)
	}
	if len(refusedCap) == 0 || !strings.Contains(refusedCap[0], "max-drained is 1") {
		t.Errorf("no max_drained refusal with its reason: %v", first(refusedCap))
	}
	if len(refusedScope) == 0 {
		t.Errorf("app2's faulty servers were never refused as out of scope: the test proves nothing")
	}
	for _, k := range refusedScope {
		if !strings.HasPrefix(k, "app2/") {
			t.Errorf("out_of_scope refusal of %s", k)
		}
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// The agent killed with SIGKILL after it drained the paper fault, and not
// started again: `hapilot restore` (what the package's removal runs)
// reads its state file and brings both servers back; the stale control
// socket left by the kill does not stop it.
func TestOfflineRestoreAfterSIGKILL(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var restoreOut string
	var restoreErr error
	killAt := coldDrain // once both drains are in
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: killAt + 15*time.Second,
		Policy: "rules", AgentBinary: agentBinary, AgentArgs: noTailGuard, KillAgentAt: killAt,
		At: map[time.Duration]func(*scenario.Env){
			killAt + 5*time.Second: func(env *scenario.Env) {
				dir := filepath.Dir(env.AuditLog)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				b, err := exec.CommandContext(ctx, agentBinary, "restore", "--haproxy-socket", env.HAProxy.Socket,
					"--state-file", filepath.Join(dir, "state-rules.json"), "--control-socket", "unix:"+filepath.Join(dir, "ctl-rules.sock"),
					"--log-format", "json").CombinedOutput()
				mu.Lock()
				restoreOut, restoreErr = string(b), err
				mu.Unlock()
			},
		}})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("hapilot restore: %v\n%s", restoreErr, restoreOut)
	if restoreErr != nil || !strings.Contains(restoreOut, "app/srv3: restored") || !strings.Contains(restoreOut, "app/srv6: restored") {
		t.Fatalf("hapilot restore: %v\n%s", restoreErr, restoreOut)
	}
	for _, s := range []string{"srv3", "srv6"} {
		if at, ok := out.DrainedAt[s]; !ok || at > killAt {
			t.Errorf("%s drained at %v (%v): the test proves nothing", s, at, ok)
		}
		if st := finalState(out, s); st.Drain() || out.Flips[s] != 2 {
			t.Errorf("%s ends %s after %d flips", s, st.Label(), out.Flips[s])
		}
	}
}

// httpText GETs url and returns its body.
func httpText(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
