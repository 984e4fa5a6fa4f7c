package llm

import (
	"context"
	"io"
	"sort"

	"github.com/hapilot/hapilot/agent"
)

// Shadow lets the model decide and the acting policy (rules) act; every
// step's disagreement goes into the audit record. This is how an operator
// trials a model without letting it touch traffic.
type Shadow struct {
	Model  *Policy
	Acting agent.Policy

	last ShadowReport
}

// ShadowReport is one shadow step. Compared is false when the model gave
// no answer of its own (a failed or overrunning call, a model still
// loading): the plans are then not compared, and no agreement is claimed.
type ShadowReport struct {
	Model        Report     `json:"model"`
	ModelPlan    agent.Plan `json:"model_plan"`
	ModelError   string     `json:"model_error,omitempty"`
	Compared     bool       `json:"compared"`
	OnlyModel    []string   `json:"only_model,omitempty"`  // the model would, the rules did not
	OnlyActing   []string   `json:"only_acting,omitempty"` // the rules did, the model would not
	Disagreement bool       `json:"disagreement"`
}

func (s *Shadow) Name() string { return "shadow:" + s.Acting.Name() }

// Needs are the acting policy's: it is the one whose plan runs.
func (s *Shadow) Needs() agent.Needs { return agent.NeedsOf(s.Acting) }

func (s *Shadow) Report() any { return s.last }

// PolicyStatus is the model's.
func (s *Shadow) PolicyStatus() any { return s.Model.PolicyStatus() }

// Start and Close run and stop the model's life cycle.
func (s *Shadow) Start() { s.Model.Start() }
func (s *Shadow) Close() { s.Model.Close() }

// WriteMetrics are the model's.
func (s *Shadow) WriteMetrics(w io.Writer) { s.Model.WriteMetrics(w) }

func (s *Shadow) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	modelPlan, merr := s.Model.Decide(ctx, obs)
	plan, err := s.Acting.Decide(ctx, obs)
	r := ShadowReport{Model: s.Model.Report().(Report), ModelPlan: modelPlan}
	switch {
	case merr != nil:
		r.ModelError = merr.Error()
	case r.Model.Fallback != "":
		r.ModelError = "the model did not decide: " + r.Model.Fallback
	default:
		r.Compared = true
	}
	if r.Compared {
		set := func(p agent.Plan) map[string]bool {
			m := map[string]bool{}
			for _, a := range p {
				m[actionKey(a)] = true
			}
			return m
		}
		mk, ak := set(modelPlan), set(plan)
		for k := range mk {
			if !ak[k] {
				r.OnlyModel = append(r.OnlyModel, k)
			}
		}
		for k := range ak {
			if !mk[k] {
				r.OnlyActing = append(r.OnlyActing, k)
			}
		}
		sort.Strings(r.OnlyModel)
		sort.Strings(r.OnlyActing)
		r.Disagreement = len(r.OnlyModel)+len(r.OnlyActing) > 0
	}
	s.last = r
	return plan, err
}
