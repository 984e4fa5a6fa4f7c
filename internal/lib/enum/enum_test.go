package enum

import "testing"

type color string

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    color
		wantErr string
	}{
		{"red", "red", ""},
		{"blue", "blue", ""},
		{"Red", "", `color "Red": want red|blue`},
		{"", "", `color "": want red|blue`},
	} {
		got, err := Parse("color", tc.in, color("red"), color("blue"))
		if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
			t.Errorf("Parse(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
