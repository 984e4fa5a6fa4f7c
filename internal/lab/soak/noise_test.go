package soak

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
)

// record runs f for secs seconds (tr as run takes it) and returns each
// chunk's start and every server's counts in it.
func record(f *fleet, secs float64, tr *onsetTrial) (starts []float64, counts [][]rules.Counts) {
	f.tap = func(t0 float64, in []rules.Counts) {
		starts = append(starts, t0)
		counts = append(counts, slices.Clone(in))
	}
	f.run(secs, tr)
	return starts, counts
}

func TestCellValidateNoise(t *testing.T) {
	ok := cell(9, 33)
	for _, tc := range []struct {
		name string
		edit func(c *Cell)
		want string // in the error; "" for none
	}{
		{"restarts", func(c *Cell) { c.Restarts = Restarts{EveryHours: 6, Down: 3 * time.Second} }, ""},
		{"restarts without a period", func(c *Cell) { c.Restarts = Restarts{Down: 3 * time.Second} }, "restarts"},
		{"restarts down zero", func(c *Cell) { c.Restarts = Restarts{EveryHours: 6} }, "restarts"},
		{"spread", func(c *Cell) { c.Bursts, c.BurstSpread = Bursts{EveryHours: 6, Min: 3, Max: 10}, 5*time.Second }, ""},
		{"spread without bursts", func(c *Cell) { c.BurstSpread = 5 * time.Second }, "without bursts"},
		{"negative spread", func(c *Cell) { c.Bursts, c.BurstSpread = Bursts{EveryHours: 6, Min: 3, Max: 10}, -time.Second }, "burst spread"},
		{"fleet fault", func(c *Cell) { c.FleetFault = 0.05 }, ""},
		{"fleet fault of 1", func(c *Cell) { c.FleetFault = 1 }, "fleet fault"},
		{"three faulty", func(c *Cell) { c.Fault, c.Faulty = 0.05, 3 }, ""},
		{"faulty without a fault", func(c *Cell) { c.Faulty = 3 }, "faulty"},
		{"every server faulty", func(c *Cell) { c.Fault, c.Faulty = 0.05, 9 }, "faulty"},
		{"check 100ms", func(c *Cell) { c.EvidenceCheck = 100 * time.Millisecond }, ""},
		{"check 2s", func(c *Cell) { c.EvidenceCheck = 2 * time.Second }, ""},
		{"check 50ms", func(c *Cell) { c.EvidenceCheck = 50 * time.Millisecond }, "evidence check"},
		{"check 100ms with latency", func(c *Cell) {
			c.EvidenceCheck, c.Latency = 100*time.Millisecond, Latency{MedianMs: 20, Sigma: 0.6}
		}, "a second at a time"},
		{"random fleets ignore servers", func(c *Cell) { c.RandomFleets, c.Servers, c.Rate = true, 0, 0 }, ""},
		{"random fleets, windowed", func(c *Cell) { c.RandomFleets, c.Windowed = true, true }, "random fleets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%v; want an error with %q", err, tc.want)
			}
		})
	}
}

// TestRestartErrors: a restart of 2.5 s from 10.25 s makes every request
// of the chunks it covers an error, and a share of those it overlaps;
// nothing else fails.
func TestRestartErrors(t *testing.T) {
	c := cell(3, 400)
	c.Noise, c.DrainFor = 0, 0
	c.Restarts = Restarts{EveryHours: 1e6, Down: 2500 * time.Millisecond}
	f := newFleet(c, rand.New(rand.NewPCG(1, 2)))
	f.restart = []float64{10.25, 1e12, 1e12}
	starts, counts := record(f, 20, nil)
	var n, x uint64
	for j, t0 := range starts {
		for i, in := range counts[j] {
			switch {
			case i != 0 || t0 < 10 || t0 >= 13:
				if in.X != 0 {
					t.Errorf("server %d, chunk at %g s: %d errors, want none", i, t0, in.X)
				}
			case t0 == 11:
				if in.X != in.N || in.N == 0 {
					t.Errorf("chunk at 11 s, all down: %d of %d failed", in.X, in.N)
				}
			default: // 10 and 12: down for 0.75 s of the chunk
				if r := float64(in.X) / float64(in.N); r < 0.6 || r > 0.9 {
					t.Errorf("chunk at %g s: %d of %d failed, want about 75%%", t0, in.X, in.N)
				}
				n += in.N
				x += in.X
			}
		}
	}
	if x == 0 || n == 0 {
		t.Fatal("no partial chunk seen")
	}
	if f.restart[0] < 12.75 {
		t.Errorf("next restart at %g s, before this one ended", f.restart[0])
	}
}

// TestRestartsPoisson: the restarts come every EveryHours on average.
func TestRestartsPoisson(t *testing.T) {
	c := cell(2, 1)
	c.Restarts = Restarts{EveryHours: 1, Down: time.Second}
	f := newFleet(c, rand.New(rand.NewPCG(3, 4)))
	count := 0
	for j := range 200 * 3600 {
		t0 := float64(j)
		before := f.restart[0]
		f.down(0, t0, t0+1)
		if f.restart[0] != before {
			count++
		}
	}
	// 200 expected; Poisson sd 14
	if count < 150 || count > 250 {
		t.Errorf("%d restarts in 200 h, want about 200", count)
	}
}

// TestBurstSpread: a burst's errors fall on the chunks its spread
// overlaps, in proportion to the overlap.
func TestBurstSpread(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dt, u, sp float64
		want      []float64 // each chunk's share, this one first
	}{
		{"3 s from 0.5 s, 1 s chunks", 1, 0.5, 3, []float64{1. / 6, 1. / 3, 1. / 3, 1. / 6}},
		{"one second from 0.25 s: two chunks", 1, 0.25, 1, []float64{0.75, 0.25}},
		{"0.3 s within the chunk", 1, 0.2, 0.3, []float64{1}},
		{"5 s in 2 s chunks from 1 s", 2, 1, 5, []float64{0.2, 0.4, 0.4}},
		{"1 s in 100 ms chunks", 0.1, 0.05, 1, []float64{0.05, .1, .1, .1, .1, .1, .1, .1, .1, .1, 0.05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cell(2, 1)
			c.EvidenceCheck = time.Duration(tc.dt * float64(time.Second))
			f := newFleet(c, rand.New(rand.NewPCG(5, 6)))
			const k = 1000000
			now := f.burst(0, k, tc.u, tc.sp)
			got := append([]uint64{now}, f.burstQ[0]...)
			if len(got) != len(tc.want) {
				t.Fatalf("touched %d chunks %v, want %d", len(got), got, len(tc.want))
			}
			var sum uint64
			for m, g := range got {
				sum += g
				if math.Abs(float64(g)/k-tc.want[m]) > 0.005 {
					t.Errorf("chunk %d: share %.4f, want %.4f", m, float64(g)/k, tc.want[m])
				}
			}
			if sum != k {
				t.Errorf("%d errors placed, want %d", sum, k)
			}
		})
	}
}

// TestBurstSpreadRun: through the run, each burst of 40 errors spread
// over 5 s lands on 5 or 6 consecutive chunks and nowhere else; over one
// second, on at most 2.
func TestBurstSpreadRun(t *testing.T) {
	for _, tc := range []struct {
		spread       time.Duration
		minRun, most int
	}{{5 * time.Second, 5, 6}, {0, 1, 2}} {
		c := cell(2, 1)
		c.Noise, c.DrainFor = 0, 0
		c.Bursts, c.BurstSpread = Bursts{EveryHours: 0.5, Min: 40, Max: 40}, tc.spread
		f := newFleet(c, rand.New(rand.NewPCG(7, 8)))
		_, counts := record(f, 6*3600, nil)
		var runs [][]uint64 // consecutive chunks with errors
		var cur []uint64
		for _, in := range counts {
			if in[0].X > 0 {
				cur = append(cur, in[0].X)
			} else if cur != nil {
				runs = append(runs, cur)
				cur = nil
			}
		}
		if len(runs) < 5 {
			t.Fatalf("spread %v: %d bursts in 6 h, want about 12", tc.spread, len(runs))
		}
		for _, r := range runs {
			var sum uint64
			for _, x := range r {
				sum += x
			}
			if sum != 40 || len(r) < tc.minRun || len(r) > tc.most {
				t.Errorf("spread %v: a burst of %d errors over %d chunks %v, want 40 over %d to %d", tc.spread, sum, len(r), r, tc.minRun, tc.most)
			}
		}
	}
}

// TestFleetFaultSteps: at the onset every server steps to the incident's
// rate together.
func TestFleetFaultSteps(t *testing.T) {
	c := cell(5, 2000)
	c.FleetFault = 0.2
	f := newFleet(c, rand.New(rand.NewPCG(9, 10)))
	tr := &onsetTrial{onset: 100.5, fleet: true}
	starts, counts := record(f, 110, tr)
	for j, t0 := range starts {
		if t0 != 99 && t0 != 101 {
			continue
		}
		for i, in := range counts[j] {
			r := float64(in.X) / float64(in.N)
			if t0 == 99 && r > 0.02 {
				t.Errorf("before the onset: server %d at %.3f", i, r)
			}
			if t0 == 101 && (r < 0.17 || r > 0.23) {
				t.Errorf("after the onset: server %d at %.3f, want 0.2", i, r)
			}
		}
	}
}

// TestFleetFaultRun: the incidents are counted per incident-hour, and the
// JSON field is there even at zero.
func TestFleetFaultRun(t *testing.T) {
	c := cell(3, 5)
	c.FleetFault, c.Trials, c.Warmup = 0.05, 2, time.Minute
	r, err := Run(c, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.IncidentHours != 4 || r.FleetFaultPer1000 == nil || *r.FleetFaultPer1000 != float64(r.FleetFaultDrains)*1000/4 {
		t.Errorf("incident-hours %v, drains %d, per 1,000 %v", r.IncidentHours, r.FleetFaultDrains, r.FleetFaultPer1000)
	}
	t.Logf("%s: %d drains in %g incident-hours", r.Cell, r.FleetFaultDrains, r.IncidentHours)
}

// TestFaultyK: K servers fail at once, the others stay healthy, and each
// faulty server's time to detect is recorded.
func TestFaultyK(t *testing.T) {
	c := cell(9, 200)
	c.Fault, c.Faulty = 0.2, 3
	f := newFleet(c, rand.New(rand.NewPCG(11, 12)))
	tr := &onsetTrial{onset: 60, k: 3, delays: []float64{-1, -1, -1}}
	starts, counts := record(f, 3600, tr)
	for j, t0 := range starts {
		if t0 != 61 {
			continue
		}
		for i, in := range counts[j] {
			r := float64(in.X) / float64(in.N)
			if faulty := i < 3; faulty != (r > 0.1) {
				t.Errorf("server %d at %.3f; faulty %v", i, r, faulty)
			}
		}
	}
	for i, d := range tr.delays {
		if d <= 0 || d > 60 {
			t.Errorf("faulty server %d found after %g s", i, d)
		}
		if !math.IsInf(f.outTill[i], 1) {
			t.Errorf("faulty server %d back in after its detection", i)
		}
	}
	if last := starts[len(starts)-1]; last > 200 {
		t.Errorf("the trial ran to %g s after all were found", last)
	}
	// Through Run: every faulty server's time counts.
	c.Trials, c.Seeds = 4, []uint64{1}
	r, err := Run(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Faulty != 3 || r.Trials != 4 || r.Missed != 0 || r.DetectMedian <= 0 {
		t.Errorf("%+v", r)
	}
}

// TestEvidenceCheckChunks: the check's cadence sets the chunks: ten a
// second at 100 ms, each with a tenth of a second's traffic, and one
// every two seconds at 2 s.
func TestEvidenceCheckChunks(t *testing.T) {
	for _, tc := range []struct {
		check  time.Duration
		chunks int
	}{{100 * time.Millisecond, 100}, {time.Second, 10}, {2 * time.Second, 5}} {
		c := cell(2, 1000)
		c.EvidenceCheck = tc.check
		f := newFleet(c, rand.New(rand.NewPCG(13, 14)))
		starts, counts := record(f, 10, nil)
		if len(starts) != tc.chunks {
			t.Errorf("check %v: %d chunks in 10 s, want %d", tc.check, len(starts), tc.chunks)
			continue
		}
		var n uint64
		for _, in := range counts {
			n += in[0].N
		}
		if per := float64(n) / float64(len(counts)); math.Abs(per-1000*tc.check.Seconds()) > 0.1*1000*tc.check.Seconds() {
			t.Errorf("check %v: %.1f requests a chunk, want %g", tc.check, per, 1000*tc.check.Seconds())
		}
		if got := starts[1] - starts[0]; math.Abs(got-tc.check.Seconds()) > 1e-9 {
			t.Errorf("check %v: chunks %g s apart", tc.check, got)
		}
	}
}

// TestRandomFleetsDraw: each draw lies within the ranges, draws differ,
// and the same seed draws the same fleets.
func TestRandomFleetsDraw(t *testing.T) {
	c := cell(9, 33)
	c.RandomFleets = true
	a, b := rand.New(rand.NewPCG(15, 16)), rand.New(rand.NewPCG(15, 16))
	seen := map[int]bool{}
	noBursts := 0
	for range 2000 {
		d := c.draw(a)
		if e := c.draw(b); d.Servers != e.Servers || d.Rate != e.Rate || d.Noise != e.Noise || d.Hetero != e.Hetero || d.Bursts != e.Bursts || d.BurstSpread != e.BurstSpread || d.Restarts != e.Restarts {
			t.Fatal("the same seed drew different fleets")
		}
		seen[d.Servers] = true
		in := func(v, lo, hi float64) bool { return v >= lo && v <= hi }
		if !in(float64(d.Servers), RandomMinServers, RandomMaxServers) || !in(d.Rate, RandomMinRate, RandomMaxRate) ||
			!in(d.Noise, RandomMinNoise, RandomMaxNoise) || !in(d.Hetero, 0, RandomMaxHetero) ||
			!in(d.Restarts.EveryHours, RandomRestartHours[0], RandomRestartHours[1]) ||
			!in(d.Restarts.Down.Seconds(), RandomRestartDown[0], RandomRestartDown[1]) {
			t.Fatalf("out of range: %+v", d)
		}
		if d.Bursts.EveryHours == 0 {
			noBursts++
		} else if !in(d.Bursts.EveryHours, RandomBurstHours[0], RandomBurstHours[1]) || d.Bursts.Min != d.Bursts.Max ||
			!in(float64(d.Bursts.Min), 1, RandomMaxBurst) || !in(d.BurstSpread.Seconds(), RandomBurstSpread[0], RandomBurstSpread[1]) {
			t.Fatalf("bursts out of range: %+v, spread %v", d.Bursts, d.BurstSpread)
		}
		if err := d.Validate(); err != nil {
			t.Fatalf("a drawn cell is invalid: %v", err)
		}
	}
	if len(seen) < 90 || noBursts == 0 || noBursts > 100 {
		t.Errorf("%d distinct N of 99, %d of 2000 days without bursts (want about 39)", len(seen), noBursts)
	}
	// The medians of the log-uniform draws: about the geometric means.
	var rates []float64
	for range 1000 {
		rates = append(rates, c.draw(a).Rate)
	}
	slices.Sort(rates)
	if m := rates[500]; m < 0.6*math.Sqrt(RandomMinRate*RandomMaxRate) || m > 1.6*math.Sqrt(RandomMinRate*RandomMaxRate) {
		t.Errorf("median rate %.1f, want about %.1f (log-uniform)", m, math.Sqrt(RandomMinRate*RandomMaxRate))
	}
}

// TestRegionTally: drains count by each server's region against its
// backend's lower median; the most one server got in a day leaves the
// degraded region out.
func TestRegionTally(t *testing.T) {
	c := cell(4, 33)
	f := newFleet(c, rand.New(rand.NewPCG(17, 18)))
	// rates 0.1%, 0.2%, 0.4%, 5%: lower median 0.2%, healthy up to
	// max(0.5%, 3 x 0.2%) = 0.6%, degraded from max(1%, 6 x 0.2%) = 1.2%
	cfg := c.Config
	rates := []float64{0.001, 0.002, 0.004, 0.05}
	sorted := slices.Clone(rates)
	slices.Sort(sorted)
	med := sorted[(len(sorted)-1)/2]
	if med != 0.002 {
		t.Fatalf("lower median %v", med)
	}
	// newFleet's regions follow the same rule on its own draw
	fs := slices.Clone(f.rate)
	slices.Sort(fs)
	for i, r := range f.rate {
		if f.region[i] != cfg.Region(r, fs[(len(fs)-1)/2]) {
			t.Errorf("server %d at %v: region %v", i, r, f.region[i])
		}
	}
	region := make([]rules.Region, 4)
	for i, r := range rates {
		region[i] = cfg.Region(r, med)
	}
	region = append(region, cfg.Region(0.008, med)) // a zone server
	var o tally
	o.day(region, []int{1, 0, 2, 7, 3})
	if o.healthyDays != 3 || o.zoneDays != 1 || o.degDays != 1 || o.days != 5 {
		t.Errorf("days: healthy %v zone %v degraded %v all %v", o.healthyDays, o.zoneDays, o.degDays, o.days)
	}
	if o.falses != 3 || o.zone != 3 || o.deg != 7 || o.most != 3 {
		t.Errorf("drains: healthy %d zone %d degraded %d, most %d; want 3, 3, 7, 3", o.falses, o.zone, o.deg, o.most)
	}
}

// TestRandomFleetsRun: a random-fleets cell runs whole backend-days until
// its server-days are reached, and names itself.
func TestRandomFleetsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a backend-day of up to 100 servers")
	}
	c := cell(0, 0)
	c.RandomFleets, c.ServerDays, c.Seeds = true, 1, []uint64{3}
	r, err := Run(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.ServerDays < 2 || r.ServerDays > 100 || r.HealthyServerDays+r.ZoneServerDays+r.DegradedServerDays != r.ServerDays || r.Cell != "random fleets" {
		t.Errorf("%+v", r)
	}
	t.Logf("%s: %.0f server-days, %.1f s", r.Cell, r.ServerDays, r.WallSeconds)
}
