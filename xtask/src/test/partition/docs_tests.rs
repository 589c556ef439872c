//! Tests that keep the docs of `--partition` true: docs/lanes.md's table of machines is the plan
//! the code computes, and docs/ci.md's example matrices (GitHub Actions, GitLab) run every
//! machine of it exactly once with `cargo xtask test --partition k/N`.

#![allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.

use std::time::Duration;

use super::{
    Partition,
    plan::{self, Plan, describe_builds, describe_clusters},
};
use crate::{progress::human, test::doc_table};

/// How many machines the docs show.
const DOC_MACHINES: u32 = 3;

/// The heading of the machines' table in docs/lanes.md.
const LANES_HEADING: &str = "## Split over machines (`--partition M/N`)";

/// The heading of this section of docs/ci.md.
const CI_HEADING: &str = "## `cargo xtask test` over CI machines (`--partition M/N`)";

fn doc(path: &str) -> String {
    std::fs::read_to_string(crate::repo::repo_root().join(path)).unwrap()
}

/// The table's rows for `plan`: machine, units, clusters, builds, planned time.
fn rows(plan: &Plan) -> Vec<Vec<String>> {
    let machines = plan.shares.len();
    plan.shares
        .iter()
        .zip(plan.times())
        .enumerate()
        .map(|(i, (share, time))| {
            vec![
                format!("{}/{machines}", i + 1),
                share.describe_units(),
                describe_clusters(share),
                describe_builds(share),
                human(time),
            ]
        })
        .collect()
}

/// The sentence under the table: the longest machine against the machines together and one
/// machine alone.
fn summary(plan: &Plan) -> String {
    let together: Duration = plan.times().iter().sum();
    let one = plan::plan(1).longest();
    let percent = |part: Duration, of: Duration| (100.0 * part.as_secs_f64() / of.as_secs_f64()).round();
    format!(
        "Planned, the longest machine takes {}: {}% of the {} machines' {} together, {}% of one machine's {}.",
        human(plan.longest()),
        percent(plan.longest(), together),
        plan.shares.len(),
        human(together),
        percent(plan.longest(), one),
        human(one)
    )
}

#[test]
fn the_table_of_machines_in_docs_lanes_md_is_the_plan() {
    let plan = plan::plan(DOC_MACHINES);
    let columns = ["Machine", "Runs", "Clusters", "Builds", "Planned"];
    let table: String = rows(&plan).iter().map(|row| format!("| {} |\n", row.join(" | "))).collect();
    // Read as the doc's rows are (a cell that is one code span is its content).
    let header =
        format!("{LANES_HEADING}\n\n| {} |\n|{}\n", columns.join(" | "), "---|".repeat(columns.len()));
    let expected = doc_table::rows(&format!("{header}{table}"), LANES_HEADING, &columns).unwrap();
    let lanes = doc("docs/lanes.md");
    let documented = doc_table::rows(&lanes, LANES_HEADING, &columns).unwrap();
    assert_eq!(documented, expected, "docs/lanes.md's machines must be the plan's:\n{table}");
    let summary = summary(&plan);
    assert!(lanes.contains(&summary), "docs/lanes.md must say, under the table: {summary}");
    assert!(lanes.contains(super::costs::FIGURES_OF), "docs/lanes.md must name the run the figures are of");
}

/// This section of docs/ci.md.
fn ci_section() -> String {
    let ci = doc("docs/ci.md");
    let start =
        ci.find(&format!("\n{CI_HEADING}\n")).unwrap_or_else(|| panic!("docs/ci.md has no {CI_HEADING:?}"));
    let rest = &ci[start + 1 + CI_HEADING.len()..];
    rest.split("\n## ").next().unwrap_or_default().to_owned()
}

/// The section's YAML blocks, parsed.
fn yaml_blocks(section: &str) -> Vec<serde_yaml::Value> {
    section
        .split("```yaml\n")
        .skip(1)
        .map(|block| {
            let yaml = block.split("```").next().unwrap();
            serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("a YAML block of docs/ci.md: {e}\n{yaml}"))
        })
        .collect()
}

/// Of `commands`, the machines `cargo xtask test --partition` is called with, each parsed; a
/// call with other flags fails.
fn partitions(commands: &[String]) -> Vec<Partition> {
    let mut found = Vec::new();
    for command in commands {
        for words in command.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()) {
            let Some(at) = words.windows(4).position(|w| w[..3] == ["cargo", "xtask", "test"]) else {
                continue;
            };
            // `--partition k/N` and nothing else: CI's whole run, split.
            let [flag, value] = words[at + 3..] else {
                panic!("`cargo xtask test` with more or less than `--partition k/N`: {command}")
            };
            assert_eq!(flag, "--partition", "{command}");
            found.push(Partition::parse(value).unwrap_or_else(|e| panic!("{command}: {e}")));
        }
    }
    found
}

/// Fails unless `found` is each machine 1..=N of N exactly once.
fn each_machine_once(found: &[Partition], ci: &str) {
    let machines: Vec<u32> = found.iter().map(|p| p.machines).collect();
    assert!(machines.iter().all(|n| *n == DOC_MACHINES), "{ci}: not {DOC_MACHINES} machines: {found:?}");
    let mut numbers: Vec<u32> = found.iter().map(|p| p.machine).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (1..=DOC_MACHINES).collect::<Vec<_>>(), "{ci}: each machine once: {found:?}");
}

#[test]
fn the_github_actions_matrix_runs_every_machine_once() {
    let blocks = yaml_blocks(&ci_section());
    let workflows: Vec<&serde_yaml::Value> = blocks.iter().filter(|b| b.get("jobs").is_some()).collect();
    let [workflow] = workflows.as_slice() else {
        panic!("one GitHub Actions workflow, not {}", workflows.len())
    };
    let jobs = workflow["jobs"].as_mapping().unwrap();
    let mut found = Vec::new();
    for job in jobs.values() {
        let values = job["strategy"]["matrix"]["machine"].as_sequence().unwrap();
        let steps = job["steps"].as_sequence().unwrap();
        let runs: Vec<&str> = steps.iter().filter_map(|s| s.get("run").and_then(|r| r.as_str())).collect();
        for value in values {
            let machine = value.as_u64().map(|m| m.to_string()).unwrap();
            let commands: Vec<String> =
                runs.iter().map(|run| run.replace("${{ matrix.machine }}", &machine)).collect();
            found.extend(partitions(&commands));
        }
    }
    each_machine_once(&found, "GitHub Actions");
}

#[test]
fn the_gitlab_job_runs_every_machine_once() {
    let blocks = yaml_blocks(&ci_section());
    let pipelines: Vec<&serde_yaml::Value> = blocks.iter().filter(|b| b.get("jobs").is_none()).collect();
    let [pipeline] = pipelines.as_slice() else { panic!("one GitLab pipeline, not {}", pipelines.len()) };
    let mut found = Vec::new();
    for job in pipeline.as_mapping().unwrap().values().filter(|job| job.get("parallel").is_some()) {
        // GitLab numbers a job's parallel copies CI_NODE_INDEX = 1..=CI_NODE_TOTAL.
        let total = job["parallel"].as_u64().unwrap();
        let script: Vec<&str> =
            job["script"].as_sequence().unwrap().iter().filter_map(|l| l.as_str()).collect();
        for index in 1..=total {
            let commands: Vec<String> = script
                .iter()
                .map(|line| {
                    line.replace("$CI_NODE_INDEX", &index.to_string())
                        .replace("$CI_NODE_TOTAL", &total.to_string())
                })
                .collect();
            found.extend(partitions(&commands));
        }
    }
    each_machine_once(&found, "GitLab");
}

#[test]
fn a_matrix_that_misses_or_repeats_a_machine_is_caught() {
    let calls = |values: &[&str]| -> Vec<Partition> {
        let commands: Vec<String> =
            values.iter().map(|v| format!("sudo cargo xtask test --partition {v}")).collect();
        partitions(&commands)
    };
    each_machine_once(&calls(&["1/3", "2/3", "3/3"]), "ok");
    for bad in
        [&["1/3", "2/3"][..], &["1/3", "2/3", "2/3"], &["1/3", "2/3", "3/3", "3/3"], &["1/2", "2/2", "3/3"]]
    {
        let found = calls(bad);
        assert!(std::panic::catch_unwind(|| each_machine_once(&found, "bad")).is_err(), "{bad:?} passed");
    }
}
