package merge

import (
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

// show stat's rows give each server its kind, merged over processes: a
// server is a backup or under agent-check if any process says so, and
// has its backend's algorithm.
func TestStatsGiveKinds(t *testing.T) {
	p := &Processes{}
	p.addStats([]haproxy.ServerStat{{Backend: "app", Server: "s1", Algo: "roundrobin"}, {Backend: "app", Server: "b1", Backup: true, Algo: "roundrobin"}})
	p.addStats([]haproxy.ServerStat{{Backend: "app", Server: "s1", AgentCheck: true, Algo: "roundrobin"}})
	if k := p.ByKey[agent.Key{Backend: "app", Server: "s1"}].Kind; !k.AgentCheck || k.Backup || k.Algo != "roundrobin" {
		t.Errorf("s1: %+v", k)
	}
	if k := p.ByKey[agent.Key{Backend: "app", Server: "b1"}].Kind; !k.Backup {
		t.Errorf("b1: %+v", k)
	}
}
