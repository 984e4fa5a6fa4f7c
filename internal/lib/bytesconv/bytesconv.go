// Package bytesconv parses numbers from byte slices without allocating,
// for the ingest paths' per-response work.
package bytesconv

// Atoi parses a decimal integer of at most 9 digits, with an optional
// leading '-'; anything else is not a number.
func Atoi(b []byte) (int, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
