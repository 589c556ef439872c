// Package iptables runs the iptables and ip6tables commands for the kubelet's utility chains
// (KUBE-IPTABLES-HINT, KUBE-FIREWALL): it creates chains and rules if they are missing and
// re-creates them when a canary chain disappears. It has the API the kubelet uses, not the whole
// of sigs.k8s.io/iptables-wrappers (kube-proxy needs more and is not built against it).
package iptables

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table name.
type Table string

// RulePosition is where EnsureRule puts a missing rule: "-I" (first) or "-A" (last).
type RulePosition string

// Protocol is the IP family a client manages.
type Protocol string

// Mode says which iptables binaries a client runs.
type Mode string

// The names the kubelet uses.
const (
	// UseInstalledMode runs the iptables and ip6tables found on PATH.
	UseInstalledMode Mode = "installed"
	// DetectHostMode also runs the binaries found on PATH: they are what the host uses here.
	DetectHostMode Mode = "detect"

	TableMangle Table = "mangle"
	TableNAT    Table = "nat"
	TableFilter Table = "filter"

	ChainInput       Chain = "INPUT"
	ChainOutput      Chain = "OUTPUT"
	ChainForward     Chain = "FORWARD"
	ChainPrerouting  Chain = "PREROUTING"
	ChainPostrouting Chain = "POSTROUTING"

	Prepend RulePosition = "-I"
	Append  RulePosition = "-A"

	ProtocolIPv4 Protocol = "IPv4"
	ProtocolIPv6 Protocol = "IPv6"
)

// Interface manages chains and rules of one IP family.
type Interface interface {
	// Protocol is the IP family.
	Protocol() Protocol
	// IsIPv6 says whether the family is IPv6.
	IsIPv6() bool
	// EnsureChain creates chain in table unless it exists; true when it existed.
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	// EnsureRule adds the rule at position unless it exists; true when it existed.
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	// Monitor creates canary in each table, then every interval checks that they all still
	// exist; when one is gone (a firewall reload flushed the tables), it deletes the rest, calls
	// reloadFunc and creates them again. It returns when ctx is done.
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

type runner struct {
	protocol Protocol
	binary   string
}

// New returns a client for protocol that runs that family's iptables binary.
func New(protocol Protocol, mode Mode) Interface {
	binary := "iptables"
	if protocol == ProtocolIPv6 {
		binary = "ip6tables"
	}
	_ = mode
	return &runner{protocol: protocol, binary: binary}
}

// NewBestEffort returns a client per IP family whose iptables binary runs and can read the
// filter table; none when neither can (no iptables, or nftables only).
func NewBestEffort(ctx context.Context, mode Mode) map[Protocol]Interface {
	clients := map[Protocol]Interface{}
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		client := New(protocol, mode).(*runner)
		if _, err := client.run(ctx, "-t", string(TableFilter), "-S", string(ChainInput), "1"); err == nil {
			clients[protocol] = client
		}
	}
	return clients
}

func (r *runner) Protocol() Protocol { return r.protocol }

func (r *runner) IsIPv6() bool { return r.protocol == ProtocolIPv6 }

func (r *runner) EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error) {
	if r.chainExists(ctx, table, chain) {
		return true, nil
	}
	if _, err := r.run(ctx, "-t", string(table), "-N", string(chain)); err != nil {
		if r.chainExists(ctx, table, chain) {
			return true, nil // created by someone else meanwhile
		}
		return false, err
	}
	return false, nil
}

func (r *runner) EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error) {
	check := append([]string{"-t", string(table), "-C", string(chain)}, args...)
	if _, err := r.run(ctx, check...); err == nil {
		return true, nil
	}
	add := append([]string{"-t", string(table), string(position), string(chain)}, args...)
	if _, err := r.run(ctx, add...); err != nil {
		return false, err
	}
	return false, nil
}

func (r *runner) Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	create := func() bool {
		for _, table := range tables {
			if _, err := r.EnsureChain(ctx, table, canary); err != nil {
				return false
			}
		}
		return true
	}
	remove := func() {
		for _, table := range tables {
			_, _ = r.run(ctx, "-t", string(table), "-X", string(canary))
		}
	}
	if !create() {
		return
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		for _, table := range tables {
			if !r.chainExists(ctx, table, canary) {
				remove()
				reloadFunc()
				create()
				break
			}
		}
	}
}

func (r *runner) chainExists(ctx context.Context, table Table, chain Chain) bool {
	_, err := r.run(ctx, "-t", string(table), "-S", string(chain), "1")
	return err == nil
}

// run runs the binary with -w (wait for the xtables lock) and args.
func (r *runner) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, r.binary, append([]string{"-w", "5"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return "", fmt.Errorf("%s %s: %v: %s", r.binary, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return "", fmt.Errorf("%s: %w", r.binary, err)
	}
	return string(out), nil
}
