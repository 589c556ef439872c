//! `cargo xtask upstream-specs V`: upstream's own list of the specs `e2e.test
//! --ginkgo.focus=DRA` selects at Kubernetes V, written to `suites/upstream/specs-V.txt` for the
//! parity test.
//!
//! Building all of test/e2e takes long on a small machine, so this builds a test binary of its
//! own (a generated module under `target/upstream-specs/V`) that imports only the test packages
//! whose sources mention `DRA` (a grep of that version's test/e2e, as the packages that register
//! DRA-labelled specs must) and runs the e2e framework as test/e2e/e2e_test.go does: the same
//! flags, `framework.AfterReadingAllFlags`, ginkgo's `RunSpecs` with the framework's config.
//! Then it runs the binary's ginkgo dry run (`--ginkgo.dry-run --ginkgo.focus=DRA`) with a JSON
//! report and writes one line per selected spec: `FULL TEXT <TAB> labels <TAB> file:line`.
//! Beside it, `gates-V.txt`: V's feature gates as the framework's `WithFeatureGate` reads them,
//! which the suite's gate tables (suites/src/versions.rs) are checked against.

mod gates;
mod gomod;
mod report;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{common::kube_version::KubeVersion, repo::repo_root};

/// Options of `cargo xtask upstream-specs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpecsOptions {
    /// The Kubernetes version, as its tag: v1.37.2, v1.38.0-beta.0.
    pub version: String,
    /// Where to write the list; `None`: suites/upstream/specs-V.txt in the repository.
    pub out: Option<PathBuf>,
}

/// The ginkgo focus upstream's DRA jobs use, and this list is the selection of.
const FOCUS: &str = "DRA";

/// Builds upstream's e2e test binary for the version, runs its dry run, writes the list.
pub fn run(args: &UpstreamSpecsOptions) -> anyhow::Result<ExitCode> {
    let release =
        KubeVersion::parse_tag(&args.version).map_err(|e| crate::usage::UsageError::new(e.to_string()))?;
    let tag = release.to_string();
    let version = tag.as_str();
    let repo = repo_root();
    let work = repo.join("target").join("upstream-specs").join(version);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;

    eprintln!("upstream-specs: downloading k8s.io/kubernetes@{version} from the Go module proxy");
    let module = crate::gomod::download(&release)?;
    let toolchain = crate::gomod::toolchain_for(&module.go_mod)?;
    eprintln!("upstream-specs: its go.mod needs {}; using GOTOOLCHAIN={}", toolchain.needed, toolchain.env);
    let packages = gomod::dra_packages(&module.dir)?;
    eprintln!("upstream-specs: test packages that mention DRA: {}", packages.join(" "));

    gomod::write_module(&work, &release, &module.go_mod, &packages)?;
    let replaced = crate::gomod::tidy(&work, &toolchain.env, &crate::gomod::replacements(&repo))?;

    eprintln!("upstream-specs: building the e2e test binary (go test -c; minutes on 2 cores)");
    let started = Instant::now();
    let status = Command::new("nice")
        .args(["go", "test", "-c", "-o", "e2e.test", "."])
        .current_dir(&work)
        .env("GOTOOLCHAIN", &toolchain.env)
        .env("GOFLAGS", "-mod=mod")
        .status()
        .context("running go test -c")?;
    if !status.success() {
        bail!("go test -c failed in {} ({status})", work.display());
    }
    let build = started.elapsed();
    eprintln!("upstream-specs: built in {build:.0?}");

    let report_path = work.join("report.json");
    let out = Command::new(work.join("e2e.test"))
        .args([
            "--ginkgo.dry-run",
            &format!("--ginkgo.focus={FOCUS}"),
            "--ginkgo.no-color",
            "--ginkgo.seed=1",
            &format!("--ginkgo.json-report={}", report_path.display()),
        ])
        .current_dir(&work)
        .output()
        .context("running the e2e binary's dry run")?;
    if !out.status.success() {
        bail!(
            "the dry run failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let json = std::fs::read_to_string(&report_path)
        .with_context(|| format!("reading {}", report_path.display()))?;
    let specs = report::selected_specs(&json, &module.dir)?;
    let header = report::Header {
        version,
        packages: &packages,
        replaced: &replaced,
        count: specs.len(),
        focus: FOCUS,
    };
    let target = args.out.clone().unwrap_or_else(|| default_out(&repo, version));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&target, report::render(&header, &specs))
        .with_context(|| format!("writing {}", target.display()))?;
    println!("{} specs ({}) -> {}", specs.len(), report::by_directory(&specs), target.display());

    let gates = gates::dump(&work, &toolchain)?;
    let gates_file = target.with_file_name(format!("gates-{version}.txt"));
    std::fs::write(&gates_file, gates::render(version, &gates))
        .with_context(|| format!("writing {}", gates_file.display()))?;
    println!("{} feature gates -> {}", gates.len(), gates_file.display());
    Ok(ExitCode::SUCCESS)
}

/// `suites/upstream/specs-V.txt`.
pub fn default_out(repo: &Path, version: &str) -> PathBuf {
    repo.join("suites").join("upstream").join(format!("specs-{version}.txt"))
}
