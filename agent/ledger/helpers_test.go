package ledger

import (
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/rs/zerolog"
)

func key(backend, server string) agent.Key { return agent.Key{Backend: backend, Server: server} }

func mustKey(s string) agent.Key {
	k, err := haproxy.ParseServerKey(s)
	if err != nil {
		panic(err)
	}
	return k
}

// savedChanges are the changes the next start reads from path.
func savedChanges(t *testing.T, path string) map[agent.Key]agent.Change {
	t.Helper()
	return New(path, zerolog.Nop()).Changes()
}
