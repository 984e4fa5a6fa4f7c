package haproxy

import "testing"

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in     string
		want   Version
		ok     bool
		is31up bool
	}{
		{"3.2.26-1", Version{3, 2}, true, true},
		{"2.6.12-1+deb12u4", Version{2, 6}, true, false},
		{"3.0.11-1+deb13u4", Version{3, 0}, true, false},
		{"3.1.0", Version{3, 1}, true, true},
		{"3.3-dev4", Version{3, 3}, true, true},
		{" 10.12 ", Version{10, 12}, true, true},
		{"", Version{}, false, false},
		{"3", Version{}, false, false},
		{"x.2", Version{}, false, false},
		{"3.x", Version{}, false, false},
		{"-1.2", Version{}, false, false},
	} {
		got, ok := ParseVersion(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok && got.AtLeast(3, 1) != tc.is31up {
			t.Errorf("%q: AtLeast(3, 1) = %v", tc.in, !tc.is31up)
		}
	}
}
