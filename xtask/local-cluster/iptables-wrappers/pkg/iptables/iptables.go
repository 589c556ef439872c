// Package iptables runs the iptables, iptables-save and iptables-restore commands (or their ip6tables
// counterparts) for Kubernetes components: the kubelet's utility chains (KUBE-IPTABLES-HINT,
// KUBE-FIREWALL), kube-proxy's iptables and ipvs proxiers (bulk iptables-save/iptables-restore of
// its chains, cleanup of leftovers) and the canary chains both use to notice a firewall reload.
//
// It has the API that Kubernetes v1.38 uses from sigs.k8s.io/iptables-wrappers/pkg/iptables; the
// package sigs.k8s.io/iptables-wrappers/pkg/iptables/testing has an in-memory fake of Interface.
package iptables

import (
	"bytes"
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

// RulePosition is where EnsureRule puts a missing rule: the iptables flag that adds it.
type RulePosition string

// Protocol is the IP family a client manages; its values are those of Kubernetes' IPFamily
// ("IPv4", "IPv6"), so callers convert one to the other.
type Protocol string

// The built-in tables, chains, rule positions and IP families callers name.
const (
	// TableMangle is the built-in mangle table.
	TableMangle Table = "mangle"
	// TableNAT is the built-in nat table.
	TableNAT Table = "nat"
	// TableFilter is the built-in filter table.
	TableFilter Table = "filter"

	// ChainInput is the built-in chain for packets addressed to this host.
	ChainInput Chain = "INPUT"
	// ChainOutput is the built-in chain for packets this host sends.
	ChainOutput Chain = "OUTPUT"
	// ChainForward is the built-in chain for packets this host routes.
	ChainForward Chain = "FORWARD"
	// ChainPrerouting is the built-in chain packets enter before routing (DNAT happens here).
	ChainPrerouting Chain = "PREROUTING"
	// ChainPostrouting is the built-in chain packets leave through after routing (SNAT happens here).
	ChainPostrouting Chain = "POSTROUTING"

	// Prepend inserts a rule at the start of its chain (iptables -I).
	Prepend RulePosition = "-I"
	// Append adds a rule at the end of its chain (iptables -A).
	Append RulePosition = "-A"

	// ProtocolIPv4 manages IPv4 rules with iptables.
	ProtocolIPv4 Protocol = "IPv4"
	// ProtocolIPv6 manages IPv6 rules with ip6tables.
	ProtocolIPv6 Protocol = "IPv6"
)

// Interface manages the chains and rules of one IP family. Implementations are safe for
// concurrent use.
type Interface interface {
	// Protocol is the IP family.
	Protocol() Protocol
	// IsIPv6 says whether the family is IPv6.
	IsIPv6() bool
	// EnsureChain creates chain in table unless it exists; true when it existed.
	EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error)
	// FlushChain removes every rule of chain; an error (see IsNotFoundError) when chain does not
	// exist.
	FlushChain(ctx context.Context, table Table, chain Chain) error
	// DeleteChain deletes chain, which must be empty and unreferenced; an error (see
	// IsNotFoundError) when it does not exist.
	DeleteChain(ctx context.Context, table Table, chain Chain) error
	// ChainExists returns true when chain exists, and an error when it does not or when that
	// could not be checked.
	ChainExists(ctx context.Context, table Table, chain Chain) (bool, error)
	// EnsureRule adds the rule made of args to chain at position unless the chain has it; true
	// when it had.
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error)
	// DeleteRule deletes the rule made of args from chain if the chain has it; nil when it has not.
	DeleteRule(ctx context.Context, table Table, chain Chain, args ...string) error
	// SaveInto appends the iptables-save output of table to buffer; every table when table is "".
	SaveInto(ctx context.Context, table Table, buffer *bytes.Buffer) error
	// Restore feeds data, in iptables-save format and possibly of several tables, to
	// iptables-restore without flushing the tables first (only the chains data declares are
	// flushed) and with the counters data gives. When iptables-restore reports the line it
	// failed on, the error is a ParseError.
	Restore(ctx context.Context, data []byte) error
	// Monitor notices flushes of tables by other programs (a firewall reload): it creates the
	// chain canary in each table, then every interval checks that the canary of tables[0] (best
	// a small table) still exists. When it is gone, it waits a little for the others to go too,
	// calls reloadFunc (which should re-create the caller's rules) and creates the canaries
	// again. When a canary cannot be created it retries every interval. It returns, deleting the
	// canaries, when ctx is done; call it in a goroutine of its own.
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)
}

// runner implements Interface by running the commands of one IP family and one iptables
// variant.
type runner struct {
	protocol Protocol
	commands commands
}

// New returns a client for protocol that runs the binaries mode selects, after checking that
// they run and can read the nat table; it returns an error (and no client) when they cannot,
// which is how callers learn whether this host supports iptables for that IP family.
func New(ctx context.Context, protocol Protocol, mode Mode) (Interface, error) {
	if protocol != ProtocolIPv4 && protocol != ProtocolIPv6 {
		return nil, fmt.Errorf("unknown IP family %q (want %q or %q)", protocol, ProtocolIPv4, ProtocolIPv6)
	}
	variant, err := selectVariant(ctx, mode)
	if err != nil {
		return nil, err
	}
	return newChecked(ctx, protocol, variant)
}

// NewBestEffort returns a client per IP family that New would return one for (see New); an
// empty map when this host supports iptables for neither (no binaries, or nftables only).
func NewBestEffort(ctx context.Context, mode Mode) map[Protocol]Interface {
	clients := map[Protocol]Interface{}
	variant, err := selectVariant(ctx, mode)
	if err != nil {
		return clients
	}
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		if client, err := newChecked(ctx, protocol, variant); err == nil {
			clients[protocol] = client
		}
	}
	return clients
}

// newChecked returns a runner for protocol and variant once it could list nat's POSTROUTING.
func newChecked(ctx context.Context, protocol Protocol, variant string) (Interface, error) {
	r := &runner{protocol: protocol, commands: commandsFor(protocol, variant)}
	if _, err := r.ChainExists(ctx, TableNAT, ChainPostrouting); err != nil {
		return nil, fmt.Errorf("%s is not usable on this host: %w", r.commands.iptables, err)
	}
	return r, nil
}

// Protocol implements Interface.
func (r *runner) Protocol() Protocol { return r.protocol }

// IsIPv6 implements Interface.
func (r *runner) IsIPv6() bool { return r.protocol == ProtocolIPv6 }

// EnsureChain implements Interface: iptables -N, which fails with exit status 1 when the chain
// exists.
func (r *runner) EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error) {
	_, err := r.run(ctx, "-t", string(table), "-N", string(chain))
	if err == nil {
		return false, nil
	}
	if exitStatus(err) == 1 {
		if exists, _ := r.ChainExists(ctx, table, chain); exists {
			return true, nil
		}
	}
	return false, err
}

// FlushChain implements Interface.
func (r *runner) FlushChain(ctx context.Context, table Table, chain Chain) error {
	_, err := r.run(ctx, "-t", string(table), "-F", string(chain))
	return err
}

// DeleteChain implements Interface.
func (r *runner) DeleteChain(ctx context.Context, table Table, chain Chain) error {
	_, err := r.run(ctx, "-t", string(table), "-X", string(chain))
	return err
}

// ChainExists implements Interface: lists the first rule of the chain (-S CHAIN 1), which fails
// when the chain does not exist.
func (r *runner) ChainExists(ctx context.Context, table Table, chain Chain) (bool, error) {
	if _, err := r.run(ctx, "-t", string(table), "-S", string(chain), "1"); err != nil {
		return false, err
	}
	return true, nil
}

// EnsureRule implements Interface: iptables -C, then -I or -A when the rule is missing.
func (r *runner) EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error) {
	if position != Prepend && position != Append {
		return false, fmt.Errorf("unknown rule position %q (want %q or %q)", position, Prepend, Append)
	}
	exists, err := r.hasRule(ctx, table, chain, args)
	if err != nil || exists {
		return exists, err
	}
	if _, err := r.run(ctx, ruleArgs(string(position), table, chain, args)...); err != nil {
		return false, err
	}
	return false, nil
}

// DeleteRule implements Interface: iptables -C, then -D when the rule is there.
func (r *runner) DeleteRule(ctx context.Context, table Table, chain Chain, args ...string) error {
	exists, err := r.hasRule(ctx, table, chain, args)
	if err != nil || !exists {
		return err
	}
	_, err = r.run(ctx, ruleArgs("-D", table, chain, args)...)
	return err
}

// hasRule runs iptables -C: exit status 0 when chain has the rule, 1 when it (or the chain) has
// not; anything else (a bad rule, a missing jump target) is an error.
func (r *runner) hasRule(ctx context.Context, table Table, chain Chain, args []string) (bool, error) {
	_, err := r.run(ctx, ruleArgs("-C", table, chain, args)...)
	switch {
	case err == nil:
		return true, nil
	case exitStatus(err) == 1:
		return false, nil
	default:
		return false, err
	}
}

// ruleArgs is "-t TABLE OP CHAIN ARGS...".
func ruleArgs(op string, table Table, chain Chain, args []string) []string {
	return append([]string{"-t", string(table), op, string(chain)}, args...)
}

// run runs the family's iptables with "-w 5" (wait up to 5s for the xtables lock) and args.
func (r *runner) run(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"-w", lockWaitSeconds}, args...)
	out, err := exec.CommandContext(ctx, r.commands.iptables, full...).CombinedOutput()
	if err != nil {
		return out, newCommandError(r.commands.iptables, full, out, err)
	}
	return out, nil
}

// lockWaitSeconds is how long iptables and iptables-restore wait for the xtables lock.
const lockWaitSeconds = "5"

// exitStatus is the exit status of the command err reports, -1 when it did not exit.
func exitStatus(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return -1
}

// quoteArgs joins args like a shell would need them, for error messages.
func quoteArgs(args []string) string {
	quoted := make([]string, len(args))
	for i, arg := range args {
		if arg == "" || strings.ContainsAny(arg, " \t\"'") {
			arg = fmt.Sprintf("%q", arg)
		}
		quoted[i] = arg
	}
	return strings.Join(quoted, " ")
}
