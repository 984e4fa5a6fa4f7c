package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/soak"
)

// cmdSoak runs simulated server-days through the rules' sequential test,
// one cell per combination of the listed values, and prints one table.
func cmdSoak(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "cost" {
		return cmdSoakCost(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "scoreboard" {
		return cmdSoakScoreboard(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("hapilot-bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	servers := fs.String("servers", "9", "servers per backend, comma-separated (one cell each)")
	rate := fs.String("rate", "33", "requests per second per server, comma-separated")
	noise := fs.Float64("noise", 0.002, "healthy 5xx rate (the fleet's median)")
	hetero := fs.String("hetero", "0", "lognormal sigma of the healthy servers' rates, comma-separated (a new fleet each day)")
	bursts := fs.String("bursts", "", "HOURS:MIN-MAX: one burst of MIN to MAX errors within a second (or --burst-spread), every HOURS per server on average")
	// issue 41: the noise real fleets have, and their faults.
	restarts := fs.String("restarts", "", "HOURS:SECONDS: each server restarts on average every HOURS (Poisson) and refuses connections for SECONDS; each request to it meanwhile is a 5xx in its counts, as HAProxy's retries report it")
	burstSpread := fs.Float64("burst-spread", 0, "SECONDS: each burst of --bursts is spread uniformly over this long, touching every check it overlaps (0: within one second, straddling two checks)")
	fleetFault := fs.Float64("fleet-fault", 0, "5xx rate P: --trials incidents a seed in which every server of the backend steps to P together for an hour, at a random time 0-600 s after --warmup; prints the drains per 1,000 incident-hours (0: none)")
	faulty := fs.Int("faulty", 1, "servers failing at --fault at once: each one's time to detect counts, and a trial is missed if any of them is")
	evidenceCheck := secondsValue(time.Second)
	fs.Var(&evidenceCheck, "evidence-check", "the check's cadence: the test is fed chunks of this long (a duration, 100ms, or seconds, 0.1; from 100ms to 1m)")
	randomFleets := fs.Bool("random-fleets", false, fmt.Sprintf("each backend-day draws its own fleet: N uniform over %d-%d, rate log-uniform %g-%g req/s, median 5xx log-uniform %g%%-%g%%, sigma uniform 0-%g, "+
		"bursts of K errors (K uniform 0-%d, 0: none) spread uniformly over %g-%g s every %g-%g h (log-uniform), restarts every %g-%g h down %g-%g s (both log-uniform); "+
		"--servers, --rate, --noise, --hetero, --bursts, --burst-spread and --restarts are ignored",
		soak.RandomMinServers, soak.RandomMaxServers, soak.RandomMinRate, soak.RandomMaxRate, 100*soak.RandomMinNoise, 100*soak.RandomMaxNoise, soak.RandomMaxHetero,
		soak.RandomMaxBurst, soak.RandomBurstSpread[0], soak.RandomBurstSpread[1], soak.RandomBurstHours[0], soak.RandomBurstHours[1],
		soak.RandomRestartHours[0], soak.RandomRestartHours[1], soak.RandomRestartDown[0], soak.RandomRestartDown[1]))
	diurnal := fs.Float64("diurnal", 0, "the traffic's swing over a day: rate x (1 + D sin(2 pi t/day)), D in [0, 1)")
	uneven := fs.Float64("uneven", 0, "lognormal sigma of each server's share of the traffic")
	fault := fs.String("fault", "", "faulty server's 5xx rates, comma-separated: one server from a random time after the warm-up")
	serverDays := fs.Float64("server-days", 1000, "healthy server-days per cell, all seeds together")
	seeds := fs.String("seeds", "1-2", "seeds, a range or a list (1-5, 1,3,7)")
	trials := fs.Int("trials", 100, "fault onsets per seed")
	warmup := fs.Duration("warmup", 2*time.Hour, "steady healthy traffic before a fault may start")
	drainFor := fs.Duration("drain-for", 30*time.Second, "how long a condemned healthy server stays out (the probe cooldown)")
	windowed := fs.Bool("windowed", false, "run the windowed test the rules ran before (60 s window, every second) instead of the sequential one")
	workers := fs.Int("workers", 0, "seeds run at once (0: GOMAXPROCS)")
	jsonOut := fs.String("json", "", "write the results to this JSON file")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof), to see where a soak's time goes")
	maxRate := fs.Float64("max-per-1000", 0, "fail when a cell's false drains per 1,000 server-days exceed this (0: never)")
	maxHigh := fs.Float64("max-upper", 0, "fail when a cell's 95% upper end reaches this (0: never)")
	maxDay := fs.Int("max-one-server-day", 0, "fail when a healthy or zone server is drained more than this many times in one day (0: never)")
	maxFleet := fs.Float64("max-fleet-per-1000", 0, "fail when a cell's drains per 1,000 fleet-wide incident-hours exceed this (0: never)")
	readmit := fs.Bool("readmit", false, "measure re-admission instead: a server failing at --fault (5% when unset) drained, then healed at a random time (or never), through today's probe path and the slow start")
	readmitWeight := fs.Int("readmit-weight", 16, "re-admission: every server's configured weight")
	healWithin := fs.Duration("heal-within", 10*time.Minute, "re-admission: the server heals at a uniform time in [0, this) after its drain")
	readmitHorizon := fs.Duration("readmit-horizon", 30*time.Minute, "re-admission: a run ends this long after the heal (or the drain, when it never heals)")
	readmitInterval := fs.Duration("readmit-interval", 10*time.Second, "re-admission: the loop's step (the agent's --interval)")
	cfg := rules.DefaultConfig()
	fs.Float64Var(&cfg.Floor, "rules-floor", cfg.Floor, "rules: the 5xx rate under which no server is degraded")
	fs.Float64Var(&cfg.DegradedRatio, "rules-degraded-ratio", cfg.DegradedRatio, "rules: times the backend's healthy median a degraded server's 5xx rate reaches")
	fs.Float64Var(&cfg.TailRatio, "rules-tail-ratio", cfg.TailRatio, "rules: an answer is slow at this many times the backend's p95, for the tail test run with --latency (0: off)")
	fs.Float64Var(&cfg.TailFloor, "rules-tail-floor", cfg.TailFloor, "rules: the slow share under which no server is degraded")
	fs.Float64Var(&cfg.ARLDays, "rules-arl-days", cfg.ARLDays, "rules: mean days between false drains a server's threshold is set for")
	fs.Float64Var(&cfg.HealthyFloor, "rules-healthy-floor", cfg.HealthyFloor, "rules: the healthy region's absolute upper end")
	fs.Float64Var(&cfg.HealthyRatio, "rules-healthy-ratio", cfg.HealthyRatio, "rules: the healthy region's upper end in times the backend's healthy median")
	fs.DurationVar(&cfg.MinDuration, "rules-min-duration", cfg.MinDuration, "rules: a burst of errors shorter than this never drains")
	fs.DurationVar(&cfg.ZoneEvery, "rules-zone-every", cfg.ZoneEvery, "rules: a zone server is drained at most once this often")
	fs.DurationVar(&cfg.BaselineSpan, "rules-baseline-span", cfg.BaselineSpan, "rules: time constant of each server's long baseline")
	// issue 37 (slow and flapping faults): the latency model and the
	// faults' shapes.
	flap := fs.String("flap", "", "ON:OFF seconds: the fault is intermittent, on for ON, off for OFF, from its onset")
	latency := fs.String("latency", "", "MS:SIGMA: simulate answer times, lognormal around each server's median MS ms with per-request log-sd SIGMA, and run the rules' latency test")
	latencyHetero := fs.Float64("latency-hetero", 0, "lognormal sigma of the healthy servers' median answer times (with --latency)")
	slowTail := fs.String("slow-tail", "", "slow tails: shares of one server's answers that take --slow-tail-ms, its median unchanged, comma-separated: from a random time after the warm-up (with --latency)")
	slowTailMs := fs.Float64("slow-tail-ms", 1500, "the slow tail's answer time, ms")
	slow := fs.String("slow", "", "slow servers' median answer time, in times the healthy one, comma-separated: one server from a random time after the warm-up (with --latency)")
	// issue 44: the LLM policy in the soak.
	var pf policyFlags
	pf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("soak: --cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("soak: --cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	base := soak.Cell{Noise: *noise, Diurnal: *diurnal, Uneven: *uneven, ServerDays: *serverDays, Trials: *trials,
		Warmup: *warmup, DrainFor: *drainFor, Config: cfg, Windowed: *windowed,
		EvidenceCheck: time.Duration(evidenceCheck), RandomFleets: *randomFleets}
	var err error
	if base.Seeds, err = parseSeeds(*seeds); err != nil {
		return err
	}
	if *bursts != "" {
		if base.Bursts, err = parseBursts(*bursts); err != nil {
			return err
		}
	}
	if *restarts != "" {
		if base.Restarts, err = parseRestarts(*restarts); err != nil {
			return err
		}
	}
	if err := checkNoiseFlags(*burstSpread, *bursts != "", *fleetFault, *faulty, *fault != ""); err != nil {
		return err
	}
	base.BurstSpread = time.Duration(*burstSpread * float64(time.Second))
	if *faulty > 1 {
		base.Faulty = *faulty
	}
	if base.Flap, base.Latency, err = parseShapes(*flap, *latency, *latencyHetero); err != nil {
		return err
	}
	ns, err := floats("servers", *servers)
	if err != nil {
		return err
	}
	rates, err := floats("rate", *rate)
	if err != nil {
		return err
	}
	agentPolicy, stop, err := pf.agent(cfg, fs)
	if err != nil {
		return err
	}
	defer stop()
	base.Agent = agentPolicy
	if *readmit {
		if agentPolicy != nil {
			return errors.New("--readmit: measured through the real loop and recovery with the rules; --policy llm and --path agent are not simulated there")
		}
		var set []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "restarts", "burst-spread", "fleet-fault", "faulty", "evidence-check", "random-fleets":
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return fmt.Errorf("--readmit: %s not simulated in re-admission", strings.Join(set, ", "))
		}
		return soakReadmit(ctx, readmitFlags{servers: ns, rates: rates, noise: *noise, fault: *fault, weight: *readmitWeight,
			healWithin: *healWithin, horizon: *readmitHorizon, interval: *readmitInterval, trials: *trials, seeds: base.Seeds,
			seedsText: *seeds, rules: cfg, workers: *workers, json: *jsonOut}, stdout, stderr)
	}
	sigmas, err := floats("hetero", *hetero)
	if err != nil {
		return err
	}
	if *randomFleets {
		// one cell: each backend-day draws its own
		ns, rates, sigmas = []float64{0}, []float64{0}, []float64{0}
	}
	// each fault cell: a 5xx rate or a slow factor
	type faultCell struct{ rate, slow, tail float64 }
	var faults []faultCell
	if *fault != "" {
		fr, err := floats("fault", *fault)
		if err != nil {
			return err
		}
		for _, f := range fr {
			faults = append(faults, faultCell{rate: f})
		}
	}
	if *slow != "" {
		sf, err := floats("slow", *slow)
		if err != nil {
			return err
		}
		for _, f := range sf {
			faults = append(faults, faultCell{slow: f})
		}
	}
	if *slowTail != "" {
		sf, err := floats("slow-tail", *slowTail)
		if err != nil {
			return err
		}
		for _, f := range sf {
			faults = append(faults, faultCell{tail: f})
		}
	}
	if len(faults) == 0 {
		faults = []faultCell{{}}
	}
	var results []soak.Result
	for _, n := range ns {
		for _, r := range rates {
			for _, s := range sigmas {
				for i, f := range faults {
					c := base
					c.Servers, c.Rate, c.Hetero, c.Fault, c.Slow, c.Tail = int(n), r, s, f.rate, f.slow, f.tail
					if f.tail > 0 {
						c.TailMs = *slowTailMs
					}
					if i == 0 {
						c.FleetFault = *fleetFault
					} else {
						c.ServerDays = 0 // the healthy days and the incidents once per cell
					}
					if err := ctx.Err(); err != nil {
						return fmt.Errorf("soak: stopped: %w", err)
					}
					if *randomFleets {
						fmt.Fprintf(stderr, "soak: random fleets fault %g slow %g fleet fault %g...\n", f.rate, f.slow, c.FleetFault)
					} else {
						fmt.Fprintf(stderr, "soak: N=%d %g req/s sigma %g fault %g slow %g fleet fault %g...\n", c.Servers, r, s, f.rate, f.slow, c.FleetFault)
					}
					res, err := soak.Run(c, *workers)
					if err != nil {
						return fmt.Errorf("soak: N=%d rate %g: %w", c.Servers, r, err)
					}
					results = append(results, res)
				}
			}
		}
	}
	test := "sequential (CUSUM)"
	if *windowed {
		test = "windowed (rules.Test, 60 s, every second)"
	}
	every := "every second"
	if d := time.Duration(evidenceCheck); d != time.Second {
		every = "every " + d.String()
	}
	if agentPolicy != nil {
		fmt.Fprintf(stdout, "soak: %s; the rules' %s test, %s of simulated traffic; seeds %s\n", pf.describe(), test, every, *seeds)
	} else {
		fmt.Fprintf(stdout, "soak: the rules' %s test, %s of simulated traffic; seeds %s\n", test, every, *seeds)
	}
	WriteSoakTable(stdout, results)
	if *jsonOut != "" {
		raw, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return fmt.Errorf("soak: %w", err)
		}
		if err := os.WriteFile(*jsonOut, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("soak: writing %s: %w", *jsonOut, err)
		}
	}
	if err := checkPromise(results, *maxRate, *maxHigh); err != nil {
		return err
	}
	return checkCycles(results, *maxDay, *maxFleet)
}

// checkNoiseFlags checks issue 41's flags against each other, in the
// flags' own names.
func checkNoiseFlags(spread float64, bursts bool, fleetFault float64, faulty int, fault bool) error {
	var errs []error
	if !(spread >= 0 && spread <= 3600) {
		errs = append(errs, fmt.Errorf("--burst-spread %v: want seconds in [0, 3600]", spread))
	} else if spread > 0 && !bursts {
		errs = append(errs, fmt.Errorf("--burst-spread %v: needs --bursts to spread", spread))
	}
	if !(fleetFault >= 0 && fleetFault < 1) {
		errs = append(errs, fmt.Errorf("--fleet-fault %v: want a 5xx rate in [0, 1)", fleetFault))
	}
	if faulty < 1 {
		errs = append(errs, fmt.Errorf("--faulty %d: want at least 1", faulty))
	} else if faulty > 1 && !fault {
		errs = append(errs, fmt.Errorf("--faulty %d: needs --fault, the rate they fail at", faulty))
	}
	return errors.Join(errs...)
}

// checkCycles fails when a server was drained more than maxDay times in
// one day, or a cell's fleet-wide incidents drained more than maxFleet
// per 1,000 incident-hours (0: never).
func checkCycles(results []soak.Result, maxDay int, maxFleet float64) error {
	for _, r := range results {
		if maxDay > 0 && r.ServerDays > 0 && r.MostOneServerOneDay > maxDay {
			return fmt.Errorf("soak: %s: a server drained %d times in one day, over %d", r.Cell, r.MostOneServerOneDay, maxDay)
		}
		if maxFleet > 0 && r.FleetFaultPer1000 != nil && *r.FleetFaultPer1000 > maxFleet {
			return fmt.Errorf("soak: %s: %.2f drains per 1,000 fleet-wide incident-hours, over %g", r.Cell, *r.FleetFaultPer1000, maxFleet)
		}
	}
	return nil
}

// checkPromise fails when a cell's false drains break the given bounds.
func checkPromise(results []soak.Result, maxRate, maxHigh float64) error {
	for _, r := range results {
		if r.ServerDays == 0 {
			continue
		}
		if maxRate > 0 && r.FalseDrainsPer1000 > maxRate {
			return fmt.Errorf("soak: %s: %.2f false drains per 1,000 server-days, over %g", r.Cell, r.FalseDrainsPer1000, maxRate)
		}
		if maxHigh > 0 && r.High95 >= maxHigh {
			return fmt.Errorf("soak: %s: 95%% upper end %.2f, not under %g", r.Cell, r.High95, maxHigh)
		}
	}
	return nil
}

// WriteSoakTable prints one row per result; the zone's, the most drains
// of one server in a day, and the fleet-wide incidents' columns only
// where a result has them.
func WriteSoakTable(w io.Writer, results []soak.Result) {
	var zone, days, fleet, model bool
	for _, r := range results {
		zone = zone || r.ZoneServerDays > 0 || r.DegradedServerDays > 0
		days = days || r.ServerDays > 0
		fleet = fleet || r.FleetFaultPer1000 != nil
		model = model || r.ModelCalls != nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "cell\tserver-days\tfalse drains\tper 1,000 server-days [95%]\t"
	if zone {
		head = "cell\tserver-days\thealthy\tfalse drains\tper 1,000 healthy server-days [95%]\tzone days\tzone drains\t"
	}
	if days {
		head += "most a server-day\t"
	}
	if fleet {
		head += "fleet fault\tincident-h\tdrains\tper 1,000 incident-h [95% upper]\t"
	}
	head += "fault\tfound\tmedian s\tp90 s\tbound s\tmedian/bound\t"
	if model {
		head += "model calls\tper server-day\tmodel actions\tof them healthy drains\tzone drains\tfinds\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range results {
		row := r.Cell + "\t"
		switch {
		case r.ServerDays > 0 && zone:
			row += fmt.Sprintf("%.0f\t%.0f\t%d\t%.2f [%.2f, %.2f]\t%.0f\t%d\t", r.ServerDays, r.HealthyServerDays, r.FalseDrains, r.FalseDrainsPer1000, r.Low95, r.High95,
				r.ZoneServerDays, r.ZoneDrains)
		case r.ServerDays > 0:
			row += fmt.Sprintf("%.0f\t%d\t%.2f [%.2f, %.2f]\t", r.ServerDays, r.FalseDrains, r.FalseDrainsPer1000, r.Low95, r.High95)
		case zone:
			row += "-\t-\t-\t-\t-\t-\t"
		default:
			row += "-\t-\t-\t"
		}
		if days {
			if r.ServerDays > 0 {
				row += fmt.Sprintf("%d\t", r.MostOneServerOneDay)
			} else {
				row += "-\t"
			}
		}
		if fleet {
			if r.FleetFaultPer1000 != nil {
				row += fmt.Sprintf("%.3g%%\t%.0f\t%d\t%.2f [%.2f]\t", 100*r.FleetFault, r.IncidentHours, r.FleetFaultDrains, *r.FleetFaultPer1000, r.FleetFaultHigh95)
			} else {
				row += "-\t-\t-\t-\t"
			}
		}
		flt := "-\t-\t-\t-\t-\t-"
		if r.Fault > 0 || r.Slow > 0 || r.Tail > 0 {
			kind := fmt.Sprintf("%.3g%%", 100*r.Fault)
			if r.Faulty > 1 {
				kind = fmt.Sprintf("%d at %.3g%%", r.Faulty, 100*r.Fault)
			}
			if r.Slow > 0 {
				kind = fmt.Sprintf("slow %g×", r.Slow)
			}
			if r.Tail > 0 {
				kind = fmt.Sprintf("tail %.3g%%", 100*r.Tail)
			}
			bound := "-\t-"
			if r.Bound > 0 {
				bound = fmt.Sprintf("%.1f\t%.2f", r.Bound, r.DetectMedian/r.Bound)
			}
			flt = fmt.Sprintf("%s\t%d/%d\t%.1f\t%.1f\t%s", kind, r.Trials-r.Missed, r.Trials, r.DetectMedian, r.DetectP90, bound)
			if r.Missed == r.Trials {
				flt = fmt.Sprintf("%s\t0/%d\t-\t-\t-\t-", kind, r.Trials)
			}
		}
		if model {
			flt += "\t" + modelColumns(r)
		}
		fmt.Fprintf(tw, "%s%s\t\n", row, flt)
	}
	tw.Flush()
}

// parseRestarts reads HOURS:SECONDS.
func parseRestarts(s string) (soak.Restarts, error) {
	h, d, ok := strings.Cut(s, ":")
	every, err1 := strconv.ParseFloat(h, 64)
	down, err2 := strconv.ParseFloat(d, 64)
	if !ok || err1 != nil || err2 != nil || !(every > 0 && every <= 1e6) || !(down > 0 && down <= 3600) {
		return soak.Restarts{}, fmt.Errorf("--restarts %q: want HOURS:SECONDS, hours above zero and seconds in (0, 3600], such as 6:3", s)
	}
	return soak.Restarts{EveryHours: every, Down: time.Duration(down * float64(time.Second))}, nil
}

// secondsValue is a duration flag that takes seconds too (0.1 or 100ms).
type secondsValue time.Duration

func (v *secondsValue) String() string { return time.Duration(*v).String() }

func (v *secondsValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		f, err2 := strconv.ParseFloat(s, 64)
		if err2 != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("want a duration (100ms, 2s) or seconds (0.1)")
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 100*time.Millisecond || d > time.Minute {
		return fmt.Errorf("%v outside [100ms, 1m] (the agent's least is 100ms)", d)
	}
	*v = secondsValue(d)
	return nil
}

func floats(name, s string) ([]float64, error) {
	var out []float64
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: want numbers, comma-separated", name, s)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseBursts reads HOURS:MIN-MAX.
func parseBursts(s string) (soak.Bursts, error) {
	bad := fmt.Errorf("--bursts %q: want HOURS:MIN-MAX, such as 6:3-10", s)
	h, r, ok := strings.Cut(s, ":")
	lo, hi, ok2 := strings.Cut(r, "-")
	if !ok || !ok2 {
		return soak.Bursts{}, bad
	}
	var b soak.Bursts
	var err error
	if b.EveryHours, err = strconv.ParseFloat(h, 64); err != nil || b.EveryHours <= 0 {
		return soak.Bursts{}, bad
	}
	if b.Min, err = strconv.Atoi(lo); err != nil {
		return soak.Bursts{}, bad
	}
	if b.Max, err = strconv.Atoi(hi); err != nil || b.Max < b.Min || b.Min < 1 {
		return soak.Bursts{}, bad
	}
	return b, nil
}

// cmdSoakCost prints what the agent's loop costs as the fleet grows.
func cmdSoakCost(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("hapilot-bench soak cost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("sizes", "10:1,100:10,1000:100,10000:100,10000:1000", "SERVERS:BACKENDS pairs, comma-separated")
	rate := fs.Float64("rate", 33, "requests per second per server")
	steps := fs.Int("steps", 20, "scheduled steps measured by hand")
	intervals := fs.Int("intervals", 10, "10 s intervals measured under Run (a step and nine evidence checks each)")
	jsonOut := fs.String("json", "", "write the results to this JSON file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var results []soak.CostResult
	for _, pair := range strings.Split(*sizes, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(pair), ":")
		n, err1 := strconv.Atoi(a)
		k, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("--sizes %q: want SERVERS:BACKENDS pairs, such as 1000:100", *sizes)
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("soak cost: stopped: %w", err)
		}
		fmt.Fprintf(stderr, "soak cost: %d servers over %d backends...\n", n, k)
		r, err := soak.Cost(n, k, *rate, *steps, *intervals)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	fmt.Fprintf(stdout, "soak cost: the real loop (agent.Loop, rules, guardrails, window store, fake runtime socket) on an injected clock, %g req/s a server, 0.2%% 5xx; CPU of this process (user+system) while the loop ran, the traffic's injection left out; the agent's defaults (interval 10 s, evidence check 1 s, no --audit-steps)\n", *rate)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "servers\tbackends\tCPU per step ms\tCPU per check ms\tCPU per 10 s interval ms\tone core busy\theap MB\t--audit-steps bytes/day\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.2f\t%.1f\t%.2f%%\t%.1f\t%.0f\t\n", r.Servers, r.Backends, r.StepCPUms, r.CheckCPUms, r.IntervalCPUms,
			100*r.IntervalCPUms/10000, r.HeapMB, r.AuditBytesPerDay)
	}
	tw.Flush()
	if *jsonOut != "" {
		raw, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return fmt.Errorf("soak cost: %w", err)
		}
		if err := os.WriteFile(*jsonOut, append(raw, '\n'), 0o644); err != nil {
			return fmt.Errorf("soak cost: writing %s: %w", *jsonOut, err)
		}
	}
	return nil
}

// parseShapes reads --flap ON:OFF (seconds) and --latency MS:SIGMA.
func parseShapes(flap, latency string, hetero float64) (soak.Flap, soak.Latency, error) {
	var fl soak.Flap
	var lat soak.Latency
	if flap != "" {
		on, off, ok := strings.Cut(flap, ":")
		a, err1 := strconv.ParseFloat(on, 64)
		b, err2 := strconv.ParseFloat(off, 64)
		if !ok || err1 != nil || err2 != nil || !(a > 0 && b > 0) {
			return fl, lat, fmt.Errorf("--flap %q: want ON:OFF, seconds above zero", flap)
		}
		fl = soak.Flap{On: time.Duration(a * float64(time.Second)), Off: time.Duration(b * float64(time.Second))}
	}
	if latency != "" {
		ms, sd, ok := strings.Cut(latency, ":")
		a, err1 := strconv.ParseFloat(ms, 64)
		b, err2 := strconv.ParseFloat(sd, 64)
		if !ok || err1 != nil || err2 != nil {
			return fl, lat, fmt.Errorf("--latency %q: want MS:SIGMA", latency)
		}
		lat = soak.Latency{MedianMs: a, Sigma: b, Hetero: hetero}
	} else if hetero != 0 {
		return fl, lat, fmt.Errorf("--latency-hetero needs --latency")
	}
	return fl, lat, nil
}

// modelColumns are the LLM policy's figures in WriteSoakTable.
func modelColumns(r soak.Result) string {
	if r.ModelCalls == nil {
		return "-\t-\t-\t-\t-\t-"
	}
	per := "-"
	if r.CallsPerServerDay != nil {
		per = fmt.Sprintf("%.2f", *r.CallsPerServerDay)
	}
	return fmt.Sprintf("%d\t%s\t%d\t%d\t%d\t%d", *r.ModelCalls, per, *r.ModelActions, *r.ModelHealthyDrains, r.ModelZoneDrains, r.ModelFinds)
}
