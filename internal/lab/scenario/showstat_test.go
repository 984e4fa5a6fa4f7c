package scenario

import "testing"

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, reply string
		rows        int
		wantErr     bool
	}{
		// Columns in an unusual order: parsing follows the header.
		{"by header", "# svname,pxname,status,\nBACKEND,app,UP,\nagent1,hapilot-agents,UP,\n\n", 2, false},
		{"quoted comma", "# pxname,svname,status,\napp,s1,\"UP, going DOWN\",\n", 1, false},
		{"no header", "pxname,svname\napp,s1\n", 0, true},
		{"short row", "# a,b,c\n1,2\n", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rows, err := parseStat(tc.reply)
			if (err != nil) != tc.wantErr || len(rows) != tc.rows {
				t.Fatalf("rows %v, err %v; want %d rows, error %v", rows, err, tc.rows, tc.wantErr)
			}
		})
	}
	rows, _ := parseStat("# svname,pxname,status,\nagent1,hapilot-agents,UP,\n")
	if r := rows[0]; r["pxname"] != "hapilot-agents" || r["svname"] != "agent1" || r["status"] != "UP" {
		t.Fatalf("row %v", r)
	}
	rows, _ = parseStat("# pxname,svname,status,\napp,s1,\"UP, going DOWN\",\n")
	if rows[0]["status"] != "UP, going DOWN" {
		t.Fatalf("quoted field %q", rows[0]["status"])
	}
}
