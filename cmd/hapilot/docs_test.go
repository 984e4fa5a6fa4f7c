package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"
)

// resultsDir holds the lab's results as the commands printed them.
const resultsDir = "docs/lab/results"

// Every relative link in README.md and docs/ leads to a file that exists
// and, where it names an anchor, to a heading of that file: docs are
// moved and split, and a link left behind would send a reader nowhere.
func TestDocLinks(t *testing.T) {
	repo := os.DirFS("../..")
	files := []string{"README.md"}
	err := fs.WalkDir(repo, "docs", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == resultsDir {
			// Verbatim copies of hapilot-bench's reports: their links
			// point into the run's own output folder, which is not kept.
			return fs.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found only %d Markdown files under docs/: is the walk looking in the right place?", len(files))
	}
	broken, err := brokenLinks(repo, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range broken {
		t.Error(b)
	}
}

// The checker itself finds what it is there to find: a missing file, a
// missing anchor, in another file or the same one. Links in code, to the
// web, and to anchors that exist pass.
func TestBrokenLinksFindsBreaks(t *testing.T) {
	fsys := fstest.MapFS{
		"docs/a.md":     {Data: []byte("# Title\n\n## The stats path: HAProxy's own counters\n\n## Twice\n\n## Twice\n")},
		"docs/img.png":  {Data: []byte{0}},
		"docs/sub/b.md": {Data: []byte("# B\n")},
	}
	for _, tc := range []struct {
		name, file, doc string
		want            []string // each broken link's target, in order
	}{
		{"file exists", "docs/c.md", "[a](a.md)", nil},
		{"image exists", "docs/c.md", "![i](img.png)", nil},
		{"up a folder", "docs/sub/c.md", "[a](../a.md)", nil},
		{"anchor exists", "docs/c.md", "[a](a.md#the-stats-path-haproxys-own-counters)", nil},
		{"second heading of a name", "docs/c.md", "[a](a.md#twice-1)", nil},
		{"own anchor", "docs/sub/c.md", "[t](#b)", nil},
		{"web link", "docs/sub/c.md", "[w](https://example.com/x.md)", nil},
		{"in a code span", "docs/sub/c.md", "`[x](missing.md)`", nil},
		{"in a code block", "docs/sub/c.md", "```\n[x](missing.md)\n```", nil},
		{"missing file", "docs/sub/c.md", "[x](missing.md)", []string{"missing.md"}},
		{"missing anchor", "docs/c.md", "[a](a.md#no-such-heading)", []string{"a.md#no-such-heading"}},
		{"missing own anchor", "docs/sub/c.md", "[t](#nothing)", []string{"#nothing"}},
		{"wrong folder", "docs/sub/c.md", "[a](a.md)", []string{"a.md"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := fstest.MapFS{}
			for k, v := range fsys {
				m[k] = v
			}
			m[tc.file] = &fstest.MapFile{Data: []byte("# B\n\n" + tc.doc + "\n")}
			got, err := brokenLinks(m, []string{tc.file})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("broken %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.HasSuffix(got[i], "("+w+")") {
					t.Errorf("broken[%d] = %q, want it to name %q", i, got[i], w)
				}
			}
		})
	}
}

// linkRE matches an inline link or image's target: [text](target) or
// [text](target "title").
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// brokenLinks returns one line per relative link in files that leads to
// no file in fsys, or to an anchor its file has no heading for.
func brokenLinks(fsys fs.FS, files []string) ([]string, error) {
	anchors := map[string]map[string]bool{} // file -> its headings' anchors
	anchorsOf := func(p string) (map[string]bool, error) {
		if a, ok := anchors[p]; ok {
			return a, nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		a := headingAnchors(b)
		anchors[p] = a
		return a, nil
	}
	var broken []string
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		for n, line := range proseLines(b) {
			if line == "" {
				continue
			}
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if u, err := url.Parse(target); err == nil && u.Scheme != "" {
					continue // the web, mail: not ours to check
				}
				file, anchor, _ := strings.Cut(target, "#")
				p := f
				if file != "" {
					p = path.Join(path.Dir(f), file)
					st, err := fs.Stat(fsys, p)
					if err != nil {
						broken = append(broken, fmt.Sprintf("%s:%d: no file %s (%s)", f, n+1, p, target))
						continue
					}
					if st.IsDir() || !strings.HasSuffix(p, ".md") {
						continue // a folder or an image: no anchors to check
					}
				}
				if anchor == "" {
					continue
				}
				a, err := anchorsOf(p)
				if err != nil {
					return nil, err
				}
				if !a[anchor] {
					broken = append(broken, fmt.Sprintf("%s:%d: %s has no heading for #%s (%s)", f, n+1, p, anchor, target))
				}
			}
		}
	}
	return broken, nil
}

// proseLines returns the file's lines with code blocks blanked and code
// spans cut out, so that a link shown as an example is not checked.
func proseLines(b []byte) []string {
	var lines []string
	fence := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			lines = append(lines, "")
			continue
		}
		if fence {
			lines = append(lines, "")
			continue
		}
		lines = append(lines, stripCodeSpans(line))
	}
	return lines
}

func stripCodeSpans(line string) string {
	var out strings.Builder
	in := false
	for _, r := range line {
		if r == '`' {
			in = !in
			continue
		}
		if !in {
			out.WriteRune(r)
		}
	}
	return out.String()
}

// headingAnchors returns the anchors GitHub makes of a file's headings:
// lower case, punctuation dropped, spaces as hyphens, and -1, -2 ... on a
// repeated one.
func headingAnchors(b []byte) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				s.WriteRune(r)
			case r == ' ':
				s.WriteRune('-')
			}
		}
		slug := s.String()
		if n := seen[slug]; n > 0 {
			a[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	return a
}
