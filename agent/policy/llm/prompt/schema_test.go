package prompt

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
)

// The schema leaves no room for unbounded output: its longest reply
// (every action with a full reason, the longest verb, names and weight)
// fits num_predict at guardCharsPerToken, with at least one action and at
// most one a server, and still parses.
func TestSchemaBoundsTheReply(t *testing.T) {
	names := func(prefix string, n int) []string {
		var out []string
		for i := 1; i <= n; i++ {
			out = append(out, fmt.Sprintf("%s%d", prefix, i))
		}
		return out
	}
	for _, numPredict := range []int{16, 64, 128, 256, 512, 1024, 4096} {
		for _, n := range []int{0, 1, 3, 6, 14} {
			backends, servers := []string{"origin-eu-west"}, names("web-backend-", n)
			var s struct {
				Properties struct {
					Actions struct {
						MaxItems int `json:"maxItems"`
						Items    struct {
							Properties struct {
								Reason struct {
									MaxLength int `json:"maxLength"`
								} `json:"reason"`
							} `json:"properties"`
						} `json:"items"`
					} `json:"actions"`
				} `json:"properties"`
			}
			if err := json.Unmarshal(Schema(backends, servers, 100, numPredict), &s); err != nil {
				t.Fatal(err)
			}
			items, reason := s.Properties.Actions.MaxItems, s.Properties.Actions.Items.Properties.Reason.MaxLength
			if reason != SchemaReason || reason > agent.MaxReason || items < 1 || items > max(1, n) || items > MaxActions {
				t.Fatalf("num_predict %d, %d servers: maxItems %d, reason maxLength %d", numPredict, n, items, reason)
			}
			server := "-"
			if n > 0 {
				server = servers[n-1]
			}
			var acts []string
			for i := 0; i < items; i++ {
				acts = append(acts, fmt.Sprintf(`{"reason":%q,"action":"set_weight","backend":%q,"server":%q,"weight":100}`, strings.Repeat("x", reason), backends[0], server))
			}
			worst := `{"actions":[` + strings.Join(acts, ",") + `]}`
			if items > 1 && len(worst) > numPredict*guardCharsPerToken {
				t.Errorf("num_predict %d, %d servers: %d actions take %d characters, over %d", numPredict, n, items, len(worst), numPredict*guardCharsPerToken)
			}
			if n > 0 {
				if _, err := ParseReply(worst); err != nil {
					t.Errorf("the longest reply does not parse: %v", err)
				}
			}
		}
	}
	// At the default num_predict the calibration's backends of 14 servers
	// get several actions a reply.
	if got := MaxItems([]string{"edge", "origin"}, names("a", 14), 37, 256); got < 2 {
		t.Fatalf("maxItems %d at num_predict 256", got)
	}
}
