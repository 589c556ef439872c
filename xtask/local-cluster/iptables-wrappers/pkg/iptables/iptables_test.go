package iptables

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The tests of this file run the real iptables binaries and change the rules of the network
// namespace they run in, so they run only when DRA_E2E_IPTABLES_TEST=1, as root in a namespace
// of their own: `unshare -n env DRA_E2E_IPTABLES_TEST=1 go test ./...`.

// realClients returns New's client for each IP family, failing t when one is missing; it skips t
// unless DRA_E2E_IPTABLES_TEST=1.
func realClients(t *testing.T, mode Mode) map[Protocol]Interface {
	t.Helper()
	if os.Getenv("DRA_E2E_IPTABLES_TEST") != "1" {
		t.Skip("set DRA_E2E_IPTABLES_TEST=1 in a network namespace of its own")
	}
	clients := map[Protocol]Interface{}
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		client, err := New(t.Context(), protocol, mode)
		if err != nil {
			t.Fatalf("New(%s): %v", protocol, err)
		}
		clients[protocol] = client
	}
	return clients
}

func TestEnsureChainAndRule(t *testing.T) {
	ctx := t.Context()
	realClients(t, UseInstalledMode)
	clients := NewBestEffort(ctx, UseInstalledMode)
	client, ok := clients[ProtocolIPv4]
	if !ok {
		t.Fatalf("no IPv4 client: %v", clients)
	}
	for i, want := range []bool{false, true} {
		existed, err := client.EnsureChain(ctx, TableFilter, "KUBE-FIREWALL")
		if err != nil || existed != want {
			t.Fatalf("EnsureChain #%d: existed=%v err=%v, want existed=%v", i, existed, err, want)
		}
		existed, err = client.EnsureRule(ctx, Prepend, TableFilter, ChainInput, "-j", "KUBE-FIREWALL")
		if err != nil || existed != want {
			t.Fatalf("EnsureRule #%d: existed=%v err=%v, want existed=%v", i, existed, err, want)
		}
	}
	if _, err := client.EnsureRule(ctx, Append, TableFilter, "NO-SUCH-CHAIN", "-j", "ACCEPT"); err == nil {
		t.Fatal("EnsureRule into a missing chain succeeded")
	}
	if err := client.DeleteRule(ctx, TableFilter, ChainInput, "-j", "KUBE-FIREWALL"); err != nil {
		t.Fatalf("DeleteRule: %v", err)
	}
	if err := client.DeleteChain(ctx, TableFilter, "KUBE-FIREWALL"); err != nil {
		t.Fatalf("DeleteChain: %v", err)
	}
}

func TestRealChainsAndRules(t *testing.T) {
	ctx := t.Context()
	for protocol, client := range realClients(t, UseInstalledMode) {
		t.Run(string(protocol), func(t *testing.T) {
			const chain Chain = "KUBE-TEST-CHAINS"
			args := []string{"-m", "comment", "--comment", "dra-e2e test rule", "-j", string(chain)}
			if _, err := client.EnsureChain(ctx, TableNAT, chain); err != nil {
				t.Fatal(err)
			}
			if exists, err := client.ChainExists(ctx, TableNAT, chain); !exists || err != nil {
				t.Errorf("ChainExists = %v, %v; want true, nil", exists, err)
			}
			if exists, err := client.ChainExists(ctx, TableNAT, "KUBE-TEST-MISSING"); exists || err == nil {
				t.Errorf("ChainExists of a missing chain = %v, %v; want false and an error", exists, err)
			}
			for i, want := range []bool{false, true} {
				if existed, err := client.EnsureRule(ctx, Append, TableNAT, ChainOutput, args...); existed != want || err != nil {
					t.Fatalf("EnsureRule #%d = %v, %v; want %v, nil", i, existed, err, want)
				}
			}
			if _, err := client.EnsureRule(ctx, Append, TableNAT, chain, "-p", "tcp", "-j", "RETURN"); err != nil {
				t.Fatal(err)
			}
			if err := client.DeleteChain(ctx, TableNAT, chain); err == nil {
				t.Error("DeleteChain of a chain in use succeeded")
			}
			if err := client.DeleteRule(ctx, TableNAT, ChainOutput, args...); err != nil {
				t.Errorf("DeleteRule: %v", err)
			}
			if err := client.DeleteRule(ctx, TableNAT, ChainOutput, args...); err != nil {
				t.Errorf("DeleteRule of a rule that is gone = %v, want nil", err)
			}
			if err := client.FlushChain(ctx, TableNAT, chain); err != nil {
				t.Errorf("FlushChain: %v", err)
			}
			if err := client.DeleteChain(ctx, TableNAT, chain); err != nil {
				t.Errorf("DeleteChain: %v", err)
			}
			for _, err := range []error{client.FlushChain(ctx, TableNAT, chain), client.DeleteChain(ctx, TableNAT, chain)} {
				if !IsNotFoundError(err) {
					t.Errorf("flushing or deleting a missing chain = %v, want a not-found error", err)
				}
			}
		})
	}
}

func TestRealSaveAndRestore(t *testing.T) {
	ctx := t.Context()
	for protocol, client := range realClients(t, UseInstalledMode) {
		t.Run(string(protocol), func(t *testing.T) {
			destination := "10.96.0.10/32"
			if protocol == ProtocolIPv6 {
				destination = "fd00:10:96::a/128"
			}
			data := strings.Join([]string{
				"*nat",
				MakeChainLine("KUBE-TEST-SERVICES"),
				MakeChainLine("KUBE-TEST-SVC"),
				`-A KUBE-TEST-SERVICES -d ` + destination + ` -p tcp -m comment --comment "ns/svc:p80 cluster IP" -m tcp --dport 80 -j KUBE-TEST-SVC`,
				"-A KUBE-TEST-SVC -j RETURN",
				"COMMIT",
				"*filter",
				MakeChainLine("KUBE-TEST-FORWARD"),
				"-A KUBE-TEST-FORWARD -m conntrack --ctstate INVALID -j DROP",
				"COMMIT",
				"",
			}, "\n")
			if err := client.Restore(ctx, []byte(data)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			var nat bytes.Buffer
			if err := client.SaveInto(ctx, TableNAT, &nat); err != nil {
				t.Fatalf("SaveInto: %v", err)
			}
			chains := GetChainsFromTable(nat.Bytes())
			if !chains.HasAll("KUBE-TEST-SERVICES", "KUBE-TEST-SVC", ChainPostrouting) || chains.Has("KUBE-TEST-FORWARD") {
				t.Errorf("nat has chains %v, want KUBE-TEST-SERVICES, KUBE-TEST-SVC and not filter's", chains.SortedList())
			}
			if !strings.Contains(nat.String(), `"ns/svc:p80 cluster IP"`) {
				t.Errorf("iptables-save -t nat lacks the rule:\n%s", nat.String())
			}
			var all bytes.Buffer
			if err := client.SaveInto(ctx, "", &all); err != nil || !strings.Contains(all.String(), "KUBE-TEST-FORWARD") {
				t.Errorf("SaveInto of every table = %v, and lacks filter's chain:\n%s", err, all.String())
			}

			// --noflush: restoring a table leaves the chains it does not declare as they are.
			if err := client.Restore(ctx, []byte("*nat\n:KUBE-TEST-OTHER - [0:0]\nCOMMIT\n")); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			if exists, _ := client.ChainExists(ctx, TableNAT, "KUBE-TEST-SVC"); !exists {
				t.Error("restoring another chain flushed the table")
			}

			// Deleting a chain that a rule still jumps to fails on the line that deletes it.
			bad := []byte("*nat\n:KUBE-TEST-SVC - [0:0]\n-X KUBE-TEST-SVC\nCOMMIT\n")
			err := client.Restore(ctx, bad)
			parseErr, ok := err.(ParseError)
			if !ok || parseErr.Line() != 3 {
				t.Errorf("Restore deleting a chain in use = %v (%T), want a ParseError on line 3", err, err)
			}
			// A jump to a missing chain fails on its line (iptables-legacy) or on the COMMIT after
			// it (iptables-nft 1.8.9).
			bad = []byte("*filter\n:KUBE-TEST-FORWARD - [0:0]\n-A KUBE-TEST-FORWARD -j ACCEPT\n-A KUBE-TEST-FORWARD -j KUBE-TEST-MISSING\nCOMMIT\n")
			err = client.Restore(ctx, bad)
			if parseErr, ok := err.(ParseError); !ok || (parseErr.Line() != 4 && parseErr.Line() != 5) {
				t.Errorf("Restore jumping to a missing chain = %v (%T), want a ParseError on line 4 or 5", err, err)
			}

			cleanup := "*nat\n:KUBE-TEST-SERVICES - [0:0]\n:KUBE-TEST-SVC - [0:0]\n:KUBE-TEST-OTHER - [0:0]\n-X KUBE-TEST-SERVICES\n-X KUBE-TEST-SVC\n-X KUBE-TEST-OTHER\nCOMMIT\n" +
				"*filter\n:KUBE-TEST-FORWARD - [0:0]\n-X KUBE-TEST-FORWARD\nCOMMIT\n"
			if err := client.Restore(ctx, []byte(cleanup)); err != nil {
				t.Fatalf("Restore deleting the chains: %v", err)
			}
			nat.Reset()
			if err := client.SaveInto(ctx, TableNAT, &nat); err != nil {
				t.Fatal(err)
			}
			if chains := GetChainsFromTable(nat.Bytes()); chains.HasAny("KUBE-TEST-SERVICES", "KUBE-TEST-SVC", "KUBE-TEST-OTHER") {
				t.Errorf("nat still has chains %v", chains.SortedList())
			}
		})
	}
}

func TestRealMonitor(t *testing.T) {
	setFlushWait(t, time.Minute)
	client := realClients(t, UseInstalledMode)[ProtocolIPv4]
	const canary Chain = "KUBE-TEST-CANARY"
	tables := []Table{TableMangle, TableNAT, TableFilter}
	exists := func(table Table) bool {
		ok, _ := client.ChainExists(context.Background(), table, canary)
		return ok
	}
	reloads := make(chan struct{}, 10)
	stop := startMonitor(t, client, canary, tables, func() { reloads <- struct{}{} })
	eventually(t, "the canaries exist", func() bool { return exists(TableMangle) && exists(TableNAT) && exists(TableFilter) })

	// A firewall reload: every table flushed and its chains deleted.
	for _, table := range tables {
		out, err := exec.Command("iptables", "-w", "5", "-t", string(table), "-X", string(canary)).CombinedOutput()
		if err != nil {
			t.Fatalf("deleting the canary of %s: %v: %s", table, err, out)
		}
	}
	select {
	case <-reloads:
	case <-time.After(10 * time.Second):
		t.Fatal("Monitor did not reload after the canaries went")
	}
	eventually(t, "the canaries exist again", func() bool { return exists(TableMangle) && exists(TableNAT) && exists(TableFilter) })
	if !stop() {
		t.Fatal("Monitor did not return when its context was done")
	}
	for _, table := range tables {
		if exists(table) {
			t.Errorf("Monitor left its canary in %s", table)
		}
	}
}

func TestRealDetectHostMode(t *testing.T) {
	realClients(t, DetectHostMode)
	if !installed(variantNFT) || !installed(variantLegacy) {
		t.Skip("needs iptables-nft and iptables-legacy")
	}
	ctx := t.Context()
	client, err := New(ctx, ProtocolIPv4, DetectHostMode)
	if err != nil {
		t.Fatal(err)
	}
	if got := client.(*runner).commands.iptables; got != "iptables-nft" {
		t.Errorf("without the kubelet's chains DetectHostMode runs %s, want iptables-nft", got)
	}

	// A kubelet that runs iptables-legacy leaves its hint in legacy's mangle table.
	hint := func(op string) {
		t.Helper()
		out, err := exec.Command("ip6tables-legacy", "-w", "5", "-t", "mangle", op, "KUBE-IPTABLES-HINT").CombinedOutput()
		if err != nil {
			t.Fatalf("ip6tables-legacy %s KUBE-IPTABLES-HINT: %v: %s", op, err, out)
		}
	}
	hint("-N")
	defer hint("-X")
	clients := NewBestEffort(ctx, DetectHostMode)
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		client, ok := clients[protocol]
		if !ok {
			t.Fatalf("NewBestEffort has no %s client: %v", protocol, clients)
		}
		if got := client.(*runner).commands.save; !strings.HasSuffix(got, "-legacy-save") {
			t.Errorf("with the hint in legacy's IPv6 tables, DetectHostMode saves %s with %s, want a legacy variant", protocol, got)
		}
	}
}
