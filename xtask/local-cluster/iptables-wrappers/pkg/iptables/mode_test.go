package iptables

import (
	"slices"
	"testing"
)

// bothVariants are the binaries of a host with iptables-nft and iptables-legacy installed.
var bothVariants = func() []string {
	var names []string
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, variant := range []string{"", "-nft", "-legacy"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				names = append(names, base+variant+suffix)
			}
		}
	}
	return names
}()

func TestDetectHostModeFollowsTheKubeletsChains(t *testing.T) {
	for _, tc := range []struct {
		name string
		// saves maps a save command to what it prints.
		saves map[string]string
		want  string
	}{
		{
			name: "no kubelet chains: nft",
			saves: map[string]string{
				"iptables-legacy-save": "*filter\n:INPUT ACCEPT [0:0]\n:OTHER - [0:0]\nCOMMIT\n",
			},
			want: "iptables-nft",
		},
		{
			name: "hint in nft's mangle",
			saves: map[string]string{
				"iptables-nft-save":    "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n",
				"iptables-legacy-save": "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n",
			},
			want: "iptables-nft",
		},
		{
			name: "canary in legacy's IPv6 tables",
			saves: map[string]string{
				"ip6tables-legacy-save": "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n",
			},
			want: "iptables-legacy",
		},
		{
			name: "a rule mentioning the hint is not the chain",
			saves: map[string]string{
				"iptables-legacy-save": "*mangle\n:OTHER - [0:0]\n-A OTHER -m comment --comment \":KUBE-IPTABLES-HINT \" -j ACCEPT\nCOMMIT\n",
			},
			want: "iptables-nft",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHost(t, bothVariants...)
			for save, output := range tc.saves {
				h.setFile("save-output-"+save, []byte(output))
			}
			client, err := New(t.Context(), ProtocolIPv4, DetectHostMode)
			if err != nil {
				t.Fatal(err)
			}
			if got := client.(*runner).commands.iptables; got != tc.want {
				t.Errorf("DetectHostMode runs %s, want %s", got, tc.want)
			}
			log := h.log()
			if !slices.Contains(log, "iptables-nft-save -t mangle") || slices.Contains(log, "iptables-legacy-save -t mangle") {
				t.Errorf("detection ran %q: want nft's mangle alone, and all of legacy's tables", log)
			}
		})
	}
}

func TestDetectHostModeWithOneVariantRunsThePlainNames(t *testing.T) {
	newFakeHost(t, "iptables", "iptables-save", "iptables-restore", "iptables-nft", "iptables-nft-save")
	clients := NewBestEffort(t.Context(), DetectHostMode)
	client, ok := clients[ProtocolIPv4]
	if !ok || len(clients) != 1 {
		t.Fatalf("NewBestEffort = %v, want an IPv4 client", clients)
	}
	if got := client.(*runner).commands; got != (commands{iptables: "iptables", save: "iptables-save", restore: "iptables-restore"}) {
		t.Errorf("runs %+v, want the plain names", got)
	}
}

func TestUseInstalledModeDoesNotDetect(t *testing.T) {
	h := newFakeHost(t, bothVariants...)
	h.setFile("save-output-iptables-legacy-save", []byte("*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"))
	client, err := New(t.Context(), ProtocolIPv6, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	if got := client.(*runner).commands.restore; got != "ip6tables-restore" {
		t.Errorf("UseInstalledMode restores with %s, want ip6tables-restore", got)
	}
	if got, want := h.log(), []string{"ip6tables -w 5 -t nat -S POSTROUTING 1"}; !slices.Equal(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}
}
