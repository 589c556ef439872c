package testing

import (
	"fmt"
	"strings"

	"sigs.k8s.io/iptables-wrappers/pkg/iptables"
)

// Rule is one parsed "-A CHAIN ..." line of iptables-save data, with the parameters that
// kube-proxy's rules use. A parameter that takes a value is an *IPTablesValue, nil when the rule
// lacks it; one that takes none is a *bool: nil when absent, true when present, false when
// negated ("! --rcheck"). "-m MODULE" is not recorded: the parameters' names say enough.
type Rule struct {
	// Raw is the line as given (for rules added by EnsureRule, as iptables-save would print it).
	Raw string

	// Chain is the chain the rule is in (-A).
	Chain iptables.Chain
	// Comment is the comment module's --comment.
	Comment *IPTablesValue

	// Protocol is -p.
	Protocol *IPTablesValue
	// InInterface is -i.
	InInterface *IPTablesValue
	// OutInterface is -o.
	OutInterface *IPTablesValue

	// SourceAddress is -s: an IP address or a CIDR.
	SourceAddress *IPTablesValue
	// SourceType is addrtype's --src-type (e.g. LOCAL).
	SourceType *IPTablesValue
	// SourcePort is tcp's, udp's or sctp's --sport.
	SourcePort *IPTablesValue

	// DestinationAddress is -d: an IP address or a CIDR.
	DestinationAddress *IPTablesValue
	// DestinationType is addrtype's --dst-type (e.g. LOCAL).
	DestinationType *IPTablesValue
	// DestinationPort is tcp's, udp's or sctp's --dport.
	DestinationPort *IPTablesValue

	// MatchSet is the set module's --match-set (the set's name; its flags are not recorded).
	MatchSet *IPTablesValue

	// Jump is -j: a chain or a target such as ACCEPT or DNAT.
	Jump *IPTablesValue
	// Goto is -g: a chain.
	Goto *IPTablesValue
	// RandomFully is MASQUERADE's --random-fully.
	RandomFully *bool
	// Probability is statistic's --probability.
	Probability *IPTablesValue
	// DNATDestination is DNAT's --to-destination.
	DNATDestination *IPTablesValue
	// SNATSource is SNAT's --to-source.
	SNATSource *IPTablesValue
	// RejectWith is REJECT's --reject-with.
	RejectWith *IPTablesValue

	// AffinityCheck is recent's --rcheck.
	AffinityCheck *bool
	// MarkCheck is mark's --mark.
	MarkCheck *IPTablesValue
	// CTStateCheck is conntrack's --ctstate.
	CTStateCheck *IPTablesValue
	// NFAcctName is nfacct's --nfacct-name.
	NFAcctName *IPTablesValue

	// AffinityName is recent's --name.
	AffinityName *IPTablesValue
	// AffinitySeconds is recent's --seconds.
	AffinitySeconds *IPTablesValue
	// AffinitySet is recent's --set.
	AffinitySet *bool
	// AffinityReap is recent's --reap.
	AffinityReap *bool
	// StatisticMode is statistic's --mode.
	StatisticMode *IPTablesValue
}

// IPTablesValue is the value of a parameter of a Rule and whether the rule negates it ("! -s
// 10.0.0.0/8" matches what is not in 10.0.0.0/8).
type IPTablesValue struct {
	// Negated says that the parameter was preceded by "!".
	Negated bool
	// Value is the parameter's value, unquoted.
	Value string
}

// String shows v for debugging: the quoted value, prefixed by NOT when negated.
func (v *IPTablesValue) String() string {
	if v.Negated {
		return fmt.Sprintf("NOT %q", v.Value)
	}
	return fmt.Sprintf("%q", v.Value)
}

// Matches says whether the parameter accepts value: value equals v.Value, or differs from it when
// v is negated.
func (v *IPTablesValue) Matches(value string) bool {
	return (v.Value == value) != v.Negated
}

// ruleParam says how ParseRule records one parameter: value is the field of a parameter that takes
// a value, flag that of one that does not.
type ruleParam struct {
	negatable bool
	value     func(*Rule) **IPTablesValue
	flag      func(*Rule) **bool
}

func valueParam(negatable bool, field func(*Rule) **IPTablesValue) ruleParam {
	return ruleParam{negatable: negatable, value: field}
}

func flagParam(negatable bool, field func(*Rule) **bool) ruleParam {
	return ruleParam{negatable: negatable, flag: field}
}

// ruleParams are the parameters ParseRule knows, by every name iptables accepts for them.
var ruleParams = func() map[string]ruleParam {
	params := map[string]ruleParam{}
	add := func(param ruleParam, names ...string) {
		for _, name := range names {
			params[name] = param
		}
	}
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.Comment }), "--comment")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.Protocol }), "-p", "--protocol")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.InInterface }), "-i", "--in-interface")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.OutInterface }), "-o", "--out-interface")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.SourceAddress }), "-s", "--source", "--src")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.SourceType }), "--src-type")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.SourcePort }), "--sport", "--source-port")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.DestinationAddress }), "-d", "--destination", "--dst")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.DestinationType }), "--dst-type")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.DestinationPort }), "--dport", "--destination-port")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.MatchSet }), "--match-set")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.Jump }), "-j", "--jump")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.Goto }), "-g", "--goto")
	add(flagParam(false, func(r *Rule) **bool { return &r.RandomFully }), "--random-fully")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.Probability }), "--probability")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.DNATDestination }), "--to-destination")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.SNATSource }), "--to-source")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.RejectWith }), "--reject-with")
	add(flagParam(true, func(r *Rule) **bool { return &r.AffinityCheck }), "--rcheck")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.MarkCheck }), "--mark")
	add(valueParam(true, func(r *Rule) **IPTablesValue { return &r.CTStateCheck }), "--ctstate")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.NFAcctName }), "--nfacct-name")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.AffinityName }), "--name")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.AffinitySeconds }), "--seconds")
	add(flagParam(true, func(r *Rule) **bool { return &r.AffinitySet }), "--set")
	add(flagParam(false, func(r *Rule) **bool { return &r.AffinityReap }), "--reap")
	add(valueParam(false, func(r *Rule) **IPTablesValue { return &r.StatisticMode }), "--mode")
	return params
}()

// ParseRule parses rule, a "-A CHAIN ..." line. With strict, a parameter that Rule has no field
// for is an error; without, it is skipped (with its value, if that does not look like a
// parameter).
func ParseRule(rule string, strict bool) (*Rule, error) {
	words := splitWords(rule)
	if len(words) < 2 || (words[0] != "-A" && words[0] != "--append") {
		return nil, fmt.Errorf("bad iptables rule %q: it does not start with \"-A CHAIN\"", rule)
	}
	parsed := &Rule{Raw: rule, Chain: iptables.Chain(words[1])}
	negated := false
	for i := 2; i < len(words); i++ {
		word := words[i]
		switch {
		case (word == "-m" || word == "--match") && i+1 < len(words):
			i++ // the module's name
			continue
		case word == "!":
			if negated {
				return nil, fmt.Errorf("bad iptables rule %q: \"! !\"", rule)
			}
			negated = true
			continue
		}
		param, known := ruleParams[word]
		switch {
		case !known && strict:
			return nil, fmt.Errorf("bad iptables rule %q: unknown parameter %q", rule, word)
		case !known:
			// Skipped; a value it takes is skipped with the next round unless it looks like
			// a parameter.
		case negated && !param.negatable:
			return nil, fmt.Errorf("bad iptables rule %q: %q cannot be negated", rule, word)
		case param.flag != nil:
			present := !negated
			*param.flag(parsed) = &present
		case i+1 >= len(words):
			return nil, fmt.Errorf("bad iptables rule %q: %q needs a value", rule, word)
		default:
			i++
			*param.value(parsed) = &IPTablesValue{Negated: negated, Value: words[i]}
		}
		negated = false
	}
	if negated && strict {
		return nil, fmt.Errorf("bad iptables rule %q: it ends with \"!\"", rule)
	}
	return parsed, nil
}

// splitWords splits line into words at blanks, a double-quoted string (in which \" and \\ stand
// for " and \) making one word without its quotes, like iptables-restore does.
func splitWords(line string) []string {
	var words []string
	var word strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\'):
			i++
			word.WriteByte(line[i])
		case c == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (c == ' ' || c == '\t' || c == '\r'):
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// quoteWords joins words into a line that splitWords splits back into them, quoting a word
// with blanks or quotes as iptables-save does.
func quoteWords(words []string) string {
	quoted := make([]string, len(words))
	for i, word := range words {
		if word == "" || strings.ContainsAny(word, " \t\"\\") {
			word = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(word) + `"`
		}
		quoted[i] = word
	}
	return strings.Join(quoted, " ")
}

// ruleKey is what two rules of a chain must share to be the same rule: their words after
// "-A CHAIN" joined by single blanks, so that a comment quoted in one and not in the other (as
// in hand-written test data) does not make them differ.
func ruleKey(words []string) string {
	return strings.Join(words, " ")
}
