package netx

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const childEnv = "NETX_TEST_LISTEN_AS_CHILD"

// TestHelperListenAsChild is the child of TestStaleSocketOfAnotherUser:
// it listens at the path in its environment, as the user it was started
// as, and says what came of it.
func TestHelperListenAsChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("the child of TestStaleSocketOfAnotherUser")
	}
	ln, err := Listen("unix:" + path)
	if err != nil {
		fmt.Printf("ERROR: %v\n", err)
		return
	}
	ln.Close()
	fmt.Println("LISTENING")
}

// The service's user starts on a control socket a root agent left: a
// stale one (the root agent killed with -9) is removed and listened on;
// one a root process still listens on is left, and the error says who and
// what to do. Before, both failed with "dial ...: connect: permission
// denied": a stale socket was removed only on ECONNREFUSED.
func TestStaleSocketOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to leave a socket as a root agent does and start as another user")
	}
	const nobody = 65534
	base, err := os.MkdirTemp("", "netx-stale-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "netx.test")
	copyFile(t, self, bin)
	run := filepath.Join(base, "run") // /run/hapilot: the service user's
	for _, err := range []error{os.Chmod(base, 0o755), os.Mkdir(run, 0o750), os.Chown(run, nobody, nobody)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	child := func(path string) string {
		cmd := exec.Command(bin, "-test.run=^TestHelperListenAsChild$")
		cmd.Env = append(os.Environ(), childEnv+"="+path)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if err != nil && !strings.Contains(string(out), "ERROR") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return string(out)
	}
	// rootSocket listens at path as root, mode 0660 root:root, as a root
	// agent's control socket is.
	rootSocket := func(path string) *net.UnixListener {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, SocketMode); err != nil {
			t.Fatal(err)
		}
		return ln.(*net.UnixListener)
	}

	t.Run("stale", func(t *testing.T) {
		path := filepath.Join(run, "stale.sock")
		ln := rootSocket(path)
		ln.SetUnlinkOnClose(false) // killed with -9: the file stays
		ln.Close()
		if out := child(path); !strings.Contains(out, "LISTENING") {
			t.Fatalf("the service could not take the stale socket's place:\n%s", out)
		}
	})
	t.Run("live", func(t *testing.T) {
		path := filepath.Join(run, "live.sock")
		ln := rootSocket(path)
		defer ln.Close()
		out := child(path)
		if !strings.Contains(out, "listen unix "+path+": another user's process listens on it") || !strings.Contains(out, "another path") {
			t.Fatalf("child:\n%s", out)
		}
		// The root process's socket is untouched, and still answers.
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the live socket was disturbed: %v", err)
		}
		c.Close()
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
