package safefile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUntrusted marks a file someone other than a trusted user may have
// written: its owner, its mode or its folder lets them.
var ErrUntrusted = errors.New("untrusted file")

// Trust checks that only a trusted user can have written path, whose
// stat is fi: the process's effective user, root, or the owner of the
// file's folder (who can replace the file anyway). The file must be owned
// by one of them, carry none of the mode bits in forbid (0o022: group and
// others may not write it; 0o077: nor read it, for a secret), and sit in
// a folder that others cannot write unless it is sticky (/tmp). what
// names the setting ("state-file"), why says what a stranger's file could
// do. The error says the file, its owner or mode, and the fix.
//
// Root-owned files are trusted: root can drive HAProxy's socket and the
// agent's own files directly, so a file only root could write grants
// nothing root does not have.
func Trust(what, path string, fi fs.FileInfo, forbid fs.FileMode, why string) error {
	if perm := fi.Mode().Perm(); perm&forbid != 0 {
		return fmt.Errorf("%s %s has mode %04o: %s (chmod %o %s): %w", what, path, perm, why, perm&^forbid, path, ErrUntrusted)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil // no owner to check (not a Unix file system)
	}
	dir := filepath.Dir(path)
	var dirOwner uint32 // root, when the folder cannot be read
	if dfi, err := os.Stat(dir); err == nil {
		if dst, ok := dfi.Sys().(*syscall.Stat_t); ok {
			dirOwner = dst.Uid
		}
		if dfi.Mode().Perm()&0o022 != 0 && dfi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("%s %s is in %s, of mode %04o: group or others may replace the file there, and %s (chmod g-w,o-w %s, or move the file): %w",
				what, path, dir, dfi.Mode().Perm(), why, dir, ErrUntrusted)
		}
	}
	euid := uint32(os.Geteuid())
	if st.Uid == euid || st.Uid == 0 || st.Uid == dirOwner {
		return nil
	}
	return fmt.Errorf("%s %s is owned by uid %d, not by this process's user (uid %d), root, or the owner of %s (uid %d): %s (check it, then chown %d %s, or remove it): %w",
		what, path, st.Uid, euid, dir, dirOwner, why, euid, path, ErrUntrusted)
}
