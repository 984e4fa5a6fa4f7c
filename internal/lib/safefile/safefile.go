// Package safefile opens the agent's own files (its state file, its
// audit log) so that nothing else can stand in for them: a path that is a
// FIFO, a device, a socket, a directory or a symbolic link is refused
// with a clear error, and checking it never blocks.
package safefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// ErrNotRegular marks a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// Open opens path as os.OpenFile does, with O_NONBLOCK and O_NOFOLLOW
// added, then checks with fstat that what it opened is a regular file.
// O_NONBLOCK is what keeps the check from blocking: opening a FIFO for
// reading waits for a writer otherwise, and for writing waits for a
// reader; on a regular file it changes nothing. O_NOFOLLOW refuses a
// link planted at the path. A path that does not exist is reported as
// such (fs.ErrNotExist), for the caller to create or skip.
func Open(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist):
		return nil, err
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("%s: a symbolic link is refused (%w)", path, ErrNotRegular)
	case errors.Is(err, syscall.ENXIO):
		// A FIFO opened for writing with no reader, or a socket.
		return nil, fmt.Errorf("%s is a FIFO or a socket: %w", path, ErrNotRegular)
	case errors.Is(err, syscall.EISDIR):
		return nil, fmt.Errorf("%s is a directory: %w", path, ErrNotRegular)
	default:
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is a %s: %w", path, kind(fi.Mode()), ErrNotRegular)
	}
	return f, nil
}

// Check reports whether path is a regular file or absent, without
// opening anything that could block: what the agent asks of its files
// at start.
func Check(path string) error {
	f, err := Open(path, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return nil // absent: it will be created; unreadable: the caller says what it does
	}
	if err != nil {
		return err
	}
	return f.Close()
}

func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file"
}
