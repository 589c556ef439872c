package iptables

import (
	"bytes"
	"context"
	"os/exec"

	"k8s.io/utils/set"
)

// SaveInto implements Interface: iptables-save -t TABLE (no -t when table is ""), stdout
// appended to buffer. On failure the error holds what the command wrote to stderr, and buffer
// may hold part of a dump.
func (r *runner) SaveInto(ctx context.Context, table Table, buffer *bytes.Buffer) error {
	var args []string
	if table != "" {
		args = []string{"-t", string(table)}
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, r.commands.save, args...)
	cmd.Stdout = buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return newCommandError(r.commands.save, args, stderr.Bytes(), err)
	}
	return nil
}

// Restore implements Interface: iptables-restore -w 5 --noflush --counters, data on stdin.
func (r *runner) Restore(ctx context.Context, data []byte) error {
	args := []string{"-w", lockWaitSeconds, "--noflush", "--counters"}
	cmd := exec.CommandContext(ctx, r.commands.restore, args...)
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if parseErr, ok := parseRestoreError(r.commands.restore, out); ok && ctx.Err() == nil {
		return parseErr
	}
	return newCommandError(r.commands.restore, args, out, err)
}

// MakeChainLine is the line of iptables-save data that declares chain (with zero counters); fed
// to iptables-restore --noflush, it creates the chain or flushes it.
func MakeChainLine(chain Chain) string {
	return ":" + string(chain) + " - [0:0]"
}

// GetChainsFromTable returns the chains that save, the iptables-save data of one table, declares.
func GetChainsFromTable(save []byte) set.Set[Chain] {
	chains := set.New[Chain]()
	for len(save) > 0 {
		line := save
		if end := bytes.IndexByte(save, '\n'); end >= 0 {
			line, save = save[:end], save[end+1:]
		} else {
			save = nil
		}
		if len(line) < 2 || line[0] != ':' {
			continue
		}
		name := line[1:]
		if end := bytes.IndexAny(name, " \t\r"); end >= 0 {
			name = name[:end]
		}
		if len(name) > 0 {
			chains.Insert(Chain(name))
		}
	}
	return chains
}
