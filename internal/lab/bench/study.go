package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"net"

	llmcalibrate "github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/examples"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/envoyod"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lab/scenario"
	"github.com/rs/zerolog"
)

// Variant is one policy as the benchmark runs it.
type Variant struct {
	Policy string // static|rules|lua|llm|envoy|haproxy-l7
	// Emulation names an emulated model served by the Ollama stand-in
	// (ollamafake.Emulations); "" with --policy llm means a real Ollama.
	Emulation string
	// Unprotected runs the model without hapilot's fixes: the study's
	// loop, which the lab builds (StudyLoop).
	Unprotected bool
	// Model is the real model of an llm variant ("" with an emulation:
	// StudyConfig.Model then). Named says whether Name carries it (more
	// than one model in the invocation).
	Model string
	Named bool
	// L7 is haproxy-l7's setting, "L:A": `observe layer7 error-limit L
	// on-error A` on every server, with checks.
	L7 string
}

// L7Actions are HAProxy's on-error actions.
var L7Actions = []string{"fastinter", "fail-check", "sudden-death", "mark-down"}

// ParseL7 reads a haproxy-l7 setting "L:A" into its server options.
func ParseL7(s string) (string, error) {
	l, a, ok := strings.Cut(s, ":")
	n := 0
	if _, err := fmt.Sscanf(l, "%d", &n); !ok || err != nil || n < 1 || fmt.Sprint(n) != l || !slices.Contains(L7Actions, a) {
		return "", fmt.Errorf("haproxy-l7 setting %q: want LIMIT:ACTION, LIMIT from 1, ACTION one of %s", s, strings.Join(L7Actions, "|"))
	}
	return fmt.Sprintf("check observe layer7 error-limit %d on-error %s", n, a), nil
}

// Name is how reports label the variant.
func (v Variant) Name() string {
	n := v.Policy
	if v.Policy == "llm" && v.Emulation != "" {
		n += "/" + v.Emulation
	}
	if v.Policy == "llm" && v.Emulation == "" && v.Named {
		n += "/" + v.Model
	}
	if v.Policy == "haproxy-l7" {
		n += "/" + strings.Replace(v.L7, ":", "/", 1)
	}
	if v.Unprotected {
		n += "/unprotected"
	}
	return n
}

// Emulated tells whether an emulation, not a model, decided.
func (v Variant) Emulated() bool { return v.Emulation != "" }

// StudyConfig is one `hapilot-bench bench` invocation.
type StudyConfig struct {
	Scenario string
	Servers  []int
	Algos    []string
	Variants []Variant // static is always run as the pair of each cell
	Steps    int
	Interval time.Duration
	Rate     float64 // total req/s; 0: the scenario's per-server rate times N
	Seed     uint64
	Out      string
	// Telemetries are the paths from HAProxy to the agent, each run side by
	// side in every cell (scenario.Scenario.Telemetry); nil: spoe.
	Telemetries []string
	// Retries gives HAProxy's backend retry-on 500 502 503 504, retries 2
	// and option redispatch 1: the static pair is then HAProxy's retries
	// alone.
	Retries    bool
	PolicyFile string // --policy lua; "" runs examples/policies/ratio.lua
	OllamaHost string // a real Ollama, with Model
	Model      string
	Think      string // llm with a real model: --think
	// NoGate lets every model act without passing calibration
	// (--skip-calibration), to test what the guards alone hold against a
	// misbehaving one.
	NoGate bool
	// LLMGate is the agent's --llm-gate ("" for its default): "always"
	// asks the model every step, so that a misbehaving one keeps trying.
	LLMGate string
	// LLMPrompt is the agent's --llm-prompt ("" for its default, full):
	// compact for small models, numbered for hapilot's own.
	LLMPrompt string
	// Envoy is the envoy baseline's configuration (envoyod.Defaults when
	// zero); EnvoySettings how it was written, for the record.
	Envoy         envoyod.Config
	EnvoySettings string
	Progress      *Progress
	Log           zerolog.Logger
}

// Cell is one point of the grid.
type Cell struct {
	Scenario string `json:"scenario"`
	Servers  int    `json:"servers"`
	Algo     string `json:"algo"`
}

func (c Cell) String() string { return fmt.Sprintf("%s n=%d %s", c.Scenario, c.Servers, c.Algo) }

// RunResult is one run, as result.json holds it.
type RunResult struct {
	Tool     string       `json:"tool"`
	Cell     Cell         `json:"cell"`
	Variant  string       `json:"variant"`
	Emulated bool         `json:"emulated_model,omitempty"`
	Config   RunSettings  `json:"config"`
	Truth    TruthView    `json:"truth"`
	Client   Client       `json:"client"`
	Static   Client       `json:"static_client"`
	Loc      Localisation `json:"localisation"`
	Agent    *Agent       `json:"agent,omitempty"`
	HAProxy  HAProxyView  `json:"haproxy"`
	Series   Series       `json:"series"`
	Dir      string       `json:"-"`
}

// RunSettings is the configuration that produced a run.
type RunSettings struct {
	Steps     int               `json:"steps"`
	Interval  string            `json:"interval"`
	Rate      float64           `json:"rate_per_s"`
	Seed      uint64            `json:"seed"`
	Telemetry string            `json:"telemetry"`
	Retries   bool              `json:"haproxy_retries,omitempty"`
	Capacity  int               `json:"server_capacity"`
	Weight    int               `json:"server_weight"`
	Backends  []BackendSettings `json:"backends"`
	Events    []Event           `json:"events,omitempty"`
	AgentArgs []string          `json:"agent_args,omitempty"`
	// StudyLoop: the agent ran as the study's loop (StudyLoop), without
	// hapilot's protections; AgentArgs are then its model's flags alone.
	StudyLoop bool   `json:"study_loop,omitempty"`
	Model     string `json:"model,omitempty"`
	// Baseline is what a baseline without hapilot ran: HAProxy's server
	// options (haproxy-l7), or Envoy's outlier-detection settings (envoy).
	Baseline string `json:"baseline,omitempty"`
	// Envoy is what the envoy baseline saw and computed: the responses it
	// read and every sweep's success-rate arithmetic.
	Envoy *EnvoyRecord `json:"envoy,omitempty"`
	// Calibration is the capability gate's verdict on the model, when
	// protections are on.
	Calibration *GateVerdict `json:"calibration,omitempty"`
}

// GateVerdict is what `hapilot calibrate` found.
type GateVerdict struct {
	Passed     bool    `json:"passed"`
	Precision  float64 `json:"precision"`
	Recall     float64 `json:"recall"`
	Collateral int     `json:"collateral"`
	Why        string  `json:"why,omitempty"`
}

// BackendSettings is one server as configured.
type BackendSettings struct {
	Server    string  `json:"server"`
	ErrorRate float64 `json:"error_rate"`
	LatencyMs float64 `json:"latency_ms"`
	JitterMs  float64 `json:"jitter_ms"`
}

// HAProxyView is what HAProxy itself paid and did during the load.
type HAProxyView struct {
	// CPUPerResponseUs is HAProxy's CPU time (user and system) over the
	// measured load, per response, in µs: at the run's rate, fixed costs
	// (health checks, the agent's polls) are in it too.
	CPUPerResponseUs float64 `json:"cpu_per_response_us"`
	// RetriedAttempts is the attempts its backend retried (wretr).
	RetriedAttempts int64 `json:"retried_attempts"`
}

// TruthView is the scenario and what it is scored against.
type TruthView struct {
	About     string   `json:"about"`
	Expect    string   `json:"expect"`
	Faulty    []string `json:"faulty"`
	EndFaulty []string `json:"end_faulty"`
	HealS     float64  `json:"heal_s,omitempty"`
}

// Series is what happened over time, for the charts.
type Series struct {
	PerSecond       []fleet.Second                    `json:"per_second"`
	StaticPerSecond []fleet.Second                    `json:"static_per_second"`
	States          map[string][]scenario.StateChange `json:"states"`
	Actions         []ActionMark                      `json:"actions"`
}

// ActionMark is a command the agent sent, from the load's start.
type ActionMark struct {
	AtS     float64 `json:"at_s"`
	Command string  `json:"command"`
}

// weight every server is configured with: the study's scale (0..256, a
// move of at most 50 a step) has room for cuts.
const serverWeight = 100

// Study runs the grid: for every cell, the static pair first, then each
// variant; every run writes its directory, and the whole a summary.
func Study(ctx context.Context, c StudyConfig) ([]*RunResult, error) {
	spec, err := Lookup(c.Scenario)
	if err != nil {
		return nil, err
	}
	var cells []Cell
	for _, n := range c.Servers {
		for _, a := range c.Algos {
			cells = append(cells, Cell{Scenario: spec.Name, Servers: spec.fleetSize(n), Algo: a})
		}
	}
	cells = dedupe(cells)
	c.Progress.Start(len(cells)*(1+len(c.Variants)*max(len(c.Telemetries), 1)), time.Duration(c.Steps)*c.Interval)
	defer c.Progress.Done()
	telemetries := c.Telemetries
	if len(telemetries) == 0 {
		telemetries = []string{"spoe"}
	}
	var all []*RunResult
	for _, cell := range cells {
		static, err := runOne(ctx, c, spec, cell, Variant{Policy: "static"}, "", nil)
		if err != nil {
			return all, fmt.Errorf("%s static: %w", cell, err)
		}
		all = append(all, static)
		for _, t := range telemetries {
			for _, v := range c.Variants {
				r, err := runOne(ctx, c, spec, cell, v, t, static)
				if err != nil {
					return all, fmt.Errorf("%s %s %s: %w", cell, v.Name(), t, err)
				}
				all = append(all, r)
			}
		}
	}
	return all, nil
}

func dedupe(cells []Cell) []Cell {
	seen := map[Cell]bool{}
	var out []Cell
	for _, c := range cells {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}

// runOne runs one variant over one telemetry path in one cell and writes
// its reports; static is the paired no-policy run (nil for the static run
// itself, whose telemetry is "": it has no agent).
func runOne(ctx context.Context, c StudyConfig, spec Spec, cell Cell, v Variant, tele string, static *RunResult) (*RunResult, error) {
	c.Progress.Begin(cell.String() + " " + v.Name() + " " + tele)
	defer c.Progress.End()
	name := slug(v.Name())
	if len(c.Telemetries) > 1 && tele != "" {
		name += "-" + tele
	}
	dir := filepath.Join(c.Out, cell.Scenario, fmt.Sprintf("n%d-%s", cell.Servers, cell.Algo), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	scratch, err := os.MkdirTemp("", "hapilot-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)

	n := cell.Servers
	backends := spec.Backends(n)
	for i := range backends {
		backends[i].Seed += c.Seed * 1000
		backends[i].Capacity = spec.capacity()
	}
	rate := c.Rate
	if rate == 0 {
		rate = spec.defaultRate(n)
	}
	faulty, end := spec.truth(n)
	var events []Event
	if spec.Events != nil {
		events = spec.Events(n, c.Steps)
	}
	res := &RunResult{
		Tool: "hapilot-bench bench", Cell: cell, Variant: v.Name(), Emulated: v.Emulated(), Dir: dir,
		Config: RunSettings{Steps: c.Steps, Interval: c.Interval.String(), Rate: rate, Seed: c.Seed, Telemetry: telemetry(tele),
			Retries: c.Retries, Capacity: spec.capacity(), Weight: serverWeight, Events: events},
		Truth: TruthView{About: spec.About, Expect: spec.Expect, Faulty: nonNil(faulty), EndFaulty: nonNil(end)},
	}
	for i, b := range backends {
		res.Config.Backends = append(res.Config.Backends, BackendSettings{Server: fleet.ServerName(i), ErrorRate: b.ErrorRate, LatencyMs: ms(b.Latency), JitterMs: ms(b.Jitter)})
	}
	truth := Truth{Faulty: faulty, EndFaulty: end, Steps: c.Steps, Interval: c.Interval}
	for i := 0; i < n; i++ {
		truth.Servers = append(truth.Servers, fleet.ServerName(i))
	}
	if spec.HealStep != nil {
		truth.Heal = time.Duration(spec.HealStep(c.Steps)) * c.Interval
		res.Truth.HealS = truth.Heal.Seconds()
	}

	args, gate, cleanup, err := agentArgs(ctx, c, v, scratch)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res.Config.AgentArgs, res.Config.Calibration, res.Config.StudyLoop = args, gate, v.Unprotected
	if v.Policy == "llm" {
		res.Config.Model = c.Model
		if v.Model != "" {
			res.Config.Model = v.Model
		}
		if v.Emulated() {
			res.Config.Model = "emulation:" + v.Emulation
		}
	}

	at := map[time.Duration]func(*scenario.Env){}
	byStep := map[int][]Event{}
	for _, e := range events {
		byStep[e.Step] = append(byStep[e.Step], e)
	}
	for s, evs := range byStep {
		at[time.Duration(s)*c.Interval] = func(env *scenario.Env) {
			for _, e := range evs {
				env.Backends[e.Server].SetErrorRate(e.ErrorRate)
			}
		}
	}
	policy := v.Policy
	sc := scenario.Scenario{
		Servers: backends, Algo: cell.Algo, Weight: serverWeight, MaxConn: spec.capacity(),
		Rate: rate, Duration: time.Duration(c.Steps) * c.Interval, Policy: policy, Interval: c.Interval,
		AgentArgs: args, Name: name, Telemetry: tele, Retries: c.Retries, At: at, Dir: scratch, Log: c.Log,
	}
	if v.Unprotected {
		sc.Build = StudyLoop
	}
	sc.DownIsOut = true // HAProxy's own detection marks servers DOWN; nothing else has checks
	var envoy *envoyod.Runner
	switch policy {
	case "static":
		sc.Policy = "" // no agent at all: HAProxy alone, the study's baseline
		sc.NoSPOE = true
	case "haproxy-l7":
		opts, err := ParseL7(v.L7)
		if err != nil {
			return nil, err
		}
		sc.Policy, sc.NoSPOE, sc.ServerOptions, sc.HTTPCheck = "", true, opts, true
		res.Config.Baseline = "option httpchk GET /; server ... " + opts
	case "envoy":
		ecfg := c.Envoy
		if ecfg.Interval == 0 {
			ecfg = envoyod.Defaults()
		}
		sc.Policy, sc.Telemetry = "", "spoe"
		res.Config.Telemetry = "spoe"
		res.Config.Baseline = "envoy outlier detection: " + c.EnvoySettings
		if c.EnvoySettings == "" {
			res.Config.Baseline += "defaults"
		}
		envoy = &envoyod.Runner{Detector: envoyod.New(ecfg, truth.Servers), Backend: fleet.BackendName, Log: c.Log}
		sc.Sidecar = func(ctx context.Context, ln net.Listener, rt *haproxy.Client) error {
			envoy.HAProxy = rt
			return envoy.Serve(ctx, ln)
		}
	}
	out, err := sc.Run(ctx)
	if err != nil {
		return nil, err
	}
	res.Client = ClientView(out.Load)
	res.HAProxy = HAProxyView{RetriedAttempts: out.Retried}
	if n := out.Load.Completed; n > 0 {
		res.HAProxy.CPUPerResponseUs = float64(out.HAProxyCPU) / float64(time.Microsecond) / float64(n)
	}
	res.Series = Series{PerSecond: out.Load.PerSecond, States: out.Changes, Actions: []ActionMark{}}
	res.Loc = Localise(out.Timeline, truth)
	var onset time.Duration
	if spec.OnsetStep != nil {
		onset = time.Duration(spec.OnsetStep(c.Steps)) * c.Interval
	}
	res.Loc.DetectS = firstChange(out.Changes, faulty, onset)
	if static != nil {
		res.Static = static.Client
		res.Client.Against(static.Client)
		res.Series.StaticPerSecond = static.Series.PerSecond
	} else {
		res.Static = res.Client
	}
	if out.AuditLog != "" {
		f, err := os.Open(out.AuditLog)
		if err != nil {
			return nil, err
		}
		a, marks, err := AgentView(f, out.Start, c.Steps, c.Interval)
		f.Close()
		if err != nil {
			return nil, err
		}
		a.Avoided(res.Client, res.Static)
		a.Score(truth.Faulty)
		res.Agent, res.Series.Actions = &a, marks
		if err := copyFile(out.AuditLog, filepath.Join(dir, "audit.jsonl")); err != nil {
			return nil, err
		}
	}
	if envoy != nil {
		res.Config.Envoy = &EnvoyRecord{Responses: envoy.Events(), Sweeps: []EnvoySweep{}}
		for _, sw := range envoy.Sweeps() {
			res.Config.Envoy.Sweeps = append(res.Config.Envoy.Sweeps, EnvoySweep{SweepStats: sw, AtS: sw.At.Sub(out.Start).Seconds()})
		}
		for _, a := range envoy.Actions() {
			cmd := "set server " + fleet.BackendName + "/" + a.Host + " state ready"
			if a.Eject {
				cmd = "set server " + fleet.BackendName + "/" + a.Host + " state drain # " + string(a.Reason)
			}
			res.Series.Actions = append(res.Series.Actions, ActionMark{AtS: a.At.Sub(out.Start).Seconds(), Command: cmd})
		}
	}
	if err := writeRun(res); err != nil {
		return nil, err
	}
	return res, nil
}

// EnvoyRecord is the envoy baseline's own record of a run.
type EnvoyRecord struct {
	Responses int          `json:"responses_seen"`
	Sweeps    []EnvoySweep `json:"sweeps"`
}

// EnvoySweep is one sweep, timed from the load's start.
type EnvoySweep struct {
	envoyod.SweepStats
	AtS float64 `json:"at_s"`
}

// firstChange is the time to detect: seconds from the load's start to
// the first change HAProxy reported (state or weight) of a faulty server,
// whoever made it (nil: none, or no faulty server).
func firstChange(changes map[string][]scenario.StateChange, faulty []string, onset time.Duration) *float64 {
	var first *float64
	for _, s := range faulty {
		for _, ch := range changes[s] {
			if ch.At > 0 && ch.At >= onset {
				if d := (ch.At - onset).Seconds(); first == nil || d < *first {
					first = ptr(d)
				}
				break
			}
		}
	}
	return first
}

// agentArgs are the `hapilot run` flags of a variant beyond the
// scenario's own, and the calibration verdict of a protected model;
// cleanup stops an emulated model's server.
func agentArgs(ctx context.Context, c StudyConfig, v Variant, scratch string) ([]string, *GateVerdict, func(), error) {
	noop := func() {}
	switch v.Policy {
	case "static", "rules", "envoy", "haproxy-l7":
		return nil, nil, noop, nil
	case "lua":
		file := c.PolicyFile
		if file == "" {
			file = filepath.Join(scratch, "ratio.lua")
			if err := os.WriteFile(file, []byte(examples.RatioPolicy), 0o644); err != nil {
				return nil, nil, noop, err
			}
		}
		return []string{"--policy-file", file}, nil, noop, nil
	case "llm":
	default:
		return nil, nil, noop, fmt.Errorf("unknown policy %q", v.Policy)
	}
	host, model, think := c.OllamaHost, c.Model, c.Think
	if v.Model != "" {
		model = v.Model
	}
	cleanup := noop
	if v.Emulated() {
		respond, err := ollamafake.Emulation(v.Emulation, c.Seed, c.Interval)
		if err != nil {
			return nil, nil, noop, err
		}
		model = "emulated-" + v.Emulation
		fake := ollamafake.New(map[string]string{model: "sha256:emulated-" + v.Emulation}, respond)
		ollamafake.Traits(v.Emulation, c.Interval)(fake)
		host, cleanup = fake.URL, fake.Close
		think = "off"
		if v.Emulation == "slow-thinker" || v.Emulation == "thinker" {
			think = "on" // the study's reasoning mode
		}
	}
	if think == "" {
		think = "off"
	}
	args := []string{"--model", model, "--ollama-host", host, "--think", think}
	if c.LLMGate != "" {
		args = append(args, "--llm-gate", c.LLMGate)
	}
	if c.LLMPrompt != "" {
		args = append(args, "--llm-prompt", c.LLMPrompt)
	}
	if v.Unprotected {
		return args, nil, cleanup, nil // StudyLoop: no gate
	}
	if c.NoGate {
		return append(args, "--skip-calibration"), nil, cleanup, nil
	}
	// The capability gate: calibrate now, with the agent's own settings,
	// and let the agent read the record as `hapilot run` would.
	calDir := filepath.Join(scratch, "calibration")
	gate, err := calibrate(ctx, append(args, "--interval", c.Interval.String()), calDir)
	if err != nil {
		cleanup()
		return nil, nil, noop, err
	}
	return append(args, "--calibration-dir", calDir), gate, cleanup, nil
}

func calibrate(ctx context.Context, args []string, dir string) (*GateVerdict, error) {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := config.Register(fs)
	if err := config.Parse(fs, args); err != nil {
		return nil, err
	}
	sc, err := llmcalibrate.Run(ctx, cfg.LLM, cfg.Rules, cfg.Loop, time.Now())
	if err != nil {
		return nil, fmt.Errorf("calibrate %s: %w", cfg.LLM.Model, err)
	}
	if _, err := sc.Save(dir); err != nil {
		return nil, err
	}
	return &GateVerdict{Passed: sc.Passed, Precision: sc.Precision, Recall: sc.Recall, Collateral: sc.Collateral, Why: sc.Why}, nil
}

// Telemetries are the paths a study can run (scenario.Scenario.Telemetry).
var Telemetries = []string{"spoe", "spoe-sampled", "spoe-sampledK", "spoe-unix", "lua", "lua-unix", "ring", "syslog", "syslog-unix", "syslog-ring", "syslog-ring-unix", "stats", "scrape15s"}

// CheckTelemetry tells whether t names a path.
func CheckTelemetry(t string) error {
	if _, sampled, err := fleet.SampledPath(t); sampled && err == nil {
		return nil
	}
	if t == "spoe-sampledK" || !slices.Contains(Telemetries, t) {
		return fmt.Errorf("--telemetry %q: want %s (K from 1 to 1024)", t, strings.Join(Telemetries, "|"))
	}
	return nil
}

func telemetry(t string) string {
	if t == "" {
		return "none"
	}
	return t
}

func slug(s string) string { return strings.ReplaceAll(s, "/", "-") }

func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}
