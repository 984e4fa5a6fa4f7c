package window

import (
	"errors"
	"fmt"
	"sort"
)

// Bin is one latency histogram bin's count.
type Bin struct {
	Index uint8 // 0 .. LatencyBins-1
	Count uint32
}

// LatencyBins is how many bins a second's latency histogram has.
const LatencyBins = latencyBins

// Second is what one series gained in one second: the unit a fleet's
// agents ship to each other. Ago counts back from the sender's current
// second, so that the receiver files it under its own clock's second and
// the nodes' clocks need not agree.
type Second struct {
	Ago                               uint8
	Requests, Err5xx, Err4xx, Retried uint32
	Latency                           []Bin // only the bins that gained
}

// Delta is one series' gains, second by second.
type Delta struct {
	Backend, Server string
	Seconds         []Second
}

// ExportBack is how many past seconds an Exporter reads again each time:
// the stats path and the Lua companion write into seconds already gone.
const ExportBack = 5

// Exporter returns, each call, what every series of a store gained since
// the call before: per second, over the current second and the
// ExportBack before it. Writes into older seconds are not shipped. It is
// not safe for concurrent use: one goroutine (the fleet's sender) owns it.
type Exporter struct {
	Store *Store
	sent  map[*Series]*[ExportBack + 1]shipped
}

// shipped is what one bucket held when it was last exported.
type shipped struct {
	sec                               int64
	requests, err5xx, err4xx, retried uint32
	latency                           [latencyBins]uint32
}

// Deltas returns every series' gains since the last call, sorted by
// backend then server.
func (e *Exporter) Deltas() []Delta {
	if e.sent == nil {
		e.sent = map[*Series]*[ExportBack + 1]shipped{}
	}
	now := e.Store.now().Unix()
	m := *e.Store.series.Load()
	live := make(map[*Series]bool, len(e.sent))
	var out []Delta
	for _, srv := range m {
		for _, sr := range srv {
			live[sr] = true
			prev := e.sent[sr]
			if prev == nil {
				prev = new([ExportBack + 1]shipped)
				for i := range prev {
					prev[i].sec = -1
				}
				e.sent[sr] = prev
			}
			if d := sr.gains(now, prev); len(d.Seconds) > 0 {
				out = append(out, d)
			}
		}
	}
	for sr := range e.sent {
		if !live[sr] {
			delete(e.sent, sr) // retained away
		}
	}
	sortDeltas(out)
	return out
}

func (sr *Series) gains(now int64, prev *[ExportBack + 1]shipped) Delta {
	d := Delta{Backend: sr.Backend, Server: sr.Server}
	for ago := int64(ExportBack); ago >= 0; ago-- {
		sec := now - ago
		if sec < 0 {
			continue
		}
		b := &sr.buckets[uint64(sec)%uint64(len(sr.buckets))]
		if b.sec.Load() != sec {
			continue
		}
		p := &prev[uint64(sec)%uint64(len(prev))]
		if p.sec != sec {
			*p = shipped{sec: sec}
		}
		if b.requests.Load() == p.requests && b.err5xx.Load() == p.err5xx {
			// nothing new: a writer adds to requests first, so latency
			// counts racing this read are shipped with its next gain
			continue
		}
		var s Second
		s.Ago = uint8(ago)
		s.Requests = gain(b.requests.Load(), &p.requests)
		s.Err5xx = gain(b.err5xx.Load(), &p.err5xx)
		s.Err4xx = gain(b.err4xx.Load(), &p.err4xx)
		s.Retried = gain(b.failed[FailRetry].Load(), &p.retried)
		b.eachLatency(func(j int, c uint32) {
			if g := gain(c, &p.latency[j]); g > 0 {
				s.Latency = append(s.Latency, Bin{Index: uint8(j), Count: g})
			}
		})
		if s.Requests > 0 || s.Err5xx > 0 || s.Err4xx > 0 || s.Latency != nil {
			d.Seconds = append(d.Seconds, s)
		}
	}
	return d
}

// gain is cur less what was shipped, and records cur as shipped. A
// counter below what was shipped was cleared (Forget) and counts afresh.
func gain(cur uint32, was *uint32) uint32 {
	g := cur - *was
	if cur < *was {
		g = cur
	}
	*was = cur
	return g
}

func sortDeltas(ds []Delta) {
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].Backend != ds[j].Backend {
			return ds[i].Backend < ds[j].Backend
		}
		return ds[i].Server < ds[j].Server
	})
}

// ErrBadSecond is a shipped second the store cannot hold: a latency bin
// out of range, or counts over MaxCount.
var ErrBadSecond = errors.New("window: bad shipped second")

// Add files what a peer shipped under the store's own second now-Ago. A
// second outside the window is skipped; a bad one is refused whole, and
// names are bounded as for events.
func (s *Store) Add(backend, server string, sec Second) error {
	if sec.Requests > MaxCount || sec.Err5xx > sec.Requests || sec.Err4xx > sec.Requests || sec.Retried > sec.Err5xx {
		return fmt.Errorf("%w: %d requests, %d 5xx, %d 4xx, %d retried", ErrBadSecond, sec.Requests, sec.Err5xx, sec.Err4xx, sec.Retried)
	}
	var timed uint64
	for _, b := range sec.Latency {
		if int(b.Index) >= latencyBins {
			return fmt.Errorf("%w: latency bin %d", ErrBadSecond, b.Index)
		}
		timed += uint64(b.Count)
	}
	if timed > uint64(sec.Requests) {
		return fmt.Errorf("%w: %d timed answers of %d requests", ErrBadSecond, timed, sec.Requests)
	}
	if int64(sec.Ago) >= s.span {
		return nil
	}
	if len(backend) == 0 || len(backend) > MaxName || len(server) == 0 || len(server) > MaxName {
		s.badNames.Add(uint64(sec.Requests))
		s.dropped.Add(uint64(sec.Requests))
		return nil
	}
	sr := s.lookup([]byte(backend), []byte(server))
	if sr == nil {
		s.dropped.Add(uint64(sec.Requests))
		return nil
	}
	// A peer's requests are new evidence for the sequential test too.
	sr.totalReq.Add(uint64(sec.Requests))
	sr.total5xx.Add(uint64(sec.Err5xx))
	sr.totalFailed[FailRetry].Add(uint64(sec.Retried))
	for _, l := range sec.Latency {
		// a bin lies within one tally slot: its slot is its top's
		sr.totalTail[TailSlot(binUpper(int(l.Index)))].Add(l.Count)
	}
	b := sr.bucketAt(s.now().Unix() - int64(sec.Ago))
	if b == nil {
		return nil
	}
	s.events.Add(uint64(sec.Requests))
	r := &sr.run // first, as record does
	r.requests.Add(uint64(sec.Requests))
	r.err5xx.Add(uint64(sec.Err5xx))
	r.err4xx.Add(uint64(sec.Err4xx))
	r.failed[FailRetry].Add(uint64(sec.Retried))
	b.requests.Add(sec.Requests)
	b.err5xx.Add(sec.Err5xx)
	b.err4xx.Add(sec.Err4xx)
	b.failed[FailRetry].Add(sec.Retried)
	for _, l := range sec.Latency {
		r.addLatency(int(l.Index), l.Count)
		b.addLatency(int(l.Index), l.Count)
	}
	return nil
}
