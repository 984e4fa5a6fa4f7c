// Package soak runs simulated server-days through the rules' sequential
// test as the agent's loop runs it: every evidence check (Cell.EvidenceCheck,
// one second unless set), every server's new requests and 5xx (Poisson
// traffic, binomial errors) are one chunk of rules.Sequential.Step, the
// exact function Policy.Evidence calls on the windows' counts every
// EvidenceCheck. It does not build the loop's observations or the runtime
// socket's replies: at 10,000 server-days (864 million server-seconds)
// that path would take hours; TestSoakAgreesWithTheLoop checks that the
// loop, on the same traffic, drains when the soak says.
//
// Cell.Agent runs the same days through an agent policy instead, the
// rules or the LLM policy behind their floor (agent.go): the loop's
// cadence, the policy's Decide on observations built from the same
// counts, and the guardrails. It is slower, and the only path a model's
// decisions can be measured on (issue 44).
//
// What it counts:
//   - a false drain: the test condemning a server in the healthy region
//     (rules.Config.Region of its own healthy rate against its backend's
//     lower median; bursts and restarts left out). The server is then out
//     for DrainFor, as the probe cooldown keeps it, and comes back with
//     its evidence reset. Every condemnation counts, as if the guardrails
//     let all through: the figure is an upper bound. Drains of servers in
//     the zone are counted apart, and so is the most drains one server got
//     in one day;
//   - a fault's time to detect: Faulty servers' error rate jumps to Fault
//     at a random time after Warmup of steady healthy traffic; the time
//     from the jump to the end of the chunk that condemns each. Or its
//     answers slow down (Cell.Slow, with Cell.Latency: latency.go), or
//     either fault comes and goes (Cell.Flap);
//   - a fleet-wide incident's drains: every server steps to FleetFault
//     together for an hour (Cell.FleetFault).
package soak

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
)

// Bursts: one burst of Min to Max errors every EveryHours per server on
// average, beginning at a uniform point of a chunk and spread uniformly
// over Cell.BurstSpread (one second unless set: it then straddles two
// chunks at a random point, as the loop's checks do not fall on the
// windows' seconds). Its errors are requests too, in N and X.
type Bursts struct {
	EveryHours float64
	Min, Max   int
}

// Restarts: each server restarts on average every EveryHours (a Poisson
// process) and refuses connections for Down. Each request to it meanwhile
// is an error in its counts (N and X), as HAProxy reports a refused
// connection that its retries then carry elsewhere: the agent counts the
// retry against the server.
type Restarts struct {
	EveryHours float64
	Down       time.Duration
}

// FleetFaultFor is how long a fleet-wide incident (Cell.FleetFault) lasts.
const FleetFaultFor = time.Hour

// The random fleets' ranges (Cell.RandomFleets): each backend-day draws
// its servers uniformly over [RandomMinServers, RandomMaxServers], its
// rate per server log-uniformly over [RandomMinRate, RandomMaxRate], its
// median 5xx rate log-uniformly over [RandomMinNoise, RandomMaxNoise], its
// spread σ uniformly over [0, RandomMaxHetero]; bursts of K errors, K
// uniform over 0–RandomMaxBurst (0: none that day), every log-uniform
// RandomBurstHours, spread uniformly over RandomBurstSpread seconds; and
// restarts every log-uniform RandomRestartHours, down for log-uniform
// RandomRestartDown seconds.
const (
	RandomMinServers, RandomMaxServers = 2, 100
	RandomMinRate, RandomMaxRate       = 0.5, 500.0
	RandomMinNoise, RandomMaxNoise     = 0.0005, 0.02
	RandomMaxHetero                    = 0.6
	RandomMaxBurst                     = 50
)

var (
	RandomBurstHours   = [2]float64{1, 24}
	RandomBurstSpread  = [2]float64{1, 5}
	RandomRestartHours = [2]float64{6, 48}
	RandomRestartDown  = [2]float64{0.5, 3}
)

// Cell is one noise model, and the fault to find in it.
type Cell struct {
	Servers int     // per backend
	Rate    float64 // requests per second per server, on average
	Noise   float64 // healthy 5xx rate (the fleet's median)
	Hetero  float64 // lognormal sigma of the healthy servers' rates
	Bursts  Bursts
	// Diurnal is the swing of the traffic over a day: rate × (1 + Diurnal
	// × sin(2πt/day)); Uneven the lognormal sigma of each server's share.
	Diurnal, Uneven float64
	// Fault is the faulty server's 5xx rate (0: healthy days only).
	Fault      float64
	ServerDays float64 // healthy server-days to run, all seeds together
	Seeds      []uint64
	// Trials is how many fault onsets each seed runs.
	Trials int
	Warmup time.Duration
	// DrainFor is how long a condemned healthy server stays out.
	DrainFor time.Duration
	Config   rules.Config
	// Windowed runs the test the rules ran before the sequential one
	// (rules.Policy.Test on a 60 s window, every second), for comparison.
	Windowed bool
	// Flap makes the fault (5xx or slow) intermittent: on for Flap.On,
	// off for Flap.Off, from the onset on.
	Flap Flap
	// Latency simulates answer times and runs the rules' latency test
	// (rules.Policy.Slow) beside the sequential one; Slow is the slow
	// fault: the faulty server's median answer time times Slow.
	Latency Latency
	Slow    float64
	// Tail is the slow tail: this share of the faulty server's answers
	// take TailMs (1,500 when 0) from the onset on, its median unchanged
	// (with Latency). The onset is when its first slow answers arrive.
	Tail   float64
	TailMs float64
	// Restarts: each server's restarts, a burst of refused connections.
	Restarts Restarts
	// BurstSpread: each burst's errors fall uniformly over this long (0:
	// one second).
	BurstSpread time.Duration
	// FleetFault: when above zero, Trials a seed of fleet-wide incidents:
	// every server steps to this 5xx rate together for FleetFaultFor, at a
	// random time 0–600 s after Warmup. Drains in them are counted per
	// incident-hour.
	FleetFault float64
	// Faulty is how many servers fail at once in the fault trials (0: one).
	Faulty int
	// EvidenceCheck is a chunk's length, the check's cadence (0: one
	// second).
	EvidenceCheck time.Duration
	// RandomFleets: each backend-day (and each trial) draws its own
	// servers, rate, noise, spread, bursts and restarts from the Random
	// ranges above; Servers, Rate, Noise, Hetero, Bursts, BurstSpread and
	// Restarts are then ignored.
	RandomFleets bool
	// Agent, when set, runs each fleet through an agent policy, the
	// loop's cadence and the guardrails included (agent.go), instead of
	// the sequential test alone.
	Agent *AgentPolicy
}

// dt is a chunk's length in seconds.
func (c Cell) dt() float64 {
	if c.EvidenceCheck <= 0 {
		return 1
	}
	return c.EvidenceCheck.Seconds()
}

// tailMs is the slow tail's answer time.
func (c Cell) tailMs() float64 {
	if c.TailMs > 0 {
		return c.TailMs
	}
	return 1500
}

// faulty is how many servers fail in a fault trial.
func (c Cell) faulty() int { return max(c.Faulty, 1) }

// Flap is an intermittent fault's on and off periods (zero: steady).
type Flap struct{ On, Off time.Duration }

// on is whether a fault that began at onset is on at time t.
func (fl Flap) on(t, onset float64) bool {
	if fl.On <= 0 {
		return true
	}
	on, off := fl.On.Seconds(), fl.Off.Seconds()
	return math.Mod(max(t-onset, 0), on+off) < on
}

// Validate checks a cell's settings.
func (c Cell) Validate() error {
	var errs []error
	if !c.RandomFleets && (c.Servers < 2 || c.Servers > 100000) {
		errs = append(errs, fmt.Errorf("servers %d outside [2, 100000]", c.Servers))
	}
	if !c.RandomFleets && !(c.Rate > 0 && c.Rate <= 1e5) {
		errs = append(errs, fmt.Errorf("rate %v outside (0, 1e5]", c.Rate))
	}
	if !(c.Noise >= 0 && c.Noise < 0.5) || !(c.Fault >= 0 && c.Fault < 1) {
		errs = append(errs, fmt.Errorf("noise %v or fault %v outside [0, 0.5) and [0, 1)", c.Noise, c.Fault))
	}
	if !(c.Hetero >= 0 && c.Hetero <= 2) || !(c.Uneven >= 0 && c.Uneven <= 2) || !(c.Diurnal >= 0 && c.Diurnal < 1) {
		errs = append(errs, fmt.Errorf("hetero %v, uneven %v outside [0, 2] or diurnal %v outside [0, 1)", c.Hetero, c.Uneven, c.Diurnal))
	}
	if c.Bursts.EveryHours < 0 || (c.Bursts.EveryHours > 0 && (c.Bursts.Min < 1 || c.Bursts.Max < c.Bursts.Min)) {
		errs = append(errs, fmt.Errorf("bursts %+v: every > 0 hours and 1 <= min <= max", c.Bursts))
	}
	if c.ServerDays < 0 || len(c.Seeds) < 1 || c.Trials < 0 {
		errs = append(errs, fmt.Errorf("server-days %v, seeds %v, trials %d", c.ServerDays, c.Seeds, c.Trials))
	}
	if c.Flap.On < 0 || c.Flap.Off < 0 || (c.Flap.On == 0) != (c.Flap.Off == 0) {
		errs = append(errs, fmt.Errorf("flap %v:%v: both periods above zero, or both zero", c.Flap.On, c.Flap.Off))
	}
	if err := c.Latency.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Slow != 0 && (!(c.Slow > 1 && c.Slow <= 1000) || c.Latency.MedianMs == 0) {
		errs = append(errs, fmt.Errorf("slow %v: want (1, 1000] times the median, with a latency model", c.Slow))
	}
	if c.Tail != 0 && (!(c.Tail > 0 && c.Tail < 1) || c.Latency.MedianMs == 0 || !(c.TailMs >= 0 && c.TailMs <= 60000)) {
		errs = append(errs, fmt.Errorf("slow tail %v at %v ms: want a share in (0, 1) at up to 60,000 ms, with a latency model", c.Tail, c.TailMs))
	}
	if c.Restarts != (Restarts{}) && !(c.Restarts.EveryHours > 0 && c.Restarts.Down > 0 && c.Restarts.Down <= time.Hour) {
		errs = append(errs, fmt.Errorf("restarts every %v hours, down %v: want hours above zero and down in (0, 1h]", c.Restarts.EveryHours, c.Restarts.Down))
	}
	if c.BurstSpread < 0 || c.BurstSpread > time.Hour {
		errs = append(errs, fmt.Errorf("burst spread %v outside [0, 1h]", c.BurstSpread))
	} else if c.BurstSpread > 0 && c.Bursts.EveryHours == 0 && !c.RandomFleets {
		errs = append(errs, fmt.Errorf("burst spread %v without bursts to spread", c.BurstSpread))
	}
	if !(c.FleetFault >= 0 && c.FleetFault < 1) {
		errs = append(errs, fmt.Errorf("fleet fault %v outside [0, 1)", c.FleetFault))
	}
	if c.Faulty < 0 || (c.Faulty > 1 && c.Fault == 0) || (c.Faulty > 0 && !c.RandomFleets && c.Faulty >= c.Servers) ||
		(c.Faulty > RandomMinServers-1 && c.RandomFleets) {
		errs = append(errs, fmt.Errorf("faulty %d: want at least one and fewer than the servers (%d; %d with random fleets), with a 5xx fault (all of them failing is the fleet fault)",
			c.Faulty, c.Servers, RandomMinServers-1))
	}
	if c.EvidenceCheck != 0 && (c.EvidenceCheck < 100*time.Millisecond || c.EvidenceCheck > time.Minute) {
		errs = append(errs, fmt.Errorf("evidence check %v outside [100ms, 1m] (the agent's least is 100ms)", c.EvidenceCheck))
	} else if c.dt() != 1 && (c.Windowed || c.Latency.MedianMs > 0) {
		errs = append(errs, fmt.Errorf("evidence check %v: the windowed test and the latency model are simulated a second at a time", c.EvidenceCheck))
	}
	if c.RandomFleets && c.Windowed {
		errs = append(errs, errors.New("random fleets with the windowed test: not simulated"))
	}
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("rules: %w", err))
	}
	if c.Agent != nil {
		if err := c.Agent.validate(); err != nil {
			errs = append(errs, err)
		}
		if c.dt() != 1 || c.Windowed {
			errs = append(errs, errors.New("an agent policy: simulated with one-second checks and the sequential test"))
		}
	}
	return errors.Join(errs...)
}

// Result is a cell's figures.
type Result struct {
	Cell     string  `json:"cell"`
	Servers  int     `json:"servers"`
	Rate     float64 `json:"rate"`
	Noise    float64 `json:"noise"`
	Hetero   float64 `json:"hetero"`
	Bursts   string  `json:"bursts,omitempty"`
	Diurnal  float64 `json:"diurnal,omitempty"`
	Uneven   float64 `json:"uneven,omitempty"`
	Restarts string  `json:"restarts,omitempty"`
	// BurstSpread in seconds (0: one second).
	BurstSpread float64 `json:"burst_spread_s,omitempty"`
	// EvidenceCheck: a chunk's seconds.
	EvidenceCheck float64 `json:"evidence_check_s"`
	RandomFleets  bool    `json:"random_fleets,omitempty"`
	// ServerDays: all the healthy days' servers (the sum of N over the
	// backend-days); HealthyServerDays and ZoneServerDays those whose own
	// healthy rate lies in the healthy region and in the zone
	// (rules.Config.Region against the backend's lower median), and
	// DegradedServerDays those a wide spread put in the degraded region
	// (their drains, DegradedDrains, are no false drains).
	ServerDays         float64 `json:"server_days"`
	HealthyServerDays  float64 `json:"healthy_server_days"`
	ZoneServerDays     float64 `json:"zone_server_days"`
	DegradedServerDays float64 `json:"degraded_server_days,omitempty"`
	// FalseDrains: drains of healthy-region servers. FalseDrainsPer1000 is
	// per 1,000 healthy-region server-days, with its exact Poisson 95%
	// interval.
	FalseDrains        int     `json:"false_drains"`
	FalseDrainsPer1000 float64 `json:"false_drains_per_1000_server_days"`
	Low95              float64 `json:"low_95"`
	High95             float64 `json:"high_95"`
	ZoneDrains         int     `json:"zone_drains"`
	DegradedDrains     int     `json:"degraded_drains,omitempty"`
	// MostOneServerOneDay: the most drains any healthy or zone server got
	// in one simulated day.
	MostOneServerOneDay int `json:"most_drains_one_server_one_day"`
	// The fleet-wide incidents: their hours, the drains in them, and those
	// per 1,000 incident-hours with the exact 95% interval.
	FleetFault        float64  `json:"fleet_fault,omitempty"`
	IncidentHours     float64  `json:"incident_hours,omitempty"`
	FleetFaultDrains  int      `json:"fleet_fault_drains,omitempty"`
	FleetFaultPer1000 *float64 `json:"fleet_fault_drains_per_1000_incident_hours,omitempty"`
	FleetFaultHigh95  float64  `json:"fleet_fault_high_95,omitempty"`
	Fault             float64  `json:"fault,omitempty"`
	Faulty            int      `json:"faulty,omitempty"`
	Slow              float64  `json:"slow,omitempty"`
	Tail              float64  `json:"tail,omitempty"`
	TailMs            float64  `json:"tail_ms,omitempty"`
	Flap              string   `json:"flap,omitempty"`
	Latency           string   `json:"latency,omitempty"`
	Trials            int      `json:"trials,omitempty"`
	Missed            int      `json:"missed,omitempty"`
	// DetectMedian and DetectP90 are over every faulty server of every
	// trial; a trial is missed when any of its faulty servers is.
	DetectMedian float64 `json:"detect_median_s,omitempty"`
	DetectP90    float64 `json:"detect_p90_s,omitempty"`
	// FoundLow95 and FoundHigh95 bound the share of trials found (exact
	// binomial 95%); MedianLow95 and MedianHigh95 the median time to
	// detect (order statistics, at least 95%).
	FoundLow95   float64 `json:"found_low_95,omitempty"`
	FoundHigh95  float64 `json:"found_high_95,omitempty"`
	MedianLow95  float64 `json:"detect_median_low_95_s,omitempty"`
	MedianHigh95 float64 `json:"detect_median_high_95_s,omitempty"`
	// Bound is ln(ARL)/KL in seconds, ARL the requests of one server over
	// the promised 1,000 days between false drains, KL that of the fault
	// against the healthy rate: the least mean delay any test with that
	// false-alarm rate can have (Lorden 1971). The checks' cadence comes
	// on top.
	Bound float64 `json:"bound_s,omitempty"`
	// FaultFalseDrains: other servers condemned during the fault trials,
	// and any before a fleet-wide incident's onset.
	FaultFalseDrains int `json:"fault_trials_false_drains,omitempty"`
	// The agent path (Cell.Agent): the policy, its steps, and for the
	// LLM policy its model's calls and actions. ModelActions are the
	// model's actions beyond the floor that the guardrails let through;
	// ModelHealthyDrains those of them that drained a healthy-region
	// server (healthy days and fault trials), ModelZoneDrains a zone
	// server; ModelFinds its drains of a faulty server before the floor
	// drained it; ModelCuts its weight cuts. ModelRefused: its actions
	// the guardrails refused; ModelUnsupported: its drains and cuts the
	// windows did not support (dropped by the policy). CallsPerServerDay
	// is over the healthy days' server-days.
	Policy             string   `json:"policy,omitempty"`
	Steps              int      `json:"steps,omitempty"`
	ModelCalls         *int     `json:"model_calls,omitempty"`
	CallsPerServerDay  *float64 `json:"model_calls_per_server_day,omitempty"`
	CallMeanMs         float64  `json:"model_call_mean_ms,omitempty"`
	ModelActions       *int     `json:"model_actions,omitempty"`
	ModelHealthyDrains *int     `json:"model_healthy_drains,omitempty"`
	ModelZoneDrains    int      `json:"model_zone_drains,omitempty"`
	ModelFinds         int      `json:"model_finds,omitempty"`
	ModelCuts          int      `json:"model_cuts,omitempty"`
	ModelRefused       int      `json:"model_refused,omitempty"`
	ModelUnsupported   int      `json:"model_unsupported,omitempty"`
	ModelFallbacks     int      `json:"model_fallbacks,omitempty"`
	PolicyErrors       int      `json:"policy_errors,omitempty"`
	WallSeconds        float64  `json:"wall_s"`
}

// perSeed runs f once a seed, with a generator of its own (the seed, on
// stream), on up to workers goroutines (0: one a core), each owned here
// and waited for.
func perSeed(seeds []uint64, workers int, stream uint64, f func(i int, rng *rand.Rand)) {
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, seed := range seeds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i, rand.New(rand.NewPCG(seed, stream)))
		}()
	}
	wg.Wait()
}

// onsetTrial is one fault onset: the first k servers fail at Cell.Fault from
// onset on, each one's time to condemnation in delays (-1: missed); or,
// with fleet, every server at Cell.FleetFault, its drains in incident.
type onsetTrial struct {
	onset    float64
	k        int
	fleet    bool
	delays   []float64
	incident int
}

// tally is one seed's counts.
type tally struct {
	days, healthyDays, zoneDays, degDays float64
	falses, zone, deg, most, faultFalses int
	missed, incidents, incidentDrains    int
	delays                               []float64
	// the agent path's
	agent                   agentCounts
	dayCalls                int
	modelHealthy, modelZone int
	llm                     bool
	err                     error
}

// model counts the model's drains of healthy-region and zone servers.
func (o *tally) model(region []rules.Region, drains []int) {
	for i, r := range region {
		switch r {
		case rules.RegionHealthy:
			o.modelHealthy += drains[i]
		case rules.RegionZone:
			o.modelZone += drains[i]
		}
	}
}

// fleetDone adds a fleet's agent counts and ends its policy.
func (o *tally) fleetDone(f *fleet, healthyDay bool) {
	if f.err != nil && o.err == nil {
		o.err = f.err
	}
	if f.drv == nil {
		return
	}
	f.drv.close()
	o.agent.add(f.drv.counts)
	o.llm = o.llm || f.drv.llm
	if healthyDay {
		o.dayCalls += f.drv.counts.calls
	}
	o.model(f.region, f.modelDrains)
}

// day counts one backend-day: each server's drains by its region, and
// the most any healthy or zone server got.
func (o *tally) day(region []rules.Region, drains []int) {
	for i, r := range region {
		switch r {
		case rules.RegionHealthy:
			o.healthyDays++
			o.falses += drains[i]
		case rules.RegionZone:
			o.zoneDays++
			o.zone += drains[i]
		default:
			o.degDays++
			o.deg += drains[i]
			continue
		}
		o.most = max(o.most, drains[i])
	}
	o.days += float64(len(region))
}

// Run runs a cell: its healthy days, its fault trials and its fleet-wide
// incidents, the seeds on up to workers goroutines (perSeed).
func Run(c Cell, workers int) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	began := time.Now()
	outs := make([]tally, len(c.Seeds))
	perSeedDays := c.ServerDays / float64(len(c.Seeds))
	if !c.RandomFleets {
		// whole backend-days, as before
		perSeedDays = math.Ceil(c.ServerDays/float64(c.Servers)/float64(len(c.Seeds))) * float64(c.Servers)
	}
	perSeed(c.Seeds, workers, 0x50a4, func(si int, rng *rand.Rand) {
		o := &outs[si]
		for o.days < perSeedDays && o.err == nil {
			f := newFleet(c.draw(rng), rng)
			f.run(f.dryTill+86400, nil)
			o.day(f.region, f.drains)
			o.fleetDone(f, true)
		}
		warm := c.Warmup.Seconds()
		if c.Fault > 0 || c.Slow > 0 || c.Tail > 0 {
			for range c.Trials {
				if o.err != nil {
					break
				}
				f := newFleet(c.draw(rng), rng)
				tr := &onsetTrial{onset: warm + rng.Float64()*600, k: c.faulty()}
				tr.delays = make([]float64, tr.k)
				for i := range tr.delays {
					tr.delays[i] = -1
				}
				o.faultFalses += f.run(tr.onset+3600, tr)
				o.fleetDone(f, false)
				missed := false
				for _, d := range tr.delays {
					if d < 0 {
						missed = true
					} else {
						o.delays = append(o.delays, d)
					}
				}
				if missed {
					o.missed++
				}
			}
		}
		if c.FleetFault > 0 {
			for range c.Trials {
				if o.err != nil {
					break
				}
				f := newFleet(c.draw(rng), rng)
				tr := &onsetTrial{onset: warm + rng.Float64()*600, fleet: true}
				o.faultFalses += f.run(tr.onset+FleetFaultFor.Seconds(), tr)
				o.fleetDone(f, false)
				o.incidents++
				o.incidentDrains += tr.incident
			}
		}
	})
	r := Result{Servers: c.Servers, Rate: c.Rate, Noise: c.Noise, Hetero: c.Hetero, Diurnal: c.Diurnal, Uneven: c.Uneven, Fault: c.Fault, Slow: c.Slow,
		Tail: c.Tail, TailMs: c.tailMs(), EvidenceCheck: c.dt(), RandomFleets: c.RandomFleets, BurstSpread: c.BurstSpread.Seconds()}
	if c.RandomFleets {
		r.Servers, r.Rate, r.Noise, r.Hetero, r.BurstSpread = 0, 0, 0, 0, 0
	}
	if c.Flap.On > 0 {
		r.Flap = fmt.Sprintf("%g:%g", c.Flap.On.Seconds(), c.Flap.Off.Seconds())
	}
	if c.Latency.MedianMs > 0 {
		r.Latency = c.Latency.String()
	}
	if c.Bursts.EveryHours > 0 && !c.RandomFleets {
		r.Bursts = fmt.Sprintf("%g:%d-%d", c.Bursts.EveryHours, c.Bursts.Min, c.Bursts.Max)
	}
	if c.Restarts.EveryHours > 0 && !c.RandomFleets {
		r.Restarts = fmt.Sprintf("%g:%g", c.Restarts.EveryHours, c.Restarts.Down.Seconds())
	}
	var delays []float64
	var ag agentCounts
	var dayCalls, modelHealthy, llmPolicy = 0, 0, false
	for _, o := range outs {
		if o.err != nil {
			return Result{}, o.err
		}
		ag.add(o.agent)
		dayCalls += o.dayCalls
		modelHealthy += o.modelHealthy
		r.ModelZoneDrains += o.modelZone
		llmPolicy = llmPolicy || o.llm
		r.ServerDays += o.days
		r.HealthyServerDays += o.healthyDays
		r.ZoneServerDays += o.zoneDays
		r.DegradedServerDays += o.degDays
		r.FalseDrains += o.falses
		r.ZoneDrains += o.zone
		r.DegradedDrains += o.deg
		r.MostOneServerOneDay = max(r.MostOneServerOneDay, o.most)
		r.FaultFalseDrains += o.faultFalses
		r.Missed += o.missed
		r.IncidentHours += float64(o.incidents) * FleetFaultFor.Hours()
		r.FleetFaultDrains += o.incidentDrains
		delays = append(delays, o.delays...)
	}
	if r.HealthyServerDays > 0 {
		lo, hi := PoissonInterval(r.FalseDrains, 0.05)
		k := 1000 / r.HealthyServerDays
		r.FalseDrainsPer1000, r.Low95, r.High95 = float64(r.FalseDrains)*k, lo*k, hi*k
	}
	if c.Tail == 0 {
		r.TailMs = 0
	}
	if c.Fault > 0 || c.Slow > 0 || c.Tail > 0 {
		r.Trials = c.Trials * len(c.Seeds)
		r.DetectMedian, r.DetectP90 = quantile(delays, 0.5), quantile(delays, 0.9)
		r.FoundLow95, r.FoundHigh95 = BinomialInterval(r.Trials-r.Missed, r.Trials, 0.05)
		r.MedianLow95, r.MedianHigh95 = MedianInterval(delays, 0.05)
		if c.Faulty > 1 {
			r.Faulty = c.Faulty
		}
	}
	if c.FleetFault > 0 {
		r.FleetFault = c.FleetFault
		_, hi := PoissonInterval(r.FleetFaultDrains, 0.05)
		per := float64(r.FleetFaultDrains) * 1000 / r.IncidentHours
		r.FleetFaultPer1000, r.FleetFaultHigh95 = &per, hi*1000/r.IncidentHours
		if r.Trials == 0 {
			r.Trials = c.Trials * len(c.Seeds)
		}
	}
	if c.Fault > 0 && c.Flap.On == 0 && !c.RandomFleets {
		// The bound is a steady fault's; a flapping one's would depend on
		// where its on periods fall, a random fleet's on its draw.
		r.Bound = Bound(c.Fault, c.Noise, c.Rate, 1000)
	}
	if c.Tail > 0 && c.Flap.On == 0 && !c.RandomFleets && c.Latency.Hetero == 0 && c.Uneven == 0 {
		// identical servers: p0 is the healthy share over the threshold
		p0 := c.Latency.healthyTail(c.Config)
		r.Bound = Bound(c.Tail+(1-c.Tail)*p0, p0, c.Rate, 1000)
	}
	if c.Agent != nil {
		r.Policy, r.Steps, r.PolicyErrors = c.Agent.Name, ag.steps, ag.policyErrors
	}
	if llmPolicy {
		calls, actions := ag.calls, ag.model
		r.ModelCalls, r.ModelActions, r.ModelHealthyDrains = &calls, &actions, &modelHealthy
		if r.ServerDays > 0 {
			per := float64(dayCalls) / r.ServerDays
			r.CallsPerServerDay = &per
		}
		if calls > 0 {
			r.CallMeanMs = ag.callWall / float64(calls)
		}
		r.ModelFinds, r.ModelRefused, r.ModelUnsupported, r.ModelFallbacks = ag.modelFinds, ag.modelRefused, ag.unsupported, ag.fallbacks
		r.ModelCuts = ag.modelCuts
	}
	r.Cell = r.name()
	r.WallSeconds = time.Since(began).Seconds()
	return r, nil
}

// draw is the cell a backend-day runs: c itself, or with RandomFleets
// one drawn from the Random ranges.
func (c Cell) draw(rng *rand.Rand) Cell {
	if !c.RandomFleets {
		return c
	}
	d := c
	d.Servers = RandomMinServers + rng.IntN(RandomMaxServers-RandomMinServers+1)
	d.Rate = logUniform(rng, RandomMinRate, RandomMaxRate)
	d.Noise = logUniform(rng, RandomMinNoise, RandomMaxNoise)
	d.Hetero = RandomMaxHetero * rng.Float64()
	d.Bursts, d.BurstSpread = Bursts{}, 0
	if k := rng.IntN(RandomMaxBurst + 1); k > 0 {
		d.Bursts = Bursts{EveryHours: logUniform(rng, RandomBurstHours[0], RandomBurstHours[1]), Min: k, Max: k}
		d.BurstSpread = seconds(RandomBurstSpread[0] + (RandomBurstSpread[1]-RandomBurstSpread[0])*rng.Float64())
	}
	d.Restarts = Restarts{EveryHours: logUniform(rng, RandomRestartHours[0], RandomRestartHours[1]),
		Down: seconds(logUniform(rng, RandomRestartDown[0], RandomRestartDown[1]))}
	return d
}

func logUniform(rng *rand.Rand, lo, hi float64) float64 {
	return lo * math.Exp(rng.Float64()*math.Log(hi/lo))
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (r Result) name() string {
	s := fmt.Sprintf("N=%d %g req/s %.2g%%", r.Servers, r.Rate, 100*r.Noise)
	if r.RandomFleets {
		s = "random fleets"
	}
	if r.Hetero > 0 {
		s += fmt.Sprintf(" σ%g", r.Hetero)
	}
	if r.Bursts != "" {
		s += " bursts " + r.Bursts
	}
	if r.Diurnal > 0 {
		s += fmt.Sprintf(" diurnal %g", r.Diurnal)
	}
	if r.Uneven > 0 {
		s += fmt.Sprintf(" uneven %g", r.Uneven)
	}
	if r.Latency != "" {
		s += " latency " + r.Latency
	}
	if r.Tail > 0 {
		s += fmt.Sprintf(" tail %.3g%%@%gms", 100*r.Tail, r.TailMs)
	}
	if r.Flap != "" {
		s += " flap " + r.Flap
	}
	if r.BurstSpread > 0 {
		s += fmt.Sprintf(" spread %gs", r.BurstSpread)
	}
	if r.Restarts != "" {
		s += " restarts " + r.Restarts
	}
	if r.EvidenceCheck != 1 {
		s += fmt.Sprintf(" check %gs", r.EvidenceCheck)
	}
	if r.Faulty > 1 {
		s += fmt.Sprintf(" %d faulty", r.Faulty)
	}
	if r.FleetFault > 0 {
		s += fmt.Sprintf(" fleet fault %.3g%%", 100*r.FleetFault)
	}
	if r.Policy != "" {
		s += " policy " + r.Policy
	}
	return s
}

// Bound is ln(ARL)/KL in seconds for a fault at rate pf among healthy
// servers at p0, at rate requests a second, ARL being arlDays of one
// server's requests.
func Bound(pf, p0, rate, arlDays float64) float64 {
	p0 = max(p0, 1e-9)
	kl := pf*math.Log(pf/p0) + (1-pf)*math.Log((1-pf)/(1-p0))
	return math.Log(rate*86400*arlDays) / kl / rate
}

// PoissonInterval is the exact (Garwood) two-sided 1-conf interval of a
// Poisson mean from k events.
func PoissonInterval(k int, alpha float64) (lo, hi float64) {
	if k > 0 {
		lo = gammaQuantile(float64(k), alpha/2)
	}
	hi = gammaQuantile(float64(k+1), 1-alpha/2)
	return lo, hi
}

// gammaQuantile is the q quantile of Gamma(shape, 1), by bisection on
// the regularised lower incomplete gamma function.
func gammaQuantile(shape, q float64) float64 {
	lo, hi := 0.0, shape+20*math.Sqrt(shape)+20
	for range 200 {
		mid := (lo + hi) / 2
		if lowerGamma(shape, mid) < q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// lowerGamma is P(shape, x), the regularised lower incomplete gamma, by
// its series (x < shape+1) or its continued fraction (Numerical Recipes
// 6.2).
func lowerGamma(a, x float64) float64 {
	if x <= 0 {
		return 0
	}
	lg, _ := math.Lgamma(a)
	if x < a+1 {
		sum, del := 1/a, 1/a
		for n := 1; n < 1000; n++ {
			del *= x / (a + float64(n))
			sum += del
			if math.Abs(del) < math.Abs(sum)*1e-15 {
				break
			}
		}
		return sum * math.Exp(-x+a*math.Log(x)-lg)
	}
	b, c, d := x+1-a, 1/1e-300, 1/(x+1-a)
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < 1e-300 {
			d = 1e-300
		}
		c = b + an/c
		if math.Abs(c) < 1e-300 {
			c = 1e-300
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-15 {
			break
		}
	}
	return 1 - math.Exp(-x+a*math.Log(x)-lg)*h
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// fleet is one backend's servers for one simulated run.
type fleet struct {
	c       Cell
	rng     *rand.Rand
	dt      float64   // a chunk's seconds
	rate    []float64 // healthy error rate of each server
	share   []float64 // traffic share (mean 1)
	region  []rules.Region
	drains  []int      // condemnations of each server, detections left out
	burstQ  [][]uint64 // errors of bursts due in the coming chunks, the next first
	restart []float64  // when each server's next restart begins
	outTill []float64  // time until which a condemned server is out
	q       *rules.Sequential
	srv     []*rules.SeqServer
	in      []rules.Counts
	serving []bool
	idx     []int
	// the windowed test's 60 s rings, when Cell.Windowed
	old  *rules.Policy
	ring [][60]rules.Counts
	view agent.BackendView
	// the latency test's policy and each server's answer times, when
	// Cell.Latency
	lat *latencies
	// tap, when set (tests), sees each chunk's counts before the test does.
	tap func(t0 float64, in []rules.Counts)
	// dryTill: before this second, condemnations are neither applied nor
	// counted. With a latency model it is the warm-up: the count begins
	// once the agent has learned each server's latency baseline, as an
	// agent that has watched the fleet before has (a new fleet is drawn
	// each day, and an agent does not restart each day). The cost of an
	// agent's own start is told apart in docs/explanation/detection.md.
	dryTill float64
	// drv, when the cell has an agent policy, runs it (agent.go);
	// modelDrains counts its model's drains of each server, detections
	// left out; err is the policy's failure to start.
	drv         *driver
	modelDrains []int
	err         error
}

func newFleet(c Cell, rng *rand.Rand) *fleet {
	n := c.Servers
	f := &fleet{c: c, rng: rng, dt: c.dt(), rate: make([]float64, n), share: make([]float64, n), region: make([]rules.Region, n),
		drains: make([]int, n), burstQ: make([][]uint64, n), restart: make([]float64, n), outTill: make([]float64, n),
		q: rules.NewSequential(c.Config), srv: make([]*rules.SeqServer, n), in: make([]rules.Counts, n), serving: make([]bool, n)}
	for i := range n {
		f.rate[i] = c.Noise * math.Exp(c.Hetero*rng.NormFloat64())
		f.share[i] = math.Exp(c.Uneven*rng.NormFloat64() - c.Uneven*c.Uneven/2)
		f.srv[i] = &rules.SeqServer{}
		if c.Restarts.EveryHours > 0 {
			f.restart[i] = rng.ExpFloat64() * c.Restarts.EveryHours * 3600
		}
	}
	// Each server's region, by its own healthy rate against the lower
	// median of the backend's healthy rates (the median rules uses).
	sorted := slices.Clone(f.rate)
	slices.Sort(sorted)
	median := sorted[(n-1)/2]
	for i, r := range f.rate {
		f.region[i] = c.Config.Region(r, median)
	}
	if c.Latency.MedianMs > 0 {
		f.lat = newLatencies(c, rng)
		f.dryTill = c.Warmup.Seconds()
	}
	if c.Windowed || f.lat != nil {
		f.view = agent.BackendView{Name: "app", Servers: make([]agent.ServerView, n)}
		for i := range n {
			name := fmt.Sprintf("srv%d", i+1)
			f.view.Servers[i] = agent.ServerView{Backend: "app", Server: name,
				State: haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1}}
		}
	}
	if c.Windowed {
		f.old = rules.New(c.Config)
		f.ring = make([][60]rules.Counts, n)
	}
	if c.Agent != nil {
		f.modelDrains = make([]int, n)
		f.drv, f.err = newDriver(c.Agent, n)
		if f.err == nil && f.lat != nil {
			f.drv.timeAnswers()
		}
	}
	return f
}

// weight is server i's traffic against its configured weight's: 1 but
// where an agent policy cut it.
func (f *fleet) weight(i int) float64 {
	if f.drv == nil {
		return 1
	}
	return f.drv.share(i)
}

// overlap is the length of [a0, a1) ∩ [b0, b1).
func overlap(a0, a1, b0, b1 float64) float64 { return max(0, min(a1, b1)-max(a0, b0)) }

// down is the share of the chunk [t0, t1) in which server i is restarting;
// it draws the server's next restarts as it passes them.
func (f *fleet) down(i int, t0, t1 float64) float64 {
	r := f.c.Restarts
	if r.EveryHours <= 0 {
		return 0
	}
	d, l := 0.0, r.Down.Seconds()
	for f.restart[i] < t1 {
		s := f.restart[i]
		d += overlap(t0, t1, s, s+l)
		if s+l > t1 {
			break // still down in the next chunk
		}
		f.restart[i] = s + l + f.rng.ExpFloat64()*r.EveryHours*3600
	}
	return min(d/(t1-t0), 1)
}

// burst spreads k errors uniformly over spread seconds from u seconds
// into the current chunk: it returns the current chunk's share and queues
// the rest on the coming chunks (each error falls in a chunk with the
// chance of its overlap with what remains of the burst).
func (f *fleet) burst(i int, k uint64, u, spread float64) uint64 {
	var now uint64
	end := u + spread
	for m := 0; k > 0; m++ {
		c0, c1 := float64(m)*f.dt, float64(m+1)*f.dt
		from := max(u, c0)
		p := 1.0
		if end > c1 {
			p = overlap(c0, c1, u, end) / (end - from)
		}
		e := binomial(f.rng, k, p)
		k -= e
		if m == 0 {
			now = e
			continue
		}
		for len(f.burstQ[i]) < m {
			f.burstQ[i] = append(f.burstQ[i], 0)
		}
		f.burstQ[i][m-1] += e
	}
	return now
}

// run simulates secs seconds in chunks of the evidence check. With tr, from
// tr.onset on, either the first tr.k servers fail at c.Fault (each one's
// time to condemnation goes to tr.delays, the server then stays out, and
// the run ends when all are found), or every server fails at c.FleetFault
// (tr.fleet: the run's end is the incident's). It returns the other
// condemnations, counted in f.drains too.
func (f *fleet) run(secs float64, tr *onsetTrial) int {
	if f.err != nil {
		return 0 // its policy did not start: Run reports why
	}
	c := f.c
	dt := f.dt
	falses := 0
	burstP := 0.0
	if c.Bursts.EveryHours > 0 {
		burstP = dt / (c.Bursts.EveryHours * 3600)
	}
	spread := c.BurstSpread.Seconds()
	if spread <= 0 {
		spread = 1
	}
	drainFor := c.DrainFor.Seconds()
	onset, k, fleetP := math.Inf(1), 0, 0.0
	if tr != nil {
		onset = tr.onset
		if tr.fleet {
			fleetP = c.FleetFault
		} else {
			k = tr.k
		}
	}
	found := 0
	for j := 0; float64(j)*dt < secs; j++ {
		t0 := float64(j) * dt
		t1 := t0 + dt
		diurnal := 1.0
		if c.Diurnal > 0 {
			diurnal = 1 + c.Diurnal*math.Sin(2*math.Pi*t0/86400)
		}
		// the share of this chunk after the onset
		after := overlap(t0, t1, onset, math.Inf(1)) / dt
		for i := range f.srv {
			f.serving[i] = t0 >= f.outTill[i]
			if f.drv != nil {
				if f.serving[i] && f.drv.drained(i) {
					f.drv.release(i) // its time out is over
				}
				f.serving[i] = f.serving[i] && f.drv.weight[i] > 0
			}
			down := f.down(i, t0, t1)
			if !f.serving[i] {
				f.in[i] = rules.Counts{}
				f.burstQ[i] = f.burstQ[i][:0] // no traffic, no errors
				if f.lat != nil && f.drv == nil {
					f.lat.second(i, 0, false) // its window ages
					f.lat.tailSecond(i, 0, false, 0)
				}
				continue
			}
			n := poisson(f.rng, c.Rate*diurnal*f.share[i]*dt*f.weight(i))
			// the requests of its restart all fail
			x := binomial(f.rng, n, down)
			rest := n - x
			pf := 0.0
			switch {
			case fleetP > 0:
				pf = fleetP
			case i < k && c.Fault > 0 && c.Flap.on(t0, onset):
				pf = c.Fault
			}
			if pf > 0 && after > 0 {
				// the fault's share of the chunk fails at its rate
				nf := binomial(f.rng, rest, after)
				x += binomial(f.rng, rest-nf, f.rate[i]) + binomial(f.rng, nf, pf)
			} else {
				x += binomial(f.rng, rest, f.rate[i])
			}
			if q := f.burstQ[i]; len(q) > 0 {
				x += q[0]
				n += q[0]
				f.burstQ[i] = append(q[:0], q[1:]...)
			}
			if burstP > 0 && f.rng.Float64() < burstP {
				e := f.burst(i, uint64(c.Bursts.Min+f.rng.IntN(c.Bursts.Max-c.Bursts.Min+1)), f.rng.Float64()*dt, spread)
				x += e
				n += e
			}
			f.in[i] = rules.Counts{N: n, X: x}
			if f.lat != nil {
				// the slow fault: from the second it begins, while on
				slow := i < k && c.Slow > 0 && t1 > onset && c.Flap.on(t0, onset)
				tail := 0.0
				if i < k && c.Tail > 0 && c.Flap.on(t0, onset) {
					tail = c.Tail * after
				}
				if f.drv != nil {
					// the agent path: each answer into the agent's
					// window store, its x errors first
					for a := range n {
						status := 200
						if a < x {
							status = 500
						}
						f.drv.answer(int(t1), i, status, f.lat.answerMs(i, slow, tail))
					}
				} else {
					f.lat.second(i, n, slow)
					f.lat.tailSecond(i, n, slow, tail)
				}
			}
		}
		if f.tap != nil {
			f.tap(t0, f.in)
		}
		var byModel []bool
		switch {
		case f.drv != nil:
			f.idx, byModel = f.drv.chunk(t1, f.in)
		case f.old != nil:
			f.idx = f.windowed(j)
		default:
			f.idx = f.q.Step(dt, f.srv, f.in, f.serving, f.idx)
		}
		if f.lat != nil && f.drv == nil {
			// the direct path's latency tests (an agent policy judges
			// answer times itself, from its windows)
			f.idx = f.slow(f.idx)
		}
		for m, i := range f.idx {
			if t0 < f.dryTill {
				break
			}
			model := byModel != nil && byModel[m]
			switch {
			case fleetP > 0 && t1 > onset:
				tr.incident++
			case i < k && t1 > onset:
				if model {
					f.drv.counts.modelFinds++
				}
				tr.delays[i] = t1 - onset
				f.outTill[i] = math.Inf(1) // found: out for the rest of the trial
				found++
				continue
			default:
				falses++
				f.drains[i]++
				if model {
					f.modelDrains[i]++
				}
			}
			out := drainFor
			if f.drv != nil {
				out = f.drv.cooldown(i, drainFor)
			}
			f.outTill[i] = t1 + out
		}
		if k > 0 && found == k {
			// every faulty server found: the trial ends, the chunk's
			// other drains counted
			return falses
		}
	}
	return falses
}

// windowed runs the old test on the last 60 s of every server, as the
// loop's evidence check ran it every second.
func (f *fleet) windowed(t int) []int {
	f.idx = f.idx[:0]
	for i := range f.srv {
		f.ring[i][t%60] = f.in[i]
		var n, x uint64
		for _, c := range f.ring[i] {
			n += c.N
			x += c.X
		}
		v := &f.view.Servers[i]
		v.Window.Requests, v.Window.Err5xx = n, x
		v.State.AdminState = 0
		if !f.serving[i] {
			v.State.AdminState = haproxy.AdminForcedDrain
			f.ring[i] = [60]rules.Counts{}
		}
	}
	for _, fd := range f.old.Test(f.view) {
		if fd.Outlier {
			// Test lists the serving servers in order of error rate
			for j := range f.view.Servers {
				if f.view.Servers[j].Server == fd.Server {
					f.idx = append(f.idx, j)
				}
			}
		}
	}
	return f.idx
}

// poisson draws a Poisson count of mean lambda: by inversion below 12,
// by the normal approximation above (the traffic's exact shape does not
// move the test: it judges errors given requests).
func poisson(rng *rand.Rand, lambda float64) uint64 {
	if lambda <= 0 {
		return 0
	}
	if lambda >= 12 {
		return uint64(max(0, math.Round(lambda+math.Sqrt(lambda)*rng.NormFloat64())))
	}
	u := rng.Float64()
	p := math.Exp(-lambda)
	k, cdf := uint64(0), p
	for u > cdf && k < 200 {
		k++
		p *= lambda / float64(k)
		cdf += p
	}
	return k
}

// binomial draws Binomial(n, p): one Bernoulli a trial for large p, the
// Poisson limit for small means (n·p < 12, p < 0.05), the normal one
// beyond.
func binomial(rng *rand.Rand, n uint64, p float64) uint64 {
	if n == 0 || p <= 0 {
		return 0
	}
	if p >= 1 {
		return n
	}
	mean := float64(n) * p
	switch {
	case p < 0.05 && mean < 12:
		return min(poisson(rng, mean), n)
	case n <= 64:
		var x uint64
		for range n {
			if rng.Float64() < p {
				x++
			}
		}
		return x
	default:
		x := math.Round(mean + math.Sqrt(mean*(1-p))*rng.NormFloat64())
		return uint64(min(max(0, x), float64(n)))
	}
}
