package iptables

import (
	"context"
	"os"
	"testing"
)

// Runs the real iptables; it changes the network namespace it runs in, so it runs only when
// DRA_E2E_IPTABLES_TEST=1 (run it as `unshare -n env DRA_E2E_IPTABLES_TEST=1 go test ./...`).
func TestEnsureChainAndRule(t *testing.T) {
	if os.Getenv("DRA_E2E_IPTABLES_TEST") != "1" {
		t.Skip("set DRA_E2E_IPTABLES_TEST=1 in a network namespace of its own")
	}
	ctx := context.Background()
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
}
