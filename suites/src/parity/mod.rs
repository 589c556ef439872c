//! Spec parity with upstream: the specs `dra-e2e --list` prints, with their labels, against the
//! list kubernetes v1.37.2's own ginkgo dry run printed (`<repo>/../shared/upstream/`), given
//! the declarations in `suites/parity.txt`. `cargo xtask test --no-cluster` runs it (it is part
//! of `cargo test --workspace`).

mod compare;
mod files;

use std::path::{Path, PathBuf};

use harness::framework::{Registry, Selection};

use self::files::{Spec, parse_declarations, parse_upstream};

/// Upstream's list, relative to the repository root (CI has `shared/` next to the clone).
const UPSTREAM_LIST: &str = "../shared/upstream/specs-v1.37.2.txt";
/// Our declarations, relative to the suites crate.
const DECLARATIONS: &str = "parity.txt";

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn upstream_path() -> PathBuf {
    // The suites crate is `<repo>/suites`.
    crate_dir().parent().expect("the suites crate is inside the repository").join(UPSTREAM_LIST)
}

/// Reads and parses upstream's list; the error says which file is missing and what it is.
fn read_upstream(path: &Path) -> Result<Vec<Spec>, String> {
    let content = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read upstream's spec list {}: {e}. The parity test needs it: it is \
             shared/upstream/specs-v1.37.2.txt next to the repository (`<repo>/{UPSTREAM_LIST}`)",
            path.display()
        )
    })?;
    parse_upstream(&content).map_err(|e| format!("{}: {e}", path.display()))
}

fn upstream_specs() -> Vec<Spec> {
    read_upstream(&upstream_path()).unwrap_or_else(|e| panic!("{e}"))
}

/// The registry `dra-e2e` runs and lists.
fn registry() -> Registry {
    let mut registry = Registry::new();
    crate::specs::register(&mut registry);
    registry.validate().unwrap_or_else(|e| panic!("{e}"));
    registry
}

fn our_specs() -> Vec<Spec> {
    registry()
        .specs()
        .map(|s| Spec {
            text: s.full_text().to_owned(),
            labels: s.labels().iter().cloned().collect(),
            origin: format!("registered #{}", s.index()),
        })
        .collect()
}

#[test]
fn registered_specs_match_upstream_or_are_declared() {
    let upstream = upstream_specs();
    let ours = our_specs();
    let path = crate_dir().join(DECLARATIONS);
    let content =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let declarations = parse_declarations(&content).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let discrepancies = compare::compare(&upstream, &ours, &declarations);
    assert!(
        discrepancies.is_empty(),
        "{} discrepancies between our specs and upstream's {} (declarations: {}):\n{}",
        discrepancies.len(),
        upstream_path().display(),
        path.display(),
        discrepancies.iter().map(|d| format!("  - {d}")).collect::<Vec<_>>().join("\n")
    );
    // The counts, for the record (`cargo test -- --nocapture`).
    let present = upstream.iter().filter(|u| ours.iter().any(|o| o.text == u.text)).count();
    println!(
        "upstream: {} specs, {present} registered, {} declared missing; ours only: {}",
        upstream.len(),
        upstream.len() - present,
        ours.len() - present
    );
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

/// `--focus` regexes written against upstream's names select the same specs here.
#[test]
fn upstream_focus_regexes_select_the_pool_status_specs() {
    let upstream = upstream_specs();
    let registry = registry();
    let specs: Vec<_> = registry.specs().collect();
    let wanted = pool_status_specs(&upstream);
    assert_eq!(wanted.len(), 12, "upstream's list changed: {wanted:#?}");
    for u in &wanted {
        let selection = Selection::new(&[format!("^{}$", regex::escape(&u.text))], &[], None).unwrap();
        let selected: Vec<_> = specs.iter().filter(|s| selection.matches(s)).map(|s| s.full_text()).collect();
        assert_eq!(selected, [u.text.as_str()], "--focus for upstream's {:?}", u.text);
    }
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
    assert_eq!((upstream_selected, ours_selected), (12, 12));
    // And upstream's label filter for the gate.
    let selection = Selection::new(&[], &[], Some("FeatureGate:DRAResourcePoolStatus && !Slow")).unwrap();
    let labelled = |labels: &[String]| selection.matches_text("", labels);
    let upstream_labelled =
        upstream.iter().filter(|u| labelled(&u.labels.iter().cloned().collect::<Vec<_>>())).count();
    let ours_labelled = specs.iter().filter(|s| selection.matches(s)).count();
    // The 12 and CRUD's ResourcePoolStatusRequest spec.
    assert_eq!((upstream_labelled, ours_labelled), (13, 13));
}

#[test]
fn reports_a_missing_upstream_list_clearly() {
    let missing = crate_dir().join("no-such-dir").join(UPSTREAM_LIST);
    let err = read_upstream(&missing).unwrap_err();
    assert!(err.starts_with(&format!("cannot read upstream's spec list {}: ", missing.display())), "{err}");
    assert!(err.contains("shared/upstream/specs-v1.37.2.txt next to the repository"), "{err}");
}
