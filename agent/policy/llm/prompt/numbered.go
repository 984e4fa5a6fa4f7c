package prompt

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/hapilot/hapilot/agent"
)

// NumberedHeader names the columns of a numbered prompt's server row:
// the compact row, then " = " and the row's reference.
const NumberedHeader = CompactHeader + " = ref"

// ErrUnknownRef is a numbered reply that names a row or backend the
// prompt did not number, or a server under another backend than its own.
var ErrUnknownRef = errors.New("the reply's reference is not the prompt's")

// Refs are a numbered prompt's references: b1, b2, ... for the backends
// shown and s1, s2, ... for the server rows listed, in the order the
// prompt writes them. A small model points at a row by a reference of two
// tokens, the same in every prompt, where a name has to be copied token by
// token, and names it never saw in training (calibration's are held out)
// were what the third attempt at hapilot's own model got wrong.
type Refs struct {
	backend map[string]string    // b1 → backend name
	server  map[string]agent.Key // s1 → its backend and name
	// ofBackend and ofServer are the same the other way, for the prompt
	// to write.
	ofBackend map[string]string
	ofServer  map[agent.Key]string
	// Backends and Servers are the references in the prompt's order;
	// Servers omits the operator's, which the reply may not name.
	Backends, Servers []string
	// MaxWeight is the largest configured weight among Servers.
	MaxWeight int
}

// Refs numbers what compactPrompt lists for in, in the order it lists
// it: the one numbering the prompt, the schema and Resolve share.
func (in Input) Refs() Refs {
	r := Refs{backend: map[string]string{}, server: map[string]agent.Key{},
		ofBackend: map[string]string{}, ofServer: map[agent.Key]string{}, MaxWeight: 1}
	n := 0
	for _, be := range in.Obs.Backends {
		if !in.shows(be) {
			continue
		}
		b := "b" + strconv.Itoa(len(r.Backends)+1)
		r.backend[b], r.ofBackend[be.Name] = be.Name, b
		r.Backends = append(r.Backends, b)
		rows, _, _, _ := in.listed(be, in.compactShown())
		for _, s := range rows {
			n++
			ref := "s" + strconv.Itoa(n)
			k := agent.Key{Backend: be.Name, Server: s.Server}
			r.server[ref], r.ofServer[k] = k, ref
			if s.Owner != agent.OwnerOperator {
				r.Servers = append(r.Servers, ref)
				r.MaxWeight = max(r.MaxWeight, s.State.Initial)
			}
		}
	}
	return r
}

// Resolve turns a numbered reply's references into the servers they
// name. Any reference the prompt did not give, or a server named under
// another backend's reference, rejects the whole reply, as a malformed
// one is: a model that points at the wrong backend has not read the rows.
func (r Refs) Resolve(plan agent.Plan) (agent.Plan, error) {
	out := make(agent.Plan, 0, len(plan))
	for i, a := range plan {
		k, ok := r.server[a.Server]
		if !ok {
			return nil, fmt.Errorf("action %d: server %q: %w (rows %v)", i, a.Server, ErrUnknownRef, r.Servers)
		}
		if b, ok := r.backend[a.Backend]; !ok || b != k.Backend {
			return nil, fmt.Errorf("action %d: backend %q for %s, which stands under %s: %w", i, a.Backend, a.Server, k.Backend, ErrUnknownRef)
		}
		a.Backend, a.Server = k.Backend, k.Server
		out = append(out, a)
	}
	return out, nil
}

// Backend is the backend ref names, "" if the prompt gave no such ref.
func (r Refs) Backend(ref string) string { return r.backend[ref] }

// Server is the server ref names, false if the prompt gave no such ref.
func (r Refs) Server(ref string) (agent.Key, bool) {
	k, ok := r.server[ref]
	return k, ok
}
