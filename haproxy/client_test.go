package haproxy_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
)

type sockets struct{ admin, user, tcp string }

func startHAProxy(t *testing.T) (*haproxyproc.Process, sockets) {
	t.Helper()
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	var s sockets
	p := labtest.StartT(t, func(dir string) (string, string) {
		s = sockets{
			admin: filepath.Join(dir, "admin.sock"),
			user:  filepath.Join(dir, "user.sock"),
			tcp:   fmt.Sprintf("127.0.0.1:%d", ports[0]),
		}
		return fmt.Sprintf(`global
    stats socket %s level admin
    stats socket %s level user
    stats socket ipv4@%s level admin
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
backend app
    balance roundrobin
    server s1 127.0.0.1:9 weight 10
    server s2 127.0.0.1:10 weight 20
    server s3 127.0.0.1:11 disabled
frontend fe
    bind 127.0.0.1:%d
    default_backend app
`, s.admin, s.user, s.tcp, ports[1]), s.admin
	})
	return p, s
}

func client(t *testing.T, addr string) *haproxy.Client {
	t.Helper()
	c, err := haproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestAgainstRealHAProxy(t *testing.T) {
	_, s := startHAProxy(t)
	for _, addr := range []string{s.admin, "unix:" + s.admin, "tcp:" + s.tcp, s.tcp} {
		t.Run(addr, func(t *testing.T) {
			c := client(t, addr)
			states, err := c.ShowServersState(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(states) != 3 {
				t.Fatalf("%d servers: %+v", len(states), states)
			}
			s1 := states[0]
			if s1.Backend != "app" || s1.Server != "s1" || s1.Weight != 10 || s1.Initial != 10 || s1.Port != 9 || s1.Addr != "127.0.0.1" {
				t.Fatalf("s1 %+v", s1)
			}
			if !states[2].Maint() || states[2].Serving() {
				t.Fatalf("s3 (disabled) %+v", states[2])
			}
			if s2 := states[1]; s2.Server != "s2" || s2.Weight != 20 {
				t.Errorf("s2 %+v", s2)
			}
			stats, err := c.ServerStats(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, s := range stats {
				found = found || s.Backend == "app" && s.Server == "s2"
			}
			if !found {
				t.Fatalf("no app/s2 row in show stat: %+v", stats)
			}
		})
	}
}

func TestSetStateAndWeight(t *testing.T) {
	_, s := startHAProxy(t)
	c := client(t, s.admin)
	state := func() haproxy.ServerState {
		st, err := c.ShowServersState(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return st[0]
	}
	if err := c.SetServerState(ctx(t), "app", "s1", haproxy.StateDrain); err != nil {
		t.Fatal(err)
	}
	if st := state(); !st.Drain() || st.Serving() || st.Label() != "drain" {
		t.Fatalf("after drain %+v", st)
	}
	if err := c.SetServerState(ctx(t), "app", "s1", haproxy.StateMaint); err != nil {
		t.Fatal(err)
	}
	if st := state(); !st.Maint() {
		t.Fatalf("after maint %+v", st)
	}
	if err := c.SetServerState(ctx(t), "app", "s1", haproxy.StateReady); err != nil {
		t.Fatal(err)
	}
	if st := state(); !st.Serving() || st.AdminState != 0 {
		t.Fatalf("after ready %+v", st)
	}
	if err := c.SetWeight(ctx(t), "app", "s1", 37); err != nil {
		t.Fatal(err)
	}
	if w, err := c.Run(ctx(t), "get weight app/s1"); err != nil || strings.TrimSpace(w) != "37 (initial 10)" {
		t.Fatalf("weight %q %v", w, err)
	}
}

func TestErrorPaths(t *testing.T) {
	p, s := startHAProxy(t)
	admin, user := client(t, s.admin), client(t, s.user)
	tests := []struct {
		name  string
		run   func() error
		reply string // HAProxy's text the error must carry; "" = refused before sending
	}{
		{"no such server", func() error { return admin.SetServerState(ctx(t), "app", "nope", haproxy.StateDrain) }, "No such server."},
		{"no such backend", func() error { return admin.SetServerState(ctx(t), "nope", "s1", haproxy.StateDrain) }, "No such backend."},
		{"permission denied", func() error { return user.SetServerState(ctx(t), "app", "s1", haproxy.StateDrain) }, "Permission denied"},
		{"weight too large", func() error { return admin.SetWeight(ctx(t), "app", "s1", 300) }, ""},
		{"name with ;", func() error { return admin.SetServerState(ctx(t), "app", "s1;shutdown", haproxy.StateDrain) }, ""},
		{"name with space", func() error { return admin.SetWeight(ctx(t), "app x", "s1", 1) }, ""},
		{"name with newline", func() error { return admin.SetWeight(ctx(t), "app", "s1\nshow info", 1) }, ""},
		{"unknown state", func() error { return admin.SetServerState(ctx(t), "app", "s1", "up") }, ""},
		{"separator in raw command", func() error { _, err := admin.Run(ctx(t), "show info; show stat"); return err }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil {
				t.Fatal("no error")
			}
			var ce *haproxy.CommandError
			if tc.reply == "" {
				if errors.As(err, &ce) {
					t.Fatalf("sent to HAProxy: %v", err)
				}
				return
			}
			if !errors.As(err, &ce) || !strings.Contains(ce.Reply, tc.reply) || ce.Command == "" {
				t.Fatalf("error %v, want HAProxy's %q", err, tc.reply)
			}
			if !strings.Contains(err.Error(), ce.Command) {
				t.Fatalf("error %q does not name the command", err)
			}
		})
	}
	// Nothing above changed s1.
	st, err := admin.ShowServersState(ctx(t))
	if err != nil || st[0].AdminState != 0 || st[0].Weight != 10 {
		t.Fatalf("s1 changed: %+v %v", st, err)
	}

	t.Run("socket vanished", func(t *testing.T) {
		c := client(t, filepath.Join(p.Dir, "missing.sock"))
		err := c.SetServerState(ctx(t), "app", "s1", haproxy.StateDrain)
		if !errors.Is(err, haproxy.ErrConnection) {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("context deadline", func(t *testing.T) {
		c0, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := admin.ShowServersState(c0); err == nil {
			t.Fatal("no error with a cancelled context")
		}
	})
	t.Run("redial after restart", func(t *testing.T) {
		before, err := admin.ShowInfo(ctx(t))
		if err != nil || before.Pid != p.Pid() || before.Version == "" {
			t.Fatalf("show info %+v %v (pid %d)", before, err, p.Pid())
		}
		if err := p.Restart(ctx(t)); err != nil {
			t.Fatal(err)
		}
		after, err := admin.ShowInfo(ctx(t))
		if err != nil || after.Instance() == before.Instance() {
			t.Fatalf("instance %v -> %v (%v)", before.Instance(), after.Instance(), err)
		}
		if _, err := admin.ShowServersState(ctx(t)); err != nil {
			t.Fatalf("after restart: %v", err)
		}
	})
}

func TestNewRejectsBadAddresses(t *testing.T) {
	for _, a := range []string{"", "unix:", "tcp:nohost"} {
		if _, err := haproxy.New(a); err == nil {
			t.Errorf("New(%q) accepted", a)
		}
	}
}

// Preflight, against a real HAProxy: the admin socket passes, one at
// `level user` is misconfigured with the fix in the message, and a socket
// nobody serves is a connection error the loop retries, not a
// misconfiguration.
func TestPreflight(t *testing.T) {
	_, s := startHAProxy(t)
	if err := client(t, s.admin).Preflight(ctx(t)); err != nil {
		t.Fatalf("admin socket: %v", err)
	}
	err := client(t, s.user).Preflight(ctx(t))
	if !errors.Is(err, haproxy.ErrMisconfigured) || !strings.Contains(err.Error(), `answers at level "user"`) || !strings.Contains(err.Error(), "level admin") {
		t.Fatalf("user socket: %v", err)
	}
	err = client(t, filepath.Join(t.TempDir(), "none.sock")).Preflight(ctx(t))
	if errors.Is(err, haproxy.ErrMisconfigured) || !errors.Is(err, haproxy.ErrConnection) {
		t.Fatalf("missing socket: %v", err)
	}
}
