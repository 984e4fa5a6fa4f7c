package peers

import (
	"fmt"
	"io"

	"github.com/hapilot/hapilot/internal/lib/promtext"
)

// WriteMetrics writes the fleet's figures in Prometheus' text format.
func (n *Node) WriteMetrics(w io.Writer) {
	st := n.Status()
	inPicture := 0
	for _, m := range st.Members {
		if m.InPicture {
			inPicture++
		}
	}
	promtext.Gauge(w, "hapilot_fleet_members", "Fleet members memberlist knows or this agent heard from, itself included.", len(st.Members))
	promtext.Gauge(w, "hapilot_fleet_members_in_picture", "Members heard within the fleet timeout, itself included: the ones deciders are chosen from.", inPicture)
	alone := 0
	if st.Alone {
		alone = 1
	}
	promtext.Gauge(w, "hapilot_fleet_alone", "1 when no peer was heard within the timeout: every backend is decided here on local evidence.", alone)
	promtext.Gauge(w, "hapilot_fleet_last_sync_age_seconds", "Seconds since the last message from any peer (-1: never).", st.LastSyncAgeMs/1000)
	fmt.Fprintf(w, "# HELP hapilot_fleet_backend_decider This agent's role for each backend, and who decides it (1 per backend).\n# TYPE hapilot_fleet_backend_decider gauge\n")
	for _, b := range st.Backends {
		fmt.Fprintf(w, "hapilot_fleet_backend_decider{backend=%q,decider=%q,role=%q,evidence=%q} 1\n", b.Backend, b.Decider, b.Role, b.Evidence)
	}
	fmt.Fprintf(w, "# HELP hapilot_fleet_backend_requests Requests in the policy's window per backend: pooled over the fleet, and this node's own.\n# TYPE hapilot_fleet_backend_requests gauge\n")
	for _, b := range st.Backends {
		fmt.Fprintf(w, "hapilot_fleet_backend_requests{backend=%q,evidence=\"pooled\"} %d\n", b.Backend, b.Pooled.Requests)
		fmt.Fprintf(w, "hapilot_fleet_backend_requests{backend=%q,evidence=\"local\"} %d\n", b.Backend, b.Local.Requests)
	}
	for _, f := range []struct{ key, metric, help string }{
		{"messages_sent", "hapilot_fleet_messages_sent_total", "Fleet messages sent (state and counts)."},
		{"messages_received", "hapilot_fleet_messages_received_total", "Fleet messages received, before any check."},
		{"bytes_sent", "hapilot_fleet_bytes_sent_total", "Bytes of fleet messages sent, before memberlist's encryption."},
		{"bytes_received", "hapilot_fleet_bytes_received_total", "Bytes of fleet messages received, after memberlist's decryption."},
		{"rejected", "hapilot_fleet_messages_rejected_total", "Fleet messages refused: malformed, claiming this node's name, or in memberlist's user messages (an agent of fleet wire version 1)."},
		{"duplicates", "hapilot_fleet_messages_duplicate_total", "Fleet messages seen before (their sequence number), ignored."},
		{"stale", "hapilot_fleet_messages_stale_total", "Fleet messages sent longer ago than the freshness window, or by a process of the sender's name memberlist no longer lists, ignored."},
		{"forged", "hapilot_fleet_messages_forged_total", "Fleet messages under a name memberlist does not list, or not from that member's address, refused."},
		{"future", "hapilot_fleet_messages_future_total", "Fleet messages sent ahead of this clock by more than the skew allowed, or before their process started, refused."},
		{"send_errors", "hapilot_fleet_send_errors_total", "Fleet messages that could not be sent."},
		{"join_errors", "hapilot_fleet_join_errors_total", "Attempts to join the fleet-join peers that reached none of them."},
		{"counts_added", "hapilot_fleet_counts_added_total", "Server-seconds of peers' counts added to the pooled windows."},
		{"counts_refused", "hapilot_fleet_counts_refused_total", "Server-seconds of peers' counts refused as impossible."},
		{"unsealed", "hapilot_fleet_envelopes_refused_total", "Packets or streams in hapilot's envelope not sealed with the fleet's key, refused."},
		{"inbox_dropped", "hapilot_fleet_inbox_dropped_total", "Fleet messages dropped because the queue to their reader was full."},
		{"state_cut", "hapilot_fleet_state_cut_total", "State messages cut to the largest message an agent sends."},
		{"streams_refused", "hapilot_fleet_streams_refused_total", "Fleet port streams closed at their length, over the largest any member sends."},
		{"streams_evicted", "hapilot_fleet_streams_evicted_total", "Fleet port streams closed at the connection caps: the oldest that had shown no header, or the new one when every other had."},
	} {
		promtext.Counter(w, f.metric, f.help, st.Traffic[f.key])
	}
}
