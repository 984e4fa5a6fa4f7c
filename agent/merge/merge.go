// Package merge reads every HAProxy process the agent reaches through
// its runtime sockets and merges their views of the servers into one: a
// server serves only if every process lets it, and only servers every
// process knows can be acted on.
package merge

import (
	"context"
	"fmt"
	"strings"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

// Processes is every HAProxy's view of its servers, merged: a server
// serves only if every process lets it, and only servers every process
// knows can be acted on.
type Processes struct {
	Epoch string     // the processes' instances, joined
	Site  agent.Site // the HAProxy they are: sockets and node names, joined
	// Order is the servers in HAProxy's order, as the first process's
	// server states list them; ByKey finds each. One entry holds all a
	// server's figures, so that a step at 10,000 servers looks each up
	// once, not once a figure.
	Order []*Server
	ByKey map[agent.Key]*Server
	pool  []Server // the entries, a few allocations for all
	Count int      // the processes read
}

// Server is what the processes say of one server, merged.
type Server struct {
	State      haproxy.ServerState // merged: the most restrictive of the processes'
	SeenBy     int                 // processes whose server states list it
	MaxConn    int                 // the smallest of the processes' limits, 0 unknown
	RespTimeMs int                 // the slowest process's average
	Kind       Kind
}

// entry is k's entry, made when first seen.
func (p *Processes) entry(k agent.Key) *Server {
	if e, ok := p.ByKey[k]; ok {
		return e
	}
	if len(p.pool) == cap(p.pool) {
		// A new array: the entries already handed out stay where they are.
		p.pool = make([]Server, 0, max(16, cap(p.pool)))
	}
	p.pool = append(p.pool, Server{})
	e := &p.pool[len(p.pool)-1]
	p.ByKey[k] = e
	return e
}

// EveryProcess is k's merged state, when every process lists it.
func (p *Processes) EveryProcess(k agent.Key) (*haproxy.ServerState, bool) {
	e, ok := p.ByKey[k]
	if !ok || e.SeenBy != p.Count {
		return nil, false
	}
	return &e.State, true
}

// Read reads every runtime's info, stats and server states.
func Read(ctx context.Context, runtimes []agent.Runtime) (*Processes, error) {
	if len(runtimes) == 0 {
		return nil, fmt.Errorf("no runtime socket")
	}
	p := &Processes{Count: len(runtimes)}
	var instances, sites []string
	for _, rt := range runtimes {
		info, err := rt.ShowInfo(ctx)
		if err != nil {
			return nil, fmt.Errorf("read info from %s: %w", rt.Addr(), err)
		}
		instances = append(instances, info.Instance())
		sites = append(sites, string(agent.SiteOf(rt.Addr(), info)))
		stats, err := rt.ServerStats(ctx)
		if err != nil {
			return nil, fmt.Errorf("read stats from %s: %w", rt.Addr(), err)
		}
		if p.ByKey == nil {
			// Sized by the first process's servers: grown one by one,
			// the map of 10,000 servers rehashed a tenth of a step.
			n := len(stats)
			p.ByKey, p.pool, p.Order = make(map[agent.Key]*Server, n), make([]Server, 0, n), make([]*Server, 0, n)
		}
		p.addStats(stats)
		states, err := rt.ShowServersState(ctx)
		if err != nil {
			return nil, fmt.Errorf("read states from %s: %w", rt.Addr(), err)
		}
		p.addStates(states)
	}
	p.Epoch, p.Site = strings.Join(instances, ","), agent.Site(strings.Join(sites, ","))
	return p, nil
}

func (p *Processes) addStats(stats []haproxy.ServerStat) {
	if p.ByKey == nil {
		p.ByKey = map[agent.Key]*Server{}
	}
	for _, st := range stats {
		e := p.entry(serverKey(st.Backend, st.Server))
		if st.MaxConn > 0 && (e.MaxConn == 0 || st.MaxConn < e.MaxConn) {
			e.MaxConn = st.MaxConn
		}
		e.RespTimeMs = max(e.RespTimeMs, st.RespTimeMs)
		e.Kind.Add(st)
	}
}

func (p *Processes) addStates(states []haproxy.ServerState) {
	if p.ByKey == nil {
		p.ByKey = map[agent.Key]*Server{}
	}
	for _, s := range states {
		e := p.entry(serverKey(s.Backend, s.Server))
		e.SeenBy++
		if e.SeenBy == 1 {
			e.State = s
			p.Order = append(p.Order, e)
			continue
		}
		m := &e.State
		m.AdminState |= s.AdminState
		m.Weight = min(m.Weight, s.Weight)
		if s.OpState != haproxy.OpRunning {
			m.OpState = s.OpState
		}
	}
}

// Everywhere lists, in HAProxy's order, the servers every process knows.
func (p *Processes) Everywhere() []*Server {
	out := make([]*Server, 0, len(p.Order))
	for _, e := range p.Order {
		if e.SeenBy == p.Count {
			out = append(out, e)
		}
	}
	return out
}

// Kind is what `show stat` says of a server beyond its counters, merged
// over the processes.
type Kind struct {
	Backup, AgentCheck, TCP bool
	Algo                    string
}

// Add merges one process's row: a server is a backup, agent-checked or
// in tcp mode if any process says so, and its algorithm is a hashing one's
// when any process hashes.
func (cur *Kind) Add(st haproxy.ServerStat) {
	cur.Backup = cur.Backup || st.Backup
	cur.AgentCheck = cur.AgentCheck || st.AgentCheck
	cur.TCP = cur.TCP || st.TCP
	if st.Hashed() || cur.Algo == "" {
		cur.Algo = st.Algo
	}
}

// serverKey is the key of backend/server.
func serverKey(backend, server string) agent.Key { return agent.Key{Backend: backend, Server: server} }
