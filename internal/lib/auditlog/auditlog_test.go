package auditlog

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Reopen after the file was moved away (what logrotate does) writes a
// new file at the path; the old one keeps what was written before.
func TestReopenAfterRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Write([]byte("{\"cycle\":1}\n")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("{\"cycle\":2}\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.Reopen(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("{\"cycle\":3}\n")); err != nil {
		t.Fatal(err)
	}
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if string(old) != "{\"cycle\":1}\n{\"cycle\":2}\n" || string(cur) != "{\"cycle\":3}\n" {
		t.Fatalf("rotated %q, new %q", old, cur)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm()&0o007 != 0 {
		t.Fatalf("new file %v %v: want no access for others", fi.Mode(), err)
	}
}

// A FIFO at the path is refused at once, at open and at reopen, and a
// failed reopen keeps the log writing where it was.
func TestFIFORefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := Open(fifo); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "FIFO") {
			t.Fatalf("err %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Open blocked on a FIFO")
	}
	path := filepath.Join(dir, "audit.jsonl")
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reopen(); err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("reopen onto a FIFO: %v", err)
	}
	if _, err := a.Write([]byte("kept\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path + ".1"); string(b) != "kept\n" {
		t.Fatalf("old file holds %q", b)
	}
}

// A reopen that comes after Close (a SIGHUP as the agent stops) opens
// nothing and leaves no file open.
func TestReopenAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Reopen(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("x\n")); err == nil {
		t.Fatal("a closed log took a write after a reopen")
	}
}
