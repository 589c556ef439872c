// ginkgo-json-check decodes a JSON report with ginkgo's own types (strictly: an unknown field
// is an error) and prints what ginkgo's API reads from it, as JSON, for the Rust tests of
// spec-runner's --json-report.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/onsi/ginkgo/v2/types"
)

type spec struct {
	FullText    string
	Labels      []string
	State       string
	RunTimeNs   int64
	NumAttempts int
	Failure     string
	// Where the failure happened: ginkgo's node type and its context ("It" and "leaf-node"
	// for a spec's body, "BeforeEach", "DeferCleanup (Each)" ... for the nodes around it).
	FailureNode    string
	FailureContext string
	ForwardedPanic string
	Flaky          bool
	StartBefore    bool
	Entries        []string
}

type summary struct {
	Suite         string
	Succeeded     bool
	Seed          int64
	FlakeAttempts int
	ParallelTotal int
	TotalSpecs    int
	SpecsWillRun  int
	RunTimeNs     int64
	Specs         []spec
	FailedCount   int
	FlakedCount   int
	SkippedCount  int
	PassedCount   int
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ginkgo-json-check REPORT.json")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var reports []types.Report
	if err := dec.Decode(&reports); err != nil {
		fmt.Fprintf(os.Stderr, "decoding with ginkgo's types failed: %v\n", err)
		os.Exit(1)
	}
	if len(reports) != 1 {
		fmt.Fprintf(os.Stderr, "expected one report, got %d\n", len(reports))
		os.Exit(1)
	}
	r := reports[0]
	out := summary{
		Suite:         r.SuiteDescription,
		Succeeded:     r.SuiteSucceeded,
		Seed:          r.SuiteConfig.RandomSeed,
		FlakeAttempts: r.SuiteConfig.FlakeAttempts,
		ParallelTotal: r.SuiteConfig.ParallelTotal,
		TotalSpecs:    r.PreRunStats.TotalSpecs,
		SpecsWillRun:  r.PreRunStats.SpecsThatWillRun,
		RunTimeNs:     int64(r.RunTime),
		FailedCount:   r.SpecReports.CountWithState(types.SpecStateFailureStates),
		FlakedCount:   r.SpecReports.CountOfFlakedSpecs(),
		SkippedCount:  r.SpecReports.CountWithState(types.SpecStateSkipped),
		PassedCount:   r.SpecReports.CountWithState(types.SpecStatePassed),
	}
	for _, s := range r.SpecReports {
		out.Specs = append(out.Specs, spec{
			FullText:       s.FullText(),
			Labels:         s.Labels(),
			State:          s.State.String(),
			RunTimeNs:      int64(s.RunTime),
			NumAttempts:    s.NumAttempts,
			Failure:        s.Failure.Message,
			FailureNode:    nodeType(s.Failure.FailureNodeType),
			FailureContext: failureContext(s.Failure.FailureNodeContext),
			ForwardedPanic: s.Failure.ForwardedPanic,
			Flaky:          s.State == types.SpecStatePassed && s.NumAttempts > 1,
			StartBefore:    !s.StartTime.After(s.EndTime),
			Entries:        entries(s.ReportEntries),
		})
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// entries renders report entries as "name=value (visibility)", the value as ginkgo decodes it.
func entries(list types.ReportEntries) []string {
	out := []string{}
	for _, e := range list {
		out = append(out, fmt.Sprintf("%s=%v (%s)", e.Name, e.GetRawValue(), e.Visibility))
	}
	return out
}

// nodeType is ginkgo's name of a node type; "" for none (a spec that did not fail).
func nodeType(t types.NodeType) string {
	if t == types.NodeTypeInvalid {
		return ""
	}
	return t.String()
}

// failureContext is ginkgo's name of a failure's node context; "" for none.
func failureContext(c types.FailureNodeContext) string {
	if c == types.FailureNodeContextInvalid {
		return ""
	}
	return c.String()
}
