package agent

import (
	"context"

	"github.com/hapilot/hapilot/haproxy"
)

// mustKey is a test's "backend/server", parsed.
func mustKey(s string) Key {
	k, err := haproxy.ParseServerKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

// scripted returns the plans it is given, one per step.
type scripted struct {
	plans  []Plan
	calls  int
	err    error
	onCall func()
}

func (s *scripted) Name() string { return "scripted" }

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
