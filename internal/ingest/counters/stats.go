package counters

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/enum"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// StatSource is one HAProxy process's runtime socket, as the stats path
// reads it; *haproxy.Client implements it.
type StatSource interface {
	Addr() string
	ShowInfo(ctx context.Context) (haproxy.Info, error)
	ServerStats(ctx context.Context) ([]haproxy.ServerStat, error)
}

// StatMode is what the stats path records.
type StatMode string

const (
	// StatAuto is StatCounts when every per-response path is off, else
	// StatRetries: the choice the daemon makes from the listeners.
	StatAuto StatMode = "auto"
	// StatCounts records every answer from HAProxy's own counters: the
	// whole telemetry, with no stanza and no per-request cost.
	StatCounts StatMode = "counts"
	// StatRetries records only the failures a per-response path (SPOE,
	// Lua, logs) beside it cannot see: the attempts HAProxy retried, the
	// transfers a server aborted, and where the path does not see them
	// (StatPoller.Unseen), HAProxy's own 502/503/504.
	StatRetries StatMode = "retries"
)

// StatModes lists the modes, for usage lines.
var StatModes = []StatMode{StatAuto, StatCounts, StatRetries}

func (m *StatMode) String() string { return string(*m) }

// Set implements flag.Value.
func (m *StatMode) Set(s string) (err error) {
	*m, err = enum.Parse("stats-poll-mode", s, StatModes...)
	return err
}

// StatsConfig is the stats path's settings.
type StatsConfig struct {
	// Poll is the period of the reads; 0 turns the path off.
	Poll time.Duration
	Mode StatMode
}

// DefaultStatsConfig reads the counters twice a second, in auto mode: on
// the stats path alone, a poll's lag is part of the time to a drain.
func DefaultStatsConfig() StatsConfig {
	return StatsConfig{Poll: 500 * time.Millisecond, Mode: StatAuto}
}

// MinStatsPoll is the shortest period: each read is two runtime commands
// per HAProxy process.
const MinStatsPoll = 100 * time.Millisecond

// Validate checks the settings.
func (c StatsConfig) Validate() error {
	if c.Poll != 0 && c.Poll < MinStatsPoll {
		return fmt.Errorf("stats-poll %v: want 0 (off) or at least %v", c.Poll, MinStatsPoll)
	}
	_, err := enum.Parse("stats-poll-mode", string(c.Mode), StatModes...)
	return err
}

// StatCounters are the stats path's figures.
type StatCounters struct {
	Polls   atomic.Uint64 // `show stat` replies read
	Errors  atomic.Uint64 // polls of a process that failed
	Resets  atomic.Uint64 // counters found lower than before: `clear counters`
	Reloads atomic.Uint64 // a process replaced by a new one (reload, restart)
	Answers atomic.Uint64 // answers recorded (StatCounts, or a silent server's)
	Retried atomic.Uint64 // retried or redispatched attempts recorded (window.FailRetry)
	Proxy   atomic.Uint64 // HAProxy's own 5xx for a server recorded (window.FailProxy)
	Aborted atomic.Uint64 // server aborts recorded (window.FailAbort)
	// Clamped counts counter gains above what their period could hold
	// (MaxGainPerSecond), recorded at that bound.
	Clamped atomic.Uint64
}

// MaxGainPerSecond bounds what one counter of one server may gain in a
// second: 2^20, a bucket's most per event (window.MaxCount). No HAProxy
// process answers a million requests a second for one server; a gain
// above it comes from something else (a counter that jumps by 2^62), and
// is recorded at the bound and counted, so that the period's work stays
// one event per second and class.
const MaxGainPerSecond = window.MaxCount

// MaxSpread bounds the seconds a gain is spread over: no window holds
// more than an hour, and the seconds before it would only be dropped.
const MaxSpread = 3600

// StatPoller turns HAProxy's cumulative per-server counters into counted
// events in the windows: every Period it reads `show info` and `show stat`
// from each process and records what grew since the last read.
//
// The counters only grow within one process, from its start or the last
// `clear counters`. So:
//   - a process seen for the first time gives a baseline and records
//     nothing: its history predates the window;
//   - a new process behind a socket (a reload, a restart) that started
//     after the last read counts from zero; one that started before
//     gives a baseline, since part of its counts may be older;
//   - a counter lower than before was cleared: what it holds now counts;
//   - a server that appears in a known process (`add server`) counts from
//     zero; one that goes away is forgotten.
//
// What a process counted between the last read and its replacement is
// lost, as are an old process's answers after a reload (`-sf` leaves it
// finishing its connections behind a socket the new one took).
type StatPoller struct {
	Sources []StatSource
	Sink    window.Sink
	Mode    StatMode
	Period  time.Duration
	Log     zerolog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Coverage, in StatRetries mode, finds the servers no per-response
	// path reports; their answers are then recorded from the counters, as
	// in StatCounts. Nil checks nothing.
	Coverage *Coverage
	// OnReload, when set, hears of each new process behind a known socket
	// (a reload, a restart) as the poll finds it: the agent's loop steps
	// then, to put back the changes the new process does not hold.
	OnReload func(addr string)
	// Unseen are the failure classes (window.Fails) no per-response path
	// beside the stats path reports, recorded from the counters in
	// StatRetries mode; nil is all of them, as for SPOE, which sees only
	// the answers HAProxy passes on. The Lua companion and the logs see
	// HAProxy's own 502/503/504 (docs/explanation/telemetry.md), so that
	// beside them FailProxy is left out, lest it count twice.
	Unseen []window.Fail
	// Sight, in StatRetries mode with FailProxy not Unseen, checks that
	// the per-response paths do report HAProxy's own 5xx; those of a
	// server they are blind to are recorded from the counters. Nil checks
	// nothing.
	Sight *Sight

	Counters StatCounters

	// mu serialises polls (Run's and a caller's) and guards the fields
	// below; pollOne and record run under it.
	mu    sync.Mutex
	procs map[string]*procCounters
	// failing: sockets whose last poll failed, so that a failure that
	// lasts (HAProxy down) is logged at warn once, then at debug.
	failing map[string]bool
}

// procCounters is what the last read of one socket found.
type procCounters struct {
	instance string
	start    int64     // the process's start, Unix seconds
	readAt   time.Time // when it was read
	servers  map[haproxy.ServerKey]haproxy.StatCounters
	// counted is, per server, the attempts without an answer accounted
	// so far: recorded as failures, or in the baseline. Stot less ReqTot
	// less counted is the room left for failures (see classes).
	counted map[haproxy.ServerKey]int64
	// means is, per server, the mean answer time of its latest answers,
	// taken from rtime's moves (haproxy.RecentMean): what its answers
	// are recorded at.
	means map[haproxy.ServerKey]*haproxy.RecentMean
}

// Run polls every Period until ctx ends.
func (p *StatPoller) Run(ctx context.Context) error {
	if p.Period <= 0 {
		return fmt.Errorf("stats poll: period must be positive")
	}
	t := time.NewTicker(p.Period)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, p.Period)
		p.Poll(pctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Poll reads every source once and records what its counters gained.
func (p *StatPoller) Poll(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.procs == nil {
		p.procs, p.failing = map[string]*procCounters{}, map[string]bool{}
	}
	for _, src := range p.Sources {
		err := p.pollOne(ctx, src)
		if err == nil {
			delete(p.failing, src.Addr())
			continue
		}
		p.Counters.Errors.Add(1)
		ev := p.Log.Warn()
		if p.failing[src.Addr()] {
			ev = p.Log.Debug()
		}
		ev.Err(err).Str("haproxy", src.Addr()).Msg("stats path: cannot read HAProxy's counters; nothing recorded from it this period")
		p.failing[src.Addr()] = true
	}
	listed := func(k haproxy.ServerKey) bool {
		for _, pc := range p.procs {
			if _, ok := pc.servers[k]; ok {
				return true
			}
		}
		return false
	}
	if p.Coverage != nil {
		p.Coverage.Forget(listed)
	}
	if p.Sight != nil {
		p.Sight.Forget(listed)
	}
}

// pollOne reads one source and records what its counters gained. The
// caller (Poll) holds p.mu.
func (p *StatPoller) pollOne(ctx context.Context, src StatSource) error {
	info, err := src.ShowInfo(ctx)
	if err != nil {
		return err
	}
	rows, err := src.ServerStats(ctx)
	if err != nil {
		return err
	}
	now := p.now()
	p.Counters.Polls.Add(1)
	prev := p.procs[src.Addr()]
	// The seconds the gains spread over: since the last read, or since
	// the process started when it is new.
	since := now.Unix() - 1
	if prev != nil {
		since = min(prev.readAt.Unix(), since)
	}
	cur := &procCounters{instance: info.Instance(), start: info.StartTime, readAt: now, servers: make(map[haproxy.ServerKey]haproxy.StatCounters, len(rows)),
		counted: make(map[haproxy.ServerKey]int64, len(rows)), means: make(map[haproxy.ServerKey]*haproxy.RecentMean, len(rows))}
	var fromZero bool // every counter of this read counts in full
	switch {
	case prev == nil:
		// First sight: a baseline.
	case prev.instance != cur.instance:
		p.Counters.Reloads.Add(1)
		fromZero = cur.start >= prev.readAt.Unix()
		if fromZero {
			since = min(max(since, cur.start-1), now.Unix()-1)
		}
		p.Log.Info().Str("haproxy", src.Addr()).Str("was", prev.instance).Str("now", cur.instance).Bool("counted_from_zero", fromZero).
			Msg("stats path: a new HAProxy process behind the socket")
		if p.OnReload != nil {
			defer p.OnReload(src.Addr()) // once this read is recorded
		}
	}
	known := prev != nil && prev.instance == cur.instance
	for _, r := range rows {
		k := haproxy.ServerKey{Backend: r.Backend, Server: r.Server}
		cur.servers[k] = r.Counters
		// The answers' time: their recent mean (haproxy.RecentMean).
		r.RespTimeMs = int(math.Round(cur.meanOf(prev, k, known).Add(now, r.RespTimeMs, answered(r.Counters))))
		var gain haproxy.StatCounters
		var counted int64 // the unanswered attempts accounted before this read
		switch old, had := prev.server(k); {
		case known && had:
			var reset bool
			if gain, reset = grown(old, r.Counters); reset {
				p.Counters.Resets.Add(1)
			} else {
				counted = prev.counted[k]
			}
		case known || fromZero:
			gain = r.Counters
		default:
			// A baseline: its unanswered attempts predate the window, but
			// for those in flight.
			cur.counted[k] = settled(r.Counters)
			continue
		}
		fails := classes(gain, unanswered(r.Counters)-counted)
		// The attempts that ended with no answer and in no class (a
		// client that gave up) are accounted too: room they left would
		// let a failure HAProxy counts twice count twice later.
		cur.counted[k] = max(counted+fails[window.FailRetry]+fails[window.FailProxy]+fails[window.FailAbort], settled(r.Counters))
		silent := false
		if p.Coverage != nil && p.Mode == StatRetries {
			var answers int64
			for _, n := range gain.Hrsp[:5] { // 1xx to 5xx; "other" is no answer
				answers += n
			}
			silent = p.Coverage.Observe(k, answers, now)
		}
		var blind bool // the paths are blind to HAProxy's 5xx for k
		if p.Sight != nil && p.Mode == StatRetries && !p.records(window.FailProxy) {
			blind = p.Sight.Observe(k, gain.Hrsp[4], fails[window.FailProxy], now)
		}
		if !blind && !silent && !p.records(window.FailProxy) {
			fails[window.FailProxy] = 0 // a path reports them
		}
		p.record(r, gain, fails, since, now.Unix(), silent)
	}
	p.procs[src.Addr()] = cur
	return nil
}

// meanOf is k's running mean in this read, carried from the last read
// of the same process (a count that went back, `clear counters`, starts
// it afresh: RecentMean.Add).
func (pc *procCounters) meanOf(prev *procCounters, k haproxy.ServerKey, known bool) *haproxy.RecentMean {
	var m *haproxy.RecentMean
	if known && prev != nil {
		m = prev.means[k]
	}
	if m == nil {
		m = &haproxy.RecentMean{}
	}
	pc.means[k] = m
	return m
}

// answered is the answers HAProxy timed for the server, each of which
// moved its rtime: those it passed on (1xx to 5xx), not "other" (no
// answer).
func answered(c haproxy.StatCounters) int64 {
	var n int64
	for _, h := range c.Hrsp[:5] {
		n += h
	}
	return n
}

func (pc *procCounters) server(k haproxy.ServerKey) (haproxy.StatCounters, bool) {
	if pc == nil {
		return haproxy.StatCounters{}, false
	}
	c, ok := pc.servers[k]
	return c, ok
}

// grown is what the counters gained from old to cur. A counter that went
// down was cleared (`clear counters`): then the whole row counts from
// zero, since a clear resets every counter at once.
func grown(old, cur haproxy.StatCounters) (haproxy.StatCounters, bool) {
	d := cur
	d.ReqTot -= old.ReqTot
	d.Wretr -= old.Wretr
	d.Wredis -= old.Wredis
	d.Econ -= old.Econ
	d.Eresp -= old.Eresp
	d.SrvAbrt -= old.SrvAbrt
	d.Stot -= old.Stot
	reset := d.ReqTot < 0 || d.Wretr < 0 || d.Wredis < 0 || d.Econ < 0 || d.Eresp < 0 || d.SrvAbrt < 0 || d.Stot < 0
	for i := range d.Hrsp {
		d.Hrsp[i] -= old.Hrsp[i]
		reset = reset || d.Hrsp[i] < 0
	}
	if reset {
		return cur, true
	}
	return d, false
}

// unanswered is the attempts HAProxy sent to the server that it counted
// no answer of (sessions less requests answered): every failure class
// lies within it, and so does a request still in flight.
func unanswered(c haproxy.StatCounters) int64 { return max(c.Stot-c.ReqTot, 0) }

// settled is the unanswered attempts no longer in flight (Scur, the
// server's current sessions): each is a failure HAProxy has counted by
// now, or no failure at all. HAProxy counts a stream's failure (eresp,
// econ, wretr, wredis) before the stream leaves Scur.
func settled(c haproxy.StatCounters) int64 { return max(unanswered(c)-int64(max(c.Scur, 0)), 0) }

// classes splits a row's gain into the failures of each class, none
// counted twice. HAProxy counts some failures in two columns: a
// retry-on retry that is redispatched in both wretr and wredis, a reset
// before the answer to a client without keep-alive twice in eresp
// (HAProxy 2.6 measured), and on some versions its own 504 in hrsp_5xx
// as well as in eresp. So each class is bounded by room, the attempts
// that ended with no answer counted and not yet accounted for: a
// failure that is an answer (hrsp_5xx) is counted as one there, and an
// attempt is counted in at most one class, taken in the order abort
// (srv_abrt), HAProxy's own (eresp less srv_abrt, econ), retry (wretr,
// wredis). An attempt in flight when read is room, not a failure: it
// is accounted once its answer or its failure is counted.
func classes(gain haproxy.StatCounters, room int64) (out [window.NumFails]int64) {
	raw := [window.NumFails]int64{
		window.FailAbort: gain.SrvAbrt,
		window.FailProxy: satAdd(max(gain.Eresp-gain.SrvAbrt, 0), gain.Econ),
		window.FailRetry: satAdd(gain.Wretr, gain.Wredis),
	}
	for _, f := range []window.Fail{window.FailAbort, window.FailProxy, window.FailRetry} {
		out[f] = min(max(raw[f], 0), max(room, 0))
		room -= out[f]
	}
	return out
}

// satAdd is a+b for counts (not negative), at most math.MaxInt64: a
// counter near 2^63 must not wrap to a negative count.
func satAdd(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// statuses stand for each answer class of StatCounters.Hrsp; "other" (no
// valid status) is a request and nothing more.
var statuses = [6]int{100, 200, 300, 400, 500, 0}

// recorderAt is a sink that takes an event's second: *window.Store.
type recorderAt interface {
	RecordAt(sec int64, ev window.Event)
}

// record adds one row's gain to the windows as counted events, spread
// evenly over the seconds (since, now] it accrued in, so that the windows
// hold a rate per second however long the period (a 15 s poll's counts
// in one bucket would read as a burst, and leave the seconds around it
// empty). Answers carry the mean time of the server's last 10 s of
// answers, taken from the moves of HAProxy's average response time
// (rtime, the only latency the counters give; haproxy.RecentMean), or
// rtime itself until there is such a mean: every percentile of the
// stats path is a mean. In StatRetries mode only the retried attempts are recorded,
// and the answers too where silent: no per-response path reports the
// server (Coverage).
func (p *StatPoller) record(r haproxy.ServerStat, gain haproxy.StatCounters, fails [window.NumFails]int64, since, now int64, silent bool) {
	at, spread := p.Sink.(recorderAt)
	secs := max(now-since, 1)
	if !spread {
		secs = 1
	}
	var clamped bool
	// emit records n events of ev's kind and returns how many it took.
	emit := func(ev window.Event, n int64) int64 {
		if n > MaxGainPerSecond*secs {
			n, clamped = MaxGainPerSecond*secs, true
		}
		base, rem := n/secs, n%secs
		// Only the last MaxSpread seconds can land in a window.
		for i := max(secs-MaxSpread, 0); i < secs; i++ {
			c := base
			if i >= secs-rem {
				c++ // the remainder goes to the latest seconds
			}
			for c > 0 { // at most twice: c is within MaxGainPerSecond+1
				k := min(c, window.MaxCount)
				ev.Count = int(k)
				if spread {
					at.RecordAt(now-secs+1+i, ev)
				} else {
					p.Sink.Record(ev)
				}
				c -= k
			}
		}
		return n
	}
	defer func() {
		if !clamped {
			return
		}
		// Warned the first time and every hundredth: a socket that sends
		// such counters every poll must not flood the log.
		if n := p.Counters.Clamped.Add(1); n == 1 || n%100 == 0 {
			p.Log.Warn().Uint64("clamped_so_far", n).Str("backend", r.Backend).Str("server", r.Server).Int64("seconds", secs).
				Msg("stats path: a counter gained more than its period could hold; recorded at the bound")
		}
	}()
	be, srv := []byte(r.Backend), []byte(r.Server)
	if p.Mode != StatRetries || silent {
		for i, n := range gain.Hrsp {
			if n > 0 {
				p.Counters.Answers.Add(uint64(emit(window.Event{Backend: be, Server: srv, Status: statuses[i], ResponseMs: r.RespTimeMs, Counted: true}, n)))
			}
		}
	}
	for _, f := range window.Fails {
		if fails[f] <= 0 || !p.records(f) && f != window.FailProxy {
			continue // FailProxy: pollOne kept it only where recorded
		}
		n := uint64(emit(window.Event{Backend: be, Server: srv, Fail: f, ResponseMs: -1, Counted: true}, fails[f]))
		switch f {
		case window.FailRetry:
			p.Counters.Retried.Add(n)
		case window.FailProxy:
			p.Counters.Proxy.Add(n)
		case window.FailAbort:
			p.Counters.Aborted.Add(n)
		}
	}
}

// records says whether the stats path records failures of class f: all
// of them but in StatRetries mode, where only the Unseen.
func (p *StatPoller) records(f window.Fail) bool {
	return p.Mode != StatRetries || p.Unseen == nil || slices.Contains(p.Unseen, f)
}

func (p *StatPoller) now() time.Time {
	if p.Now == nil {
		return time.Now()
	}
	return p.Now()
}

// Figures are the stats path's counters, for /metrics and /status.
func (p *StatPoller) Figures() []promtext.Figure {
	c := &p.Counters
	return []promtext.Figure{
		{Metric: "hapilot_stats_polls_total", Help: "show stat replies read by the stats path.", V: c.Polls.Load()},
		{Metric: "hapilot_stats_errors_total", Help: "Reads of an HAProxy process's counters that failed.", V: c.Errors.Load()},
		{Metric: "hapilot_stats_resets_total", Help: "Server counters found lower than before (clear counters).", V: c.Resets.Load()},
		{Metric: "hapilot_stats_reloads_total", Help: "HAProxy processes replaced behind a socket (reload, restart).", V: c.Reloads.Load()},
		{Metric: "hapilot_stats_answers_total", Help: "Answers recorded from HAProxy's counters.", V: c.Answers.Load()},
		{Metric: "hapilot_stats_retried_total", Help: "Retried or redispatched attempts (wretr, wredis) recorded as failures of their server.", V: c.Retried.Load()},
		{Metric: "hapilot_stats_haproxy_5xx_total", Help: "HAProxy's own 502/503/504 for a server (eresp less srv_abrt, econ) recorded as its failures.", V: c.Proxy.Load()},
		{Metric: "hapilot_stats_aborted_total", Help: "Transfers a server aborted (srv_abrt) recorded as its failures.", V: c.Aborted.Load()},
		{Metric: "hapilot_stats_clamped_total", Help: "Server rows whose counters gained more than their period could hold, recorded at the bound.", V: c.Clamped.Load()},
	}
}
