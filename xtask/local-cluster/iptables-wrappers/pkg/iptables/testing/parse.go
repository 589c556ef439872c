package testing

import (
	"fmt"
	"strconv"
	"strings"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// IPTablesDump is parsed iptables-save output, or iptables-restore input.
type IPTablesDump struct {
	// Tables are the tables in the order the data has them.
	Tables []Table
}

// Table is one table of an IPTablesDump.
type Table struct {
	// Name is the table's name ("filter", "nat", ...).
	Name iptables.Table
	// Chains are the table's chains in the order the data declares them.
	Chains []Chain
}

// Chain is one chain of a Table.
type Chain struct {
	// Name is the chain's name.
	Name iptables.Chain
	// Policy is a built-in chain's policy (ACCEPT, DROP); "" where the data has "-".
	Policy string
	// Packets is the chain's packet counter.
	Packets uint64
	// Bytes is the chain's byte counter.
	Bytes uint64
	// Rules are the chain's rules, in order.
	Rules []*Rule
	// Deleted says that the data deletes the chain ("-X NAME"), which iptables-restore input
	// may do and iptables-save output never does.
	Deleted bool
}

// ParseIPTablesDump parses data: per table, "*TABLE", then chain declarations (":CHAIN POLICY
// [PACKETS:BYTES]"), rules ("-A CHAIN ...", see ParseRule; parameters it does not know are
// skipped) and chain deletions ("-X CHAIN"), then "COMMIT". Blank lines, blanks around lines and
// "#" comments are ignored. A rule or deletion must name a chain its table declares.
func ParseIPTablesDump(data string) (*IPTablesDump, error) {
	dump := &IPTablesDump{}
	var table *Table
	for n, line := range strings.Split(data, "\n") {
		n++
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if table == nil {
			if line[0] != '*' || len(line) == 1 {
				return nil, fmt.Errorf("line %d: %q: expected the start of a table (\"*TABLE\")", n, line)
			}
			dump.Tables = append(dump.Tables, Table{Name: iptables.Table(line[1:])})
			table = &dump.Tables[len(dump.Tables)-1]
			continue
		}
		line = stripCounters(line)
		switch {
		case line == "COMMIT":
			table = nil
		case line[0] == ':':
			chain, err := parseChainLine(line)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if table.chain(chain.Name) != nil {
				return nil, fmt.Errorf("line %d: %q: chain %s declared twice", n, line, chain.Name)
			}
			table.Chains = append(table.Chains, chain)
		case strings.HasPrefix(line, "-A ") || strings.HasPrefix(line, "--append "):
			rule, err := ParseRule(line, false)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			chain := table.chain(rule.Chain)
			switch {
			case chain == nil:
				return nil, fmt.Errorf("line %d: %q: chain %s is not declared in table %s", n, line, rule.Chain, table.Name)
			case chain.Deleted:
				return nil, fmt.Errorf("line %d: %q: chain %s is deleted", n, line, rule.Chain)
			}
			chain.Rules = append(chain.Rules, rule)
		case strings.HasPrefix(line, "-X "):
			name := iptables.Chain(strings.TrimSpace(line[3:]))
			chain := table.chain(name)
			switch {
			case chain == nil:
				return nil, fmt.Errorf("line %d: %q: chain %s is not declared in table %s", n, line, name, table.Name)
			case len(chain.Rules) > 0:
				return nil, fmt.Errorf("line %d: %q: chain %s has rules", n, line, name)
			}
			chain.Deleted = true
		default:
			return nil, fmt.Errorf("line %d: %q: expected a chain, a rule, a deletion or COMMIT", n, line)
		}
	}
	if table != nil {
		return nil, fmt.Errorf("table %s has no COMMIT line", table.Name)
	}
	return dump, nil
}

// parseChainLine parses ":NAME POLICY [PACKETS:BYTES]" (the counters may be missing).
func parseChainLine(line string) (Chain, error) {
	fields := strings.Fields(line[1:])
	if len(fields) == 0 || len(fields) > 3 {
		return Chain{}, fmt.Errorf("%q: expected \":CHAIN POLICY [PACKETS:BYTES]\"", line)
	}
	chain := Chain{Name: iptables.Chain(fields[0])}
	if len(fields) > 1 && fields[1] != "-" {
		chain.Policy = fields[1]
	}
	if len(fields) > 2 {
		var err error
		if chain.Packets, chain.Bytes, err = parseCounters(fields[2]); err != nil {
			return Chain{}, fmt.Errorf("%q: %w", line, err)
		}
	}
	return chain, nil
}

// parseCounters parses "[PACKETS:BYTES]".
func parseCounters(field string) (packets, bytes uint64, err error) {
	inner, ok := strings.CutPrefix(field, "[")
	if ok {
		inner, ok = strings.CutSuffix(inner, "]")
	}
	p, b, found := strings.Cut(inner, ":")
	if !ok || !found {
		return 0, 0, fmt.Errorf("bad counters %q: expected [PACKETS:BYTES]", field)
	}
	if packets, err = strconv.ParseUint(p, 10, 64); err == nil {
		bytes, err = strconv.ParseUint(b, 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("bad counters %q: %w", field, err)
	}
	return packets, bytes, nil
}

// stripCounters removes the "[PACKETS:BYTES] " that iptables-save -c puts before rules.
func stripCounters(line string) string {
	if !strings.HasPrefix(line, "[") {
		return line
	}
	end := strings.Index(line, "] ")
	if end < 0 {
		return line
	}
	if _, _, err := parseCounters(line[:end+1]); err != nil {
		return line
	}
	return strings.TrimSpace(line[end+2:])
}

// String formats dump as iptables-save would, plus a "-X CHAIN" line for each deleted chain
// after the table's rules: each table's chain declarations, then the rules chain by chain.
func (dump *IPTablesDump) String() string {
	var out strings.Builder
	for i := range dump.Tables {
		writeTable(&out, &dump.Tables[i])
	}
	return out.String()
}

// writeTable writes table as String does.
func writeTable(out *strings.Builder, table *Table) {
	fmt.Fprintf(out, "*%s\n", table.Name)
	for _, chain := range table.Chains {
		policy := chain.Policy
		if policy == "" {
			policy = "-"
		}
		fmt.Fprintf(out, ":%s %s [%d:%d]\n", chain.Name, policy, chain.Packets, chain.Bytes)
	}
	for _, chain := range table.Chains {
		for _, rule := range chain.Rules {
			out.WriteString(rule.Raw)
			out.WriteByte('\n')
		}
	}
	for _, chain := range table.Chains {
		if chain.Deleted {
			fmt.Fprintf(out, "-X %s\n", chain.Name)
		}
	}
	out.WriteString("COMMIT\n")
}

// GetTable returns the table named table; an error when dump has none.
func (dump *IPTablesDump) GetTable(table iptables.Table) (*Table, error) {
	for i := range dump.Tables {
		if dump.Tables[i].Name == table {
			return &dump.Tables[i], nil
		}
	}
	return nil, fmt.Errorf("no table %q", table)
}

// GetChain returns chain of table; an error when dump has no such table or chain.
func (dump *IPTablesDump) GetChain(table iptables.Table, chain iptables.Chain) (*Chain, error) {
	t, err := dump.GetTable(table)
	if err != nil {
		return nil, err
	}
	if c := t.chain(chain); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("no chain %q in table %q", chain, table)
}

// chain returns the chain named name, nil when table has none.
func (table *Table) chain(name iptables.Chain) *Chain {
	for i := range table.Chains {
		if table.Chains[i].Name == name {
			return &table.Chains[i]
		}
	}
	return nil
}

// clone copies dump deeply enough that changing the copy's tables, chains and rule lists leaves
// dump as it was (rules themselves are shared: nothing changes a parsed rule).
func (dump *IPTablesDump) clone() *IPTablesDump {
	tables := make([]Table, len(dump.Tables))
	for i, table := range dump.Tables {
		chains := make([]Chain, len(table.Chains))
		for j, chain := range table.Chains {
			chain.Rules = append([]*Rule(nil), chain.Rules...)
			chains[j] = chain
		}
		tables[i] = Table{Name: table.Name, Chains: chains}
	}
	return &IPTablesDump{Tables: tables}
}
