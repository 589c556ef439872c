package testing

import (
	"strings"
	"testing"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// The state kube-proxy's first sync leaves: a service chain and an endpoint chain.
var synced = dedent(`
	*nat
	:KUBE-SERVICES - [0:0]
	:KUBE-MARK-MASQ - [0:0]
	:KUBE-SVC-A - [0:0]
	:KUBE-SEP-A - [0:0]
	-A KUBE-SERVICES -m comment --comment "ns/a:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-A
	-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
	-A KUBE-SVC-A -m comment --comment "ns/a:p80 -> 10.180.0.1:80" -j KUBE-SEP-A
	-A KUBE-SEP-A -m comment --comment ns/a:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
	-A KUBE-SEP-A -m comment --comment ns/a:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
	COMMIT
	*filter
	:KUBE-FORWARD - [0:0]
	-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
	COMMIT
	`)

func restoredFake(t *testing.T) *FakeIPTables {
	t.Helper()
	f := NewFake()
	if err := f.Restore(t.Context(), []byte(synced)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	return f
}

func TestRestoreAddsToTheTables(t *testing.T) {
	f := restoredFake(t)
	want := dedent(`
		*nat
		:PREROUTING - [0:0]
		:INPUT - [0:0]
		:OUTPUT - [0:0]
		:POSTROUTING - [0:0]
		:KUBE-SERVICES - [0:0]
		:KUBE-MARK-MASQ - [0:0]
		:KUBE-SVC-A - [0:0]
		:KUBE-SEP-A - [0:0]
		-A KUBE-SERVICES -m comment --comment "ns/a:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-A
		-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
		-A KUBE-SVC-A -m comment --comment "ns/a:p80 -> 10.180.0.1:80" -j KUBE-SEP-A
		-A KUBE-SEP-A -m comment --comment ns/a:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
		-A KUBE-SEP-A -m comment --comment ns/a:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
		COMMIT
		`)
	if got := save(t, f, iptables.TableNAT); got != want {
		t.Errorf("nat =\n%s\nwant\n%s", got, want)
	}
	sep, _ := f.Dump.GetChain(iptables.TableNAT, "KUBE-SEP-A")
	if sep == nil || sep.Rules[1].DNATDestination == nil || sep.Rules[1].DNATDestination.Value != "10.180.0.1:80" {
		t.Errorf("KUBE-SEP-A's rules are not parsed: %+v", sep)
	}
}

func TestRestoreFlushesOnlyTheChainsItDeclares(t *testing.T) {
	f := restoredFake(t)
	update := dedent(`
		*nat
		:KUBE-SERVICES - [0:0]
		:KUBE-SVC-B - [7:420]
		:KUBE-SVC-A - [0:0]
		:KUBE-SEP-A - [0:0]
		-A KUBE-SERVICES -j KUBE-SVC-B
		-A KUBE-SVC-B -j RETURN
		-X KUBE-SVC-A
		-X KUBE-SEP-A
		COMMIT
		`)
	if err := f.Restore(t.Context(), []byte(update)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	chains := iptables.GetChainsFromTable([]byte(save(t, f, iptables.TableNAT)))
	if chains.HasAny("KUBE-SVC-A", "KUBE-SEP-A") || !chains.HasAll("KUBE-SVC-B", "KUBE-MARK-MASQ") {
		t.Errorf("nat has %v after the update", chains.SortedList())
	}
	if got := rawRules(t, f, iptables.TableNAT, "KUBE-SERVICES"); len(got) != 1 || got[0] != "-A KUBE-SERVICES -j KUBE-SVC-B" {
		t.Errorf("KUBE-SERVICES = %q, want the new rule alone", got)
	}
	if got := rawRules(t, f, iptables.TableNAT, "KUBE-MARK-MASQ"); len(got) != 1 {
		t.Errorf("KUBE-MARK-MASQ, which the update does not declare, = %q", got)
	}
	if svc, _ := f.Dump.GetChain(iptables.TableNAT, "KUBE-SVC-B"); svc.Packets != 7 || svc.Bytes != 420 {
		t.Errorf("KUBE-SVC-B's counters = [%d:%d], want the restored [7:420]", svc.Packets, svc.Bytes)
	}
	if got := rawRules(t, f, iptables.TableFilter, "KUBE-FORWARD"); len(got) != 1 {
		t.Errorf("filter, which the update does not have, changed: KUBE-FORWARD = %q", got)
	}
}

func TestRestoreCommands(t *testing.T) {
	f := restoredFake(t)
	commands := dedent(`
		*filter
		-N KUBE-NEW
		-A KUBE-NEW -j ACCEPT
		-I KUBE-NEW -s 1.2.3.4 -j DROP
		-I KUBE-NEW 3 -m comment --comment "at the end" -j RETURN
		-D KUBE-NEW -j ACCEPT
		-P FORWARD DROP
		-A FORWARD -j KUBE-NEW
		-F KUBE-FORWARD
		-Z
		COMMIT
		`)
	if err := f.Restore(t.Context(), []byte(commands)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	want := dedent(`
		*filter
		:INPUT - [0:0]
		:FORWARD DROP [0:0]
		:OUTPUT - [0:0]
		:KUBE-FORWARD - [0:0]
		:KUBE-NEW - [0:0]
		-A FORWARD -j KUBE-NEW
		-A KUBE-NEW -s 1.2.3.4 -j DROP
		-A KUBE-NEW -m comment --comment "at the end" -j RETURN
		COMMIT
		`)
	if got := save(t, f, iptables.TableFilter); got != want {
		t.Errorf("filter =\n%s\nwant\n%s", got, want)
	}
}

func TestRestoreCommitsTableByTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		// line is the line the error is about; message what it says.
		line    int
		message string
	}{
		{
			name:    "jump to a missing chain",
			data:    "*filter\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-MISSING\nCOMMIT\n",
			line:    5,
			message: "Chain 'KUBE-SVC-MISSING' does not exist",
		},
		{
			// kube-proxy's partial sync deleting an endpoint chain that a service chain it
			// did not rewrite still jumps to.
			name:    "deleting a chain in use",
			data:    "*nat\n:KUBE-SEP-A - [0:0]\n-X KUBE-SEP-A\nCOMMIT\n",
			line:    3,
			message: "Too many links",
		},
		{
			name:    "rule in a missing chain",
			data:    "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SVC-MISSING -j ACCEPT\nCOMMIT\n",
			line:    3,
			message: "No chain/target/match by that name",
		},
		{
			name:    "deleting a chain with rules",
			data:    "*filter\n-X KUBE-FORWARD\nCOMMIT\n",
			line:    2,
			message: "Directory not empty",
		},
		{
			name:    "deleting a built-in chain",
			data:    "*filter\n:INPUT - [0:0]\n-X INPUT\nCOMMIT\n",
			line:    3,
			message: "built in",
		},
		{
			name:    "policy of a user chain",
			data:    "*filter\n:KUBE-X ACCEPT [0:0]\nCOMMIT\n",
			line:    2,
			message: "not a built-in chain",
		},
		{
			name:    "unknown table",
			data:    "*bogus\nCOMMIT\n",
			line:    1,
			message: "table name \"bogus\" invalid",
		},
		{
			name:    "missing COMMIT",
			data:    "*nat\n:KUBE-X - [0:0]\n",
			line:    3,
			message: "COMMIT expected",
		},
		{
			name:    "unknown command",
			data:    "*nat\n-Q KUBE-X\nCOMMIT\n",
			line:    2,
			message: "unknown command",
		},
		{
			name:    "deleting a missing rule",
			data:    "*filter\n-D KUBE-FORWARD -j ACCEPT\nCOMMIT\n",
			line:    2,
			message: "does a matching rule exist",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The first table of the input is fine: like iptables-restore, the fake commits
			// it before it fails on the next.
			good := "*mangle\n:KUBE-OK - [0:0]\nCOMMIT\n"
			want := restoredFake(t)
			if err := want.Restore(t.Context(), []byte(good)); err != nil {
				t.Fatal(err)
			}
			f := restoredFake(t)
			data := good + tc.data
			err := f.Restore(t.Context(), []byte(data))
			parseErr, ok := err.(iptables.ParseError)
			if !ok {
				t.Fatalf("Restore = %v (%T), want an iptables.ParseError", err, err)
			}
			if parseErr.Line() != tc.line+3 || !strings.Contains(parseErr.Error(), tc.message) {
				t.Errorf("Restore's error is about line %d: %q; want line %d and %q", parseErr.Line(), parseErr, tc.line+3, tc.message)
			}
			if !strings.HasPrefix(parseErr.Error(), "iptables-restore: line ") {
				t.Errorf("Restore's error %q does not name iptables-restore", parseErr)
			}
			if got, want := save(t, f, ""), save(t, want, ""); got != want {
				t.Errorf("after the failed Restore the state is\n%s\nwant\n%s", got, want)
			}
		})
	}
}

func TestRestoreRecreatesADeletedChain(t *testing.T) {
	f := restoredFake(t)
	data := "*filter\n:KUBE-OLD - [0:0]\n-X KUBE-OLD\n:KUBE-OLD - [0:0]\n-A KUBE-OLD -j ACCEPT\n-A FORWARD -j KUBE-OLD\nCOMMIT\n"
	if err := f.Restore(t.Context(), []byte(data)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if got := rawRules(t, f, iptables.TableFilter, "KUBE-OLD"); len(got) != 1 {
		t.Errorf("KUBE-OLD = %q", got)
	}
}

func TestIPv6FakeNamesIP6tablesRestore(t *testing.T) {
	f := NewIPv6Fake()
	err := f.Restore(t.Context(), []byte("*nat\n-A KUBE-X -j ACCEPT\nCOMMIT\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "ip6tables-restore: line 2 failed") {
		t.Errorf("Restore = %v, want ip6tables-restore's error on line 2", err)
	}
}
