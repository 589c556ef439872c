//! The variables cargo sets for a test process only. A cargo started from a test (a build, or
//! `cargo xtask …`) must not inherit them: build scripts that track them (ring's tracks
//! `CARGO_MANIFEST_DIR`) would run again and rebuild half the tree, and the next build outside
//! the test would rebuild it back (about 30 s each on two cores with incremental caches, about
//! three minutes without).

/// The names of the variables in this process's environment that cargo set for the test only.
pub fn test_only_vars() -> Vec<String> {
    std::env::vars_os()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .filter(|name| {
            name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_BIN_")
                || [
                    "CARGO_MANIFEST_DIR",
                    "CARGO_MANIFEST_PATH",
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_str())
        })
        .collect()
}

#[test]
fn a_test_process_has_its_manifest_dir_and_cargo_keeps_its_own_path() {
    let vars = test_only_vars();
    assert!(vars.iter().any(|v| v == "CARGO_MANIFEST_DIR"), "{vars:?}");
    assert!(!vars.iter().any(|v| v == "CARGO"), "the path of cargo itself stays: {vars:?}");
}
