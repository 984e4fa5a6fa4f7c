package dataset

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
)

// Example is one model call as the policy makes it, and the answer the
// ground truth gives.
type Example struct {
	Kind   Kind
	System string
	User   string
	Answer string
	// Suspicious: the prompt flags a server as a candidate that is not
	// faulty, slow or overloaded; a drain there is collateral damage, and
	// the penalty weighs the example up.
	Suspicious bool
	// Truth is every server's ground truth, for tests.
	Truth map[agent.Key]Truth `json:"-"`
}

// Text is the example as the model reads it in training: the chat
// template Ollama renders (modelserver.ChatTemplate) and the answer,
// ended by the newline the Modelfile stops at.
func (e Example) Text() string {
	return "<|im_start|>system\n" + e.System + "<|im_end|>\n<|im_start|>user\n" + e.User + "<|im_end|>\n<|im_start|>assistant\n" + e.Answer + "\n"
}

// HasHistory tells whether the prompt shows the model's last decisions
// ("you: step 1: drain ..."), which the policy's prompt writes last.
func (e Example) HasHistory() bool { return strings.Contains(e.User, "\nyou: ") }

// Prompt is the example's text up to the answer: what Ollama sends the
// model.
func (e Example) Prompt() string {
	t := e.Text()
	return t[:len(t)-len(e.Answer)-1]
}

// Policy is the policy whose prompts become examples, one per situation:
// it decides each step, and is closed when its situation ends. An alias,
// so that a constructor that names no type of this package (and so does
// not import it) is a NewPolicy.
type Policy = interface {
	Decide(context.Context, agent.Observation) (agent.Plan, error)
	Close()
}

// NewPolicy builds the policy whose prompts become examples around server,
// the model server the dataset answers as, in the prompt form style. With
// production false it is set as calibration runs it (every step asked, no
// confirmation, no hold). The caller passes the LLM policy
// (internal/lab/llmprompts.New), so that the examples are the very prompts
// the agent sends, history, confirmations and the rules' floor included,
// while this package simulates and labels without knowing how the policy
// decides.
type NewPolicy func(server modelapi.Server, style prompt.Style, production bool) Policy

// Generate draws n examples from seed: situations run step by step
// through the policy newPolicy builds, with a model server that records
// each prompt and answers with the label, the situations drawn as d says.
func Generate(seed uint64, n int, style prompt.Style, d Draw, newPolicy NewPolicy) ([]Example, error) {
	g := &gen{r: rand.New(rand.NewPCG(seed, 0x64617461736574)), hold: CalibrationHoldout(), draw: d}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out []Example
	for len(out) < n {
		sit := g.situation(now)
		ex, err := run(g, sit, style, newPolicy)
		if err != nil {
			return nil, err
		}
		for _, e := range ex {
			// A prompt with no backend (nothing flagged, nothing of the
			// agent's) has one right answer and teaches little: most are
			// dropped, so that the faults get the training tokens.
			if !strings.Contains(e.User, "\nbackend ") && g.pick(5) != 0 {
				continue
			}
			out = append(out, e)
		}
		now = now.Add(time.Hour)
	}
	return out[:n], nil
}

// run steps one situation through a policy of its own, applying each
// step's plan to the simulation as the guardrails would let it through.
func run(g *gen, sit *situation, style prompt.Style, newPolicy NewPolicy) ([]Example, error) {
	rec := &recorder{sit: sit}
	p := newPolicy(rec, style, sit.production)
	defer p.Close()
	var out []Example
	for step := range sit.steps {
		obs := g.observe(sit, step)
		rec.called = false
		plan, err := p.Decide(context.Background(), obs)
		if err != nil {
			return nil, fmt.Errorf("dataset: %s step %d: %w", sit.kind, step, err)
		}
		if rec.called {
			out = append(out, rec.last)
		}
		if !sit.frozen {
			apply(sit, obs.Time, plan)
		}
	}
	return out, nil
}

func apply(sit *situation, at time.Time, plan agent.Plan) {
	for _, a := range plan {
		for _, b := range sit.backends {
			if b.name != a.Backend {
				continue
			}
			for _, s := range b.servers {
				if s.name != a.Server || s.operator {
					continue
				}
				switch a.Kind {
				case agent.Drain:
					if s.drainedAt.IsZero() {
						s.drainedAt = at
					}
				case agent.SetWeight:
					s.cur, s.cutAt = a.Weight, at
				}
			}
		}
	}
}

// recorder is the model server: it records the call and answers with
// the ground truth's label.
type recorder struct {
	sit    *situation
	called bool
	last   Example
}

func (r *recorder) Inspect(context.Context, string) (modelapi.Info, error) {
	return modelapi.Info{API: modelapi.APIOllama}, nil
}
func (r *recorder) Loaded(context.Context, string) (bool, error)                  { return true, nil }
func (r *recorder) Warm(context.Context, modelapi.Request) (time.Duration, error) { return 0, nil }
func (r *recorder) Digest(context.Context, string) (string, error)                { return "dataset", nil }
func (r *recorder) SizesContext() bool                                            { return true }

func (r *recorder) Chat(_ context.Context, req modelapi.Request) (modelapi.Reply, error) {
	ans, suspicious := Label(r.sit, req.User)
	r.called = true
	truth := map[agent.Key]Truth{}
	for _, b := range r.sit.backends {
		for _, s := range b.servers {
			truth[agent.Key{Backend: b.name, Server: s.name}] = s.truthAt(r.sit.now)
		}
	}
	r.last = Example{Kind: r.sit.kind, System: req.System, User: req.User, Answer: ans, Suspicious: suspicious, Truth: truth}
	return modelapi.Reply{Content: ans, DoneReason: "stop"}, nil
}

// row is one server row of a prompt, as the prompt builder writes it
// (prompt.Header's columns, then the note).
type row struct {
	backend, server string
	// bref and sref are the numbered form's references (b1, s3), ""
	// in the other forms: a numbered answer names them.
	bref, sref string
	owner      string
	weight     int
	candidate  string // why the windows flag it, "" when they do not
	floor      bool   // the rules act on it this step
	util       string // its util column: "-" where it has no maxconn
}

// rows reads a prompt's server rows back, in any style: the header line
// (prompt.Header, prompt.CompactHeader or prompt.NumberedHeader) says where the
// note starts, and a numbered row ends with its reference.
func rows(text string) []row {
	var out []row
	backend, bref := "", ""
	noteAt, utilAt, numbered := 16, 6, false
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "backend "); ok {
			bref = ""
			if ref, named, ok := strings.Cut(rest, " = "); ok && !strings.Contains(ref, ":") {
				bref, rest = ref, named
			}
			backend, _, _ = strings.Cut(rest, ":")
			continue
		}
		switch line {
		case prompt.Header:
			noteAt, utilAt, numbered = 16, 6, false
			continue
		case prompt.CompactHeader:
			noteAt, utilAt, numbered = 13, 12, false
			continue
		case prompt.NumberedHeader:
			noteAt, utilAt, numbered = 13, 12, true
			continue
		}
		sref := ""
		if numbered {
			i := strings.LastIndex(line, " = s")
			if i < 0 {
				continue
			}
			line, sref = line[:i], line[i+3:]
		}
		f := strings.Fields(line)
		if backend == "" || len(f) < noteAt+1 || strings.HasPrefix(line, "(") || strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "you: ") {
			continue
		}
		rw := row{backend: backend, server: f[0], owner: f[2], bref: bref, sref: sref, util: f[utilAt]}
		w, _, _ := strings.Cut(f[3], "/") // the compact "weight/cfg"
		fmt.Sscan(w, &rw.weight)
		note := strings.Join(f[noteAt:], " ")
		if _, why, ok := strings.Cut(note, "candidate: "); ok {
			rw.candidate, _, _ = strings.Cut(why, "; ")
		}
		rw.floor = strings.Contains(note, "the rules ") || strings.HasPrefix(note, "rules ") || strings.Contains(note, "; rules ")
		out = append(out, rw)
	}
	return out
}

// answer is one action of the reply schema, its keys in the schema's
// order.
type answer struct {
	Reason  string `json:"reason"`
	Action  string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight,omitempty"`
}

// Label is the answer the ground truth gives a prompt of sit: a drain of
// the first flagged server that is truly faulty or slow, a weight cut of
// one truly overloaded, else no_op with the reason. One action an answer,
// as the system prompt asks. A numbered prompt's answer (and its reason)
// names the rows' references, not the servers. suspicious: the prompt
// flags a server that is healthy (draining it would be collateral damage).
func Label(sit *situation, text string) (ans string, suspicious bool) {
	truth := map[agent.Key]*sserver{}
	for _, b := range sit.backends {
		for _, s := range b.servers {
			truth[agent.Key{Backend: b.name, Server: s.name}] = s
		}
	}
	var act *answer
	var noop string
	var floor, healthyCand string
	for _, rw := range rows(text) {
		s := truth[agent.Key{Backend: rw.backend, Server: rw.server}]
		if s == nil || rw.owner == string(agent.OwnerOperator) {
			continue
		}
		name, bname := rw.server, rw.backend
		if rw.sref != "" {
			name, bname = rw.sref, rw.bref
		}
		if rw.floor && floor == "" {
			floor = name
		}
		if rw.candidate == "" {
			continue
		}
		// The truth decides, whichever test flagged the server (the
		// policy keeps the first reason: errors, latency, overload).
		tr := s.truthAt(sit.now)
		switch {
		case tr == Faulty && s.drainedAt.IsZero(), tr == Slow:
			if act == nil {
				why := "5xx far above its peers"
				if tr == Slow {
					why = "p95 far above its peers"
				}
				act = &answer{Reason: name + ": " + why, Action: string(agent.Drain), Backend: bname, Server: name}
			}
		case tr == Overloaded:
			if act == nil {
				w := max(1, rw.weight*6/10)
				act = &answer{Reason: name + ": near its maxconn, cut its weight", Action: string(agent.SetWeight), Backend: bname, Server: name, Weight: &w}
			}
		case tr == Healthy:
			suspicious = true
			if healthyCand == "" {
				healthyCand = name
			}
		}
	}
	if act == nil {
		switch {
		case sit.kind == KindFleetwide && healthyCand != "":
			noop = "every server fails alike: not one server's fault"
		case healthyCand != "":
			noop = healthyCand + ": within chance of its peers"
		case floor != "":
			noop = "the rules act on " + floor
		case sit.kind == KindDrained:
			noop = "drained, no traffic: wait for its probes"
		case sit.kind == KindQuiet:
			noop = "no traffic yet"
		default:
			noop = "nothing stands out"
		}
		act = &answer{Reason: noop, Action: agent.VerbNoOp, Backend: "-", Server: "-"}
	}
	if len(act.Reason) > prompt.SchemaReason {
		act.Reason = act.Reason[:prompt.SchemaReason]
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(struct {
		Actions []answer `json:"actions"`
	}{[]answer{*act}})
	return strings.TrimSuffix(buf.String(), "\n"), suspicious
}
