// Package testing has FakeIPTables, an in-memory implementation of iptables.Interface for unit
// tests, and the parser of iptables-save data it is built on (ParseIPTablesDump, ParseRule),
// which tests also use to inspect the data a program restores.
package testing

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// FakeIPTables implements iptables.Interface in memory, with the rules of iptables for what the
// methods accept: chains must exist before rules are added to them, a rule may jump only to an
// existing chain or a target extension, a chain may be deleted only when it is empty and no rule
// jumps to it, and Restore commits table by table (on an error, the tables before the failing one
// stay restored, and that one is as it was). Its errors carry iptables' messages, so
// iptables.IsNotFoundError works on them; Restore's are iptables.ParseError.
//
// It does not model policies of built-in chains it was not told, nor packets: SaveInto prints "-"
// for a chain without a policy, and counters are the ones last restored.
type FakeIPTables struct {
	// Dump is the state: the tables, their chains and rules, in iptables-save order. NewFake
	// starts with the built-in chains of nat and filter, and an empty mangle table; other built-in
	// chains are added when first used. Read it only while no method runs.
	Dump *IPTablesDump

	protocol iptables.Protocol
	mu       sync.Mutex
}

var _ iptables.Interface = &FakeIPTables{}

// NewFake returns an IPv4 FakeIPTables with the tables nat, filter and mangle.
func NewFake() *FakeIPTables {
	return newFake(iptables.ProtocolIPv4)
}

// NewIPv6Fake returns an IPv6 FakeIPTables (IsIPv6 is true) with the tables of NewFake.
func NewIPv6Fake() *FakeIPTables {
	return newFake(iptables.ProtocolIPv6)
}

func newFake(protocol iptables.Protocol) *FakeIPTables {
	dump := &IPTablesDump{}
	for _, name := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		table := Table{Name: name}
		for _, chain := range builtinChains[name] {
			table.Chains = append(table.Chains, Chain{Name: chain})
		}
		dump.Tables = append(dump.Tables, table)
	}
	dump.Tables = append(dump.Tables, Table{Name: iptables.TableMangle, Chains: []Chain{}})
	return &FakeIPTables{protocol: protocol, Dump: dump}
}

// Protocol implements iptables.Interface.
func (f *FakeIPTables) Protocol() iptables.Protocol { return f.protocol }

// IsIPv6 implements iptables.Interface.
func (f *FakeIPTables) IsIPv6() bool { return f.protocol == iptables.ProtocolIPv6 }

// EnsureChain implements iptables.Interface.
func (f *FakeIPTables) EnsureChain(ctx context.Context, table iptables.Table, chain iptables.Chain) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	t, err := lookupTable(f.Dump, table, true)
	if err != nil {
		return false, err
	}
	if chainExists(t, table, chain) {
		return true, nil
	}
	t.Chains = append(t.Chains, Chain{Name: chain})
	return false, nil
}

// FlushChain implements iptables.Interface.
func (f *FakeIPTables) FlushChain(ctx context.Context, table iptables.Table, chain iptables.Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := lookupTable(f.Dump, table, false)
	if err != nil {
		return err
	}
	if !chainExists(t, table, chain) {
		return errNoChain(table, chain)
	}
	if c := lookupChain(t, chain, false); c != nil {
		c.Rules = nil
	}
	return nil
}

// DeleteChain implements iptables.Interface.
func (f *FakeIPTables) DeleteChain(ctx context.Context, table iptables.Table, chain iptables.Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := lookupTable(f.Dump, table, false)
	if err != nil {
		return err
	}
	if t == nil {
		if isBuiltinChain(table, chain) {
			return checkDeletable(&Table{Name: table}, chain)
		}
		return errNoChain(table, chain)
	}
	if err := checkDeletable(t, chain); err != nil {
		return err
	}
	removeChain(t, chain)
	return nil
}

// ChainExists implements iptables.Interface.
func (f *FakeIPTables) ChainExists(ctx context.Context, table iptables.Table, chain iptables.Chain) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	t, err := lookupTable(f.Dump, table, false)
	if err != nil {
		return false, err
	}
	if !chainExists(t, table, chain) {
		return false, errNoChain(table, chain)
	}
	return true, nil
}

// EnsureRule implements iptables.Interface. A rule it adds has the Raw "-A CHAIN ARGS...", args
// with blanks quoted as iptables-save quotes them; a rule is the same as args when their words
// are, however quoted.
func (f *FakeIPTables) EnsureRule(ctx context.Context, position iptables.RulePosition, table iptables.Table, chain iptables.Chain, args ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if position != iptables.Prepend && position != iptables.Append {
		return false, fmt.Errorf("unknown rule position %q", position)
	}
	t, err := lookupTable(f.Dump, table, true)
	if err != nil {
		return false, err
	}
	c := lookupChain(t, chain, true)
	if c == nil {
		return false, errNoChain(table, chain)
	}
	if findRule(c, args) >= 0 {
		return true, nil
	}
	rule, err := ParseRule("-A "+quoteWords(append([]string{string(chain)}, args...)), false)
	if err != nil {
		return false, err
	}
	if target := jumpTarget(rule); target != "" && !targetExtensions[target] && !chainExists(t, table, iptables.Chain(target)) {
		return false, errNoTarget(table, target)
	}
	if position == iptables.Append {
		c.Rules = append(c.Rules, rule)
	} else {
		c.Rules = append([]*Rule{rule}, c.Rules...)
	}
	return false, nil
}

// DeleteRule implements iptables.Interface. Like iptables, it returns nil when the chain does
// not exist either.
func (f *FakeIPTables) DeleteRule(ctx context.Context, table iptables.Table, chain iptables.Chain, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	t, err := lookupTable(f.Dump, table, false)
	if err != nil {
		return err
	}
	c := lookupChain(t, chain, false)
	if c == nil {
		return nil
	}
	if i := findRule(c, args); i >= 0 {
		c.Rules = append(c.Rules[:i:i], c.Rules[i+1:]...)
	}
	return nil
}

// findRule is the index in chain of the first rule made of args; -1 when there is none.
func findRule(chain *Chain, args []string) int {
	key := ruleKey(args)
	for i, rule := range chain.Rules {
		if words := splitWords(rule.Raw); len(words) >= 2 && ruleKey(words[2:]) == key {
			return i
		}
	}
	return -1
}

// SaveInto implements iptables.Interface. Beyond iptables-save, table "" saves every table.
func (f *FakeIPTables) SaveInto(ctx context.Context, table iptables.Table, buffer *bytes.Buffer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	var out strings.Builder
	if table == "" {
		for i := range f.Dump.Tables {
			writeTable(&out, &f.Dump.Tables[i])
		}
	} else {
		t, err := lookupTable(f.Dump, table, false)
		if err != nil {
			return err
		}
		if t == nil {
			t = &Table{Name: table}
		}
		writeTable(&out, t)
	}
	buffer.WriteString(out.String())
	return nil
}

// Restore implements iptables.Interface; see restore for what it accepts.
func (f *FakeIPTables) Restore(ctx context.Context, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	command := "iptables-restore"
	if f.protocol == iptables.ProtocolIPv6 {
		command = "ip6tables-restore"
	}
	state, err := restore(f.Dump, command, string(data))
	f.Dump.Tables = state.Tables
	return err
}

// Monitor implements iptables.Interface: it creates canary in every table, and after every
// interval in which canary went from tables[0] (a test deleting it stands for a firewall reload)
// calls reloadFunc and creates the canaries again; when ctx is done it deletes them and returns.
func (f *FakeIPTables) Monitor(ctx context.Context, canary iptables.Chain, tables []iptables.Table, reloadFunc func(), interval time.Duration) {
	if len(tables) == 0 {
		return
	}
	defer func() {
		cleanup := context.WithoutCancel(ctx)
		for _, table := range tables {
			_ = f.DeleteChain(cleanup, table, canary)
		}
	}()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		for _, table := range tables {
			_, _ = f.EnsureChain(ctx, table, canary)
		}
		for gone := false; !gone; {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			exists, _ := f.ChainExists(ctx, tables[0], canary)
			gone = !exists && ctx.Err() == nil
		}
		reloadFunc()
	}
}
