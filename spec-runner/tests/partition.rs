//! A run split over two machines, end to end on a cluster in memory: the command line's
//! `--partition`, each shard's progress output, JSON and JUnit reports, `report merge` of the
//! two, and `--rerun-failed` of the merged report.

#![allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.

use std::{
    path::Path,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use clap::Parser;
use serde_json::Value;
use spec_runner::{
    ArtifactRequest, ClusterBackend, ClusterError, ClusterInfo, Merged, NamespaceRequest, NodeInfo, Output,
    PreflightError, Registry, RunOptions, RunnerArgs, Selection, SpecError, SpecNamespace, run_on,
    run_with_backend,
};
use tokio_util::sync::CancellationToken;

/// A cluster that hands out namespaces and counts its preflights.
#[derive(Default)]
struct Memory {
    preflights: AtomicUsize,
}

#[async_trait]
impl ClusterBackend for Memory {
    async fn preflight(&self) -> Result<ClusterInfo, PreflightError> {
        self.preflights.fetch_add(1, Ordering::SeqCst);
        Ok(ClusterInfo {
            server: "https://memory".into(),
            server_version: "v1.37.2".into(),
            api_versions: ["v1".to_owned()].into(),
            nodes: vec![NodeInfo {
                name: "node".into(),
                kubelet_version: "v1.37.2".into(),
                ready: true,
                schedulable: true,
            }],
            api_server_gates: None,
        })
    }

    fn client(&self) -> kube::Client {
        let service = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<http_body_util::Empty<bytes::Bytes>>, _>(std::io::Error::other(
                "no API server",
            ))
        });
        kube::Client::new(service, "default")
    }

    async fn create_namespace(&self, request: &NamespaceRequest) -> Result<SpecNamespace, ClusterError> {
        Ok(SpecNamespace { name: format!("{}x", request.generate_name), uid: "uid".into() })
    }

    async fn delete_namespace(&self, _: &SpecNamespace) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn wait_namespace_gone(&self, _: &SpecNamespace, _: Duration) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn wait_namespace_pods_gone(&self, _: &SpecNamespace, _: Duration) -> Result<(), ClusterError> {
        Ok(())
    }

    async fn collect_artifacts(&self, _: ArtifactRequest<'_>) -> Vec<String> {
        Vec::new()
    }
}

/// Which spec bodies ran.
type Ran = Arc<Mutex<Vec<String>>>;

/// Seven specs (two `[Serial]`); `fails` fails.
fn registry(ran: &Ran) -> Registry {
    let mut reg = Registry::new();
    reg.describe("suite", |r| {
        for (name, serial) in [
            ("one", true),
            ("two", false),
            ("fails", false),
            ("three", true),
            ("four", false),
            ("five", false),
            ("six", false),
        ] {
            let ran = ran.clone();
            let spec = r.it(name, move |_ctx| {
                let ran = ran.clone();
                async move {
                    ran.lock().unwrap().push(name.to_owned());
                    if name == "fails" { Err(SpecError::fail("it fails")) } else { Ok(()) }
                }
            });
            if serial {
                spec.labels(["Serial"]);
            }
        }
    });
    reg
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    runner: RunnerArgs,
}

/// Runs of the command line in a folder of their own, and what their specs did.
struct Runs {
    dir: tempfile::TempDir,
    ran: Ran,
}

impl Runs {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap(), ran: Ran::default() }
    }

    /// A file in the folder.
    fn file(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    /// `dra-e2e -p 2 --seed 1 ARGS…` on a cluster in memory: the exit code and how often the
    /// cluster was asked for its preflight.
    async fn run(&self, args: &[&str]) -> (ExitCode, usize) {
        let artifacts = self.file("artifacts");
        let line = ["dra-e2e", "-p", "2", "--seed", "1", "--artifacts", &artifacts];
        let cli = Cli::parse_from(line.iter().chain(args));
        let backend = Arc::new(Memory::default());
        let code = run_on(registry(&self.ran), cli.runner, backend.clone()).await;
        (code, backend.preflights.load(Ordering::SeqCst))
    }

    /// The names of the spec bodies that ran since the last call, sorted.
    fn took(&self) -> Vec<String> {
        let mut names = std::mem::take(&mut *self.ran.lock().unwrap());
        names.sort();
        names
    }
}

fn json(path: &Path) -> Vec<Value> {
    let report: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    report[0]["SpecReports"].as_array().unwrap().clone()
}

fn text(spec: &Value) -> &str {
    spec["LeafNodeText"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_cover_the_selection_merge_and_rerun_what_failed() {
    let runs = Runs::new();
    let (s1, s2, j1) = (runs.file("s1.json"), runs.file("s2.json"), runs.file("s1.xml"));

    // slice: the serial specs dealt first (one, three), then the others in registration order.
    let (code, _) = runs.run(&["--partition", "slice:1/2", "--json-report", &s1, "--junit", &j1]).await;
    assert_eq!(code, ExitCode::SUCCESS);
    assert_eq!(runs.took(), ["four", "one", "six", "two"]);
    let (code, _) = runs.run(&["--partition", "slice:2/2", "--json-report", &s2]).await;
    assert_eq!(code, ExitCode::from(1), "shard 2 runs `fails`");
    assert_eq!(runs.took(), ["fails", "five", "three"]);

    // Each shard's report lists the whole selection: the other shard's specs as skipped.
    let specs = json(Path::new(&s1));
    assert_eq!(specs.len(), 7);
    for spec in &specs {
        let mine =
            ["one", "two", "four", "six"].iter().any(|n| text(spec).starts_with(&format!("suite {n}")));
        if mine {
            assert_eq!(spec["ReportEntries"].as_array().unwrap().last().unwrap()["Name"], "shard", "{spec}");
            assert_eq!(
                spec["ReportEntries"].as_array().unwrap().last().unwrap()["Value"]["Representation"],
                "1/2"
            );
        } else {
            assert_eq!(
                (spec["State"].as_str(), spec["NumAttempts"].as_u64()),
                (Some("skipped"), Some(0)),
                "{spec}"
            );
            assert_eq!(spec["Failure"]["Message"], "in shard 2 of 2", "{spec}");
        }
    }
    let junit = std::fs::read_to_string(&j1).unwrap();
    assert_eq!(junit.matches(r#"<skipped message="in shard 2 of 2"/>"#).count(), 3, "{junit}");

    // The merge: each spec once, saying where; the failure fails it.
    let merged = Merged::read(&[s1.clone().into(), s2.clone().into()]).unwrap();
    assert_eq!(merged.problems(), Vec::<String>::new());
    assert!(!merged.succeeded());
    let summary = merged.summary();
    assert!(summary.contains("Every spec of the selection ran in exactly one shard."), "{summary}");
    assert!(summary.contains("  2/2 failed     suite fails\n"), "{summary}");
    assert!(summary.contains("  1/2 passed     suite two\n"), "{summary}");
    let (all, xml) = (runs.file("all.json"), runs.file("all.xml"));
    merged.write(Some(Path::new(&all)), Some(Path::new(&xml))).unwrap();
    let merged_specs = json(Path::new(&all));
    assert_eq!(merged_specs.len(), 7);
    assert!(merged_specs.iter().all(|s| s["State"] != "skipped"), "{merged_specs:?}");
    let junit = std::fs::read_to_string(&xml).unwrap();
    assert_eq!((junit.matches("<testcase ").count(), junit.matches("<failure").count()), (7, 1), "{junit}");

    // Only what failed runs again, under its name, and nothing else.
    let rerun = runs.file("rerun.json");
    let (code, _) = runs.run(&["--rerun-failed", &all, "--json-report", &rerun]).await;
    assert_eq!(code, ExitCode::from(1));
    assert_eq!(runs.took(), ["fails"]);
    assert_eq!(json(Path::new(&rerun)).iter().map(text).collect::<Vec<_>>(), ["suite fails"]);

    // A report without failures: nothing runs, the cluster is never asked.
    let (code, preflights) = runs.run(&["--rerun-failed", &s1]).await;
    assert_eq!((code, preflights), (ExitCode::SUCCESS, 0));
    assert_eq!(runs.took(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_refuses_overlaps_and_gaps_but_not_rounds() {
    let runs = Runs::new();
    let (s1, s2, rounds) = (runs.file("s1.json"), runs.file("s2.json"), runs.file("rounds.json"));
    runs.run(&["--partition", "hash:1/2", "--json-report", &s1]).await;
    runs.run(&["--partition", "hash:2/2", "--json-report", &s2]).await;
    runs.run(&["--partition", "slice:1/1", "--repeat", "2", "--json-report", &rounds]).await;

    let only_one = Merged::read(&[s1.clone().into()]).unwrap();
    let [gap] = &only_one.problems()[..] else { panic!("{:?}", only_one.problems()) };
    assert!(
        gap.contains("specs of the selection ran in no shard") && gap.contains("(in shard 2 of 2)"),
        "{gap}"
    );
    let twice = Merged::read(&[s1.clone().into(), s2.clone().into(), s2.clone().into()]).unwrap();
    let [overlap] = &twice.problems()[..] else { panic!("{:?}", twice.problems()) };
    assert!(
        overlap.contains("specs ran in more than one shard") && overlap.contains("shard 2/2"),
        "{overlap}"
    );
    // Every spec twice in one file: rounds of one run, no overlap.
    let repeated = Merged::read(&[rounds.into()]).unwrap();
    assert_eq!(repeated.problems(), Vec::<String>::new());
    assert_eq!(repeated.run_report().repeat, 2);
    assert_eq!(repeated.run_report().specs.len(), 14);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_progress_output_names_the_shard_and_each_spec_of_the_others() {
    let runs = Runs::new();
    let cli = Cli::parse_from(["dra-e2e", "--partition", "slice:2/3", "-v"]);
    let selection: Selection = cli.runner.selection().unwrap();
    let (output, buffer) = Output::capture();
    let options = RunOptions {
        procs: 2,
        output,
        artifacts: runs.file("artifacts").into(),
        seed: Some(1),
        ..cli.runner.options()
    };
    let backend = Arc::new(Memory::default());
    let report =
        run_with_backend(registry(&runs.ran), &selection, options, backend, CancellationToken::new()).await;
    assert_eq!(runs.took(), ["four", "three"]);
    assert_eq!(report.skipped(), 5);
    let out = buffer.contents();
    assert!(out.contains("Running 2 of 7 specs"), "{out}");
    assert!(
        out.contains(
            "This run is shard 2 of 3 by slice (--partition slice:2/3); the 5 selected specs of the other shards are reported as skipped."
        ),
        "{out}"
    );
    assert!(out.contains("SKIP [    0.00s] suite two -- in shard 3 of 3\n"), "{out}");
    assert!(out.contains("5 of the skipped spec runs are other shards' (--partition)."), "{out}");
}
