//! The Go module side of building Kubernetes: downloading k8s.io/kubernetes@V from the Go module
//! proxy, the Go toolchain its go.mod needs, its staging modules, whether the proxy refused a
//! module, and the version a go.mod requires (`go mod edit -json`). Used by `cluster up
//! --k8s-version` (xtask/src/common/kube_module.rs), the builds and `upstream-specs`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::common::kube_version::KubeVersion;

/// What `go mod download -json` says about k8s.io/kubernetes@V.
pub struct Module {
    /// The extracted module (`…/k8s.io/kubernetes@V`).
    pub dir: PathBuf,
    /// Its go.mod, as text.
    pub go_mod: String,
}

/// The error of a `go` command that did not start: a Go missing from PATH is said so, in one
/// sentence.
pub fn cannot_run_go(command: &str, error: &std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "`go` is not on PATH: the local cluster is built from Kubernetes Go modules; install Go 1.26 or later and retry"
        )
    } else {
        anyhow::anyhow!("cannot run `{command}`: {error}")
    }
}

/// The version of `module` that the go.mod at `go_mod` builds with, as `go mod edit -json` reads
/// the file: its requirement, or the version a `replace` puts in its place (a `replace` by a
/// directory leaves the required version). An error when the go.mod does not require `module`.
pub fn go_mod_version(go_mod: &Path, module: &str) -> anyhow::Result<String> {
    let out = Command::new("go")
        .args(["mod", "edit", "-json"])
        .arg(go_mod)
        // Reading a file needs no other toolchain, whatever its `go` line says.
        .env("GOTOOLCHAIN", "local")
        .output()
        .map_err(|e| cannot_run_go("go mod edit -json", &e))?;
    if !out.status.success() {
        bail!("cannot read {}: {}", go_mod.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    version_in(&out.stdout, module)
        .with_context(|| format!("read `go mod edit -json {}`'s output", go_mod.display()))?
        .with_context(|| format!("{} does not require {module}", go_mod.display()))
}

/// The version of `module` in `go mod edit -json`'s output; see [`go_mod_version`].
fn version_in(json: &[u8], module: &str) -> serde_json::Result<Option<String>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct GoMod {
        require: Option<Vec<ModuleVersion>>,
        replace: Option<Vec<Replace>>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct ModuleVersion {
        path: String,
        version: Option<String>,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Replace {
        old: ModuleVersion,
        new: ModuleVersion,
    }
    let go_mod: GoMod = serde_json::from_slice(json)?;
    let Some(required) =
        go_mod.require.unwrap_or_default().into_iter().find(|r| r.path == module).and_then(|r| r.version)
    else {
        return Ok(None);
    };
    let replaced = go_mod
        .replace
        .unwrap_or_default()
        .into_iter()
        .find(|r| r.old.path == module && r.old.version.as_ref().is_none_or(|v| *v == required))
        .and_then(|r| r.new.version);
    Ok(Some(replaced.unwrap_or(required)))
}

/// Downloads the module through the Go module proxy, from an empty directory so that no go.mod
/// asks for another toolchain. The installed Go refuses a module whose go.mod needs a newer Go;
/// then the download runs again with the Go its error names (the go.mod's `go` line).
pub fn download(version: &KubeVersion) -> anyhow::Result<Module> {
    match download_with(version, "local")? {
        Ok(module) => Ok(module),
        Err(error) => match needed_by_error(&error) {
            Some(go) => download_with(version, &go)?.map_err(|e| anyhow::anyhow!("{e}")),
            None => Err(anyhow::anyhow!("{error}")),
        },
    }
}

/// `go mod download -json` with `GOTOOLCHAIN=toolchain`; the inner error is go's own.
fn download_with(version: &KubeVersion, toolchain: &str) -> anyhow::Result<Result<Module, String>> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Download {
        dir: Option<PathBuf>,
        go_mod: Option<PathBuf>,
        error: Option<String>,
    }
    let outside = tempfile::tempdir().context("creating an empty directory")?;
    let out = crate::common::go_retry::go_output_with_retries("go mod download", || {
        let mut command = Command::new("go");
        command
            .args(["mod", "download", "-json", &format!("k8s.io/kubernetes@{version}")])
            .current_dir(outside.path())
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", toolchain);
        command
    })?;
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

/// Whether go's error says the proxy would not serve `module`.
pub fn refused_by_proxy(stderr: &str, module: &str) -> bool {
    stderr.lines().any(|l| {
        l.contains(&format!("{module}@")) && (l.contains("403") || l.contains("404") || l.contains("410"))
    })
}

/// The `k8s.io/<name> v0.0.0` requirements of k8s.io/kubernetes (its staging modules).
pub fn staging_modules(go_mod: &str) -> Vec<&str> {
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

/// A module the Go module proxy may refuse, and the directory of our own implementation that a
/// build uses instead when it does.
pub struct Replacement {
    /// The module path (`sigs.k8s.io/iptables-wrappers`).
    pub module: &'static str,
    /// Our module's directory.
    pub dir: PathBuf,
}

/// This repository's replacements: `sigs.k8s.io/iptables-wrappers`, which Kubernetes v1.38's
/// kubelet imports and whose zip the proxy of this project's machines refuses (403).
pub fn replacements(repo: &Path) -> Vec<Replacement> {
    vec![Replacement {
        module: "sigs.k8s.io/iptables-wrappers",
        dir: repo.join("xtask/local-cluster/iptables-wrappers"),
    }]
}

/// Runs `go mod tidy` in `work` with `GOTOOLCHAIN=toolchain`; when the proxy refuses a module of
/// `replacements`, adds a `replace` of it by our directory to go.mod and retries. Returns the
/// modules replaced.
pub fn tidy(work: &Path, toolchain: &str, replacements: &[Replacement]) -> anyhow::Result<Vec<&'static str>> {
    let mut replaced: Vec<&'static str> = Vec::new();
    loop {
        let out = crate::common::go_retry::go_output_with_retries("go mod tidy", || {
            let mut command = Command::new("go");
            command.args(["mod", "tidy"]).current_dir(work).env("GOTOOLCHAIN", toolchain);
            command
        })?;
        if out.status.success() {
            return Ok(replaced);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let refused = replacements
            .iter()
            .find(|r| !replaced.contains(&r.module) && refused_by_proxy(&stderr, r.module));
        let Some(replacement) = refused else {
            bail!("go mod tidy failed in {}:\n{stderr}", work.display());
        };
        eprintln!(
            "note: the Go module proxy refuses {}; building with our own implementation in {}",
            replacement.module,
            replacement.dir.display()
        );
        let mut go_mod = std::fs::read_to_string(work.join("go.mod")).context("reading go.mod")?;
        go_mod.push_str(&format!("replace {} => {}\n", replacement.module, replacement.dir.display()));
        std::fs::write(work.join("go.mod"), go_mod).context("writing go.mod")?;
        replaced.push(replacement.module);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_replacements_pass_their_go_tests() {
        // Without root their tests against the real iptables skip; the fake's and the client's
        // (stand-in binaries on PATH) run.
        for replacement in replacements(&crate::repo::repo_root()) {
            let out = Command::new("go")
                .args(["test", "-count=1", "./..."])
                .current_dir(&replacement.dir)
                .env_remove("DRA_E2E_IPTABLES_TEST")
                .output()
                .expect("run go test");
            assert!(
                out.status.success(),
                "go test in {}:\n{}{}",
                replacement.dir.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn reads_the_version_a_go_mod_requires() {
        let dir = tempfile::tempdir().unwrap();
        let go_mod = dir.path().join("go.mod");
        std::fs::write(
            &go_mod,
            "module x\n\ngo 1.99.0\n\nrequire (\n\tk8s.io/kubernetes v1.37.2\n\tgo.etcd.io/etcd/server/v3 v3.7.0 // indirect\n\tk8s.io/api v0.0.0\n\tk8s.io/kubelet v0.0.0\n)\nrequire github.com/a/b v0.1.0\nreplace k8s.io/api => k8s.io/api v0.37.2\nreplace k8s.io/kubelet => ./kubelet\nreplace k8s.io/client-go => k8s.io/client-go v0.37.2\n",
        )
        .unwrap();
        let version = |module| go_mod_version(&go_mod, module).map_err(|e| e.to_string());
        assert_eq!(version("k8s.io/kubernetes").as_deref(), Ok("v1.37.2"));
        assert_eq!(version("go.etcd.io/etcd/server/v3").as_deref(), Ok("v3.7.0"));
        assert_eq!(version("github.com/a/b").as_deref(), Ok("v0.1.0"));
        // A replace by another version is what go builds with; one by a directory is not a version.
        assert_eq!(version("k8s.io/api").as_deref(), Ok("v0.37.2"));
        assert_eq!(version("k8s.io/kubelet").as_deref(), Ok("v0.0.0"));
        let err = version("k8s.io/client-go").unwrap_err();
        assert_eq!(err, format!("{} does not require k8s.io/client-go", go_mod.display()));
        let err = go_mod_version(&dir.path().join("missing/go.mod"), "x").unwrap_err().to_string();
        assert!(err.starts_with("cannot read ") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn a_replace_of_another_version_leaves_the_requirement() {
        let json = br#"{"Require":[{"Path":"m","Version":"v1.0.0"}],"Replace":[{"Old":{"Path":"m","Version":"v0.9.0"},"New":{"Path":"m","Version":"v0.9.1"}}]}"#;
        assert_eq!(version_in(json, "m").unwrap().as_deref(), Some("v1.0.0"));
        let json = br#"{"Require":null,"Replace":null}"#;
        assert_eq!(version_in(json, "m").unwrap(), None);
    }

    #[test]
    fn the_repository_pins_kubernetes_and_containerd() {
        let go_dir = crate::repo::repo_root().join("xtask/local-cluster");
        let k8s = go_mod_version(&go_dir.join("go.mod"), "k8s.io/kubernetes").unwrap();
        KubeVersion::parse_tag(&k8s).unwrap();
        let containerd =
            go_mod_version(&go_dir.join("containerd/go.mod"), "github.com/containerd/containerd/v2").unwrap();
        assert!(containerd.starts_with("v2."), "{containerd}");
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
}
