// Package enum parses settings that take one of a few words, so that each
// such setting is a typed value with its allowed words in one place, and
// every flag, config file line and error message agrees on them.
package enum

import (
	"fmt"
	"strings"
)

// Parse returns s as a T when it is one of allowed, else an error that
// names the setting and lists the allowed words.
func Parse[T ~string](setting, s string, allowed ...T) (T, error) {
	for _, a := range allowed {
		if string(a) == s {
			return a, nil
		}
	}
	return "", fmt.Errorf("%s %q: want %s", setting, s, Join(allowed...))
}

// Join lists the allowed words as "a|b|c", for usage lines.
func Join[T ~string](allowed ...T) string {
	s := make([]string, len(allowed))
	for i, a := range allowed {
		s[i] = string(a)
	}
	return strings.Join(s, "|")
}
