package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/telemetry"
	"github.com/rs/zerolog"
)

// LiveWait is how long `hapilot check --live` listens for telemetry: the
// silence test's DefaultSilentAfter and a few polls more.
const LiveWait = 8 * time.Second

// LiveReport is what `hapilot check --live` found against the running
// HAProxy: the lines it prints, and the problems that make the agent
// unable to act or to see (a non-zero exit).
type LiveReport struct {
	Lines    []string
	Problems []string
}

func (r *LiveReport) say(format string, a ...any) {
	r.Lines = append(r.Lines, fmt.Sprintf(format, a...))
}
func (r *LiveReport) problem(format string, a ...any) {
	p := fmt.Sprintf(format, a...)
	r.Problems = append(r.Problems, p)
	r.Lines = append(r.Lines, "PROBLEM: "+p)
}

// Write prints the report, its verdict last.
func (r LiveReport) Write(w io.Writer) {
	for _, l := range r.Lines {
		fmt.Fprintln(w, l)
	}
	if len(r.Problems) == 0 {
		fmt.Fprintln(w, "ok: the agent can act on HAProxy and sees its traffic")
		return
	}
	fmt.Fprintf(w, "not ok: %d problem(s)\n", len(r.Problems))
}

// LiveCheck checks c against the running HAProxy: each runtime socket's
// version and level, the servers the agent would govern and those it
// leaves alone with the reason, whether each telemetry path delivers the
// traffic HAProxy counts (the silence test, run once for wait), and the
// advice per version. The telemetry is heard by listening as the agent
// would, with the static policy (nothing is changed in HAProxy); where an
// agent already listens there, its /status is read instead.
func LiveCheck(ctx context.Context, c config.Config, wait time.Duration) LiveReport {
	var r LiveReport
	var versions []string
	running, runErr := runningAgent(ctx, c)
	owned := map[string]string{} // server -> whose change, for the report
	for k := range running.Changes {
		owned[k] = "changed by the running agent"
	}
	if runErr != nil {
		// No agent answers: its state file still says which drains are
		// its own, and a drain there is not "someone"'s.
		if file, err := c.StateFileIn(os.Getenv); err == nil && file != "" {
			changes, err := ledger.ReadChanges(file)
			if err != nil {
				r.say("state file %s: %v: the agent's own changes cannot be told from the operator's", file, err)
			}
			for k, ch := range changes {
				owned[k.String()] = fmt.Sprintf("%s by the agent since %s, per its state file %s; the agent is not running: `hapilot restore` undoes it",
					ch.Phase, ch.At.UTC().Format(time.RFC3339), file)
			}
		}
	}
	for _, s := range c.HAProxySockets {
		cl, err := haproxy.New(s)
		if err != nil {
			r.problem("haproxy-socket %s: %v", s, err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		info, ierr := cl.ShowInfo(cctx)
		level, lerr := cl.Level(cctx)
		cancel()
		switch {
		case ierr != nil:
			r.problem("HAProxy at %s does not answer: %v", s, ierr)
			continue
		case lerr != nil:
			r.problem("HAProxy %s at %s: show cli level: %v", info.Version, s, lerr)
		case level != "admin":
			r.problem("HAProxy %s at %s answers at level %q: the agent cannot set states or weights; put `level admin` on its stats socket line", info.Version, s, level)
		default:
			r.say("haproxy-socket %s: HAProxy %s, pid %d, level admin", s, info.Version, info.Pid)
		}
		versions = append(versions, info.Version)
		r.scope(ctx, cl, c.Loop.HashBackends, owned)
	}
	if len(versions) == 0 {
		r.problem("no HAProxy answered: the agent could not act")
		return r
	}
	path := r.telemetry(ctx, c, wait, running, runErr)
	for _, v := range versions {
		if a := telemetry.Advice(v, path); a != "" {
			r.say("advice for HAProxy %s: %s", v, a)
		}
	}
	return r
}

// scope prints, per backend, the servers the agent governs and those it
// leaves as they are, with the reason.
func (r *LiveReport) scope(ctx context.Context, cl *haproxy.Client, hashBackends []string, owned map[string]string) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stats, err := cl.ServerStats(cctx)
	if err != nil {
		r.problem("show stat at %s: %v", cl.Addr(), err)
		return
	}
	states, err := cl.ShowServersState(cctx)
	if err != nil {
		r.problem("show servers state at %s: %v", cl.Addr(), err)
		return
	}
	byKey := map[haproxy.ServerKey]haproxy.ServerState{}
	for _, s := range states {
		byKey[haproxy.ServerKey{Backend: s.Backend, Server: s.Server}] = s
	}
	type line struct{ governed, alone []string }
	backends := map[string]*line{}
	var order []string
	for _, st := range stats {
		b := backends[st.Backend]
		if b == nil {
			b = &line{}
			backends[st.Backend] = b
			order = append(order, st.Backend)
		}
		k := haproxy.ServerKey{Backend: st.Backend, Server: st.Server}
		why := loop.Untouched(st, byKey[k], hashBackends)
		// (A change a reload lost shows the configured state: governed.)
		if whose, ours := owned[k.String()]; ours && !atConfigured(byKey[k]) {
			b.governed = append(b.governed, st.Server+" ("+whose+")")
			continue
		}
		if why == "" {
			b.governed = append(b.governed, st.Server)
		} else {
			b.alone = append(b.alone, st.Server+" ("+why+")")
		}
	}
	slices.Sort(order)
	for _, name := range order {
		b := backends[name]
		r.say("backend %s: governs %d [%s]; leaves alone %d%s", name, len(b.governed), strings.Join(b.governed, " "), len(b.alone), bracket(b.alone))
	}
}

// atConfigured reports whether s is ready at its configured weight.
func atConfigured(s haproxy.ServerState) bool {
	return !s.Drain() && !s.Maint() && s.Weight == s.Initial
}

func bracket(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return " [" + strings.Join(s, "; ") + "]"
}

// telemetry runs the silence test once and returns the path the advice
// is about ("spoe", "spoe-sampled", "stats" or "").
func (r *LiveReport) telemetry(ctx context.Context, c config.Config, wait time.Duration, running agentStatus, runErr error) string {
	ls, err := c.Listeners()
	if err != nil {
		r.problem("%v", err)
		return ""
	}
	perResponse := !ls.SPOE.Off() || !ls.Lua.Off() || !ls.Syslog.Off()
	if !perResponse {
		if c.Stats.Poll <= 0 {
			r.problem("no telemetry at all: every per-response path is off and --stats-poll is 0: the agent would be blind")
			return ""
		}
		r.say("telemetry: HAProxy's counters alone (every %v), no per-response path", c.Stats.Poll)
		return "stats"
	}
	if c.Stats.Poll <= 0 {
		r.say("telemetry: --stats-poll is 0, so a silent path cannot be noticed, nor the servers judged from the counters meanwhile")
	}
	// Listen as the agent would, acting on nothing.
	probe := c
	probe.Policy, probe.StatusListen, probe.AuditLog, probe.OnExit = config.PolicyStatic, "off", "", config.OnExitKeep
	probe.Loop.StateFile, probe.ControlSocket = "off", "off"
	probe.Fleet = config.Default().Fleet
	// The report says what the probe found: its own log would repeat it.
	d, err := New(probe, zerolog.Nop())
	if errors.Is(err, syscall.EADDRINUSE) || (err != nil && strings.Contains(err.Error(), "another process answers")) {
		return r.fromRunningAgent(c, running, runErr)
	}
	if err != nil {
		r.problem("cannot listen as the agent would: %v", err)
		return ""
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := d.Serve(lctx); err != nil {
		r.problem("listening: %v", err)
	}
	s := d.Silence()
	path := telemetry.SPOEPath(d.SPOE.Counters.Events.Load(), d.SPOE.Counters.Sampled.Load())
	r.say("telemetry: in %v, %s; %d server(s) reported, %d silent", wait, d.pathCounts(), s.Covered, len(s.Silent))
	switch u := d.Paths.Unseen(); {
	case strings.HasPrefix(u, "telemetry blind"):
		r.problem("%s", u)
	case u != "":
		r.say("telemetry: %s", u)
	}
	if b := d.Blindness(); len(b.Blind) > 0 {
		r.problem("%s", d.Paths.BlindWarning(b))
	}
	switch {
	case len(s.Silent) > 0:
		r.problem("%s", d.Paths.SilenceWarning(s))
	case d.Stats != nil && d.Stats.Counters.Polls.Load() > 0 && d.Store.Events() == 0:
		r.say("telemetry: HAProxy served no traffic in %v, so whether the paths deliver cannot be told yet; run again under traffic", wait)
	}
	return path
}

// pathCounts is what each per-response path received.
func (d *Daemon) pathCounts() string {
	var p []string
	if d.spoeLn != nil {
		c := &d.SPOE.Counters
		p = append(p, fmt.Sprintf("SPOE at %s: %d connections, %d messages' responses", d.SPOEAddr(), c.Connections.Load(), c.Events.Load()))
	}
	if c := d.luaCounters(); c != nil {
		p = append(p, fmt.Sprintf("Lua at %s: %d batches, %d responses", d.LuaAddr(), c.Batches.Load(), c.Events.Load()))
	}
	if c := d.syslogCounters(); c != nil {
		p = append(p, fmt.Sprintf("logs at %s: %d batches, %d responses", d.Config.SyslogListen, c.Batches.Load(), c.Events.Load()))
	}
	return strings.Join(p, "; ")
}

// agentStatus is what check --live reads of a running agent's /status.
type agentStatus struct {
	Warnings []string                   `json:"warnings"`
	Unseen   string                     `json:"unseen"`
	Ingest   map[string]uint64          `json:"ingest"`
	Changes  map[string]json.RawMessage `json:"changes"`
}

// runningAgent reads the /status of an agent already running with c's
// status address; an error when none answers there.
func runningAgent(ctx context.Context, c config.Config) (agentStatus, error) {
	var st agentStatus
	ls, _ := c.Listeners()
	if ls.Status.Off() {
		return st, errors.New("--status-listen is off")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ls.Status.Addr+"/status", nil)
	if err != nil {
		return st, err
	}
	if c.StatusToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.StatusToken)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("/status at %s: %s", ls.Status.Addr, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&st); err != nil {
		return st, fmt.Errorf("/status at %s: %w", ls.Status.Addr, err)
	}
	return st, nil
}

// fromRunningAgent reads the silence test's verdict from the agent that
// already listens, through its /status.
func (r *LiveReport) fromRunningAgent(c config.Config, st agentStatus, err error) string {
	if err != nil {
		r.problem("an agent already listens on the telemetry addresses, and its /status cannot be read: %v", err)
		return ""
	}
	r.say("telemetry: read from the running agent's /status at %s: %d responses recorded, %d server(s) silent", c.StatusListen, st.Ingest["events"], st.Ingest["telemetry_silent_servers"])
	if st.Unseen != "" && !strings.HasPrefix(st.Unseen, "telemetry blind") {
		r.say("telemetry: %s", st.Unseen)
	}
	for _, w := range st.Warnings {
		if strings.HasPrefix(w, "telemetry silent") || strings.HasPrefix(w, "telemetry blind") {
			r.problem("%s", w)
		}
	}
	return telemetry.SPOEPath(st.Ingest["events"], 0)
}
