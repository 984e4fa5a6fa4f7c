//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	"github.com/hapilot/hapilot/internal/lab/logbuf"
	"github.com/miekg/dns"
	"github.com/rs/zerolog"
)

// nameServer answers A queries for one name with the addresses it holds
// now, for HAProxy's resolvers.
type nameServer struct {
	srv  *dns.Server
	mu   sync.Mutex
	addr []string
}

func startNameServer(t *testing.T, name string, addrs ...string) *nameServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ns := &nameServer{addr: addrs}
	mux := dns.NewServeMux()
	mux.HandleFunc(name, func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		ns.mu.Lock()
		for _, a := range ns.addr {
			if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 1}, A: net.ParseIP(a)})
			}
		}
		ns.mu.Unlock()
		w.WriteMsg(m)
	})
	ns.srv = &dns.Server{PacketConn: pc, Handler: mux}
	go ns.srv.ActivateAndServe()
	t.Cleanup(func() { ns.srv.Shutdown() })
	return ns
}

func (ns *nameServer) set(addrs ...string) {
	ns.mu.Lock()
	ns.addr = addrs
	ns.mu.Unlock()
}

func (ns *nameServer) port() int { return ns.srv.PacketConn.LocalAddr().(*net.UDPAddr).Port }

// server-template slots resolved through DNS, in a real HAProxy: the
// agent drains the slot whose host fails 5%; when DNS drops that host,
// the slot enters the resolver's maintenance too (admin_state 0x28) and
// stays the agent's change, not an operator's; when DNS gives another
// slot a new host, that slot's window starts empty.
func TestServerTemplateSlots(t *testing.T) {
	t.Parallel()
	labtest.RequireHAProxy(t)
	dir := t.TempDir()
	// Four hosts on one port, the first failing 5%, and a fifth for later.
	first, err := fleet.StartBackend(fleet.BackendConfig{ErrorRate: 0.05, Latency: 9 * time.Millisecond, Jitter: 4 * time.Millisecond, Seed: 1, Listen: "127.0.0.11:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	_, port, _ := net.SplitHostPort(first.Addr)
	hosts := []string{"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14", "127.0.0.15"}
	for i, h := range hosts[1:] {
		b, err := fleet.StartBackend(fleet.BackendConfig{Latency: 9 * time.Millisecond, Jitter: 4 * time.Millisecond, Seed: uint64(2 + i), Listen: h + ":" + port})
		if err != nil {
			t.Skipf("port %s is taken on %s: %v", port, h, err)
		}
		defer b.Close()
	}
	ns := startNameServer(t, "app.test.", hosts[:4]...)
	ports, err := haproxyproc.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandConfig(t, dir)
	socket := h.socket
	var b strings.Builder
	b.WriteString(h.head(ports[0], fmt.Sprintf(`
resolvers lab
    nameserver ns1 127.0.0.1:%d
    accepted_payload_size 8192
    resolve_retries 2
    timeout resolve 200ms
    timeout retry 200ms
    hold valid 500ms
    hold obsolete 500ms
    hold nx 500ms
`, ns.port())))
	fmt.Fprintf(&b, `    default_backend app

backend app
    server-template slot 4 app.test:%s resolvers lab init-addr none resolve-prefer ipv4

%s`, port, h.agents)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hp, err := haproxyproc.Start(ctx, dir, b.String(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Stop()
	rt, err := haproxy.New(socket)
	if err != nil {
		t.Fatal(err)
	}
	states := func() map[string]haproxy.ServerState {
		st, err := rt.ShowServersState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]haproxy.ServerState{}
		for _, s := range st {
			if s.Backend == "app" {
				out[s.Server] = s
			}
		}
		return out
	}
	slotOf := func(host string) string {
		for name, s := range states() {
			if s.Addr == host {
				return name
			}
		}
		return ""
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("not within 30 s: %s; states %+v\nhaproxy:\n%s", what, states(), hp.Log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("every slot resolved", func() bool {
		for _, h := range hosts[:4] {
			if slotOf(h) == "" {
				return false
			}
		}
		return true
	})

	log := &logbuf.Buffer{}
	d := startAgent(t, ctx, zerolog.New(log), h.agentArgs("--status-listen", "off", "--readmit", "off"))
	loadCtx, stopLoad := context.WithCancel(ctx)
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		fleet.Load{Addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), Rate: 300, Duration: time.Minute}.Run(loadCtx)
	}()
	defer func() { stopLoad(); <-loaded }()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", tail(log.String(), 6000))
		}
	})

	faulty := slotOf(hosts[0])
	waitFor("the faulty slot drained", func() bool { return states()[faulty].Drain() })
	for name, s := range states() {
		if name != faulty && s.AdminState != 0 {
			t.Errorf("healthy %s: admin_state %#x", name, s.AdminState)
		}
	}

	// DNS drops the faulty host: its slot enters the resolver's
	// maintenance on top of the agent's drain, and stays the agent's.
	ns.set(hosts[1:4]...)
	waitFor("the slot in the resolver's maintenance", func() bool {
		return states()[faulty].AdminState&haproxy.AdminDNSMaint != 0
	})
	if a := states()[faulty].AdminState; a != haproxy.AdminForcedDrain|haproxy.AdminDNSMaint {
		t.Errorf("%s: admin_state %#x, want 0x28", faulty, a)
	}
	cycle := d.Loop.View().Status().Cycle
	waitFor("three steps more", func() bool { return d.Loop.View().Status().Cycle >= cycle+3 })
	k := haproxy.ServerKey{Backend: "app", Server: faulty}
	st := d.Loop.View().Status()
	if ch, ok := st.Changes[k]; !ok || ch.Phase != "drained" {
		t.Errorf("%s is no longer the agent's drain: changes %v", faulty, st.Changes)
	}
	for _, bv := range st.Backends {
		for _, sv := range bv.Servers {
			if sv.Server == faulty && (sv.Owner != "agent" || !sv.OperatorUntil.IsZero()) {
				t.Errorf("%s: owner %s, operator until %v", faulty, sv.Owner, sv.OperatorUntil)
			}
		}
	}

	// DNS gives a new host: HAProxy puts it in a free slot (here the
	// drained one, whose host went away), which is a new server to the
	// agent: its window is emptied. The agent's drain stays on the slot
	// (HAProxy keeps a forced drain), for re-admission to judge the new
	// host on its own evidence.
	ns.set(hosts[1], hosts[2], hosts[4])
	waitFor("a slot given the new host", func() bool { return slotOf(hosts[4]) != "" })
	moved := slotOf(hosts[4])
	cycle = d.Loop.View().Status().Cycle
	waitFor("two steps after", func() bool { return d.Loop.View().Status().Cycle >= cycle+2 })
	if !strings.Contains(log.String(), `"server":"app/`+moved+`","was":"`) || !strings.Contains(log.String(), `"now":"`+hosts[4]+`"`) {
		t.Errorf("the re-addressed slot %s was not noticed", moved)
	}
	for name, s := range states() {
		if name != faulty && s.Drain() {
			t.Errorf("healthy %s drained", name)
		}
	}
}
