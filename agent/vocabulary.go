package agent

import (
	"fmt"
	"strings"

	"github.com/hapilot/hapilot/haproxy"
)

// The words of a policy's answer, for the parsers of replies that come
// from outside Go (a model's JSON, a Lua script's tables): each verb is an
// action Kind, and VerbNoOp is "nothing for this server".
const VerbNoOp = "no_op"

// Verbs lists every verb an answer may use, in the order a schema offers
// them.
var Verbs = []string{string(Drain), string(Ready), string(SetWeight), VerbNoOp}

// MaxReason bounds, in bytes, the reason an answer gives with an action:
// it goes into the audit log and /status on every step.
const MaxReason = 200

// ParseAction checks one proposed action as an answer gives it: a verb,
// the server's names, a weight for set_weight only (in [0,
// haproxy.MaxWeight]; one given with another verb is ignored), and a
// reason, cut to MaxReason and prefixed with who gave it. ok is false
// for no_op. Every reply parser goes through it, so that they accept the
// same words and bounds.
func ParseAction(verb, backend, server string, weight *int, from, reason string) (a Action, ok bool, err error) {
	if verb == VerbNoOp {
		return Action{}, false, nil
	}
	if err := haproxy.ValidName(backend); err != nil {
		return Action{}, false, fmt.Errorf("backend: %w", err)
	}
	if err := haproxy.ValidName(server); err != nil {
		return Action{}, false, fmt.Errorf("server: %w", err)
	}
	a = Action{Backend: backend, Server: server, Reason: from + ": " + cut(reason, MaxReason)}
	switch Kind(verb) {
	case Drain, Ready:
		a.Kind = Kind(verb)
	case SetWeight:
		if weight == nil || *weight < 0 || *weight > haproxy.MaxWeight {
			return Action{}, false, fmt.Errorf("set_weight needs an integer weight in [0, %d]", haproxy.MaxWeight)
		}
		a.Kind, a.Weight = SetWeight, *weight
	default:
		return Action{}, false, fmt.Errorf("unknown action %q", verb)
	}
	return a, true, nil
}

// cut shortens s to at most n bytes of valid UTF-8, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
