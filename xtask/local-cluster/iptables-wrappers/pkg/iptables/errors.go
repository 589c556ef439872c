package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// commandError is a failed run of an iptables binary: the command line, the underlying error
// (an *exec.ExitError when it ran) and what it printed.
type commandError struct {
	command string
	args    []string
	output  string
	err     error
}

func newCommandError(command string, args []string, output []byte, err error) error {
	return &commandError{command: command, args: args, output: strings.TrimSpace(string(output)), err: err}
}

func (e *commandError) Error() string {
	msg := fmt.Sprintf("%s %s: %v", e.command, quoteArgs(e.args), e.err)
	if e.output != "" {
		msg += ": " + e.output
	}
	return msg
}

func (e *commandError) Unwrap() error { return e.err }

// notFoundMessages are what iptables prints (legacy or nft variant, old or new) when a chain,
// rule, target or table that a command names does not exist.
var notFoundMessages = []string{
	// -F/-X/-A/-I of a missing chain; -C/-D of a missing rule with iptables-legacy.
	"No chain/target/match by that name",
	// -j MISSING-CHAIN with iptables-legacy (it looks for a target extension of that name).
	"No such file or directory",
	// -C/-D of a missing rule, or in a missing chain.
	"does a matching rule exist",
	// -j MISSING-CHAIN, or a missing chain or table, with iptables-nft.
	"does not exist",
}

// IsNotFoundError says whether err is an iptables error saying that a chain, rule, target or
// table does not exist. It reads the message, so use it to decide whether an error is worth
// reporting, not for anything that must be exact.
func IsNotFoundError(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	for _, notFound := range notFoundMessages {
		if strings.Contains(msg, notFound) {
			return true
		}
	}
	return false
}

// resourceProblemStatus is the exit status of iptables when it could not try the operation,
// e.g. when it timed out waiting for the xtables lock.
const resourceProblemStatus = 4

// isResourceError says whether err is an iptables run that could not try its operation, so
// that it says nothing about the rules.
func isResourceError(err error) bool {
	return exitStatus(err) == resourceProblemStatus
}

// ParseError is the error of an iptables-restore run that reported the line of its input it
// failed on.
type ParseError interface {
	error
	// Line is the number of the line iptables-restore failed on; the first line is 1.
	Line() int
}

// parseError implements ParseError.
type parseError struct {
	command string
	line    int
	output  string
}

func (e *parseError) Line() int { return e.line }

func (e *parseError) Error() string {
	return fmt.Sprintf("%s failed on line %d of its input: %s", e.command, e.line, e.output)
}

// restoreErrorLine finds the input line in iptables-restore's messages, which vary with the
// variant and the kind of failure:
//
//	iptables-restore: line 7 failed                  (legacy, failed commit)
//	iptables-restore: line 7 failed: <reason>        (nft, failed command)
//	line 7: CHAIN_DEL failed (<reason>): chain FOO   (nft, failed commit)
//	Error occurred at line: 7                        (both, bad syntax)
//	iptables-restore: COMMIT expected at line 7      (both, truncated input)
var restoreErrorLine = []*regexp.Regexp{
	regexp.MustCompile(`Error occurred at line: (\d+)`),
	regexp.MustCompile(`\bline (\d+) failed`),
	regexp.MustCompile(`(?m)^line (\d+): `),
	regexp.MustCompile(`\bexpected at line (\d+)`),
}

// parseRestoreError returns the ParseError that output, what command (an iptables-restore)
// printed when it failed, describes; false when output names no line.
func parseRestoreError(command string, output []byte) (ParseError, bool) {
	for _, re := range restoreErrorLine {
		match := re.FindSubmatch(output)
		if match == nil {
			continue
		}
		line, err := strconv.Atoi(string(match[1]))
		if err != nil || line < 1 {
			continue
		}
		return &parseError{command: command, line: line, output: strings.TrimSpace(string(output))}, true
	}
	return nil, false
}

// LineData is one numbered line of iptables-restore input.
type LineData struct {
	// Line is the line's number; the first line is 1.
	Line int
	// Data is the line, without its newline.
	Data string
}

// ExtractLines returns line number line of data with the count lines before and after it (fewer
// at the start or end of data), e.g. to show the context of a ParseError; nil when line < 1.
func ExtractLines(data []byte, line, count int) []LineData {
	if line < 1 {
		return nil
	}
	first, last := max(line-count, 1), line+count
	var lines []LineData
	scanner := bufio.NewScanner(bytes.NewReader(data))
	scanner.Buffer(nil, len(data)+1)
	for n := 1; n <= last && scanner.Scan(); n++ {
		if n >= first {
			lines = append(lines, LineData{Line: n, Data: scanner.Text()})
		}
	}
	return lines
}
