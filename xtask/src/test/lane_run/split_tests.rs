//! Tests of a lane split over machines: its run lists and runs one slice of its specs and
//! accepts the other slices' skips, nothing else new.

#![allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use super::{
    Ran, SuiteRun,
    tests::{no_skips, report_of},
};
use crate::test::{partition::Slice, report};

/// A stand-in for dra-e2e that splits as `--partition slice:k/n` does: of `specs`, slice k lists
/// and runs (passes) the k-th even share, the others are skipped `in shard j of n`. Every call's
/// arguments go to `calls.txt`.
fn slicing_runner(dir: &Path, specs: &[&str]) -> PathBuf {
    std::fs::write(dir.join("specs.txt"), specs.iter().map(|s| format!("{s}\n")).collect::<String>())
        .unwrap();
    let script = format!(
        r#"#!/bin/sh
echo "$*" >> {d}/calls.txt
list=no; json=; k=1; n=1
while [ $# -gt 0 ]; do
  case "$1" in
    --list) list=yes;;
    --json-report) json="$2"; shift;;
    --partition) k=${{2#slice:}}; k=${{k%/*}}; n=${{2#*/}}; shift;;
  esac
  shift
done
awk -v k=$k -v n=$n -v list=$list -v total=$(wc -l < {d}/specs.txt) '
  {{ j = int((NR - 1) * n / total) + 1 }}
  list == "yes" {{ if (j == k) print; next }}
  {{ state = (j == k) ? "passed" : "skipped"; msg = (j == k) ? "" : "in shard " j " of " n
     out = out sep "{{\"LeafNodeText\":\"" $0 "\",\"State\":\"" state "\",\"Failure\":{{\"Message\":\"" msg "\"}}}}"; sep = "," }}
  END {{ if (list != "yes") print "[{{\"SpecReports\":[" out "]}}]" > "'"$json"'" }}' {d}/specs.txt
"#,
        d = dir.display()
    );
    let program = dir.join("slicing-dra-e2e");
    std::fs::write(&program, script).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    program
}

#[tokio::test]
async fn a_split_lane_lists_and_runs_its_slice_and_accepts_the_others_as_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let runner = slicing_runner(dir.path(), &["a", "b", "c", "d", "e"]);
    let mut counted = Vec::new();
    for index in 1..=2 {
        let slice = Slice { index, total: 2 };
        let suite =
            SuiteRun::in_dir(dir.path(), dir.path(), &["--focus", "x"], "suites", "1").sliced(Some(slice));
        let ran = suite.run(&runner, Path::new("/k.conf"), "v1.37.2").await.unwrap();
        counted.push(ran.judge(&no_skips()).unwrap());
    }
    assert_eq!(
        counted,
        [
            "3 passed of 3 selected (slice 1/2; 2 in the other slices)",
            "2 passed of 2 selected (slice 2/2; 3 in the other slices)"
        ]
    );
    // The list and the run of each slice both had its flag.
    let calls = std::fs::read_to_string(dir.path().join("calls.txt")).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len(), 4, "{calls:?}");
    for (call, slice) in calls.iter().zip(["slice:1/2", "slice:1/2", "slice:2/2", "slice:2/2"]) {
        assert!(call.contains(&format!("--partition {slice} --focus x")), "{call}");
    }
    assert!(calls[0].contains("--list") && !calls[1].contains("--list"), "{calls:?}");
    // Unsplit, the same runner lists and runs all five.
    let whole = SuiteRun::in_dir(dir.path(), dir.path(), &["--focus", "x"], "suites", "1").sliced(None);
    let ran = whole.run(&runner, Path::new("/k.conf"), "v1.37.2").await.unwrap();
    assert_eq!(ran.judge(&no_skips()).unwrap(), "5 passed of 5 selected");
}

#[test]
fn a_split_lane_accepts_no_other_new_skip() {
    let ran = |slice: Option<Slice>, listed: &[&str], specs: &[(&str, &str, &str)]| Ran {
        stem: "suites".into(),
        expected: listed.iter().map(|s| s.to_string()).collect(),
        code: 0,
        specs: report::specs(&report_of(specs)),
        slice,
    };
    let first = Some(Slice { index: 1, total: 2 });
    let ok = ran(first, &["a"], &[("a", "passed", ""), ("b", "skipped", "in shard 2 of 2")]);
    assert_eq!(ok.judge(&no_skips()).unwrap(), "1 passed of 1 selected (slice 1/2; 1 in the other slices)");
    let cases = [
        // A listed spec skipped as another slice's: the list and the run disagree.
        (
            ran(first, &["a", "b"], &[("a", "passed", ""), ("b", "skipped", "in shard 2 of 2")]),
            "skipped for a reason",
        ),
        // Its own slice, another split, another reason: not another slice's.
        (ran(first, &["a"], &[("a", "passed", ""), ("b", "skipped", "in shard 1 of 2")]), "does not list"),
        (ran(first, &["a"], &[("a", "passed", ""), ("b", "skipped", "in shard 2 of 3")]), "does not list"),
        (ran(first, &["a"], &[("a", "passed", ""), ("b", "skipped", "needs 2 nodes")]), "does not list"),
        (ran(first, &["a"], &[("a", "passed", ""), ("b", "passed", "")]), "does not list"),
        // An unsplit lane accepts no shard's skip.
        (ran(None, &["a"], &[("a", "passed", ""), ("b", "skipped", "in shard 2 of 2")]), "does not list"),
    ];
    for (ran, says) in cases {
        let err = format!("{:#}", ran.judge(&no_skips()).unwrap_err());
        assert!(err.contains(says), "{:?}: {err}", ran.specs);
    }
}
