package stats

import "testing"

func TestLowerMedian(t *testing.T) {
	tests := []struct {
		v    []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2}, // the lower of the two middle values
		{[]float64{520, 20, 20, 20, 20}, 20},
	}
	for _, tt := range tests {
		if got := LowerMedian(append([]float64(nil), tt.v...)); got != tt.want {
			t.Errorf("LowerMedian(%v) = %v, want %v", tt.v, got, tt.want)
		}
	}
}
