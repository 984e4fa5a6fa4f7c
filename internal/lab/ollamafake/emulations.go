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
var Emulations = []string{"capable", "conservative", "trigger-happy", "flip-flop", "slow-thinker"}

// The study's figures the emulations aim at (shared/PAPER.md).
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
	case "capable":
		return Capable, nil
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
			rep := Reply{PromptTokens: 350, CompletionTokens: 30, Content: Answer()}
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
