package peers

import (
	"sort"
	"time"
)

// score ranks member for backend: rendezvous (highest random weight)
// hashing, so that a member's going moves only its own backends, and
// every agent ranks the same members the same way.
func score(member, backend string) uint64 {
	// FNV-1a over backend, a zero byte and member
	const prime = 1099511628211
	x := uint64(14695981039346656037)
	for i := 0; i < len(backend); i++ {
		x = (x ^ uint64(backend[i])) * prime
	}
	x *= prime
	for i := 0; i < len(member); i++ {
		x = (x ^ uint64(member[i])) * prime
	}
	// splitmix64's finaliser: FNV's high bits are poor alone.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// before is the members' order for a backend: the higher score first,
// the name on a tie.
func before(si uint64, ni string, sj uint64, nj string) bool {
	if si != sj {
		return si > sj
	}
	return ni < nj
}

// firstTwo is the first two members for backend in that order ("" for
// none): each step asks it of every backend, so it scans, not sorts.
func firstTwo(backend string, members []string) (first, second string) {
	var s1, s2 uint64
	for _, m := range members {
		sc := score(m, backend)
		switch {
		case first == "" || before(sc, m, s1, first):
			second, s2 = first, s1
			first, s1 = m, sc
		case second == "" || before(sc, m, s2, second):
			second, s2 = m, sc
		}
	}
	return first, second
}

// picture is the members in the picture now: this node and every peer
// heard within Timeout. Only the warm ones may decide, so that an agent
// that (re)starts into a running fleet, with no pooled history and an
// empty ledger, follows the fleet's word before it gives its own. A
// member is warm once it has run for Warmup, or for about as long as
// the longest-running member (within startGrace): a fleet started
// together is warm at once. Every agent reads a member's start from its
// incarnation, so all of them agree on who is warm.
type picture struct {
	self      string
	all, warm []string // sorted
}

// startGrace is how far apart members may start and still count as
// started together.
const startGrace = 5 * time.Second

// picture is the members in the picture now. Callers hold n.mu.
func (n *Node) picture(now time.Time) picture {
	p := picture{self: n.name, all: []string{n.name}}
	ages := map[string]time.Duration{n.name: now.Sub(n.started)}
	oldest := ages[n.name]
	for name, q := range n.peers {
		if now.Sub(q.lastHeard) <= n.cfg.Timeout {
			p.all = append(p.all, name)
			ages[name] = now.Sub(time.Unix(0, int64(q.incarnation)))
			oldest = max(oldest, ages[name])
		}
	}
	sort.Strings(p.all)
	warmAfter := min(n.cfg.Warmup, oldest-startGrace)
	for _, name := range p.all {
		if ages[name] >= warmAfter {
			p.warm = append(p.warm, name)
		}
	}
	return p
}

// alone reports whether no peer is in the picture.
func (p picture) alone() bool { return len(p.all) == 1 }

// decider is the member that decides backend, and the next in line
// ("" when alone).
func (p picture) decider(backend string) (first, second string) {
	return firstTwo(backend, p.warm) // never empty: the oldest member is warm
}

// receivers are the peers that get this node's counts of backend: its
// decider and the next in line (a takeover starts from the same
// evidence), and the member that will decide it once warm.
func (p picture) receivers(backend string) []string {
	first, second := p.decider(backend)
	out := []string{first}
	if second != "" {
		out = append(out, second)
	}
	if future, _ := firstTwo(backend, p.all); future != first && future != second {
		out = append(out, future)
	}
	return out
}
