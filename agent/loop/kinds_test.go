package loop

import (
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/merge"
)

// Each kind of server real configs hold is governed or left alone, with
// the reason.
func TestLeftAlone(t *testing.T) {
	l := &Loop{Settings: agent.Settings{HashBackends: []string{"opted"}}}
	for _, tc := range []struct {
		name string
		k    agent.Key
		Kind merge.Kind
		want string // a part of the reason; "" governed
	}{
		{"an active server, round robin", agent.Key{Backend: "app", Server: "s1"}, merge.Kind{Algo: "roundrobin"}, ""},
		{"leastconn", agent.Key{Backend: "app", Server: "s1"}, merge.Kind{Algo: "leastconn"}, ""},
		{"random", agent.Key{Backend: "app", Server: "s1"}, merge.Kind{Algo: "unknown"}, ""},
		{"a TCP backend", agent.Key{Backend: "db", Server: "s1"}, merge.Kind{TCP: true, Algo: "roundrobin"}, "not mode http"},
		{"a backup server", agent.Key{Backend: "app", Server: "b1"}, merge.Kind{Backup: true, Algo: "roundrobin"}, "backup server"},
		{"under agent-check", agent.Key{Backend: "app", Server: "s2"}, merge.Kind{AgentCheck: true, Algo: "roundrobin"}, "agent-check"},
		{"balance uri", agent.Key{Backend: "cache", Server: "s1"}, merge.Kind{Algo: "uri"}, "balance uri"},
		{"balance source", agent.Key{Backend: "sticky", Server: "s1"}, merge.Kind{Algo: "source"}, "--hash-backends"},
		{"balance hdr", agent.Key{Backend: "h", Server: "s1"}, merge.Kind{Algo: "hdr"}, "balance hdr"},
		{"balance url_param", agent.Key{Backend: "h", Server: "s1"}, merge.Kind{Algo: "url_param"}, "balance url_param"},
		{"balance rdp-cookie", agent.Key{Backend: "h", Server: "s1"}, merge.Kind{Algo: "rdp-cookie"}, "balance rdp-cookie"},
		{"balance hash", agent.Key{Backend: "h", Server: "s1"}, merge.Kind{Algo: "hash"}, "balance hash"},
		{"a hash backend the operator named", agent.Key{Backend: "opted", Server: "s1"}, merge.Kind{Algo: "uri"}, ""},
		{"a backup in a named hash backend", agent.Key{Backend: "opted", Server: "b1"}, merge.Kind{Backup: true, Algo: "uri"}, "backup server"},
	} {
		got := l.leftAlone(tc.k, tc.Kind)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Each server left alone is logged once per reason: the same reason at
// the next step says nothing, a new one is said, and one that goes away
// is forgotten.
func TestAloneSaysEachOnce(t *testing.T) {
	var a alone
	k := agent.Key{Backend: "app", Server: "b1"}
	if got := a.note(map[agent.Key]string{k: AloneBackup}); len(got) != 1 {
		t.Fatalf("first: %v", got)
	}
	if got := a.note(map[agent.Key]string{k: AloneBackup}); len(got) != 0 {
		t.Fatalf("again: %v", got)
	}
	if got := a.note(map[agent.Key]string{k: AloneAgentCheck}); len(got) != 1 {
		t.Fatalf("a new reason: %v", got)
	}
	a.note(nil)
	if got := a.note(map[agent.Key]string{k: AloneAgentCheck}); len(got) != 1 {
		t.Fatalf("back after going: %v", got)
	}
}

// A server whose address changed is a new server: its window is emptied;
// the first sight and an unchanged address leave it.
func TestReaddressForgetsTheWindow(t *testing.T) {
	w := &forgetting{}
	l := &Loop{Windows: w}
	k := agent.Key{Backend: "app", Server: "slot1"}
	l.readdress(k, "10.0.0.1")
	l.readdress(k, "10.0.0.1")
	l.readdress(k, "-") // the resolver's maintenance: no address, no new server
	if len(w.forgot) != 0 {
		t.Fatalf("forgot %v", w.forgot)
	}
	l.readdress(k, "10.0.0.2")
	if len(w.forgot) != 1 || w.forgot[0] != "app/slot1" {
		t.Fatalf("forgot %v", w.forgot)
	}
}

type forgetting struct {
	agent.Windows
	forgot []string
}

func (f *forgetting) Forget(backend, server string) { f.forgot = append(f.forgot, backend+"/"+server) }
