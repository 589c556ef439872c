package testing

import (
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// restoreError is an error of FakeIPTables.Restore: the line of the input it is about and what
// is wrong with it.
type restoreError struct {
	command string
	line    int
	msg     string
}

var _ iptables.ParseError = &restoreError{}

func (e *restoreError) Error() string {
	return fmt.Sprintf("%s: line %d failed: %s", e.command, e.line, e.msg)
}

// Line implements iptables.ParseError.
func (e *restoreError) Line() int { return e.line }

// restoreTable is what restore tracks of the table it is in.
type restoreTable struct {
	name iptables.Table
	// deleted has the line that deleted each chain the input deleted.
	deleted map[iptables.Chain]int
	// added has the line that added each rule the input added.
	added map[*Rule]int
}

// restore applies data, iptables-restore input, as iptables-restore --noflush --counters applies
// it to the kernel, and returns the resulting state; state itself is left alone. Like
// iptables-restore (either variant), it commits table by table: after an error, the result has
// the tables committed before the one that failed, and none of that one's changes. Per table
// ("*TABLE" ... "COMMIT") it accepts:
//
//	:CHAIN POLICY [PACKETS:BYTES]  creates CHAIN, or flushes it; sets its counters (and a
//	                               built-in chain's policy unless POLICY is "-")
//	-A CHAIN RULE...               appends a rule to a chain that exists
//	-I CHAIN [N] RULE...           inserts a rule at N (from 1; the default is 1)
//	-D CHAIN RULE... / -D CHAIN N  deletes a rule (the Nth, from 1), which must exist
//	-N CHAIN / -X CHAIN            creates a chain / deletes an empty one
//	-F [CHAIN] / -Z [CHAIN]        flushes a chain (all, without CHAIN) / does nothing
//	-P CHAIN POLICY                sets a built-in chain's policy
//
// and at COMMIT checks that every rule of the table jumps to a chain that exists (or a target
// extension). Its errors are *restoreError, with the line they are about.
func restore(state *IPTablesDump, command, data string) (*IPTablesDump, error) {
	committed := state
	work := state.clone()
	var current *restoreTable
	lines := strings.Split(data, "\n")
	fail := func(n int, format string, args ...any) (*IPTablesDump, error) {
		return committed, &restoreError{command: command, line: n, msg: fmt.Sprintf(format, args...)}
	}
	for n, line := range lines {
		n++
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if current == nil {
			name, ok := strings.CutPrefix(line, "*")
			if !ok || name == "" {
				return fail(n, "expected the start of a table (\"*TABLE\"), got %q", line)
			}
			if _, err := lookupTable(work, iptables.Table(name), true); err != nil {
				return fail(n, "table name %q invalid: %v", name, err)
			}
			current = &restoreTable{name: iptables.Table(name), deleted: map[iptables.Chain]int{}, added: map[*Rule]int{}}
			continue
		}
		// lookupTable cannot fail now, and its result must be looked up again after each
		// change: adding a table may move the others.
		table, _ := lookupTable(work, current.name, true)
		var err error
		switch line = stripCounters(line); {
		case line == "COMMIT":
			if err = checkJumps(table, current); err == nil {
				committed, work = work, work.clone()
			}
			current = nil
		case line[0] == ':':
			err = declareChain(table, current, line)
		default:
			err = applyCommand(table, current, n, line)
		}
		if err != nil {
			if restoreErr, ok := err.(*restoreError); ok {
				restoreErr.command = command
				return committed, restoreErr
			}
			return fail(n, "%v", err)
		}
	}
	if current != nil {
		return fail(len(lines), "COMMIT expected at line %d (table %s is not committed)", len(lines), current.name)
	}
	return committed, nil
}

// declareChain applies ":CHAIN POLICY [PACKETS:BYTES]".
func declareChain(table *Table, current *restoreTable, line string) error {
	decl, err := parseChainLine(line)
	if err != nil {
		return err
	}
	builtin := isBuiltinChain(table.Name, decl.Name)
	if decl.Policy != "" && !builtin {
		return fmt.Errorf("cannot set policy %s on chain %s: it is not a built-in chain", decl.Policy, decl.Name)
	}
	delete(current.deleted, decl.Name)
	chain := lookupChain(table, decl.Name, true)
	if chain == nil {
		table.Chains = append(table.Chains, Chain{Name: decl.Name})
		chain = &table.Chains[len(table.Chains)-1]
	}
	chain.Rules = nil
	chain.Packets, chain.Bytes = decl.Packets, decl.Bytes
	if decl.Policy != "" {
		chain.Policy = decl.Policy
	}
	return nil
}

// applyCommand applies line, a command (-A, -I, -D, -N, -X, -F, -Z, -P) of the table.
func applyCommand(table *Table, current *restoreTable, n int, line string) error {
	words := splitWords(line)
	op := words[0]
	var chainName iptables.Chain
	if len(words) > 1 {
		chainName = iptables.Chain(words[1])
	}
	needsChain := func() (*Chain, error) {
		if chainName == "" {
			return nil, fmt.Errorf("%s needs a chain", op)
		}
		chain := lookupChain(table, chainName, true)
		if chain == nil {
			return nil, errNoChain(table.Name, chainName)
		}
		return chain, nil
	}
	switch op {
	case "-A", "--append":
		chain, err := needsChain()
		if err != nil {
			return err
		}
		rule, err := ParseRule(line, false)
		if err != nil {
			return err
		}
		chain.Rules = append(chain.Rules, rule)
		current.added[rule] = n
	case "-I", "--insert":
		chain, err := needsChain()
		if err != nil {
			return err
		}
		rest, position := words[2:], 1
		if len(rest) > 0 {
			if p, err := strconv.Atoi(rest[0]); err == nil {
				if p < 1 || p > len(chain.Rules)+1 {
					return fmt.Errorf("Index of insertion too big (%d, chain %s has %d rules)", p, chainName, len(chain.Rules))
				}
				rest, position = rest[1:], p
			}
		}
		rule, err := ParseRule("-A "+quoteWords(append([]string{string(chainName)}, rest...)), false)
		if err != nil {
			return err
		}
		chain.Rules = append(chain.Rules[:position-1:position-1], append([]*Rule{rule}, chain.Rules[position-1:]...)...)
		current.added[rule] = n
	case "-D", "--delete":
		chain, err := needsChain()
		if err != nil {
			return err
		}
		i := findRule(chain, words[2:])
		if len(words) == 3 {
			if number, err := strconv.Atoi(words[2]); err == nil {
				i = number - 1
			}
		}
		if i < 0 || i >= len(chain.Rules) {
			return fmt.Errorf("%s (%q)", msgNoRule, line)
		}
		chain.Rules = append(chain.Rules[:i:i], chain.Rules[i+1:]...)
	case "-N", "--new-chain":
		if chainName == "" {
			return fmt.Errorf("%s needs a chain", op)
		}
		if chainExists(table, table.Name, chainName) {
			return fmt.Errorf("Chain already exists (%s)", chainName)
		}
		delete(current.deleted, chainName)
		table.Chains = append(table.Chains, Chain{Name: chainName})
	case "-X", "--delete-chain":
		if chainName == "" {
			return fmt.Errorf("%s needs a chain", op)
		}
		// Whether rules still jump to the chain is known only at COMMIT: the input may flush
		// them later.
		if isBuiltinChain(table.Name, chainName) || table.chain(chainName) == nil || len(table.chain(chainName).Rules) > 0 {
			return checkDeletable(table, chainName)
		}
		removeChain(table, chainName)
		current.deleted[chainName] = n
	case "-F", "--flush", "-Z", "--zero":
		if chainName == "" {
			if op == "-F" || op == "--flush" {
				for i := range table.Chains {
					table.Chains[i].Rules = nil
				}
			}
			return nil
		}
		chain, err := needsChain()
		if err != nil {
			return err
		}
		if op == "-F" || op == "--flush" {
			chain.Rules = nil
		}
	case "-P", "--policy":
		if len(words) != 3 || !isBuiltinChain(table.Name, chainName) {
			return fmt.Errorf("bad policy command %q: expected -P BUILT-IN-CHAIN POLICY", line)
		}
		chain, err := needsChain()
		if err != nil {
			return err
		}
		chain.Policy = words[2]
	default:
		return fmt.Errorf("unknown command %q", line)
	}
	return nil
}

// checkJumps returns an error when a rule of table jumps to a chain that does not exist, about the
// line that deleted the chain or added the rule when the input did (restore puts the COMMIT line
// in the others).
func checkJumps(table *Table, current *restoreTable) error {
	for _, chain := range table.Chains {
		for _, rule := range chain.Rules {
			target := jumpTarget(rule)
			if target == "" || targetExtensions[target] || chainExists(table, table.Name, iptables.Chain(target)) {
				continue
			}
			if line, deleted := current.deleted[iptables.Chain(target)]; deleted {
				return &restoreError{line: line, msg: fmt.Sprintf("%s: cannot delete chain %s, rule %q jumps to it", msgInUse, target, rule.Raw)}
			}
			if line, added := current.added[rule]; added {
				return &restoreError{line: line, msg: errNoTarget(table.Name, target).Error()}
			}
			return fmt.Errorf("rule %q jumps to chain %s, which does not exist", rule.Raw, target)
		}
	}
	return nil
}
