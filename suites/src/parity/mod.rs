//! Spec parity with upstream, per Kubernetes version: for every list committed as
//! `suites/upstream/specs-V.txt` (written by `cargo xtask upstream-specs V` from upstream's own
//! ginkgo dry run with `--ginkgo.focus=DRA`), the specs `dra-e2e --list --k8s-version V` prints,
//! with their labels, must be the list's, except what `suites/upstream/parity-V.txt` declares.
//! `cargo xtask test --no-cluster` runs it (it is part of `cargo test --workspace`).

mod compare;
mod files;

use std::path::{Path, PathBuf};

use harness::framework::{GateTable, Registry, Selection};

use self::files::{Declaration, Spec, parse_declarations, parse_upstream};
use crate::versions::TABLES;

/// The committed lists and declarations, relative to the suites crate.
const UPSTREAM_DIR: &str = "upstream";

fn upstream_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(UPSTREAM_DIR)
}

/// `specs-V.txt` of a version.
fn list_path(dir: &Path, version: &str) -> PathBuf {
    dir.join(format!("specs-{version}.txt"))
}

/// `parity-V.txt` of a version.
fn declarations_path(dir: &Path, version: &str) -> PathBuf {
    dir.join(format!("parity-{version}.txt"))
}

/// The versions of the committed lists (`specs-V.txt`), sorted.
fn committed_versions(dir: &Path) -> Result<Vec<String>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut versions: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("specs-")?.strip_suffix(".txt").map(str::to_owned)
        })
        .collect();
    versions.sort();
    Ok(versions)
}

/// Reads and parses upstream's list of a version; the error says how to make it.
fn read_upstream(path: &Path, version: &str) -> Result<Vec<Spec>, String> {
    let content = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read upstream's spec list {}: {e}. `cargo xtask upstream-specs {version}` writes it",
            path.display()
        )
    })?;
    parse_upstream(&content).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_declarations(path: &Path) -> Result<Vec<Declaration>, String> {
    let content =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_declarations(&content).map_err(|e| format!("{}: {e}", path.display()))
}

/// The registry `dra-e2e --k8s-version V` runs and lists.
fn registry(table: &'static GateTable) -> Registry {
    let mut registry = Registry::for_version(table);
    crate::specs::register(&mut registry);
    registry.validate().unwrap_or_else(|e| panic!("{table}: {e}"));
    registry
}

fn our_specs(registry: &Registry) -> Vec<Spec> {
    registry
        .specs()
        .map(|s| Spec {
            text: s.full_text().to_owned(),
            labels: s.labels().iter().cloned().collect(),
            origin: format!("registered #{}", s.index()),
        })
        .collect()
}

/// The table of a committed list's version.
fn table(version: &str) -> &'static GateTable {
    TABLES.iter().find(|t| t.version == version).unwrap_or_else(|| {
        panic!(
            "suites/upstream/specs-{version}.txt is committed but the suite has no gate table for {version} (suites/src/versions.rs)"
        )
    })
}

#[test]
fn every_committed_list_matches_the_texts_of_its_version() {
    let dir = upstream_dir();
    let versions = committed_versions(&dir).unwrap();
    assert!(!versions.is_empty(), "no specs-V.txt in {}", dir.display());
    let mut failures = Vec::new();
    for version in &versions {
        let upstream = read_upstream(&list_path(&dir, version), version).unwrap();
        let ours = our_specs(&registry(table(version)));
        let declarations_file = declarations_path(&dir, version);
        let declarations = read_declarations(&declarations_file).unwrap();
        let discrepancies = compare::compare(&upstream, &ours, &declarations);
        if !discrepancies.is_empty() {
            failures.push(format!(
                "{version}: {} discrepancies between our specs and upstream's {} (declarations: {}):\n{}{}",
                discrepancies.len(),
                list_path(&dir, version).display(),
                declarations_file.display(),
                discrepancies.iter().map(|d| format!("  - {d}")).collect::<Vec<_>>().join("\n"),
                ours_hint(&discrepancies, &declarations_file)
            ));
        }
        // The counts, for the record (`cargo test -- --nocapture`).
        let present = upstream.iter().filter(|u| ours.iter().any(|o| o.text == u.text)).count();
        println!(
            "{version}: upstream {} specs, {present} registered, {} declared missing; ours only: {}",
            upstream.len(),
            upstream.len() - present,
            ours.len() - present
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// For specs of ours not declared yet: the lines that declare them, to paste into the version's
/// declarations file (empty when there are none).
fn ours_hint(discrepancies: &[compare::Discrepancy], file: &Path) -> String {
    let undeclared: Vec<&str> = discrepancies
        .iter()
        .filter_map(|d| match d {
            compare::Discrepancy::Unknown { ours, .. } => Some(ours.as_str()),
            _ => None,
        })
        .collect();
    if undeclared.is_empty() {
        return String::new();
    }
    format!(
        "\n  A spec of our own is declared in {}: add these lines, with the reason upstream lacks it:\n\nours: <why upstream lacks it>\n{}\n",
        file.display(),
        undeclared.join("\n")
    )
}

#[test]
fn a_spec_of_ours_not_declared_gets_the_lines_that_declare_it() {
    let unknown =
        compare::Discrepancy::Unknown { ours: "[sig-node] [DRA] kubelet x".to_owned(), closest: None };
    let hint = ours_hint(&[unknown], Path::new("parity-v1.37.2.txt"));
    assert!(hint.contains("declared in parity-v1.37.2.txt: add these lines"), "{hint}");
    assert!(hint.ends_with("\nours: <why upstream lacks it>\n[sig-node] [DRA] kubelet x\n"), "{hint}");
    assert_eq!(ours_hint(&[], Path::new("p")), "");
}

#[test]
fn every_version_with_texts_has_a_committed_list() {
    let committed = committed_versions(&upstream_dir()).unwrap();
    for table in TABLES {
        assert!(
            committed.iter().any(|v| v == table.version),
            "no suites/upstream/specs-{0}.txt: `cargo xtask upstream-specs {0}` writes it",
            table.version
        );
    }
}

/// `--focus` regexes written against either version's e2e.test select the same specs here:
/// each spec's whole text, and upstream's DRA focus.
#[test]
fn upstream_focus_regexes_select_the_same_specs() {
    let dir = upstream_dir();
    for version in committed_versions(&dir).unwrap() {
        let upstream = read_upstream(&list_path(&dir, &version), &version).unwrap();
        let registry = registry(table(&version));
        let specs: Vec<_> = registry.specs().collect();
        for u in upstream.iter().filter(|u| specs.iter().any(|s| s.full_text() == u.text)) {
            let selection = Selection::new(&[format!("^{}$", regex::escape(&u.text))], &[], None).unwrap();
            let selected: Vec<_> =
                specs.iter().filter(|s| selection.matches(s)).map(|s| s.full_text()).collect();
            assert_eq!(selected, [u.text.as_str()], "{version}: --focus for upstream's {:?}", u.text);
        }
        // Upstream's `--ginkgo.focus=DRA` selected the whole list; here it selects every spec
        // registered for the version.
        let selection = Selection::new(&["DRA".to_owned()], &[], None).unwrap();
        assert_eq!(specs.iter().filter(|s| selection.matches(s)).count(), specs.len(), "{version}");
    }
}

/// The twelve `DRAResourcePoolStatus` specs of `control plane` and `control plane views`.
fn pool_status_specs(upstream: &[Spec]) -> Vec<&Spec> {
    upstream
        .iter()
        .filter(|u| {
            u.text.starts_with("[sig-node] [DRA] control plane [FeatureGate:DRAResourcePoolStatus] ")
                || u.text
                    .starts_with("[sig-node] [DRA] control plane views [FeatureGate:DRAResourcePoolStatus] ")
        })
        .collect()
}

/// A focus on a gate and upstream's label filter select the same specs in both versions.
#[test]
fn upstream_gate_focus_and_label_filter_select_the_pool_status_specs() {
    let dir = upstream_dir();
    for version in committed_versions(&dir).unwrap() {
        let upstream = read_upstream(&list_path(&dir, &version), &version).unwrap();
        let registry = registry(table(&version));
        let specs: Vec<_> = registry.specs().collect();
        assert_eq!(pool_status_specs(&upstream).len(), 12, "{version}: upstream's list changed");
        // A focus on the gate right before the spec name, as upstream's text has it.
        let selection = Selection::new(
            &[r"control plane( views)? \[FeatureGate:DRAResourcePoolStatus\] [a-z]".to_owned()],
            &[],
            None,
        )
        .unwrap();
        let upstream_selected =
            upstream.iter().filter(|u| selection.matches_text(&u.text, &[] as &[&str])).count();
        let ours_selected = specs.iter().filter(|s| selection.matches(s)).count();
        assert_eq!((upstream_selected, ours_selected), (12, 12), "{version}");
        // And upstream's label filter for the gate.
        let selection = Selection::new(&[], &[], Some("FeatureGate:DRAResourcePoolStatus && !Slow")).unwrap();
        let labelled = |labels: &[String]| selection.matches_text("", labels);
        let upstream_labelled =
            upstream.iter().filter(|u| labelled(&u.labels.iter().cloned().collect::<Vec<_>>())).count();
        let ours_labelled = specs.iter().filter(|s| selection.matches(s)).count();
        // The 12 and CRUD's ResourcePoolStatusRequest spec.
        assert_eq!((upstream_labelled, ours_labelled), (13, 13), "{version}");
    }
}

#[test]
fn reports_a_missing_upstream_list_clearly() {
    let missing = list_path(&upstream_dir().join("no-such-dir"), "v1.99.0");
    let err = read_upstream(&missing, "v1.99.0").unwrap_err();
    assert!(err.starts_with(&format!("cannot read upstream's spec list {}: ", missing.display())), "{err}");
    assert!(err.ends_with("`cargo xtask upstream-specs v1.99.0` writes it"), "{err}");
}
