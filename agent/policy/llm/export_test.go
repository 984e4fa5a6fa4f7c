package llm

import (
	"testing"

	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// NewOpenAIPolicy is newOpenAIPolicy with its defaults, for the tests
// outside the package (calibration through the OpenAI API).
func NewOpenAIPolicy(t *testing.T, respond ollamafake.Responder) *Policy {
	p, _ := newOpenAIPolicy(t, respond, nil, nil)
	return p
}
