package agent

import (
	"encoding/json"
	"testing"
)

// An action's identity is its verb and server, whatever its weight,
// reason or origin; its text form reads back to the same identity, and a
// map keyed by it goes to JSON and back.
func TestActionID(t *testing.T) {
	drain := Action{Kind: Drain, Backend: "app", Server: "srv1", Reason: "errors"}
	cut := Action{Kind: SetWeight, Backend: "app", Server: "srv1", Weight: 50}
	if drain.ID() == cut.ID() {
		t.Fatalf("a drain and a cut of one server share the identity %v", drain.ID())
	}
	again := drain
	again.Reason, again.Origin, again.Weight = "latency", OriginRecovery, 3
	if drain.ID() != again.ID() {
		t.Fatalf("%v and %v: one action, two identities", drain.ID(), again.ID())
	}
	tests := []struct {
		text string
		want ActionID
		err  bool
	}{
		{"drain app/srv1", ActionID{Kind: Drain, Server: Key{Backend: "app", Server: "srv1"}}, false},
		{"set_weight shop/web-5", ActionID{Kind: SetWeight, Server: Key{Backend: "shop", Server: "web-5"}}, false},
		{"ready a/b/c", ActionID{Kind: Ready, Server: Key{Backend: "a", Server: "b/c"}}, false},
		{"drain", ActionID{}, true},
		{"restart app/srv1", ActionID{}, true},
		{"drain app", ActionID{}, true},
		{"drain /srv1", ActionID{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			got, err := ParseActionID(tc.text)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("ParseActionID(%q) = %v, %v; want %v, error %v", tc.text, got, err, tc.want, tc.err)
			}
			if !tc.err && got.String() != tc.text {
				t.Fatalf("%v.String() = %q, want %q", got, got.String(), tc.text)
			}
		})
	}
	in := map[ActionID]string{drain.ID(): "x", cut.ID(): "y"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"drain app/srv1":"x","set_weight app/srv1":"y"}` {
		t.Fatalf("JSON %s", b)
	}
	var out map[ActionID]string
	if err := json.Unmarshal(b, &out); err != nil || len(out) != 2 || out[drain.ID()] != "x" || out[cut.ID()] != "y" {
		t.Fatalf("read back %v, %v", out, err)
	}
}
