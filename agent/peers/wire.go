package peers

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// The agents' messages travel sealed with the fleet's key (seal.go),
// beside memberlist's own packets on the same port: what reaches decode
// came from a holder of the key. decode still trusts nothing about its
// shape, and Node.admit nothing about its sender.
//
//	header: 'h' version kind, sender (string), incarnation, sent, seq (uvarints)
//	state:  n × backend, pooled requests, pooled 5xx, n × (server, phase, weight, reason, 5xx rate in ppm)
//	counts: n × backend, server, n × (ago, requests, 5xx, 4xx, retried, n × (bin, count))
//
// Version 3 added a held server's 5xx rate at its drain, which sizes the
// probe burst that may bring it back on whichever agent decides next.
// Version 2 added the time of sending (sent), so that a message replayed
// later is refused by any receiver, however recently it started; version
// 1's messages rode in memberlist's user messages, which say nothing of
// where they came from. The two versions do not talk: every agent of a
// fleet runs the same one.
const (
	magic   = 'h'
	version = 3

	kindState  = 1
	kindCounts = 2

	maxName   = window.MaxName
	maxReason = 160
	maxItems  = 1 << 16

	// MaxMessage bounds every message an agent sends, and so what a
	// receiver reads before it refuses one: a state message is cut to
	// it (the backends left out are decided locally by their followers,
	// as when a decider has not spoken), counts are packed far below it.
	MaxMessage = 256 << 10
)

// header opens every message.
type header struct {
	Kind        byte
	Sender      string
	Incarnation uint64 // the sender's start, in Unix nanoseconds
	Sent        uint64 // when it was sent, in Unix nanoseconds, by the sender's clock
	Seq         uint64 // per sender and incarnation, one per message
}

// Held is one server a decider holds out of full service.
type Held struct {
	Server string
	Phase  agent.Phase
	Weight int
	Reason string
	// ErrorRate is the server's 5xx rate when the decider drained it:
	// a follower that drains it on this word has no such figure of its
	// own (its window holds a third of the traffic, or nothing after a
	// restart), and the probe burst that may bring it back is sized on
	// it, on this agent or on whichever decides next.
	ErrorRate float64
}

// ppm is a rate in parts per million, as it travels.
const ppm = 1e6

// Decision is a decider's word on one backend: every server it holds
// drained or at a cut weight, all others at full service. It is a state,
// not a command, so a repeated or late one changes nothing.
type Decision struct {
	Backend string
	// Pooled is the fleet's evidence the decider judged on, for the
	// followers' /status.
	PooledRequests, PooledErr5xx uint64
	Held                         []Held
}

// stateMsg is what every agent sends every peer each sync: its heartbeat,
// and its decisions for the backends it decides.
type stateMsg struct {
	header
	Decisions []Decision
}

// countsMsg is what an agent's windows gained, sent to the deciders of
// their backends.
type countsMsg struct {
	header
	Deltas []window.Delta
}

var phases = []agent.Phase{"", agent.PhaseDrained, agent.PhaseCut, agent.PhaseCanary}

func phaseCode(p agent.Phase) byte {
	for i, q := range phases {
		if q == p && i > 0 {
			return byte(i)
		}
	}
	return 0
}

type writer struct{ b []byte }

func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) byte(c byte)      { w.b = append(w.b, c) }
func (w *writer) string(s string, limit int) {
	if len(s) > limit {
		s = s[:limit]
	}
	w.uvarint(uint64(len(s)))
	w.b = append(w.b, s...)
}

func (w *writer) header(h header) {
	w.b = append(w.b, magic, version, h.Kind)
	w.string(h.Sender, maxName)
	w.uvarint(h.Incarnation)
	w.uvarint(h.Sent)
	w.uvarint(h.Seq)
}

// encodeState encodes m, cut to MaxMessage: left is how many of its
// decisions did not fit (0 but for thousands of held servers with the
// longest names).
func encodeState(m stateMsg) (msg []byte, left int) {
	w := &writer{}
	m.Kind = kindState
	w.header(m.header)
	var body writer
	n := 0
	for _, d := range m.Decisions {
		var e writer
		e.string(d.Backend, maxName)
		e.uvarint(d.PooledRequests)
		e.uvarint(d.PooledErr5xx)
		e.uvarint(uint64(len(d.Held)))
		for _, h := range d.Held {
			e.string(h.Server, maxName)
			e.byte(phaseCode(h.Phase))
			e.uvarint(uint64(max(h.Weight, 0)))
			e.string(h.Reason, maxReason)
			e.uvarint(uint64(math.Round(min(max(h.ErrorRate, 0), 1) * ppm)))
		}
		if len(w.b)+binary.MaxVarintLen64+len(body.b)+len(e.b) > MaxMessage {
			break
		}
		body.b = append(body.b, e.b...)
		n++
	}
	w.uvarint(uint64(n))
	w.b = append(w.b, body.b...)
	return w.b, len(m.Decisions) - n
}

// encodeCounts packs deltas into messages of at most limit bytes each
// (one delta larger than limit goes alone), so that each fits a UDP
// packet.
func encodeCounts(h header, deltas []window.Delta, limit int, nextSeq func() uint64) [][]byte {
	var out [][]byte
	var body writer
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		w := &writer{}
		h.Kind, h.Seq = kindCounts, nextSeq()
		w.header(h)
		w.uvarint(uint64(n))
		w.b = append(w.b, body.b...)
		out = append(out, w.b)
		body.b, n = nil, 0
	}
	for _, d := range deltas {
		var e writer
		e.string(d.Backend, maxName)
		e.string(d.Server, maxName)
		e.uvarint(uint64(len(d.Seconds)))
		for _, s := range d.Seconds {
			e.byte(s.Ago)
			e.uvarint(uint64(s.Requests))
			e.uvarint(uint64(s.Err5xx))
			e.uvarint(uint64(s.Err4xx))
			e.uvarint(uint64(s.Retried))
			e.uvarint(uint64(len(s.Latency)))
			for _, b := range s.Latency {
				e.byte(b.Index)
				e.uvarint(uint64(b.Count))
			}
		}
		if n > 0 && len(body.b)+len(e.b)+headerRoom > limit {
			flush()
		}
		body.b = append(body.b, e.b...)
		n++
	}
	flush()
	return out
}

// headerRoom bounds a header and an item count.
const headerRoom = 3 + 1 + maxName + 3*binary.MaxVarintLen64 + binary.MaxVarintLen64

var errShort = errors.New("message cut short")

type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errShort)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail(errShort)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) string(limit int) string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(r.b)) {
		r.fail(fmt.Errorf("string of %d bytes (limit %d, %d left)", n, limit, len(r.b)))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// count reads an item count, which may not exceed what the bytes left
// could hold at minItem bytes per item.
func (r *reader) count(minItem int) int {
	n := r.uvarint()
	if r.err == nil && (n > maxItems || n*uint64(minItem) > uint64(len(r.b))) {
		r.fail(fmt.Errorf("%d items in %d bytes", n, len(r.b)))
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

func (r *reader) u32() uint32 {
	v := r.uvarint()
	if v > 1<<32-1 {
		r.fail(fmt.Errorf("count %d over 32 bits", v))
	}
	return uint32(v)
}

// decode parses one message: a *stateMsg or a *countsMsg.
func decode(b []byte) (any, error) {
	r := &reader{b: b}
	if len(b) < 3 || b[0] != magic {
		return nil, errors.New("not a hapilot fleet message")
	}
	if b[1] != version {
		return nil, fmt.Errorf("fleet message version %d, this agent speaks %d", b[1], version)
	}
	r.b = b[3:]
	h := header{Kind: b[2]}
	h.Sender = r.string(maxName)
	h.Incarnation = r.uvarint()
	h.Sent = r.uvarint()
	h.Seq = r.uvarint()
	if r.err == nil && h.Sender == "" {
		r.fail(errors.New("no sender"))
	}
	var out any
	switch h.Kind {
	case kindState:
		m := &stateMsg{header: h}
		for range r.count(4) {
			d := Decision{Backend: r.string(maxName), PooledRequests: r.uvarint(), PooledErr5xx: r.uvarint()}
			for range r.count(4) {
				hd := Held{Server: r.string(maxName)}
				code := r.byte()
				if int(code) >= len(phases) || code == 0 {
					r.fail(fmt.Errorf("phase %d", code))
				} else {
					hd.Phase = phases[code]
				}
				w := r.uvarint()
				if w > 256 {
					r.fail(fmt.Errorf("weight %d", w)) // HAProxy's own bound
				}
				hd.Weight = int(w)
				hd.Reason = r.string(maxReason)
				if rate := r.uvarint(); rate > ppm {
					r.fail(fmt.Errorf("5xx rate %d ppm", rate))
				} else {
					hd.ErrorRate = float64(rate) / ppm
				}
				d.Held = append(d.Held, hd)
			}
			m.Decisions = append(m.Decisions, d)
		}
		out = m
	case kindCounts:
		m := &countsMsg{header: h}
		for range r.count(5) {
			d := window.Delta{Backend: r.string(maxName), Server: r.string(maxName)}
			for range r.count(6) {
				s := window.Second{Ago: r.byte(), Requests: r.u32(), Err5xx: r.u32(), Err4xx: r.u32(), Retried: r.u32()}
				for range r.count(2) {
					s.Latency = append(s.Latency, window.Bin{Index: r.byte(), Count: r.u32()})
				}
				d.Seconds = append(d.Seconds, s)
			}
			m.Deltas = append(m.Deltas, d)
		}
		out = m
	default:
		return nil, fmt.Errorf("message kind %d", h.Kind)
	}
	if r.err != nil {
		return nil, fmt.Errorf("fleet message from %q: %w", h.Sender, r.err)
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("fleet message from %q: %d bytes after its end", h.Sender, len(r.b))
	}
	return out, nil
}

// The node's meta in memberlist carries its incarnation, so that every
// member knows which process of a name memberlist lists, and refuses
// messages from any other (an older process, or a member lying about
// another's name): 'h' version, incarnation (uvarint).
func encodeMeta(incarnation uint64) []byte {
	w := &writer{b: []byte{magic, version}}
	w.uvarint(incarnation)
	return w.b
}

func decodeMeta(b []byte) (uint64, error) {
	if len(b) < 2 || b[0] != magic {
		return 0, errors.New("no hapilot meta: an agent of fleet wire version 1, or not an agent")
	}
	if b[1] != version {
		return 0, fmt.Errorf("meta of fleet wire version %d, this agent speaks %d", b[1], version)
	}
	r := &reader{b: b[2:]}
	inc := r.uvarint()
	if r.err == nil && len(r.b) != 0 {
		r.fail(errors.New("bytes after the incarnation"))
	}
	return inc, r.err
}
