package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lab/bench"
	"github.com/hapilot/hapilot/internal/lab/envoyod"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "overhead" {
		return cmdBenchOverhead(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("hapilot-bench bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: hapilot-bench bench [--scenario S] [--sweep] [flags]   the study's benchmark against a real HAProxy")
		fmt.Fprintln(stderr, "       hapilot-bench bench overhead [flags]                  what each telemetry path costs HAProxy")
		fs.PrintDefaults()
	}
	var scenarios []string
	for _, s := range bench.Scenarios {
		scenarios = append(scenarios, s.Name)
	}
	scenario := fs.String("scenario", "paper,paper-late", "scenarios, comma-separated (paper-late: the paper fault after a steady state, its time to detect timed from the onset): "+strings.Join(scenarios, "|"))
	sweep := fs.Bool("sweep", false, "the study's grid: servers 3,5,7,9 x roundrobin,leastconn (unless --servers/--algo say otherwise)")
	servers := fs.String("servers", "3", "fleet sizes, comma-separated")
	algos := fs.String("algo", "roundrobin", "balance algorithms, comma-separated: roundrobin|leastconn")
	policies := fs.String("policy", "rules", "policies, comma-separated: static|haproxy-l7|envoy|rules|lua|llm (each run is paired with static; haproxy-l7 and envoy are baselines without hapilot)")
	l7 := fs.String("haproxy-l7", "10:fail-check,1:mark-down", "haproxy-l7: HAProxy's own detection, LIMIT:ACTION settings, comma-separated: `observe layer7 error-limit LIMIT on-error ACTION` on every server, with HTTP checks (ACTION: "+strings.Join(bench.L7Actions, "|")+")")
	envoySettings := fs.String("envoy", "", "envoy: Envoy outlier-detection fields over its defaults, field=value comma-separated (fields: "+strings.Join(envoyod.FieldNames(), ", ")+")")
	seeds := fs.String("seeds", "", "seeds, a range or a list (1-5, 1,3,7): each cell runs once per seed; overrides --seed")
	emulate := fs.String("emulate", "", "llm: emulated models, comma-separated, served by the Ollama stand-in: "+strings.Join(ollamafake.Emulations, "|"))
	protections := fs.String("protections", "on", "llm: on (hapilot's fixes), off (the study's loop, which the lab builds without hapilot's fixes), or on,off side by side")
	steps := fs.Int("steps", 60, "control-loop steps per run (the study: 60)")
	interval := fs.Duration("interval", 10*time.Second, "agent interval (the study: 10s; 1s compresses time tenfold)")
	rate := fs.Float64("rate", 0, "total client requests per second (0: the scenario's per-server rate, 50 for most, times the fleet size)")
	seed := fs.Uint64("seed", 1, "seed of the servers' faults and the emulations' coins")
	out := fs.String("out", "bench-out", "directory for result.json, report.md and charts")
	telemetry := fs.String("telemetry", "spoe", "how HAProxy reports to the agent, comma-separated to compare paths side by side: "+strings.Join(bench.Telemetries, "|"))
	retries := fs.Bool("retries", false, "HAProxy retries failed answers (retry-on 500 502 503 504, retries 2, option redispatch 1): static is then HAProxy's retries alone")
	policyFile := fs.String("policy-file", "", "lua: the policy script (default: examples/policies/ratio.lua)")
	ollamaHost := fs.String("ollama-host", "", "llm without --emulate: a real Ollama")
	model := fs.String("model", "", "llm without --emulate: the models on --ollama-host, comma-separated, each run through the whole grid")
	think := fs.String("think", "off", "llm with a real model: thinking off|on|low|medium|high")
	llmGate := fs.String("llm-gate", "", "llm: the agent's --llm-gate; always asks the model every step, so that a misbehaving one keeps trying")
	llmPrompt := fs.String("llm-prompt", "", "llm with a real model: the agent's --llm-prompt: full, compact (for small models) or numbered (hapilot's own model)")
	noGate := fs.Bool("no-gate", false, "llm: let every model act without passing calibration, to test what the guards alone hold")
	list := fs.Bool("list", false, "describe the scenarios and emulated models, and exit")
	reread := fs.String("report", "", "write the reports of an earlier run's `dir` again from its result.json files, and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *list {
		for _, s := range bench.Scenarios {
			fmt.Fprintf(stdout, "%-11s %s.\n            expected: %s.\n", s.Name, s.About, s.Expect)
		}
		fmt.Fprintf(stdout, "emulated models (Go code behind the Ollama stand-in, not models): %s\n", strings.Join(ollamafake.Emulations, ", "))
		return nil
	}
	if *reread != "" {
		runs, err := bench.Reread(*reread)
		if err != nil {
			return err
		}
		if bench.SideBySideWanted(runs) {
			bench.WriteSideBySide(stdout, bench.SideBySide(runs))
			fmt.Fprintln(stdout)
			bench.WritePerModel(stdout, bench.PerModel(runs))
		} else {
			bench.WriteTable(stdout, runs)
		}
		return bench.WriteSummary(*reread, bench.Command(*reread, "hapilot-bench bench --report "+*reread), runs)
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if *sweep && !explicit["servers"] {
		*servers = "3,5,7,9"
	}
	if *sweep && !explicit["algo"] {
		*algos = "roundrobin,leastconn"
	}
	cfg := bench.StudyConfig{Steps: *steps, Interval: *interval, Rate: *rate, Seed: *seed, Out: *out,
		Telemetries: split(*telemetry), Retries: *retries, PolicyFile: *policyFile, OllamaHost: *ollamaHost, Think: *think, NoGate: *noGate, LLMGate: *llmGate, LLMPrompt: *llmPrompt, Log: zerolog.Nop()}
	ecfg, err := envoyod.ParseConfig(*envoySettings)
	if err != nil {
		return err
	}
	cfg.Envoy, cfg.EnvoySettings = ecfg, *envoySettings
	seedList := []uint64{*seed}
	if *seeds != "" {
		if seedList, err = parseSeeds(*seeds); err != nil {
			return err
		}
	}
	for _, sc := range split(*scenario) {
		if _, err := bench.Lookup(sc); err != nil {
			return err
		}
	}
	for _, t := range cfg.Telemetries {
		if err := bench.CheckTelemetry(t); err != nil {
			return err
		}
	}
	for _, s := range split(*servers) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 || n > 64 {
			return fmt.Errorf("--servers %q: want sizes from 2 to 64", s)
		}
		cfg.Servers = append(cfg.Servers, n)
	}
	for _, a := range split(*algos) {
		if a != "roundrobin" && a != "leastconn" {
			return fmt.Errorf("--algo %q: want roundrobin or leastconn", a)
		}
		cfg.Algos = append(cfg.Algos, a)
	}
	variants, err := benchVariants(split(*policies), split(*emulate), split(*protections), split(*model), split(*l7))
	if err != nil {
		return err
	}
	cfg.Variants = variants
	if *steps < 2 || *interval < 250*time.Millisecond {
		return errors.New("--steps must be at least 2 and --interval at least 250ms")
	}
	if len(cfg.Servers) == 0 || len(cfg.Algos) == 0 {
		return errors.New("--servers and --algo need at least one value each")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	if f, ok := stderr.(*os.File); ok && isTerminal(f) && os.Getenv("CI") == "" {
		cfg.Progress = &bench.Progress{W: stderr}
	}
	var runs []*bench.RunResult
	for _, seed := range seedList {
		cfg.Seed = seed
		if len(seedList) > 1 {
			cfg.Out = filepath.Join(*out, fmt.Sprintf("seed%d", seed))
		}
		for _, sc := range split(*scenario) {
			cfg.Scenario = sc
			r, err := bench.Study(ctx, cfg)
			runs = append(runs, r...)
			if err != nil {
				return err
			}
		}
	}
	bench.SortRuns(runs)
	command := "hapilot-bench bench " + strings.Join(args, " ")
	if bench.SideBySideWanted(runs) {
		bench.WriteSideBySide(stdout, bench.SideBySide(runs))
		fmt.Fprintln(stdout)
		bench.WritePerModel(stdout, bench.PerModel(runs))
		fmt.Fprintf(stdout, "\nevery run's row: %s/summary.md\n", *out)
	} else {
		bench.WriteTable(stdout, runs)
	}
	if len(cfg.Telemetries) > 1 || cfg.Retries {
		fmt.Fprintln(stdout)
		bench.WriteTelemetryTable(stdout, runs)
	}
	if err := bench.WriteSummary(*out, command, runs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nreports: %s/summary.md, and one directory per run (result.json, report.md, 5xx.svg, states.svg, latency.svg)\n", *out)
	return nil
}

// benchVariants expands the policy list: haproxy-l7 once per setting,
// llm once per emulated model (or real one) and per protection setting.
func benchVariants(policies, emulations, protections, models, l7 []string) ([]bench.Variant, error) {
	var out []bench.Variant
	for _, p := range policies {
		switch p {
		case "static":
			continue // every cell runs it as the pair
		case "rules", "lua", "envoy":
			out = append(out, bench.Variant{Policy: p})
		case "haproxy-l7":
			if len(l7) == 0 {
				return nil, errors.New("--policy haproxy-l7 needs --haproxy-l7 LIMIT:ACTION")
			}
			for _, s := range l7 {
				if _, err := bench.ParseL7(s); err != nil {
					return nil, err
				}
				out = append(out, bench.Variant{Policy: p, L7: s})
			}
		case "llm":
			if len(emulations) == 0 && len(models) == 0 {
				return nil, errors.New("--policy llm needs --emulate PROFILE, or --ollama-host and --model for a real Ollama")
			}
			type m struct{ emulation, model string }
			var ms []m
			for _, e := range emulations {
				ms = append(ms, m{emulation: e})
			}
			for _, r := range models {
				ms = append(ms, m{model: r})
			}
			for _, mm := range ms {
				e := mm.emulation
				if e != "" {
					if _, err := ollamafake.Emulation(e, 0, time.Second); err != nil {
						return nil, err
					}
				}
				for _, pr := range protections {
					if pr != "on" && pr != "off" {
						return nil, fmt.Errorf("--protections %q: want on, off or on,off", pr)
					}
					out = append(out, bench.Variant{Policy: "llm", Emulation: e, Model: mm.model, Named: len(models) > 1, Unprotected: pr == "off"})
				}
			}
		default:
			return nil, fmt.Errorf("--policy %q: want static, haproxy-l7, envoy, rules, lua or llm", p)
		}
	}
	return out, nil
}

// parseSeeds reads "1-5" or "1,3,7" (or both: "1-3,9").
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range split(s) {
		a, b, isRange := strings.Cut(part, "-")
		lo, err := strconv.ParseUint(a, 10, 64)
		hi := lo
		if err == nil && isRange {
			hi, err = strconv.ParseUint(b, 10, 64)
		}
		if err != nil || hi < lo || hi-lo > 1000 {
			return nil, fmt.Errorf("--seeds %q: want a range or list of seeds, such as 1-5 or 1,3,7", s)
		}
		for x := lo; x <= hi; x++ {
			if !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--seeds %q: no seed", s)
	}
	return out, nil
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func cmdBenchOverhead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot-bench bench overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := bench.OverheadConfig{}
	fs.IntVar(&cfg.Concurrency, "concurrency", 16, "requests in flight")
	fs.DurationVar(&cfg.Duration, "duration", 20*time.Second, "load per telemetry path, split over the rounds")
	fs.IntVar(&cfg.Rounds, "rounds", 4, "interleaved rounds (plain, syslog, ring, lua, spoe, plain, ...)")
	fs.IntVar(&cfg.Backends, "backends", 2, "backend servers, answering at once")
	fs.BoolVar(&cfg.Profile, "profile", false, "turn HAProxy's task profiling on for the measured rounds and print where its CPU goes per response, handler by handler (profiling costs CPU of its own: quote the ratios of a run without it)")
	fs.BoolVar(&cfg.Pin, "pin", true, "pin HAProxy to the last core and the load generator, backends and agent to the others (taskset), where there are two or more")
	paths := fs.String("paths", "plain,stats,ring,lua,syslog,spoe,spoe-sampled4,spoe-sampled16", "telemetry paths to compare, plain first: "+strings.Join(bench.OverheadPaths, ",")+" (-noagent: HAProxy's side alone)")
	matrix := fs.String("haproxy", "", "HAProxy binaries to run the same paths on, one after the other, as NAME=PATH comma-separated (2.6=haproxy,3.2=bin/haproxy-3.2/haproxy); each prints its table, then one table has them all; empty: $HAPROXY_BIN or haproxy on PATH")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Paths = strings.Split(*paths, ",")
	if cfg.Paths[0] != "plain" {
		return errors.New("--paths must start with plain: every ratio is to it")
	}
	if cfg.Concurrency < 1 || cfg.Rounds < 1 || cfg.Backends < 1 || cfg.Duration < time.Second {
		return errors.New("concurrency, rounds and backends must be positive, duration at least 1s")
	}
	bins, err := parseBinaries(*matrix)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "hapilot-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if len(bins) == 0 {
		res, err := bench.Overhead(ctx, &cfg, dir)
		if err != nil {
			return err
		}
		bench.PrintOverhead(stdout, cfg, res)
		return nil
	}
	// HAProxy is found through $HAPROXY_BIN (haproxyproc.Binary): each
	// binary in turn, and the caller's value back after.
	if old, ok := os.LookupEnv("HAPROXY_BIN"); ok {
		defer os.Setenv("HAPROXY_BIN", old)
	} else {
		defer os.Unsetenv("HAPROXY_BIN")
	}
	var rows []bench.MatrixRow
	for _, b := range bins {
		os.Setenv("HAPROXY_BIN", b.path)
		out, err := exec.CommandContext(ctx, b.path, "-v").Output()
		if err != nil {
			return fmt.Errorf("%s (%s): %w", b.name, b.path, err)
		}
		version, _, _ := strings.Cut(string(out), "\n")
		fmt.Fprintf(stdout, "== %s: %s\n", b.name, version)
		c := cfg
		res, err := bench.Overhead(ctx, &c, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", b.name, err)
		}
		bench.PrintOverhead(stdout, c, res)
		fmt.Fprintln(stdout)
		rows = append(rows, bench.MatrixRow{HAProxy: bench.VersionOf(version), Results: res})
	}
	bench.PrintOverheadMatrix(stdout, cfg, rows)
	return nil
}

type haproxyBinary struct{ name, path string }

// parseBinaries reads --haproxy's NAME=PATH,NAME=PATH.
func parseBinaries(s string) ([]haproxyBinary, error) {
	if s == "" {
		return nil, nil
	}
	var out []haproxyBinary
	for _, item := range strings.Split(s, ",") {
		name, path, ok := strings.Cut(item, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--haproxy %q: want NAME=PATH, comma-separated", item)
		}
		out = append(out, haproxyBinary{name, path})
	}
	return out, nil
}
