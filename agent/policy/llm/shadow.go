package llm

import (
	"context"
	"sort"

	"github.com/hapilot/hapilot/agent"
)

// shadow lets the model decide and the acting policy (rules) act; every
// step's disagreement goes into the audit record. This is how an operator
// trials a model without letting it touch traffic (`--policy shadow`).
type shadow struct {
	Model  *Policy
	Acting agent.Policy

	// last is the loop goroutine's alone: the loop calls Decide and then
	// Report, never at once, so it needs no mutex.
	last shadowReport
}

// NewShadow is shadow mode as the loop runs it: the acting policy's
// needs and evidence test (its plan is the one that runs; acting should
// be the model's floor, as the daemon builds it), the model's
// status, metrics and life cycle, and the comparison as the report.
func NewShadow(model *Policy, acting agent.Policy) agent.Policy {
	s := &shadow{Model: model, Acting: acting}
	pol := agent.Policy{Decider: s, Needs: acting.Needs, Report: s.Report,
		Status: model.PolicyStatus, Metrics: model.WriteMetrics, Start: model.Start, Close: model.Close}
	if acting.Evidence != nil {
		// The model's candidates' test reads what the acting rules read
		// (the daemon makes the acting rules the model's floor too).
		pol.Evidence = func(obs agent.Observation) []agent.Key {
			model.feedCandidates(obs)
			return acting.Evidence(obs)
		}
	}
	return pol
}

// shadowReport is one shadow step. Compared is false when the model gave
// no answer of its own (a failed or overrunning call, a model still
// loading, a step the gate left to the floor): the plans are then not
// compared, and no agreement is claimed.
type shadowReport struct {
	Model        Report     `json:"model"`
	ModelPlan    agent.Plan `json:"model_plan"`
	ModelError   string     `json:"model_error,omitempty"`
	Compared     bool       `json:"compared"`
	OnlyModel    []string   `json:"only_model,omitempty"`  // the model would, the rules did not
	OnlyActing   []string   `json:"only_acting,omitempty"` // the rules did, the model would not
	Disagreement bool       `json:"disagreement"`
}

func (s *shadow) Name() string { return "shadow:" + s.Acting.Name() }

func (s *shadow) Report() any { return s.last }

func (s *shadow) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	modelPlan, merr := s.Model.Decide(ctx, obs)
	plan, err := s.Acting.Decide(ctx, obs)
	r := shadowReport{Model: s.Model.LastReport(), ModelPlan: modelPlan}
	switch {
	case merr != nil:
		r.ModelError = merr.Error()
	case r.Model.Fallback != "":
		r.ModelError = "the model did not decide: " + r.Model.Fallback
	case !r.Model.Called:
		// Gated: the model's plan is its floor's, which is the acting
		// rules' own, so a match would claim an agreement no model made
		// (seen against the real Ollama: every step "agreed").
	default:
		r.Compared = true
	}
	if r.Compared {
		set := func(p agent.Plan) map[proposal]bool {
			m := map[proposal]bool{}
			for _, a := range p {
				m[proposalOf(a)] = true
			}
			return m
		}
		mk, ak := set(modelPlan), set(plan)
		for k := range mk {
			if !ak[k] {
				r.OnlyModel = append(r.OnlyModel, k.String())
			}
		}
		for k := range ak {
			if !mk[k] {
				r.OnlyActing = append(r.OnlyActing, k.String())
			}
		}
		sort.Strings(r.OnlyModel)
		sort.Strings(r.OnlyActing)
		r.Disagreement = len(r.OnlyModel)+len(r.OnlyActing) > 0
	}
	s.last = r
	return plan, err
}
