package haproxy

import (
	"strconv"
	"strings"
)

// Version is HAProxy's major and minor release, as `show info` names it
// ("Version: 3.2.26-1" is 3.2).
type Version struct{ Major, Minor int }

// ParseVersion reads the major and minor release from `show info`'s
// Version field, or from `haproxy -v`'s number: "3.2.26-1", "2.6.12-1+deb12u4",
// "3.3-dev4". ok is false when it does not start with two numbers.
func ParseVersion(s string) (v Version, ok bool) {
	major, rest, found := strings.Cut(strings.TrimSpace(s), ".")
	if !found {
		return Version{}, false
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	var err1, err2 error
	v.Major, err1 = strconv.Atoi(major)
	v.Minor, err2 = strconv.Atoi(rest[:end])
	if err1 != nil || err2 != nil || v.Major < 0 {
		return Version{}, false
	}
	return v, true
}

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

func (v Version) String() string { return strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor) }
