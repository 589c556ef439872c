package testing

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// The test of this file checks FakeIPTables against the real iptables: it runs the same calls on
// both and compares their results and the tables after. It changes the rules of the network
// namespace it runs in, so it runs only when DRA_E2E_IPTABLES_TEST=1, as root in a namespace of
// its own: `unshare -n env DRA_E2E_IPTABLES_TEST=1 go test ./...`.

// shape is what the fake and iptables-save must agree on for a table: per chain (built-in ones,
// and those named KUBE-TEST-*), the targets its rules jump to, in order ("" for none).
// iptables-save rewrites rules (it orders matches its own way, adds /32), so rules are not
// compared as text.
func shape(t *testing.T, client iptables.Interface, table iptables.Table) map[iptables.Chain][]string {
	t.Helper()
	var buffer bytes.Buffer
	if err := client.SaveInto(context.Background(), table, &buffer); err != nil {
		t.Fatalf("SaveInto(%s): %v", table, err)
	}
	dump, err := ParseIPTablesDump(buffer.String())
	if err != nil {
		t.Fatalf("ParseIPTablesDump of\n%s\n: %v", buffer.String(), err)
	}
	got, err := dump.GetTable(table)
	if err != nil {
		t.Fatal(err)
	}
	out := map[iptables.Chain][]string{}
	for _, chain := range got.Chains {
		if !strings.HasPrefix(string(chain.Name), "KUBE-TEST-") && !isBuiltinChain(table, chain.Name) {
			continue
		}
		targets := []string{}
		for _, rule := range chain.Rules {
			targets = append(targets, jumpTarget(rule))
		}
		if len(targets) > 0 || strings.HasPrefix(string(chain.Name), "KUBE-TEST-") {
			out[chain.Name] = targets
		}
	}
	return out
}

func TestFakeBehavesLikeIPTables(t *testing.T) {
	if os.Getenv("DRA_E2E_IPTABLES_TEST") != "1" {
		t.Skip("set DRA_E2E_IPTABLES_TEST=1 in a network namespace of its own")
	}
	ctx := t.Context()
	host, err := iptables.New(ctx, iptables.ProtocolIPv4, iptables.UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	fake := NewFake()
	clients := map[string]iptables.Interface{"iptables": host, "fake": fake}

	restores := []struct {
		name string
		data string
		ok   bool
	}{
		{"first sync", dedent(`
			*nat
			:KUBE-TEST-SERVICES - [0:0]
			:KUBE-TEST-MARK-MASQ - [0:0]
			:KUBE-TEST-SVC-A - [0:0]
			:KUBE-TEST-SEP-A - [0:0]
			:KUBE-TEST-SVC-B - [0:0]
			:KUBE-TEST-SEP-B - [0:0]
			-A KUBE-TEST-SERVICES -m comment --comment "ns/a:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-TEST-SVC-A
			-A KUBE-TEST-SERVICES -m comment --comment "ns/b:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-TEST-SVC-B
			-A KUBE-TEST-MARK-MASQ -j MARK --or-mark 0x4000
			-A KUBE-TEST-SVC-A -m comment --comment "ns/a:p80 -> 10.180.0.1:80" -j KUBE-TEST-SEP-A
			-A KUBE-TEST-SEP-A -s 10.180.0.1/32 -j KUBE-TEST-MARK-MASQ
			-A KUBE-TEST-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.180.0.1:80
			-A KUBE-TEST-SVC-B -j KUBE-TEST-SEP-B
			-A KUBE-TEST-SEP-B -p tcp -m tcp -j DNAT --to-destination 10.180.0.2:80
			-A OUTPUT -j KUBE-TEST-SERVICES
			COMMIT
			*filter
			:KUBE-TEST-FORWARD - [0:0]
			-A KUBE-TEST-FORWARD -m conntrack --ctstate INVALID -j DROP
			-A FORWARD -j KUBE-TEST-FORWARD
			COMMIT
			`), true},
		{"jump to a missing chain", "*nat\n:KUBE-TEST-SERVICES - [0:0]\n-A KUBE-TEST-SERVICES -j KUBE-TEST-SVC-C\nCOMMIT\n", false},
		{"rule in a missing chain", "*nat\n-A KUBE-TEST-SVC-C -j RETURN\nCOMMIT\n", false},
		{"deleting an endpoint chain a service chain still jumps to", "*nat\n:KUBE-TEST-SEP-B - [0:0]\n-X KUBE-TEST-SEP-B\nCOMMIT\n", false},
		{"deleting a missing chain", "*nat\n-X KUBE-TEST-MISSING\nCOMMIT\n", false},
		{"a good table, then a bad one", "*filter\n:KUBE-TEST-NEW - [0:0]\nCOMMIT\n*nat\n-A KUBE-TEST-MISSING -j RETURN\nCOMMIT\n", false},
		{"partial sync deleting service b", dedent(`
			*nat
			:KUBE-TEST-SERVICES - [0:0]
			:KUBE-TEST-SVC-B - [0:0]
			:KUBE-TEST-SEP-B - [0:0]
			-A KUBE-TEST-SERVICES -m comment --comment "ns/a:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-TEST-SVC-A
			-X KUBE-TEST-SVC-B
			-X KUBE-TEST-SEP-B
			COMMIT
			`), true},
		{"flushing a declared chain only", "*nat\n:KUBE-TEST-SEP-A - [0:0]\n-A KUBE-TEST-SEP-A -j RETURN\nCOMMIT\n", true},
	}
	for _, step := range restores {
		results := map[string]error{}
		for name, client := range clients {
			results[name] = client.Restore(ctx, []byte(step.data))
		}
		if (results["iptables"] == nil) != step.ok || (results["fake"] == nil) != step.ok {
			t.Errorf("%s: iptables: %v, fake: %v; want success %v from both", step.name, results["iptables"], results["fake"], step.ok)
		}
		if _, ok := results["fake"].(iptables.ParseError); !step.ok && !ok {
			t.Errorf("%s: the fake's error %v is not an iptables.ParseError", step.name, results["fake"])
		}
		compareTables(t, step.name, host, fake)
	}

	// The single-rule and single-chain calls.
	type call struct {
		name string
		run  func(iptables.Interface) error
		ok   bool
	}
	for _, c := range []call{
		{"EnsureRule jumping to a missing chain", func(c iptables.Interface) error {
			_, err := c.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainPrerouting, "-j", "KUBE-TEST-MISSING")
			return err
		}, false},
		{"EnsureRule with a comment", func(c iptables.Interface) error {
			_, err := c.EnsureRule(ctx, iptables.Prepend, iptables.TableNAT, iptables.ChainPrerouting, "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-TEST-SERVICES")
			return err
		}, true},
		{"DeleteChain of a chain with rules", func(c iptables.Interface) error {
			return c.DeleteChain(ctx, iptables.TableNAT, "KUBE-TEST-SEP-A")
		}, false},
		{"FlushChain", func(c iptables.Interface) error {
			return c.FlushChain(ctx, iptables.TableNAT, "KUBE-TEST-SEP-A")
		}, true},
		{"DeleteChain of a chain a rule jumps to", func(c iptables.Interface) error {
			return c.DeleteChain(ctx, iptables.TableNAT, "KUBE-TEST-SEP-A")
		}, false},
		{"DeleteRule of a missing rule", func(c iptables.Interface) error {
			return c.DeleteRule(ctx, iptables.TableNAT, iptables.ChainPrerouting, "-j", "KUBE-TEST-SVC-A")
		}, true},
		{"DeleteRule with a comment", func(c iptables.Interface) error {
			return c.DeleteRule(ctx, iptables.TableNAT, iptables.ChainPrerouting, "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-TEST-SERVICES")
		}, true},
		{"FlushChain of a missing chain", func(c iptables.Interface) error {
			return c.FlushChain(ctx, iptables.TableNAT, "KUBE-TEST-MISSING")
		}, false},
		{"EnsureChain", func(c iptables.Interface) error {
			_, err := c.EnsureChain(ctx, iptables.TableFilter, "KUBE-TEST-ENSURED")
			return err
		}, true},
	} {
		for name, client := range clients {
			err := c.run(client)
			if (err == nil) != c.ok {
				t.Errorf("%s on %s = %v, want success %v", c.name, name, err, c.ok)
			}
		}
		compareTables(t, c.name, host, fake)
	}
	if _, err := fake.ChainExists(ctx, iptables.TableNAT, "KUBE-TEST-MISSING"); !iptables.IsNotFoundError(err) {
		t.Errorf("the fake's ChainExists of a missing chain = %v, want a not-found error", err)
	}
	if _, err := host.ChainExists(ctx, iptables.TableNAT, "KUBE-TEST-MISSING"); err == nil {
		t.Error("ChainExists of a missing chain succeeded")
	}
}

// compareTables fails t when the fake's nat and filter tables have another shape than the real
// ones.
func compareTables(t *testing.T, step string, host, fake iptables.Interface) {
	t.Helper()
	for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		want, got := shape(t, host, table), shape(t, fake, table)
		if !maps.EqualFunc(want, got, slices.Equal) {
			t.Errorf("after %s, %s differs:\niptables: %s\nfake:     %s", step, table, format(want), format(got))
		}
	}
}

func format(shape map[iptables.Chain][]string) string {
	var parts []string
	for _, chain := range slices.Sorted(maps.Keys(shape)) {
		parts = append(parts, fmt.Sprintf("%s%q", chain, shape[chain]))
	}
	return strings.Join(parts, " ")
}
