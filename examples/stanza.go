package examples

import (
	"fmt"
	"github.com/hapilot/hapilot/spoe"
	"regexp"
	"strconv"
	"strings"
)

// AgentAddr is the agent address written in haproxy.cfg's example.
const AgentAddr = "abns@hapilot-spoe"

// Stanza returns the drop-in parts of haproxy.cfg: the hapilot lines of
// the frontend (bind and default_backend left out) and the hapilot-agents
// backend with its server pointed at agentAddr.
func Stanza(agentAddr string) (frontend []string, agentsBackend string, err error) {
	return StanzaOf(HAProxyCfg, agentAddr)
}

// StanzaOf is Stanza taken from another example config (the sampled one).
func StanzaOf(cfg, agentAddr string) (frontend []string, agentsBackend string, err error) {
	frontend = Lines(cfg, "frontend www")
	backend := Lines(cfg, "backend hapilot-agents")
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

var (
	randK   = regexp.MustCompile(`rand\((\d+)\)`)
	sampleK = regexp.MustCompile(`sample=int\((\d+)\)`)
)

// SampleK reads k from a sampled stanza: the rand(k) of the send rule in
// cfg and the sample=int(k) of the SPOE file, which must agree.
func SampleK(cfg, spoeConf string) (int, error) {
	r, s := randK.FindStringSubmatch(cfg), sampleK.FindStringSubmatch(spoeConf)
	if r == nil || s == nil {
		return 0, fmt.Errorf("examples: no rand(k) in the config or no sample=int(k) in the SPOE file")
	}
	if r[1] != s[1] {
		return 0, fmt.Errorf("examples: rand(%s) in the config but sample=int(%s) in the SPOE file", r[1], s[1])
	}
	return strconv.Atoi(r[1])
}

// Sampled returns the sampled stanza's files with k in place of theirs.
func Sampled(k int) (cfg, spoeConf string) {
	cfg = randK.ReplaceAllString(HAProxySampledCfg, fmt.Sprintf("rand(%d)", k))
	spoeConf = sampleK.ReplaceAllString(spoe.SampledConf, fmt.Sprintf("sample=int(%d)", k))
	return cfg, spoeConf
}
