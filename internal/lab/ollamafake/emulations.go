package ollamafake

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"
)

// Emulations are the benchmark's emulated models, named after the
// behaviours the study saw. They are Go code behind the stand-in server,
// not models; every report that uses one says so.
var Emulations = []string{"capable", "thinker", "conservative", "trigger-happy", "flip-flop", "slow-thinker",
	"drain-all", "garbage", "slow", "cold", "small-context", "readies-all", "raises-weights"}

// Misbehaving are the emulations that must never do worse than static
// and never harm a healthy server, whatever they answer.
var Misbehaving = []string{"drain-all", "trigger-happy", "flip-flop", "garbage", "slow", "cold", "small-context", "readies-all", "raises-weights"}

// Traits sets the server-side traits an emulation needs, scaled to the
// loop being benchmarked as Emulation's delays are: a cold model loads
// for two intervals (20 s at the study's 10 s); a small-context one has
// 1,536 tokens; the thinkers can think.
func Traits(name string, interval time.Duration) func(*Server) {
	return func(s *Server) {
		switch name {
		case "cold":
			s.LoadTime = 2 * interval
		case "small-context":
			s.ContextLength, s.DefaultNumCtx = 1536, 1536
		case "thinker", "slow-thinker":
			s.Thinking = true
		}
	}
}

// The figures the emulations aim at, as the study reported them (Chauhan &
// Pendyala, "Benchmarking LLM-Guided Control-Plane Policies for Backend
// Fault Isolation in HAProxy", 2026; docs/explanation/study.md).
const (
	// conservative: precision about 0.92, recall about 0.34.
	conservativeNotices = 0.34   // share of faulty servers it ever acts on
	conservativeFalse   = 0.0015 // per step: drains the slowest healthy server
	// trigger-happy: precision about 0.71, recall about 0.94.
	triggerHappyMisses = 0.06  // share of faulty servers it never acts on
	triggerHappyFalse  = 0.006 // per step: drains a server that "looks slow"
	// slow-thinker, reasoning on: about 1,546 completion tokens and 12 s
	// a step at a 10 s interval; reasoning off: about 157 tokens.
	slowThinkerTokens  = 1546
	slowThinkerCheap   = 157
	slowThinkerOverrun = 1.2 // times the interval
)

// Emulation returns the named emulated model. seed makes its coin flips
// repeatable; interval scales the slow thinker's delay to the loop being
// benchmarked (12 s at the study's 10 s, 1.2 s at 1 s).
func Emulation(name string, seed uint64, interval time.Duration) (Responder, error) {
	switch name {
	case "capable", "cold", "small-context":
		return Capable, nil
	case "thinker":
		return func(req Request) Reply {
			rep := Capable(req)
			rep.Thinking = strings.Repeat("Compare each flagged server with its peers before acting. ", 60)
			rep.ThinkingTokens = 900
			return rep
		}, nil
	case "drain-all":
		return func(req Request) Reply {
			var acts []Action
			for _, r := range ready(ParsePrompt(req)) {
				acts = append(acts, Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "drain everything"})
			}
			return Reply{Content: Answer(grammar(acts)...)}
		}, nil
	case "garbage":
		var mu sync.Mutex
		n := 0
		replies := []string{
			"Sure! srv3 looks bad, drain it.",
			`{"actions":[{"action":"reboot","backend":"app","server":"srv1","reason":"x"}]}`,
			`{"actions":[{"action":"drain","backend":"app","server":"srv1; set server app/srv2 state maint","reason":"x"}]}`,
			`{"actions":[{"action":"drain"`,
			`{"plan":"drain"}`,
		}
		return func(Request) Reply {
			mu.Lock()
			defer mu.Unlock()
			n++
			return Reply{Content: replies[n%len(replies)]}
		}, nil
	case "slow":
		return func(req Request) Reply {
			rep := Capable(req)
			rep.Delay = 3 * interval
			return rep
		}, nil
	case "readies-all":
		return func(req Request) Reply {
			var acts []Action
			for _, r := range ParsePrompt(req) {
				if r.State == "drain" && r.Owner == "agent" {
					acts = append(acts, Action{Action: "ready", Backend: r.Backend, Server: r.Server, Reason: "looks healthy: 0 errors"})
				}
			}
			if len(acts) == 0 {
				return Capable(req)
			}
			return Reply{Content: Answer(acts...)}
		}, nil
	case "raises-weights":
		return func(req Request) Reply {
			var acts []Action
			for _, r := range ready(ParsePrompt(req)) {
				w := min(r.Weight+50, 256)
				acts = append(acts, Action{Action: "set_weight", Backend: r.Backend, Server: r.Server, Weight: &w, Reason: "more traffic to the best"})
			}
			return Reply{Content: Answer(grammar(acts)...)}
		}, nil
	case "flip-flop":
		return FlipFlop, nil
	case "conservative":
		c := newCoins(seed)
		return func(req Request) Reply {
			rep := Capable(req)
			a, drains := drainIn(rep.Content)
			switch {
			case drains && !c.fixed(a.Server, conservativeNotices):
				rep.Content = Answer(Action{Action: "no_op", Backend: "-", Server: "-", Reason: "not sure enough"})
			case !drains && c.step(conservativeFalse):
				if r, ok := slowest(ParsePrompt(req)); ok {
					rep.Content = Answer(Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "looks slow"})
				}
			}
			return rep
		}, nil
	case "trigger-happy":
		c := newCoins(seed)
		return func(req Request) Reply {
			rows := ready(ParsePrompt(req))
			rep := Reply{Content: Answer()}
			for _, r := range rows {
				if r.Err5xx > 0 && !c.fixed(r.Server, triggerHappyMisses) {
					rep.Content = Answer(Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "has errors"})
					return rep
				}
			}
			if c.step(triggerHappyFalse) {
				if r, ok := slowest(rows); ok {
					rep.Content = Answer(Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "looks slow"})
				}
			}
			return rep
		}, nil
	case "slow-thinker":
		return func(req Request) Reply {
			rep := Capable(req)
			if len(req.Think) == 0 || string(req.Think) == "false" {
				rep.CompletionTokens = slowThinkerCheap
				return rep
			}
			rep.CompletionTokens = slowThinkerTokens
			rep.Thinking = strings.Repeat("Let me weigh each server's error rate against its peers. ", 40)
			rep.Delay = time.Duration(slowThinkerOverrun * float64(interval))
			return rep
		}, nil
	}
	return nil, fmt.Errorf("unknown emulation %q (want %s)", name, strings.Join(Emulations, ", "))
}

// grammar keeps what Ollama's grammar for hapilot's schema would let
// through: at most 8 actions. A real model cannot answer more, so an
// emulation that would is cut as the grammar cuts it.
func grammar(acts []Action) []Action {
	return acts[:min(len(acts), 8)]
}

// drainIn finds the first drain in a reply rendered by Answer.
func drainIn(content string) (Action, bool) {
	var r struct{ Actions []Action }
	if json.Unmarshal([]byte(content), &r) != nil {
		return Action{}, false
	}
	for _, a := range r.Actions {
		if a.Action == "drain" {
			return a, true
		}
	}
	return Action{}, false
}

// slowest is the ready row with the highest p95.
func slowest(rows []Row) (Row, bool) {
	var best []Row
	for _, r := range rows {
		if r.State == "ready" {
			best = append(best, r)
		}
	}
	if len(best) == 0 {
		return Row{}, false
	}
	sort.SliceStable(best, func(i, j int) bool { return best[i].P95Ms > best[j].P95Ms })
	return best[0], true
}

// coins are an emulation's repeatable randomness: a fixed coin per server
// (the same answer every step of a run) and a fresh coin per step.
type coins struct {
	seed uint64
	mu   sync.Mutex
	rng  *rand.Rand
}

func newCoins(seed uint64) *coins {
	return &coins{seed: seed, rng: rand.New(rand.NewPCG(seed, 0x5eed))}
}

func (c *coins) fixed(server string, p float64) bool {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", c.seed, server)
	return rand.New(rand.NewPCG(h.Sum64(), 1)).Float64() < p
}

func (c *coins) step(p float64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rng.Float64() < p
}
