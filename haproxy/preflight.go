package haproxy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
)

// ErrMisconfigured marks a socket the agent can reach but cannot use as
// it is set up: no permission to connect, or a level below admin. It does
// not mend by waiting, unlike an HAProxy that is not up yet.
var ErrMisconfigured = errors.New("runtime socket misconfigured")

// Level reads the CLI level of a session on the socket: admin, operator
// or user (`show cli level`).
func (c *Client) Level(ctx context.Context) (string, error) {
	const cmd = "show cli level"
	reply, err := c.Run(ctx, cmd)
	if err != nil {
		return "", err
	}
	// HAProxy prints the level as an informational message: "[6]: admin"
	// under `set severity-output number`.
	var ce *CommandError
	if errors.As(failure(cmd, reply), &ce) {
		if ce.Severity < 5 {
			return "", ce
		}
		return ce.Reply, nil
	}
	return strings.TrimSpace(reply), nil
}

// Preflight tells whether the agent can steer HAProxy through this
// socket, and what to do when it cannot. A socket that does not answer yet
// (HAProxy starting, or down) is returned as is, wrapping ErrConnection:
// the loop retries it every step. Permission denied and a level below
// admin wrap ErrMisconfigured, with the fix in the message.
func (c *Client) Preflight(ctx context.Context) error {
	level, err := c.Level(ctx)
	switch {
	case err == nil && level == "admin":
		return nil
	case err == nil:
		return fmt.Errorf("%w: HAProxy's socket %s answers at level %q, and the agent must set server states and weights: "+
			"put `level admin` on its line in haproxy.cfg (stats socket %s mode 660 level admin)", ErrMisconfigured, c.Addr(), level, c.address)
	case errors.Is(err, syscall.EACCES) || errors.Is(err, os.ErrPermission):
		return fmt.Errorf("%w: permission denied on HAProxy's socket %s%s", ErrMisconfigured, c.Addr(), c.ownerHint())
	}
	return err
}

// ownerHint names the socket's owner and group, and the groups this
// process runs with, so that the fix is plain.
func (c *Client) ownerHint() string {
	if c.network != "unix" {
		return ""
	}
	fi, err := os.Stat(c.address)
	if err != nil {
		return ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	owner, group := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	if g, err := user.LookupGroupId(group); err == nil {
		group = g.Name
	}
	return fmt.Sprintf(" (owner %s, group %s, mode %04o; this agent runs as uid %d with groups %v): run hapilot in group %s "+
		"(the package's unit does: Group=haproxy), or give the stats socket line `group` and `mode 660` for the agent's group",
		owner, group, fi.Mode().Perm(), os.Getuid(), groups(), group)
}

func groups() []string {
	ids, err := os.Getgroups()
	if err != nil {
		return nil
	}
	out := []string{strconv.Itoa(os.Getgid())}
	for _, id := range ids {
		out = append(out, strconv.Itoa(id))
	}
	for i, id := range out {
		if g, err := user.LookupGroupId(id); err == nil {
			out[i] = g.Name
		}
	}
	return out
}
