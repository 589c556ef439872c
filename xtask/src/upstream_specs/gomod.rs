//! The Go side of `upstream-specs`: the module download, the toolchain its go.mod asks for,
//! the test packages to import and the generated module that builds them.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

/// What `go mod download -json` says about k8s.io/kubernetes@V.
pub struct Module {
    /// The extracted module (`…/k8s.io/kubernetes@V`).
    pub dir: PathBuf,
    /// Its go.mod, as text.
    pub go_mod: String,
}

/// Whether `version` is a tag like `v1.37.2` or `v1.38.0-beta.0` (it names paths, so nothing else).
pub fn is_release_tag(version: &str) -> bool {
    let Some(rest) = version.strip_prefix("v1.") else { return false };
    let (core, pre) = rest.split_once('-').unwrap_or((rest, ""));
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 2
        && numbers.iter().all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        && pre.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
}

/// Downloads the module through the Go module proxy, from an empty directory so that no go.mod
/// asks for another toolchain. The installed Go refuses a module whose go.mod needs a newer Go;
/// then the download runs again with the Go its error names (the go.mod's `go` line).
pub fn download(version: &str) -> anyhow::Result<Module> {
    match download_with(version, "local")? {
        Ok(module) => Ok(module),
        Err(error) => match needed_by_error(&error) {
            Some(go) => download_with(version, &go)?.map_err(|e| anyhow::anyhow!("{e}")),
            None => Err(anyhow::anyhow!("{error}")),
        },
    }
}

/// `go mod download -json` with `GOTOOLCHAIN=toolchain`; the inner error is go's own.
fn download_with(version: &str, toolchain: &str) -> anyhow::Result<Result<Module, String>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Download {
        dir: Option<PathBuf>,
        go_mod: Option<PathBuf>,
        error: Option<String>,
    }
    let outside = tempfile::tempdir().context("creating an empty directory")?;
    let out = Command::new("go")
        .args(["mod", "download", "-json", &format!("k8s.io/kubernetes@{version}")])
        .current_dir(outside.path())
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", toolchain)
        .output()
        .context("running go mod download (is Go installed?)")?;
    let Ok(info) = serde_json::from_slice::<Download>(&out.stdout) else {
        return Ok(Err(format!("go mod download: {}", String::from_utf8_lossy(&out.stderr).trim())));
    };
    if let Some(error) = info.error {
        return Ok(Err(format!("go mod download k8s.io/kubernetes@{version}: {error}")));
    }
    let (Some(dir), Some(go_mod)) = (info.dir, info.go_mod) else {
        bail!("go mod download k8s.io/kubernetes@{version} named no directory or go.mod");
    };
    let go_mod = std::fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    Ok(Ok(Module { dir, go_mod }))
}

/// `go1.27.0` from go's "… requires go >= 1.27.0 (running go 1.26.8; …)".
fn needed_by_error(error: &str) -> Option<String> {
    let rest = error.split("requires go >= ").nth(1)?;
    let version: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    go_version(&format!("go{version}")).map(|_| format!("go{version}"))
}

/// The Go toolchain a go.mod needs, and the `GOTOOLCHAIN` that gets it.
pub struct Toolchain {
    /// `go1.27.0`: the go.mod's `toolchain` line, else its `go` line.
    pub needed: String,
    /// `local` when the installed Go is at least that, else the needed one (fetched by go).
    pub env: String,
}

/// Reads the `go` and `toolchain` lines and compares them with the installed Go.
pub fn toolchain_for(go_mod: &str) -> anyhow::Result<Toolchain> {
    let needed = needed_toolchain(go_mod).context("the go.mod has no `go` line")?;
    let out = Command::new("go")
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .output()
        .context("running go env GOVERSION")?;
    let local = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let env = match (go_version(&local), go_version(&needed)) {
        (Some(have), Some(want)) if have >= want => "local".to_owned(),
        _ => needed.clone(),
    };
    Ok(Toolchain { needed, env })
}

/// `toolchain goX` if present, else `go X` as `goX` (`go 1.27` is `go1.27.0`).
fn needed_toolchain(go_mod: &str) -> Option<String> {
    let line = |key: &str| {
        go_mod.lines().find_map(|l| l.trim().strip_prefix(key).map(|rest| rest.trim().to_owned()))
    };
    if let Some(toolchain) = line("toolchain ") {
        return Some(toolchain);
    }
    let go = line("go ")?;
    Some(if go.matches('.').count() == 1 { format!("go{go}.0") } else { format!("go{go}") })
}

/// `go1.27.0` → `(1, 27, 0)`; pre-releases (`go1.27rc1`) are not compared.
fn go_version(name: &str) -> Option<(u32, u32, u32)> {
    let mut parts = name.strip_prefix("go")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    Some((major, minor, patch))
}

/// The test/e2e packages (import paths) with a non-test, non-main Go file that mentions `DRA`.
pub fn dra_packages(module: &Path) -> anyhow::Result<Vec<String>> {
    let mut found = std::collections::BTreeSet::new();
    let mut stack = vec![module.join("test").join("e2e")];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "testdata") {
                    stack.push(path);
                }
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !name.ends_with(".go") || name.ends_with("_test.go") {
                continue;
            }
            let source =
                std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            if source.contains("DRA") && !is_main_package(&source) {
                let rel = dir.strip_prefix(module).unwrap_or(&dir);
                found.insert(format!("k8s.io/kubernetes/{}", rel.to_string_lossy()));
            }
        }
    }
    if !found.iter().any(|p| p.ends_with("/test/e2e/dra")) {
        bail!("no test/e2e/dra package in {}", module.display());
    }
    Ok(found.into_iter().collect())
}

fn is_main_package(source: &str) -> bool {
    source.lines().any(|l| l.trim() == "package main")
}

/// A module with the part of its API that k8s.io/kubernetes uses in the test binary's
/// dependencies, bodies that panic: the dry run never calls it.
struct Stub {
    module: &'static str,
    package: &'static str,
    source: &'static str,
}

/// pkg/kubelet imports it since v1.38 (test/e2e/apimachinery reaches pkg/kubelet through
/// test/e2e/common/node).
const STUBS: &[Stub] = &[Stub {
    module: "sigs.k8s.io/iptables-wrappers",
    package: "pkg/iptables",
    source: include_str!("iptables_stub.go.txt"),
}];

/// Writes go.mod (k8s.io/kubernetes@V, its staging modules at their published versions) and
/// the test file that imports `packages`.
pub fn write_module(work: &Path, version: &str, k8s_go_mod: &str, packages: &[String]) -> anyhow::Result<()> {
    let go_line = k8s_go_mod
        .lines()
        .find_map(|l| l.strip_prefix("go "))
        .context("k8s.io/kubernetes's go.mod has no go line")?;
    let staging = format!("v0.{}", version.trim_start_matches("v1."));
    let mut go_mod = format!(
        "// Generated by `cargo xtask upstream-specs {version}`.\nmodule dra-e2e.local/upstream-specs\n\ngo {}\n\nrequire k8s.io/kubernetes {version}\n\n",
        go_line.trim()
    );
    for module in staging_modules(k8s_go_mod) {
        go_mod.push_str(&format!("replace {module} => {module} {staging}\n"));
    }
    std::fs::write(work.join("go.mod"), go_mod).context("writing go.mod")?;
    let _ = std::fs::remove_file(work.join("go.sum"));
    std::fs::write(work.join("e2e_test.go"), test_file(packages)).context("writing e2e_test.go")
}

/// Runs `go mod tidy`; when the proxy refuses a module of [`STUBS`], uses the stand-in and
/// retries. Returns the modules stubbed.
pub fn tidy(work: &Path, toolchain: &Toolchain) -> anyhow::Result<Vec<&'static str>> {
    let mut stubbed: Vec<&'static str> = Vec::new();
    loop {
        let out = Command::new("go")
            .args(["mod", "tidy"])
            .current_dir(work)
            .env("GOTOOLCHAIN", &toolchain.env)
            .output()
            .context("running go mod tidy")?;
        if out.status.success() {
            return Ok(stubbed);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let refused =
            STUBS.iter().find(|s| !stubbed.contains(&s.module) && refused_by_proxy(&stderr, s.module));
        let Some(stub) = refused else {
            bail!("go mod tidy failed in {}:\n{stderr}", work.display());
        };
        eprintln!(
            "upstream-specs: the module proxy refuses {}; using a compile-only stand-in (the dry run never calls it)",
            stub.module
        );
        let dir = work.join("stub").join(stub.module.replace('/', "_"));
        std::fs::create_dir_all(dir.join(stub.package)).context("creating the stub module")?;
        std::fs::write(dir.join("go.mod"), format!("module {}\n\ngo 1.24\n", stub.module))?;
        std::fs::write(dir.join(stub.package).join("stub.go"), stub.source)?;
        let mut go_mod = std::fs::read_to_string(work.join("go.mod"))?;
        go_mod.push_str(&format!("replace {} => ./{}\n", stub.module, dir.strip_prefix(work)?.display()));
        std::fs::write(work.join("go.mod"), go_mod)?;
        stubbed.push(stub.module);
    }
}

/// Whether go's error says the proxy would not serve `module`.
fn refused_by_proxy(stderr: &str, module: &str) -> bool {
    stderr.lines().any(|l| {
        l.contains(&format!("{module}@")) && (l.contains("403") || l.contains("404") || l.contains("410"))
    })
}

/// The `k8s.io/<name> v0.0.0` requirements of k8s.io/kubernetes (its staging modules).
fn staging_modules(go_mod: &str) -> Vec<&str> {
    let mut out: Vec<&str> = go_mod
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let first = fields.next()?;
            let path = if first == "require" { fields.next()? } else { first };
            (path.starts_with("k8s.io/") && fields.next() == Some("v0.0.0")).then_some(path)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The generated test file: upstream's e2e flags and ginkgo run, with only `packages`.
fn test_file(packages: &[String]) -> String {
    let imports: String = packages.iter().map(|p| format!("\t_ \"{p}\"\n")).collect();
    format!(
        r#"// Generated by `cargo xtask upstream-specs`: upstream's test/e2e/e2e_test.go set-up with only
// the test packages that register DRA specs.
package upstreamspecs

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"

	_ "k8s.io/kubernetes/test/e2e/feature"

{imports})

func TestMain(m *testing.M) {{
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}}

func TestE2E(t *testing.T) {{
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "Kubernetes e2e suite", suiteConfig, reporterConfig)
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_release_tags_only() {
        for ok in ["v1.37.2", "v1.38.0-beta.0", "v1.38.0-rc.1"] {
            assert!(is_release_tag(ok), "{ok}");
        }
        for bad in ["1.37.2", "v1.37", "v1.37.2/../x", "v2.0.0", "v1.37.x", "v1.38.0-beta 0"] {
            assert!(!is_release_tag(bad), "{bad}");
        }
    }

    #[test]
    fn reads_the_toolchain_a_go_mod_needs() {
        assert_eq!(needed_toolchain("module k8s.io/kubernetes\n\ngo 1.27.0\n").as_deref(), Some("go1.27.0"));
        assert_eq!(needed_toolchain("go 1.26\n").as_deref(), Some("go1.26.0"));
        assert_eq!(needed_toolchain("go 1.26.0\n\ntoolchain go1.26.3\n").as_deref(), Some("go1.26.3"));
        assert_eq!(needed_toolchain("module x\n"), None);
        assert!(go_version("go1.26.8") > go_version("go1.26.0"));
        assert!(go_version("go1.26.8") < go_version("go1.27.0"));
    }

    #[test]
    fn reads_the_go_a_refused_download_needs() {
        let error = "go mod download k8s.io/kubernetes@v1.38.0-beta.0: k8s.io/kubernetes@v1.38.0-beta.0 requires go >= 1.27.0 (running go 1.26.8; GOTOOLCHAIN=local)";
        assert_eq!(needed_by_error(error).as_deref(), Some("go1.27.0"));
        assert_eq!(needed_by_error("go: module not found"), None);
    }

    #[test]
    fn finds_the_staging_modules() {
        let go_mod = "module k8s.io/kubernetes\n\nrequire (\n\tgithub.com/x/y v1.0.0\n\tk8s.io/api v0.0.0\n\tk8s.io/klog/v2 v2.130.1\n)\n\nrequire k8s.io/client-go v0.0.0\n\nreplace k8s.io/api => ./staging/src/k8s.io/api\n";
        assert_eq!(staging_modules(go_mod), ["k8s.io/api", "k8s.io/client-go"]);
    }

    #[test]
    fn recognises_a_refused_module() {
        let stderr = "\tsigs.k8s.io/iptables-wrappers/pkg/iptables: sigs.k8s.io/iptables-wrappers@v1.0.0: reading https://proxy.golang.org/sigs.k8s.io/iptables-wrappers/@v/v1.0.0.zip: 403 Forbidden";
        assert!(refused_by_proxy(stderr, "sigs.k8s.io/iptables-wrappers"));
        assert!(!refused_by_proxy(stderr, "sigs.k8s.io/yaml"));
    }

    #[test]
    fn the_test_file_imports_each_package_once() {
        let file = test_file(&["k8s.io/kubernetes/test/e2e/dra".to_owned()]);
        assert_eq!(file.matches("_ \"k8s.io/kubernetes/test/e2e/dra\"").count(), 1);
        assert!(file.contains("framework.AfterReadingAllFlags"));
    }
}
