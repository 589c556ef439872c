package iptables

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestIsNotFoundError(t *testing.T) {
	for _, tc := range []struct {
		message string
		want    bool
	}{
		{"iptables: No chain/target/match by that name.", true},
		{"iptables: Bad rule (does a matching rule exist in that chain?).", true},
		{"iptables v1.8.9 (nf_tables): Chain 'KUBE-SVC-X' does not exist", true},
		{"iptables v1.8.2 (legacy): Couldn't load target `KUBE-SVC-X':No such file or directory", true},
		{"iptables: Chain already exists.", false},
		{"iptables v1.8.9 (nf_tables):  CHAIN_DEL failed (Device or resource busy): chain FOO", false},
		{"Another app is currently holding the xtables lock.", false},
	} {
		err := fmt.Errorf("iptables -w 5 -t nat -X FOO: exit status 1: %s", tc.message)
		if got := IsNotFoundError(err); got != tc.want {
			t.Errorf("IsNotFoundError(%q) = %v, want %v", tc.message, got, tc.want)
		}
	}
	if IsNotFoundError(nil) {
		t.Error("IsNotFoundError(nil) = true")
	}
}

func TestParseRestoreError(t *testing.T) {
	// Messages of iptables 1.8.9's iptables-restore (nft and legacy variants).
	for _, tc := range []struct {
		output string
		line   int
	}{
		{"iptables-restore: line 7 failed\n", 7},
		{"iptables-restore: line 12 failed: No chain/target/match by that name.\n", 12},
		{"iptables-restore v1.8.9 (nf_tables): \nline 4: CHAIN_DEL failed (Device or resource busy): chain FOO\n", 4},
		{"iptables-restore v1.8.9 (legacy): Couldn't load target `NOSUCH':No such file or directory\n\nError occurred at line: 4\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n", 4},
		{"iptables-restore v1.8.9 (nf_tables): unknown option \"--bogus\"\nError occurred at line: 31\n", 31},
		{"iptables-restore: COMMIT expected at line 3\n", 3},
		{"iptables-restore: unable to initialize table 'nat'\n", 0},
		{"iptables-restore: line 0 failed\n", 0},
		{"", 0},
	} {
		parseErr, ok := parseRestoreError("iptables-restore", []byte(tc.output))
		switch {
		case ok != (tc.line > 0):
			t.Errorf("parseRestoreError(%q) found a line: %v, want %v", tc.output, ok, tc.line > 0)
		case ok && parseErr.Line() != tc.line:
			t.Errorf("parseRestoreError(%q) = line %d, want %d", tc.output, parseErr.Line(), tc.line)
		}
	}
}

func TestExtractLines(t *testing.T) {
	data := []byte("one\ntwo\nthree\nfour\nfive")
	numbers := func(lines []LineData) []int {
		var out []int
		for _, line := range lines {
			out = append(out, line.Line)
		}
		return out
	}
	for _, tc := range []struct {
		line, count int
		want        []int
	}{
		{3, 1, []int{2, 3, 4}},
		{1, 2, []int{1, 2, 3}},
		{5, 3, []int{2, 3, 4, 5}},
		{4, 0, []int{4}},
		{9, 1, nil},
		{0, 3, nil},
	} {
		got := ExtractLines(data, tc.line, tc.count)
		if !slices.Equal(numbers(got), tc.want) {
			t.Errorf("ExtractLines(line %d, count %d) = %+v, want lines %v", tc.line, tc.count, got, tc.want)
		}
	}
	if got := ExtractLines(data, 2, 0); len(got) != 1 || got[0] != (LineData{Line: 2, Data: "two"}) {
		t.Errorf("ExtractLines(2, 0) = %+v", got)
	}
}

func TestCommandErrorKeepsTheExitStatus(t *testing.T) {
	h := newFakeHost(t)
	client, err := New(t.Context(), ProtocolIPv4, UseInstalledMode)
	if err != nil {
		t.Fatal(err)
	}
	h.setFile("busy", []byte{})
	_, err = client.ChainExists(t.Context(), TableNAT, ChainPostrouting)
	var cmdErr *commandError
	if !errors.As(err, &cmdErr) || exitStatus(err) != resourceProblemStatus || !isResourceError(err) {
		t.Errorf("ChainExists while the lock is held = %v, want a resource error", err)
	}
}
