package loop

import (
	"context"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

// mustKey is a test's "backend/server", parsed.
func mustKey(s string) agent.Key {
	k, err := haproxy.ParseServerKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

// scripted returns the plans it is given, one per step.
type scripted struct {
	plans  []agent.Plan
	calls  int
	err    error
	onCall func()
}

func (s *scripted) Name() string { return "scripted" }

func (s *scripted) Decide(context.Context, agent.Observation) (agent.Plan, error) {
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
