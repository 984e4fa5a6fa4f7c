package bytesconv

import "testing"

func TestAtoi(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"0", 0, true}, {"200", 200, true}, {"-1", -1, true}, {"999999999", 999999999, true},
		{"", 0, false}, {"-", 0, false}, {"12ms", 0, false}, {"1234567890", 0, false}, {" 1", 0, false}, {"+1", 0, false},
	}
	for _, tc := range tests {
		if got, ok := Atoi([]byte(tc.in)); got != tc.want || ok != tc.ok {
			t.Errorf("Atoi(%q) = %d, %v", tc.in, got, ok)
		}
	}
}
