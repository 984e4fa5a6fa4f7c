package llm

import (
	"context"
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

// ShadowReport is one shadow step.
type ShadowReport struct {
	Model        Report     `json:"model"`
	ModelPlan    agent.Plan `json:"model_plan"`
	ModelError   string     `json:"model_error,omitempty"`
	OnlyModel    []string   `json:"only_model,omitempty"`  // the model would, the rules did not
	OnlyActing   []string   `json:"only_acting,omitempty"` // the rules did, the model would not
	Disagreement bool       `json:"disagreement"`
}

func (s *Shadow) Name() string { return "shadow:" + s.Acting.Name() }

// Needs are the acting policy's: it is the one whose plan runs.
func (s *Shadow) Needs() agent.Needs { return agent.NeedsOf(s.Acting) }

func (s *Shadow) Report() any { return s.last }

func (s *Shadow) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	modelPlan, merr := s.Model.Decide(ctx, obs)
	plan, err := s.Acting.Decide(ctx, obs)
	r := ShadowReport{Model: s.Model.Report().(Report), ModelPlan: modelPlan}
	if merr != nil {
		r.ModelError = merr.Error()
	}
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
	s.last = r
	return plan, err
}
