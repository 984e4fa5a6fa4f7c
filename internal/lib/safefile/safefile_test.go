package safefile

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every kind of path the agent may be pointed at, opened for reading and
// for appending as the state file and the audit log are: only a regular
// file (or none) is taken, and no open blocks. A FIFO blocked the agent
// in open before (0 steps, SIGTERM ignored).
func TestOpenRefusesAllButRegularFiles(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(regular, link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tests := []struct {
		name, path, want string
	}{
		{"regular file", regular, ""},
		{"absent", filepath.Join(dir, "absent"), "no such file"},
		{"FIFO", fifo, "FIFO"},
		{"symbolic link", link, "symbolic link"},
		{"directory", dir, "directory"},
		{"socket", sock, "socket"},
		{"character device", "/dev/null", "character device"},
	}
	for _, tc := range tests {
		for _, mode := range []struct {
			name string
			flag int
		}{{"read", os.O_RDONLY}, {"append", os.O_WRONLY | os.O_APPEND}} {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				done := make(chan error, 1)
				go func() {
					f, err := Open(tc.path, mode.flag, 0o640)
					if err == nil {
						f.Close()
					}
					done <- err
				}()
				var err error
				select {
				case err = <-done:
				case <-time.After(5 * time.Second):
					t.Fatal("open blocked")
				}
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("refused a regular file: %v", err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("err %v, want %q", err, tc.want)
				case tc.want != "" && tc.name != "absent" && !errors.Is(err, ErrNotRegular):
					t.Fatalf("err %v is not ErrNotRegular", err)
				case tc.name == "absent" && !errors.Is(err, fs.ErrNotExist):
					t.Fatalf("err %v is not fs.ErrNotExist", err)
				}
			})
		}
	}
}
