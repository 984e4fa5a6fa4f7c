package llm_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// A model behind the OpenAI API calibrates as one behind Ollama's: its
// record is keyed by the digest the OpenAI client makes up, and a
// trigger-happy model fails. Package calibrate runs the policy, so this
// test stands outside package llm, with its OpenAI stand-in.
func TestOpenAICalibration(t *testing.T) {
	for _, tc := range []struct {
		name    string
		respond ollamafake.Responder
		pass    bool
	}{{"capable", ollamafake.Capable, true}, {"trigger-happy", ollamafake.TriggerHappy, false}} {
		t.Run(tc.name, func(t *testing.T) {
			p := llm.NewOpenAIPolicy(t, tc.respond)
			sc, err := calibrate.RunModel(context.Background(), p.Model, rules.DefaultConfig(), p.Model.Config.CallBudget(8*time.Second), time.Unix(5000, 0))
			if err != nil {
				t.Fatal(err)
			}
			if sc.Passed != tc.pass || !strings.HasPrefix(sc.Key.Digest, "openai:") || sc.ValidRate != 1 {
				t.Fatalf("passed %v (%s), digest %s, valid %.2f", sc.Passed, sc.Why, sc.Key.Digest, sc.ValidRate)
			}
		})
	}
}
