package agent

import "context"

// scripted returns the plans it is given, one per step.
type scripted struct {
	plans  []Plan
	calls  int
	err    error
	onCall func()
	needs  Needs
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Needs() Needs { return s.needs }

func (s *scripted) Decide(context.Context, Observation) (Plan, error) {
	s.calls++
	if s.onCall != nil {
		s.onCall()
	}
	if s.err != nil {
		return nil, s.err
	}
	if len(s.plans) == 0 {
		return nil, nil
	}
	p := s.plans[0]
	s.plans = s.plans[1:]
	return p, nil
}
