package window

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// What a node ships and a peer files adds up, read through Merged, to
// what one store that saw every event holds.
func TestExportAddMergedEqualsOneStore(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	local, peer, remote, all := New(time.Minute, 16, clk.Now), New(time.Minute, 16, clk.Now), New(time.Minute, 16, clk.Now), New(time.Minute, 16, clk.Now)
	exp := &Exporter{Store: peer}
	for sec := 0; sec < 12; sec++ {
		for i := 0; i < 40; i++ {
			status := 200
			if i%10 == 0 && sec%2 == 0 {
				status = 500
			}
			e := ev("app", "srv1", status, 5+i)
			if i%2 == 0 {
				local.Record(e)
			} else {
				peer.Record(e)
			}
			all.Record(e)
		}
		if sec == 6 {
			// a late write into a past second, as the stats path makes
			late := ev("app", "srv2", 502, -1)
			peer.RecordAt(clk.t.Unix()-3, late)
			all.RecordAt(clk.t.Unix()-3, late)
		}
		if sec%3 == 2 {
			ship(t, exp, remote)
		}
		clk.t = clk.t.Add(time.Second)
	}
	ship(t, exp, remote)
	if d := exp.Deltas(); len(d) != 0 {
		t.Fatalf("a second call with nothing new shipped %+v", d)
	}
	got, want := Merged{local, remote}.Snapshot(time.Minute), all.Snapshot(time.Minute)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged\n%+v\nwant\n%+v", got, want)
	}
	if got, want := (Merged{local, remote}).Snapshot(5*time.Second), all.Snapshot(5*time.Second); !reflect.DeepEqual(got, want) {
		t.Fatalf("last 5 s merged\n%+v\nwant\n%+v", got, want)
	}
}

func ship(t *testing.T, exp *Exporter, to *Store) {
	t.Helper()
	for _, d := range exp.Deltas() {
		for _, s := range d.Seconds {
			if err := to.Add(d.Backend, d.Server, s); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestAddRefusesWhatNoSecondHolds(t *testing.T) {
	s := New(time.Minute, 16, nil)
	for _, sec := range []Second{
		{Requests: 2, Err5xx: 3},
		{Requests: 2, Err4xx: 3},
		{Requests: 2, Err5xx: 1, Retried: 2},
		{Requests: 1, Latency: []Bin{{Index: LatencyBins, Count: 1}}},
		{Requests: 1, Latency: []Bin{{Index: 1, Count: 2}}},
		{Requests: MaxCount + 1},
	} {
		if err := s.Add("app", "srv1", sec); !errors.Is(err, ErrBadSecond) {
			t.Errorf("%+v: got %v, want ErrBadSecond", sec, err)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("a refused second made a series")
	}
	if err := s.Add("", "srv1", Second{Requests: 1}); err != nil || s.BadNames() != 1 {
		t.Fatalf("an empty name: err %v, bad names %d", err, s.BadNames())
	}
	if err := s.Add("app", "srv1", Second{Ago: 200, Requests: 1}); err != nil || s.Len() != 0 {
		t.Fatalf("a second older than the window: err %v, %d series", err, s.Len())
	}
}
