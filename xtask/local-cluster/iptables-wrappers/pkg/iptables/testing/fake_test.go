package testing

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// save returns what f.SaveInto(table) writes, failing t on an error.
func save(t *testing.T, f *FakeIPTables, table iptables.Table) string {
	t.Helper()
	var buffer bytes.Buffer
	if err := f.SaveInto(t.Context(), table, &buffer); err != nil {
		t.Fatalf("SaveInto(%q): %v", table, err)
	}
	return buffer.String()
}

// rawRules returns the Raw of the rules of chain in table.
func rawRules(t *testing.T, f *FakeIPTables, table iptables.Table, chain iptables.Chain) []string {
	t.Helper()
	c, err := f.Dump.GetChain(table, chain)
	if err != nil {
		t.Fatal(err)
	}
	var raws []string
	for _, rule := range c.Rules {
		raws = append(raws, rule.Raw)
	}
	return raws
}

func TestNewFake(t *testing.T) {
	f := NewFake()
	if f.IsIPv6() || f.Protocol() != iptables.ProtocolIPv4 {
		t.Errorf("NewFake is %s", f.Protocol())
	}
	if f6 := NewIPv6Fake(); !f6.IsIPv6() || f6.Protocol() != iptables.ProtocolIPv6 {
		t.Errorf("NewIPv6Fake is %s", f6.Protocol())
	}
	want := dedent(`
		*nat
		:PREROUTING - [0:0]
		:INPUT - [0:0]
		:OUTPUT - [0:0]
		:POSTROUTING - [0:0]
		COMMIT
		*filter
		:INPUT - [0:0]
		:FORWARD - [0:0]
		:OUTPUT - [0:0]
		COMMIT
		*mangle
		COMMIT
		`)
	if got := save(t, f, ""); got != want {
		t.Errorf("SaveInto(\"\") =\n%s\nwant\n%s", got, want)
	}
	if got := save(t, f, "raw"); got != "*raw\nCOMMIT\n" {
		t.Errorf("SaveInto(raw) = %q", got)
	}
	if err := f.SaveInto(t.Context(), "bogus", &bytes.Buffer{}); err == nil {
		t.Error("SaveInto(bogus) succeeded")
	}
}

func TestFakeChains(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	for i, want := range []bool{false, true} {
		if existed, err := f.EnsureChain(ctx, iptables.TableNAT, "KUBE-SERVICES"); existed != want || err != nil {
			t.Fatalf("EnsureChain #%d = %v, %v; want %v, nil", i, existed, err, want)
		}
	}
	if existed, err := f.EnsureChain(ctx, iptables.TableMangle, iptables.ChainPrerouting); !existed || err != nil {
		t.Errorf("EnsureChain of a built-in chain = %v, %v; want true, nil", existed, err)
	}
	if exists, err := f.ChainExists(ctx, iptables.TableNAT, "KUBE-SERVICES"); !exists || err != nil {
		t.Errorf("ChainExists = %v, %v", exists, err)
	}
	if exists, err := f.ChainExists(ctx, iptables.TableMangle, iptables.ChainOutput); !exists || err != nil {
		t.Errorf("ChainExists of a built-in chain mangle lists not = %v, %v", exists, err)
	}
	exists, err := f.ChainExists(ctx, iptables.TableNAT, "KUBE-MISSING")
	if exists || !iptables.IsNotFoundError(err) {
		t.Errorf("ChainExists of a missing chain = %v, %v; want false and a not-found error", exists, err)
	}
	if _, err := f.EnsureChain(ctx, "bogus", "X"); err == nil {
		t.Error("EnsureChain in table bogus succeeded")
	}

	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainOutput, "-j", "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "KUBE-SERVICES", "-j", "RETURN"); err != nil {
		t.Fatal(err)
	}
	err = f.DeleteChain(ctx, iptables.TableNAT, "KUBE-SERVICES")
	if err == nil || !strings.Contains(err.Error(), "Directory not empty") {
		t.Errorf("DeleteChain of a chain with rules = %v", err)
	}
	if err := f.FlushChain(ctx, iptables.TableNAT, "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	err = f.DeleteChain(ctx, iptables.TableNAT, "KUBE-SERVICES")
	if err == nil || !strings.Contains(err.Error(), "Too many links") {
		t.Errorf("DeleteChain of a chain that OUTPUT jumps to = %v", err)
	}
	if err := f.DeleteRule(ctx, iptables.TableNAT, iptables.ChainOutput, "-j", "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteChain(ctx, iptables.TableNAT, "KUBE-SERVICES"); err != nil {
		t.Errorf("DeleteChain: %v", err)
	}
	for _, err := range []error{
		f.FlushChain(ctx, iptables.TableNAT, "KUBE-SERVICES"),
		f.DeleteChain(ctx, iptables.TableNAT, "KUBE-SERVICES"),
	} {
		if !iptables.IsNotFoundError(err) {
			t.Errorf("flushing or deleting a missing chain = %v, want a not-found error", err)
		}
	}
	if err := f.DeleteChain(ctx, iptables.TableMangle, iptables.ChainInput); err == nil {
		t.Error("DeleteChain of a built-in chain succeeded")
	}
	if err := f.FlushChain(ctx, iptables.TableMangle, iptables.ChainInput); err != nil {
		t.Errorf("FlushChain of a built-in chain: %v", err)
	}
}

func TestFakeRules(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	jump := []string{"-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainPrerouting, jump...); err == nil || !iptables.IsNotFoundError(err) {
		t.Errorf("EnsureRule jumping to a missing chain = %v, want a not-found error", err)
	}
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "KUBE-MISSING", "-j", "ACCEPT"); !iptables.IsNotFoundError(err) {
		t.Errorf("EnsureRule into a missing chain = %v, want a not-found error", err)
	}
	if _, err := f.EnsureChain(ctx, iptables.TableNAT, "KUBE-SERVICES"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true} {
		if existed, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainPrerouting, jump...); existed != want || err != nil {
			t.Fatalf("EnsureRule #%d = %v, %v; want %v, nil", i, existed, err, want)
		}
	}
	if _, err := f.EnsureRule(ctx, iptables.Prepend, iptables.TableNAT, iptables.ChainPrerouting, "-s", "1.2.3.4", "-j", "DROP"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-A PREROUTING -s 1.2.3.4 -j DROP",
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
	}
	if got := rawRules(t, f, iptables.TableNAT, iptables.ChainPrerouting); !slices.Equal(got, want) {
		t.Errorf("PREROUTING = %q, want %q", got, want)
	}
	rule := f.Dump.Tables[0].Chains[0].Rules[1]
	if rule.Comment == nil || rule.Comment.Value != "kubernetes service portals" || rule.Jump.Value != "KUBE-SERVICES" {
		t.Errorf("the added rule is parsed as %+v", rule)
	}

	// A rule restored with its comment unquoted (as hand-written test data has it) is the same.
	if err := f.Restore(ctx, []byte("*filter\n:KUBE-FORWARD - [0:0]\n-A FORWARD -m comment --comment kubernetes forwarding rules -j KUBE-FORWARD\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	forward := []string{"-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"}
	if existed, err := f.EnsureRule(ctx, iptables.Append, iptables.TableFilter, iptables.ChainForward, forward...); !existed || err != nil {
		t.Errorf("EnsureRule of a restored rule = %v, %v; want true, nil", existed, err)
	}
	if err := f.DeleteRule(ctx, iptables.TableFilter, iptables.ChainForward, forward...); err != nil {
		t.Fatal(err)
	}
	if got := rawRules(t, f, iptables.TableFilter, iptables.ChainForward); len(got) != 0 {
		t.Errorf("FORWARD still has %q", got)
	}
	if err := f.DeleteRule(ctx, iptables.TableFilter, iptables.ChainForward, forward...); err != nil {
		t.Errorf("DeleteRule of a missing rule = %v, want nil", err)
	}
	if err := f.DeleteRule(ctx, iptables.TableFilter, "KUBE-MISSING", forward...); err != nil {
		t.Errorf("DeleteRule in a missing chain = %v, want nil", err)
	}
	if _, err := f.EnsureRule(ctx, "-Z", iptables.TableFilter, iptables.ChainForward, "-j", "ACCEPT"); err == nil {
		t.Error("EnsureRule at position -Z succeeded")
	}
}

func TestFakeHonorsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	f := NewFake()
	if _, err := f.EnsureChain(ctx, iptables.TableNAT, "KUBE-X"); err == nil {
		t.Error("EnsureChain with a cancelled context succeeded")
	}
	if err := f.Restore(ctx, []byte("*nat\n:KUBE-X - [0:0]\nCOMMIT\n")); err == nil {
		t.Error("Restore with a cancelled context succeeded")
	}
	if _, err := f.Dump.GetChain(iptables.TableNAT, "KUBE-X"); err == nil {
		t.Error("a cancelled call changed the state")
	}
}

func TestFakeMonitor(t *testing.T) {
	f := NewFake()
	const canary iptables.Chain = "KUBE-PROXY-CANARY"
	tables := []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter}
	exists := func(table iptables.Table) bool {
		ok, _ := f.ChainExists(context.Background(), table, canary)
		return ok
	}
	waitFor := func(what string, condition func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !condition(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	reloads := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Monitor(ctx, canary, tables, func() { reloads <- struct{}{} }, time.Millisecond)
	}()
	defer func() { cancel(); <-done }()
	waitFor("the canaries exist", func() bool {
		return exists(iptables.TableMangle) && exists(iptables.TableNAT) && exists(iptables.TableFilter)
	})

	for _, table := range tables {
		if err := f.DeleteChain(t.Context(), table, canary); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-reloads:
	case <-time.After(10 * time.Second):
		t.Fatal("Monitor did not reload after the canaries went")
	}
	waitFor("the canaries exist again", func() bool {
		return exists(iptables.TableMangle) && exists(iptables.TableNAT) && exists(iptables.TableFilter)
	})

	cancel()
	<-done
	for _, table := range tables {
		if exists(table) {
			t.Errorf("Monitor left its canary in %s", table)
		}
	}
}
