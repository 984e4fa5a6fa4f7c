package prompt

import (
	"fmt"
	"strings"

	"github.com/hapilot/hapilot/agent"
)

// CompactHeader names the columns of a compact server row: what the
// decision rests on, the recent window (rreq, rerr%) beside the full one,
// and the note.
const CompactHeader = "server state owner w/cfg req 5xx err% peer% ratio rreq rerr% p95 util note"

// CompactShown is the most servers a compact prompt lists in full per
// backend: the candidates and the agent's own always, then the most
// anomalous. A small model's context holds the whole example that way,
// and a row it need not read costs it nothing.
const CompactShown = 4

// compactPrompt is Prompt's compact form: the same facts about the
// servers that decide (the candidates, the agent's own, the worst of the
// rest), with notes in a few words. A small model reads it faster, and a
// model trained here sees each example whole in its context.
//
// The numbered form (Numbered) writes the same rows, each ended by
// its reference (" = s3"), and each backend's line begins with its own
// ("backend b1 = app: ..."), as Refs numbers them.
func compactPrompt(in Input) string {
	var b strings.Builder
	obs := in.Obs
	numbered := in.Style == Numbered
	header := CompactHeader
	var refs Refs
	if numbered {
		header, refs = NumberedHeader, in.Refs()
	}
	fmt.Fprintf(&b, "step %d, window %s, recent %s\n", obs.Cycle, lookback(obs.Lookback), lookback(obs.RecentSpan))
	shown := in.compactShown()
	for _, be := range obs.Backends {
		if !in.shows(be) {
			continue
		}
		if numbered {
			fmt.Fprintf(&b, "backend %s = ", refs.ofBackend[be.Name])
		} else {
			b.WriteString("backend ")
		}
		var req, e5 uint64
		for _, s := range be.Servers {
			req += s.Window.Requests
			e5 += s.Window.Err5xx
		}
		drains := 1
		if in.DrainsPer > 0 {
			drains = max(1, len(be.Servers)/in.DrainsPer)
		}
		fmt.Fprintf(&b, "%s: %d servers, %d serving, keep %d, drains %d, 5xx %.2f%%\n",
			be.Name, len(be.Servers), be.ServingCount(), (len(be.Servers)+1)/2, drains, pct(e5, req))
		b.WriteString(header + "\n")
		rows, hidden, hReq, hErr := in.listed(be, shown)
		for _, s := range rows {
			writeCompactRow(&b, in, be, s)
			if numbered {
				b.WriteString(" = " + refs.ofServer[s.Key()])
			}
			b.WriteByte('\n')
		}
		if hidden > 0 {
			fmt.Fprintf(&b, "(%d more, none flagged: %d requests, 5xx %.2f%%)\n", hidden, hReq, pct(hErr, hReq))
		}
	}
	for _, h := range in.History {
		b.WriteString("you: " + h + "\n")
	}
	return b.String()
}

// compactShown is how many servers a backend a compact prompt lists in
// full, besides its candidates and the agent's own.
func (in Input) compactShown() int {
	if in.MaxShown <= 0 || in.MaxShown > CompactShown {
		return CompactShown
	}
	return in.MaxShown
}

func writeCompactRow(b *strings.Builder, in Input, be agent.BackendView, s agent.ServerView) {
	f := rowFigures(be, s)
	fmt.Fprintf(b, "%s %s %s %d/%d %d %d %.2f %.2f %s %d %.2f %d %s %s",
		s.Server, s.State.Label(), s.Owner, s.State.Weight, s.State.Initial,
		s.Window.Requests, s.Window.Err5xx, 100*f.rate, 100*f.peer, f.ratio,
		s.Recent.Requests, 100*s.Recent.ErrorRate(), s.Window.P95Ms, utilization(s, f.rps), compactNote(in, be, s))
}

// compactWhy is a candidate's reason without the figures its row shows
// already: the test that flagged it and, for errors, the p-value.
func compactWhy(why string) string {
	kind, rest, _ := strings.Cut(why, " ")
	kind = strings.TrimSuffix(kind, ":")
	if _, p, ok := strings.Cut(rest, "p="); ok {
		return kind + " p=" + p
	}
	return kind
}

// compactNote is note in a few words each.
func compactNote(in Input, be agent.BackendView, s agent.ServerView) string {
	k := agent.Key{Backend: be.Name, Server: s.Server}
	var n []string
	if why, ok := in.Candidates[k]; ok {
		if brief, ok := in.Brief[k]; ok {
			why = brief
		} else {
			why = compactWhy(why)
		}
		n = append(n, "candidate: "+why)
	}
	if a, ok := in.Floor[k]; ok {
		n = append(n, "rules "+a)
	}
	if s.Changed != nil {
		n = append(n, fmt.Sprintf("%s by agent %.0fs ago", s.Changed.Phase, in.Obs.Time.Sub(s.Changed.At).Seconds()))
	}
	if !s.NoDrainUntil.IsZero() {
		n = append(n, fmt.Sprintf("held %.0fs", s.NoDrainUntil.Sub(in.Obs.Time).Seconds()))
	}
	if c := in.Pending[k]; c > 0 {
		n = append(n, fmt.Sprintf("proposed %d/%d", c, in.Confirm))
	}
	if why, ok := in.Obs.Refused[k]; ok {
		n = append(n, "refused: "+why)
	}
	if s.Owner == agent.OwnerOperator {
		n = append(n, "operator's")
	}
	if len(n) == 0 {
		return "-"
	}
	return strings.Join(n, "; ")
}
