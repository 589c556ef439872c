package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
)

// Mode says which iptables binaries a client runs: hosts may have both the legacy (xtables) and
// the nf_tables variant of iptables installed, and rules written with one are invisible to the
// other.
type Mode string

const (
	// UseInstalledMode runs iptables, iptables-save and iptables-restore (ip6tables… for IPv6)
	// as found on PATH: right for a program that runs on the host, like the kubelet.
	UseInstalledMode Mode = "installed"
	// DetectHostMode runs the variant (iptables-nft… or iptables-legacy…) whose rules hold the
	// kubelet's chains (KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY in the mangle table), nft when
	// neither does: right for a program in a container whose iptables may not be the host's, like
	// kube-proxy. Unless both variants are installed, it runs the plain names, as
	// UseInstalledMode does.
	DetectHostMode Mode = "detect"
)

// commands are the binaries of one IP family and iptables variant.
type commands struct {
	iptables string
	save     string
	restore  string
}

// commandsFor names the binaries of protocol's family in variant ("nft", "legacy", or "" for the
// plain names).
func commandsFor(protocol Protocol, variant string) commands {
	base := "iptables"
	if protocol == ProtocolIPv6 {
		base = "ip6tables"
	}
	if variant != "" {
		base += "-" + variant
	}
	return commands{iptables: base, save: base + "-save", restore: base + "-restore"}
}

// The iptables variants DetectHostMode chooses between.
const (
	variantNFT    = "nft"
	variantLegacy = "legacy"
)

// selectVariant is the variant mode runs: "" for the plain names.
func selectVariant(ctx context.Context, mode Mode) (string, error) {
	switch mode {
	case UseInstalledMode:
		return "", nil
	case DetectHostMode:
		return detectHostVariant(ctx), nil
	default:
		return "", fmt.Errorf("unknown iptables mode %q (want %q or %q)", mode, UseInstalledMode, DetectHostMode)
	}
}

// detectHostVariant finds the variant the host's kubelet uses. With only one variant (or none)
// installed there is nothing to choose: the plain names run it.
func detectHostVariant(ctx context.Context) string {
	if !installed(variantNFT) || !installed(variantLegacy) {
		return ""
	}
	// iptables-nft-save can dump the mangle table alone cheaply; iptables-legacy-save must dump
	// every table, since naming one would make the kernel create it.
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		if hasKubeletChains(ctx, commandsFor(protocol, variantNFT).save, "-t", string(TableMangle)) {
			return variantNFT
		}
	}
	for _, protocol := range []Protocol{ProtocolIPv4, ProtocolIPv6} {
		if hasKubeletChains(ctx, commandsFor(protocol, variantLegacy).save) {
			return variantLegacy
		}
	}
	return variantNFT
}

// installed says whether variant's IPv4 iptables and iptables-save are on PATH.
func installed(variant string) bool {
	cmds := commandsFor(ProtocolIPv4, variant)
	for _, name := range []string{cmds.iptables, cmds.save} {
		if _, err := exec.LookPath(name); err != nil {
			return false
		}
	}
	return true
}

// kubeletChain matches the declaration of a chain the kubelet creates in the mangle table.
var kubeletChain = regexp.MustCompile(`(?m)^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) `)

// hasKubeletChains runs save with args and says whether its output declares a kubelet chain;
// false when it fails.
func hasKubeletChains(ctx context.Context, save string, args ...string) bool {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, save, args...)
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return false
	}
	return kubeletChain.Match(out.Bytes())
}
