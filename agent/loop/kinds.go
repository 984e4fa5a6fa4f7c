package loop

import (
	"fmt"
	"slices"
	"sync"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/merge"
	"github.com/hapilot/hapilot/haproxy"
)

// Why the agent leaves a server alone: it neither judges it nor acts on
// it, and it is nobody's peer. Each reason is one kind of server that
// real configs hold and the test's premise does not fit (docs/reference/server-kinds.md).
const (
	// AloneBackup: a backup server takes traffic only when every active
	// server is down, so it is neither serving capacity for the floor
	// nor a peer of the active servers, and its own few requests judge
	// nothing.
	AloneBackup = "backup server: neither serving capacity nor a peer of the active servers"
	// AloneAgentCheck: HAProxy's agent-check sets the server's state and
	// weight; the agent neither fights it nor reads its changes as an
	// operator's.
	AloneAgentCheck = "HAProxy's agent-check sets its state and weight"
	// AloneTCP: a backend in mode tcp (or spop) answers no HTTP status;
	// nothing judges it (the SPOE agents' own backend is one).
	AloneTCP = "not mode http: no HTTP status to judge"
)

// hashedReason says why a hash-balanced backend is left alone.
func hashedReason(algo string) string {
	return fmt.Sprintf("balance %s sends each server its own request mix, so the same-mix test does not hold: name the backend in --hash-backends to govern it", algo)
}

// leftAlone is why the agent leaves server k alone, "" when it governs it.
func (l *Loop) leftAlone(k agent.Key, kd merge.Kind) string { return leaveAlone(k, kd, l.HashBackends) }

func leaveAlone(k agent.Key, kd merge.Kind, hashBackends []string) string {
	switch {
	case kd.TCP:
		return AloneTCP
	case kd.Backup:
		return AloneBackup
	case kd.AgentCheck:
		return AloneAgentCheck
	case slices.Contains(haproxy.HashAlgos, kd.Algo) && !slices.Contains(hashBackends, k.Backend):
		return hashedReason(kd.Algo)
	}
	return ""
}

// Untouched is why the agent leaves a server as it is, "" when it may act
// on it: the kinds it leaves alone (backups, agent-checked servers,
// hash-balanced backends not in hashBackends), and the states it never
// changes (an operator's maint or drain, weight 0, a slot the resolver
// holds in maintenance). `hapilot check --live` prints it per server.
func Untouched(st haproxy.ServerStat, s haproxy.ServerState, hashBackends []string) string {
	k := key(st.Backend, st.Server)
	if why := leaveAlone(k, merge.Kind{Backup: st.Backup, AgentCheck: st.AgentCheck, TCP: st.TCP, Algo: st.Algo}, hashBackends); why != "" {
		return why
	}
	switch {
	case s.AdminState&(haproxy.AdminDNSMaint|haproxy.AdminHostnameMaint) != 0:
		return "in the resolver's maintenance (a server-template slot with no address): neither serving nor a peer"
	case s.Maint():
		return "in maintenance: the operator's, never changed"
	case s.Drain():
		return "drained by someone: the operator's unless the agent's state file says it is the agent's"
	case s.Initial == 0:
		return "configured weight 0: takes no traffic, never changed"
	}
	return ""
}

// alone is the servers left alone and why, as the last step found them.
type alone struct {
	mu     sync.Mutex // guards why and logged
	why    map[agent.Key]string
	logged map[agent.Key]string // what was logged for each, so that each is said once
}

// note records this step's servers left alone, and returns those whose
// reason is new since it was last logged.
func (a *alone) note(now map[agent.Key]string) map[agent.Key]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.logged == nil {
		a.logged = map[agent.Key]string{}
	}
	fresh := map[agent.Key]string{}
	for k, why := range now {
		if a.logged[k] != why {
			fresh[k] = why
			a.logged[k] = why
		}
	}
	for k := range a.logged {
		if _, ok := now[k]; !ok {
			delete(a.logged, k)
		}
	}
	a.why = now
	return fresh
}

// readdress notes each server's address, and empties the window of one
// whose address changed: a server-template slot that DNS gave another
// host is a new server, and the old host's errors must not count against
// it. Only Step calls it.
func (l *Loop) readdress(k agent.Key, addr string) {
	if addr == "" || addr == "-" { // "-": a slot the resolver left without one
		return
	}
	if l.st.addrs == nil {
		l.st.addrs = map[agent.Key]string{}
	}
	was, seen := l.st.addrs[k]
	l.st.addrs[k] = addr
	if !seen || was == addr {
		return
	}
	if f, ok := l.Windows.(forgetter); ok {
		f.Forget(k.Backend, k.Server)
	}
	l.Log.Info().Stringer("server", k).Str("was", was).Str("now", addr).Msg("a server's address changed: a new server, its window starts empty")
}
