package iptables

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestNewChecksThatNATCanBeListed(t *testing.T) {
	h := newFakeHost(t)
	client, err := New(t.Context(), ProtocolIPv6, UseInstalledMode)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if client.Protocol() != ProtocolIPv6 || !client.IsIPv6() {
		t.Errorf("Protocol() = %q, IsIPv6() = %v; want IPv6", client.Protocol(), client.IsIPv6())
	}
	if got, want := h.log(), []string{"ip6tables -w 5 -t nat -S POSTROUTING 1"}; !slices.Equal(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}

	h.setFile("broken", []byte{})
	if client, err := New(t.Context(), ProtocolIPv4, UseInstalledMode); err == nil || client != nil {
		t.Errorf("New on a host whose iptables fails = %v, %v; want an error", client, err)
	} else if !strings.Contains(err.Error(), "can't initialize iptables table") {
		t.Errorf("New's error %q does not say why", err)
	}
	if clients := NewBestEffort(t.Context(), UseInstalledMode); len(clients) != 0 {
		t.Errorf("NewBestEffort on a host whose iptables fails = %v, want none", clients)
	}
}

func TestNewBestEffortReturnsTheFamiliesThatWork(t *testing.T) {
	newFakeHost(t, "iptables", "iptables-save", "iptables-restore")
	clients := NewBestEffort(t.Context(), UseInstalledMode)
	if len(clients) != 1 || clients[ProtocolIPv4] == nil || clients[ProtocolIPv4].IsIPv6() {
		t.Errorf("NewBestEffort without ip6tables = %v, want an IPv4 client only", clients)
	}
	if _, err := New(t.Context(), ProtocolIPv6, UseInstalledMode); err == nil {
		t.Error("New(IPv6) without ip6tables succeeded")
	}
}

func TestNewRejectsUnknownFamiliesAndModes(t *testing.T) {
	newFakeHost(t)
	if _, err := New(t.Context(), "IPv5", UseInstalledMode); err == nil {
		t.Error("New(IPv5) succeeded")
	}
	if _, err := New(t.Context(), ProtocolIPv4, "sideways"); err == nil {
		t.Error(`New(mode "sideways") succeeded`)
	}
	if clients := NewBestEffort(t.Context(), "sideways"); len(clients) != 0 {
		t.Errorf(`NewBestEffort(mode "sideways") = %v, want none`, clients)
	}
}

func TestChains(t *testing.T) {
	h := newFakeHost(t)
	ctx := t.Context()
	client, err := New(ctx, ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.log()

	for i, want := range []bool{false, true} {
		existed, err := client.EnsureChain(ctx, TableFilter, "KUBE-FORWARD")
		if err != nil || existed != want {
			t.Fatalf("EnsureChain #%d = %v, %v; want %v, nil", i, existed, err, want)
		}
	}
	if exists, err := client.ChainExists(ctx, TableFilter, "KUBE-FORWARD"); !exists || err != nil {
		t.Errorf("ChainExists(KUBE-FORWARD) = %v, %v; want true, nil", exists, err)
	}
	exists, err := client.ChainExists(ctx, TableFilter, "KUBE-MISSING")
	if exists || err == nil || !IsNotFoundError(err) {
		t.Errorf("ChainExists(KUBE-MISSING) = %v, %v; want false and a not-found error", exists, err)
	}
	if _, err := client.EnsureRule(ctx, Append, TableFilter, "KUBE-FORWARD", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	if err := client.DeleteChain(ctx, TableFilter, "KUBE-FORWARD"); err == nil || IsNotFoundError(err) {
		t.Errorf("DeleteChain of a chain with rules = %v, want an error other than not found", err)
	}
	if err := client.FlushChain(ctx, TableFilter, "KUBE-FORWARD"); err != nil {
		t.Errorf("FlushChain: %v", err)
	}
	if err := client.DeleteChain(ctx, TableFilter, "KUBE-FORWARD"); err != nil {
		t.Errorf("DeleteChain: %v", err)
	}
	for _, err := range []error{
		client.FlushChain(ctx, TableFilter, "KUBE-FORWARD"),
		client.DeleteChain(ctx, TableFilter, "KUBE-FORWARD"),
	} {
		if !IsNotFoundError(err) {
			t.Errorf("flushing or deleting a missing chain = %v, want a not-found error", err)
		}
	}
	want := []string{
		"iptables -w 5 -t filter -N KUBE-FORWARD",
		"iptables -w 5 -t filter -N KUBE-FORWARD",
		"iptables -w 5 -t filter -S KUBE-FORWARD 1",
		"iptables -w 5 -t filter -S KUBE-FORWARD 1",
		"iptables -w 5 -t filter -S KUBE-MISSING 1",
		"iptables -w 5 -t filter -C KUBE-FORWARD -j ACCEPT",
		"iptables -w 5 -t filter -A KUBE-FORWARD -j ACCEPT",
		"iptables -w 5 -t filter -X KUBE-FORWARD",
		"iptables -w 5 -t filter -F KUBE-FORWARD",
		"iptables -w 5 -t filter -X KUBE-FORWARD",
		"iptables -w 5 -t filter -F KUBE-FORWARD",
		"iptables -w 5 -t filter -X KUBE-FORWARD",
	}
	if got := h.log(); !slices.Equal(got, want) {
		t.Errorf("ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRules(t *testing.T) {
	h := newFakeHost(t)
	ctx := t.Context()
	client, err := New(ctx, ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.addChain(TableNAT, ChainPrerouting)
	comment := []string{"-m", "comment", "--comment", "kubernetes service portals"}
	services := append(slices.Clone(comment), "-j", "KUBE-SERVICES")
	for i, want := range []bool{false, true} {
		existed, err := client.EnsureRule(ctx, Append, TableNAT, ChainPrerouting, services...)
		if err != nil || existed != want {
			t.Fatalf("EnsureRule #%d = %v, %v; want %v, nil", i, existed, err, want)
		}
	}
	if _, err := client.EnsureRule(ctx, Prepend, TableNAT, ChainPrerouting, "-j", "KUBE-FIRST"); err != nil {
		t.Fatal(err)
	}
	want := []string{"-j KUBE-FIRST", "-m comment --comment kubernetes service portals -j KUBE-SERVICES"}
	if got := h.rules(TableNAT, ChainPrerouting); !slices.Equal(got, want) {
		t.Errorf("PREROUTING has %q, want %q (Prepend first)", got, want)
	}
	if _, err := client.EnsureRule(ctx, "-Z", TableNAT, ChainPrerouting, "-j", "ACCEPT"); err == nil {
		t.Error("EnsureRule at position -Z succeeded")
	}
	if _, err := client.EnsureRule(ctx, Append, TableNAT, "KUBE-MISSING", "-j", "ACCEPT"); !IsNotFoundError(err) {
		t.Errorf("EnsureRule into a missing chain = %v, want a not-found error", err)
	}

	h.log()
	if err := client.DeleteRule(ctx, TableNAT, ChainPrerouting, services...); err != nil {
		t.Errorf("DeleteRule: %v", err)
	}
	if err := client.DeleteRule(ctx, TableNAT, ChainPrerouting, services...); err != nil {
		t.Errorf("DeleteRule of a missing rule = %v, want nil", err)
	}
	if err := client.DeleteRule(ctx, TableNAT, "KUBE-MISSING", "-j", "ACCEPT"); err != nil {
		t.Errorf("DeleteRule in a missing chain = %v, want nil (like iptables -C, which exits 1)", err)
	}
	if got, want := h.rules(TableNAT, ChainPrerouting), []string{"-j KUBE-FIRST"}; !slices.Equal(got, want) {
		t.Errorf("PREROUTING has %q, want %q", got, want)
	}
	wantLog := []string{
		"iptables -w 5 -t nat -C PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"iptables -w 5 -t nat -D PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"iptables -w 5 -t nat -C PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
		"iptables -w 5 -t nat -C KUBE-MISSING -j ACCEPT",
	}
	if got := h.log(); !slices.Equal(got, wantLog) {
		t.Errorf("ran\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantLog, "\n"))
	}

	h.setFile("busy", []byte{})
	if err := client.DeleteRule(ctx, TableNAT, ChainPrerouting, "-j", "KUBE-FIRST"); err == nil || !isResourceError(err) {
		t.Errorf("DeleteRule while the lock is held = %v, want a resource error", err)
	}
}

func TestSaveInto(t *testing.T) {
	h := newFakeHost(t)
	ctx := t.Context()
	client, err := New(ctx, ProtocolIPv6, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.log()
	dump := "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n"
	h.setFile("save-output", []byte(dump))
	buffer := bytes.NewBufferString("kept\n")
	if err := client.SaveInto(ctx, TableNAT, buffer); err != nil {
		t.Fatalf("SaveInto: %v", err)
	}
	if buffer.String() != "kept\n"+dump {
		t.Errorf("SaveInto appended %q, want %q", strings.TrimPrefix(buffer.String(), "kept\n"), dump)
	}
	if err := client.SaveInto(ctx, "", buffer); err != nil {
		t.Fatalf("SaveInto of every table: %v", err)
	}
	if got, want := h.log(), []string{"ip6tables-save -t nat", "ip6tables-save"}; !slices.Equal(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}

	h.setFile("broken", []byte{})
	err = client.SaveInto(ctx, TableNAT, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "can't initialize iptables table") {
		t.Errorf("SaveInto on a broken host = %v, want an error with iptables-save's message", err)
	}
}

func TestRestore(t *testing.T) {
	h := newFakeHost(t)
	ctx := t.Context()
	client, err := New(ctx, ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.log()
	data := []byte("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-X\nCOMMIT\n")
	if err := client.Restore(ctx, data); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got, want := h.log(), []string{"iptables-restore -w 5 --noflush --counters"}; !slices.Equal(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}
	if got := h.read("restore-input"); got != string(data) {
		t.Errorf("iptables-restore read %q, want %q", got, data)
	}

	h.setFile("restore-error", []byte("iptables-restore v1.8.9 (nf_tables): Chain 'KUBE-SVC-X' does not exist\nError occurred at line: 3\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n"))
	err = client.Restore(ctx, data)
	parseErr, ok := err.(ParseError)
	if !ok {
		t.Fatalf("Restore's error %v (%T) is not a ParseError", err, err)
	}
	if parseErr.Line() != 3 || !strings.Contains(parseErr.Error(), "KUBE-SVC-X' does not exist") {
		t.Errorf("ParseError line %d, %q; want line 3 and iptables-restore's message", parseErr.Line(), parseErr)
	}
	if lines := ExtractLines(data, parseErr.Line(), 1); len(lines) != 3 || lines[1].Data != "-A KUBE-SERVICES -j KUBE-SVC-X" {
		t.Errorf("ExtractLines around the failed line = %+v", lines)
	}

	h.setFile("restore-error", []byte("iptables-restore: unable to initialize table 'nat'\n"))
	err = client.Restore(ctx, data)
	var parseErrAgain ParseError
	if err == nil || errors.As(err, &parseErrAgain) || !strings.Contains(err.Error(), "unable to initialize table") {
		t.Errorf("Restore failing without a line = %v, want a plain error with iptables-restore's message", err)
	}
}
