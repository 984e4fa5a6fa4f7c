package examples

import (
	"fmt"
	"strings"
)

// AgentAddr is the agent address written in haproxy.cfg's example.
const AgentAddr = "unix@/run/hapilot/spoe.sock"

// Stanza returns the drop-in parts of haproxy.cfg: the hapilot lines of
// the frontend (bind and default_backend left out) and the hapilot-agents
// backend with its server pointed at agentAddr.
func Stanza(agentAddr string) (frontend []string, agentsBackend string, err error) {
	frontend = Lines(HAProxyCfg, "frontend www")
	backend := Lines(HAProxyCfg, "backend hapilot-agents")
	if len(frontend) == 0 || len(backend) == 0 {
		return nil, "", fmt.Errorf("examples: haproxy.cfg lacks the hapilot stanza")
	}
	agentsBackend = "backend hapilot-agents\n    " + strings.Join(backend, "\n    ") + "\n"
	return frontend, strings.ReplaceAll(agentsBackend, AgentAddr, agentAddr), nil
}

// Lines returns the directives of one section of cfg ("global",
// "frontend www"): comments, bind and default_backend left out.
func Lines(cfg, section string) []string {
	cur := ""
	var out []string
	for _, line := range strings.Split(cfg, "\n") {
		trimmed := strings.TrimSpace(line)
		if line != "" && line[0] != ' ' && line[0] != '#' {
			cur = trimmed
			continue
		}
		if cur != section || trimmed == "" || trimmed[0] == '#' ||
			strings.HasPrefix(trimmed, "bind ") || strings.HasPrefix(trimmed, "default_backend ") {
			continue
		}
		out = append(out, trimmed)
	}
	return out
}
