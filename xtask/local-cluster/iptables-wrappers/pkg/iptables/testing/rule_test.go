package testing

import (
	"reflect"
	"slices"
	"testing"
)

func value(v string) *IPTablesValue    { return &IPTablesValue{Value: v} }
func notValue(v string) *IPTablesValue { return &IPTablesValue{Negated: true, Value: v} }
func flag(present bool) *bool          { return &present }

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		rule string
		want Rule
	}{
		{
			rule: `-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			want: Rule{
				Chain:              "KUBE-SVC-XPGD46QRK7WJZT7O",
				Comment:            value("ns1/svc1:p80 cluster IP"),
				Protocol:           value("tcp"),
				DestinationAddress: value("172.30.0.41"),
				DestinationPort:    value("80"),
				SourceAddress:      notValue("10.0.0.0/8"),
				Jump:               value("KUBE-MARK-MASQ"),
			},
		},
		{
			rule: `-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m recent --name KUBE-SEP-SXIVWICOYRO3J4NJ --rcheck --seconds 10800 --reap -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ`,
			want: Rule{
				Chain:           "KUBE-SVC-XPGD46QRK7WJZT7O",
				Comment:         value("ns1/svc1:p80 -> 10.180.0.1:80"),
				AffinityName:    value("KUBE-SEP-SXIVWICOYRO3J4NJ"),
				AffinityCheck:   flag(true),
				AffinitySeconds: value("10800"),
				AffinityReap:    flag(true),
				StatisticMode:   value("random"),
				Probability:     value("0.5000000000"),
				Jump:            value("KUBE-SEP-SXIVWICOYRO3J4NJ"),
			},
		},
		{
			rule: `-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80`,
			want: Rule{
				Chain:           "KUBE-SEP-SXIVWICOYRO3J4NJ",
				Comment:         value("ns1/svc1:p80"),
				Protocol:        value("tcp"),
				Jump:            value("DNAT"),
				DNATDestination: value("10.180.0.1:80"),
			},
		},
		{
			rule: `-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
			want: Rule{
				Chain:              "KUBE-FIREWALL",
				Comment:            value("block incoming localnet connections"),
				DestinationAddress: value("127.0.0.0/8"),
				SourceAddress:      notValue("127.0.0.0/8"),
				CTStateCheck:       notValue("RELATED,ESTABLISHED,DNAT"),
				Jump:               value("DROP"),
			},
		},
		{
			rule: `-A KUBE-NODE-PORT -p tcp -m comment --comment "Kubernetes nodeport TCP port for masquerade purpose" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ`,
			want: Rule{
				Chain:    "KUBE-NODE-PORT",
				Protocol: value("tcp"),
				Comment:  value("Kubernetes nodeport TCP port for masquerade purpose"),
				MatchSet: value("KUBE-NODE-PORT-TCP"),
				Jump:     value("KUBE-MARK-MASQ"),
			},
		},
		{
			// Long names, a quoted comment with escapes, a negated flag, and unknown
			// parameters (--or-mark) skipped with their value.
			rule: `--append POSTROUTING --source 10.0.0.0/8 --out-interface eth0 -m comment --comment "say \"hi\"" -m recent ! --set -j MARK --or-mark 0x4000`,
			want: Rule{
				Chain:         "POSTROUTING",
				SourceAddress: value("10.0.0.0/8"),
				OutInterface:  value("eth0"),
				Comment:       value(`say "hi"`),
				AffinitySet:   flag(false),
				Jump:          value("MARK"),
			},
		},
		{
			rule: `-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
			want: Rule{
				Chain:       "KUBE-POSTROUTING",
				Comment:     value("kubernetes service traffic requiring SNAT"),
				Jump:        value("MASQUERADE"),
				RandomFully: flag(true),
			},
		},
		{
			rule: `-A COUNT-ONLY`,
			want: Rule{Chain: "COUNT-ONLY"},
		},
	} {
		t.Run(tc.rule, func(t *testing.T) {
			got, err := ParseRule(tc.rule, false)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.Raw = tc.rule
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("ParseRule =\n%+v\nwant\n%+v", *got, tc.want)
			}
		})
	}
}

func TestParseRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		strict bool
	}{
		{rule: "", strict: false},
		{rule: "-I INPUT -j ACCEPT", strict: false},
		{rule: "-A", strict: false},
		{rule: "-A INPUT -j", strict: false},
		{rule: "-A INPUT ! -j ACCEPT", strict: false},
		{rule: "-A INPUT ! ! -s 1.2.3.4", strict: false},
		{rule: "-A INPUT -j MARK --or-mark 0x4000", strict: true},
		{rule: "-A INPUT -s 1.2.3.4 !", strict: true},
	} {
		if rule, err := ParseRule(tc.rule, tc.strict); err == nil {
			t.Errorf("ParseRule(%q, strict %v) = %+v, want an error", tc.rule, tc.strict, rule)
		}
	}
	if _, err := ParseRule("-A INPUT -m tcp -p tcp --dport 80 -j ACCEPT", true); err != nil {
		t.Errorf("strict ParseRule of known parameters: %v", err)
	}
}

func TestIPTablesValue(t *testing.T) {
	if !value("tcp").Matches("tcp") || value("tcp").Matches("udp") {
		t.Error("a value matches only itself")
	}
	if notValue("tcp").Matches("tcp") || !notValue("tcp").Matches("udp") {
		t.Error("a negated value matches all but itself")
	}
	if got := notValue("10.0.0.0/8").String(); got != `NOT "10.0.0.0/8"` {
		t.Errorf("String() = %s", got)
	}
}

func TestSplitAndQuoteWords(t *testing.T) {
	words := []string{"-A", "INPUT", "--comment", `a "quoted" word`, `back\slash`, "", "-j", "ACCEPT"}
	line := quoteWords(words)
	if got := splitWords(line); !slices.Equal(got, words) {
		t.Errorf("splitWords(quoteWords(%q)) = %q (line %s)", words, got, line)
	}
	if got, want := splitWords(` -A  X	--comment "two words"  `), []string{"-A", "X", "--comment", "two words"}; !slices.Equal(got, want) {
		t.Errorf("splitWords = %q, want %q", got, want)
	}
	if got, want := quoteWords([]string{"--comment", "kubernetes service portals"}), `--comment "kubernetes service portals"`; got != want {
		t.Errorf("quoteWords = %s, want %s", got, want)
	}
}
