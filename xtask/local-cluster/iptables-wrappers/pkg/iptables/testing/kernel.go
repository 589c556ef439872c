package testing

import (
	"fmt"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// builtinChains are the chains the kernel gives each table it has.
var builtinChains = map[iptables.Table][]iptables.Chain{
	iptables.TableFilter: {iptables.ChainInput, iptables.ChainForward, iptables.ChainOutput},
	iptables.TableNAT:    {iptables.ChainPrerouting, iptables.ChainInput, iptables.ChainOutput, iptables.ChainPostrouting},
	iptables.TableMangle: {iptables.ChainPrerouting, iptables.ChainInput, iptables.ChainForward, iptables.ChainOutput, iptables.ChainPostrouting},
	"raw":                {iptables.ChainPrerouting, iptables.ChainOutput},
	"security":           {iptables.ChainInput, iptables.ChainForward, iptables.ChainOutput},
}

// isBuiltinChain says whether chain is one the kernel gives table.
func isBuiltinChain(table iptables.Table, chain iptables.Chain) bool {
	for _, builtin := range builtinChains[table] {
		if builtin == chain {
			return true
		}
	}
	return false
}

// targetExtensions are the -j targets that are not chains: iptables' own verdicts and the target
// extensions of the iptables and ip6tables packages.
var targetExtensions = func() map[string]bool {
	targets := map[string]bool{}
	for _, target := range []string{
		"ACCEPT", "DROP", "RETURN", "QUEUE",
		"AUDIT", "CHECKSUM", "CLASSIFY", "CLUSTERIP", "CONNMARK", "CONNSECMARK", "CT", "DNAT",
		"DNPT", "DSCP", "ECN", "HL", "HMARK", "IDLETIMER", "LED", "LOG", "MARK", "MASQUERADE",
		"NETMAP", "NFLOG", "NFQUEUE", "NOTRACK", "RATEEST", "REDIRECT", "REJECT", "SECMARK", "SET",
		"SNAT", "SNPT", "SYNPROXY", "TCPMSS", "TCPOPTSTRIP", "TEE", "TOS", "TPROXY", "TRACE", "TTL",
		"ULOG",
	} {
		targets[target] = true
	}
	return targets
}()

// lookupTable returns the table named name. A table the kernel has but dump lacks yet (the
// kernel creates tables when first used) is added to dump when create, else nil is returned; a
// table the kernel does not have is an error.
func lookupTable(dump *IPTablesDump, name iptables.Table, create bool) (*Table, error) {
	if table, _ := dump.GetTable(name); table != nil {
		return table, nil
	}
	if _, known := builtinChains[name]; !known {
		return nil, fmt.Errorf("table %q does not exist", name)
	}
	if !create {
		return nil, nil
	}
	dump.Tables = append(dump.Tables, Table{Name: name})
	return &dump.Tables[len(dump.Tables)-1], nil
}

// lookupChain returns chain of table, nil when table lacks it. A built-in chain that table does
// not list yet (NewFake lists only some) exists all the same: it is added to table when create.
func lookupChain(table *Table, chain iptables.Chain, create bool) *Chain {
	if table == nil {
		return nil
	}
	if c := table.chain(chain); c != nil {
		return c
	}
	if !create || !isBuiltinChain(table.Name, chain) {
		return nil
	}
	table.Chains = append(table.Chains, Chain{Name: chain})
	return &table.Chains[len(table.Chains)-1]
}

// chainExists says whether table (nil when it has not been used) has chain.
func chainExists(table *Table, name iptables.Table, chain iptables.Chain) bool {
	return isBuiltinChain(name, chain) || (table != nil && table.chain(chain) != nil)
}

// jumpTarget is the chain or target rule jumps (-j) or goes (-g) to; "" when it has neither.
func jumpTarget(rule *Rule) string {
	switch {
	case rule.Jump != nil:
		return rule.Jump.Value
	case rule.Goto != nil:
		return rule.Goto.Value
	}
	return ""
}

// referrer returns the first rule of table that jumps to chain, nil when none does.
func referrer(table *Table, chain iptables.Chain) *Rule {
	for _, c := range table.Chains {
		for _, rule := range c.Rules {
			if jumpTarget(rule) == string(chain) {
				return rule
			}
		}
	}
	return nil
}

// The messages of iptables that the fake's errors carry, so that iptables.IsNotFoundError
// recognizes them as it does iptables' own.
const (
	msgNoChain  = "No chain/target/match by that name"
	msgNoRule   = "Bad rule (does a matching rule exist in that chain?)"
	msgNotEmpty = "Directory not empty"
	msgInUse    = "Too many links"
)

// errNoChain is the error of a command naming chain, missing from table.
func errNoChain(table iptables.Table, chain iptables.Chain) error {
	return fmt.Errorf("iptables: %s (chain %q in table %q)", msgNoChain, chain, table)
}

// errNoTarget is the error of a rule that jumps to target, neither a chain of table nor a target
// extension.
func errNoTarget(table iptables.Table, target string) error {
	return fmt.Errorf("iptables: Chain '%s' does not exist (in table %q)", target, table)
}

// checkDeletable returns why chain of table cannot be deleted now, nil when it can.
func checkDeletable(table *Table, chain iptables.Chain) error {
	if isBuiltinChain(table.Name, chain) {
		return fmt.Errorf("iptables: Operation not permitted (chain %q of table %q is built in)", chain, table.Name)
	}
	c := table.chain(chain)
	if c == nil {
		return errNoChain(table.Name, chain)
	}
	if len(c.Rules) > 0 {
		return fmt.Errorf("iptables: %s (chain %q of table %q has %d rules)", msgNotEmpty, chain, table.Name, len(c.Rules))
	}
	if rule := referrer(table, chain); rule != nil {
		return fmt.Errorf("iptables: %s (chain %q of table %q is the target of %q)", msgInUse, chain, table.Name, rule.Raw)
	}
	return nil
}

// removeChain removes chain from table.
func removeChain(table *Table, chain iptables.Chain) {
	for i := range table.Chains {
		if table.Chains[i].Name == chain {
			table.Chains = append(table.Chains[:i], table.Chains[i+1:]...)
			return
		}
	}
}
