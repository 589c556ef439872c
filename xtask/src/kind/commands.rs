//! Every external command of the kind provider, built by a pure function, so `--dry-run` prints
//! exactly what would run and the tests check it without docker or kind.

use super::*;
/// One external command: `docker` or `kind` and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd {
    /// `"docker"` or `"kind"`, resolved on PATH when run.
    pub program: &'static str,
    /// The arguments, unquoted.
    pub args: Vec<OsString>,
}

impl Cmd {
    pub(super) fn new<I, S>(program: &'static str, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Cmd { program, args: args.into_iter().map(Into::into).collect() }
    }
}

/// Renders the command as one POSIX shell line, quoting arguments that need it.
impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program)?;
        for arg in &self.args {
            write!(f, " {}", shell_quote(arg))?;
        }
        Ok(())
    }
}

/// Quotes `arg` for a POSIX shell if it contains anything but plain characters.
pub fn shell_quote(arg: &OsStr) -> String {
    let text = arg.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c);
    if !text.is_empty() && text.chars().all(plain) {
        text.into_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// `<repo>/.e2e/kind-<name>.kubeconfig`, where `cluster up` writes the cluster's kubeconfig.
pub fn kubeconfig_path(repo: &Path, name: &str) -> PathBuf {
    repo.join(".e2e").join(format!("kind-{name}.kubeconfig"))
}

/// `kind create cluster --name N --config CONFIG [--image IMG] --kubeconfig PATH --wait 5m`.
pub fn create_cluster_cmd(name: &str, config: &Path, image: Option<&str>, kubeconfig: &Path) -> Cmd {
    let mut args: Vec<OsString> = vec!["create".into(), "cluster".into(), "--name".into(), name.into()];
    args.extend(["--config".into(), config.as_os_str().to_owned()]);
    if let Some(image) = image {
        args.extend(["--image".into(), image.into()]);
    }
    args.extend(["--kubeconfig".into(), kubeconfig.as_os_str().to_owned()]);
    args.extend(["--wait".into(), CREATE_WAIT.into()]);
    Cmd::new("kind", args)
}

/// `cmd` without its `--wait DURATION` (kind's wait for Ready nodes), if it has one.
pub fn without_wait(mut cmd: Cmd) -> Cmd {
    if let Some(at) = cmd.args.iter().position(|a| a == "--wait") {
        cmd.args.drain(at..(at + 2).min(cmd.args.len()));
    }
    cmd
}

/// `kind export kubeconfig --name N --kubeconfig PATH` (for a cluster that already exists).
pub fn export_kubeconfig_cmd(name: &str, kubeconfig: &Path) -> Cmd {
    Cmd::new(
        "kind",
        [
            OsStr::new("export"),
            "kubeconfig".as_ref(),
            "--name".as_ref(),
            name.as_ref(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
        ],
    )
}

/// `kind delete cluster --name N --kubeconfig PATH`.
pub fn delete_cluster_cmd(name: &str, kubeconfig: &Path) -> Cmd {
    Cmd::new(
        "kind",
        [
            OsStr::new("delete"),
            "cluster".as_ref(),
            "--name".as_ref(),
            name.as_ref(),
            "--kubeconfig".as_ref(),
            kubeconfig.as_os_str(),
        ],
    )
}

/// `kind get clusters`.
pub fn get_clusters_cmd() -> Cmd {
    Cmd::new("kind", ["get", "clusters"])
}

/// `kind get nodes --name N`.
pub fn get_nodes_cmd(name: &str) -> Cmd {
    Cmd::new("kind", ["get", "nodes", "--name", name])
}

/// `kind version`.
pub fn kind_version_cmd() -> Cmd {
    Cmd::new("kind", ["version"])
}

/// `docker info --format {{.ID}}|{{.DockerRootDir}}`: the daemon's identity (the same ID and
/// data root is the same daemon); fails when the daemon does not answer.
pub fn docker_info_cmd() -> Cmd {
    Cmd::new("docker", ["info", "--format", "{{.ID}}|{{.DockerRootDir}}"])
}

/// `docker container ls --all --format {{.Names}}`.
pub fn container_names_cmd() -> Cmd {
    Cmd::new("docker", ["container", "ls", "--all", "--format", "{{.Names}}"])
}

/// `<repo>/.e2e/kind-<name>.owner`: written when `cluster up` creates the cluster, with the
/// identity of the Docker daemon it runs on; a cluster of that name without it is someone else's.
pub fn owner_path(repo: &Path, name: &str) -> PathBuf {
    repo.join(".e2e").join(format!("kind-{name}.owner"))
}

/// The containers among `names` that kind would name as nodes of cluster `cluster`
/// (`<cluster>-control-plane`, `<cluster>-worker3`, `<cluster>-external-load-balancer`, …).
pub fn node_name_conflicts(cluster: &str, names: &[String]) -> Vec<String> {
    names
        .iter()
        .filter(|name| {
            let Some(rest) = name.strip_prefix(cluster).and_then(|r| r.strip_prefix('-')) else {
                return false;
            };
            ["control-plane", "worker", "external-load-balancer"]
                .iter()
                .any(|role| rest.strip_prefix(role).is_some_and(|n| n.chars().all(|c| c.is_ascii_digit())))
        })
        .cloned()
        .collect()
}

/// The sentence for a cluster name that is in use by a cluster `cargo xtask` did not create.
pub fn name_in_use_sentence(name: &str) -> String {
    format!(
        "a kind cluster named {name:?} already exists on this Docker daemon and was not created by `cargo xtask \
         cluster up`: delete it (`cargo xtask cluster down --provider kind --name {name}`) if it is yours to delete, \
         or choose another name with --name (KIND_CLUSTER_NAME)."
    )
}

/// The sentence for containers that already carry the names of the cluster's nodes.
pub fn names_taken_sentence(name: &str, taken: &[String]) -> String {
    format!(
        "containers named as the nodes of kind cluster {name:?} already exist ({}) though kind lists no such \
         cluster: remove them (`docker rm -f {}`) or choose another name with --name (KIND_CLUSTER_NAME).",
        taken.join(", "),
        taken.join(" ")
    )
}

/// `docker image inspect --format {{.Id}} IMG`: succeeds when the image is present locally.
pub fn image_present_cmd(image: &str) -> Cmd {
    Cmd::new("docker", ["image", "inspect", "--format", "{{.Id}}", image])
}

/// `docker pull IMG`.
pub fn pull_cmd(image: &str) -> Cmd {
    Cmd::new("docker", ["pull", image])
}

/// `kind load docker-image --name N IMG`.
pub fn load_image_cmd(name: &str, image: &str) -> Cmd {
    Cmd::new("kind", ["load", "docker-image", "--name", name, image])
}

/// `docker image save --platform P --output ARCHIVE IMG`: the fallback for `kind load
/// docker-image` failing with "content digest ... not found" when Docker keeps images in the
/// containerd image store (kubernetes-sigs/kind#3795); the archive then holds one platform only.
pub fn save_image_cmd(image: &str, platform: &str, archive: &Path) -> Cmd {
    Cmd::new(
        "docker",
        [
            OsStr::new("image"),
            "save".as_ref(),
            "--platform".as_ref(),
            platform.as_ref(),
            "--output".as_ref(),
            archive.as_os_str(),
            image.as_ref(),
        ],
    )
}

/// `kind load image-archive --name N ARCHIVE`.
pub fn load_archive_cmd(name: &str, archive: &Path) -> Cmd {
    Cmd::new(
        "kind",
        [OsStr::new("load"), "image-archive".as_ref(), "--name".as_ref(), name.as_ref(), archive.as_os_str()],
    )
}

/// `kind build node-image --image IMG DIR`.
pub fn build_node_image_cmd(image: &str, k8s_source: &Path) -> Cmd {
    Cmd::new(
        "kind",
        [
            OsStr::new("build"),
            "node-image".as_ref(),
            "--image".as_ref(),
            image.as_ref(),
            k8s_source.as_os_str(),
        ],
    )
}

/// The shell line that pulls `image` only if Docker does not have it.
pub fn pull_if_missing_line(image: &str) -> String {
    format!("{} >/dev/null 2>&1 || {}", image_present_cmd(image), pull_cmd(image))
}

/// What `cluster up --dry-run` prints: the commands that change anything, in order, for a cluster
/// that does not exist yet.
pub fn up_lines(name: &str, config: &Path, image: Option<&str>, kubeconfig: &Path) -> Vec<String> {
    let mut lines: Vec<String> = SUITE_IMAGES.iter().map(|image| pull_if_missing_line(image)).collect();
    lines.push(create_cluster_cmd(name, config, image, kubeconfig).to_string());
    lines.extend(SUITE_IMAGES.iter().map(|image| load_image_cmd(name, image).to_string()));
    lines
}

/// What `cluster down --dry-run` prints.
pub fn down_lines(name: &str, kubeconfig: &Path) -> Vec<String> {
    vec![
        delete_cluster_cmd(name, kubeconfig).to_string(),
        format!("rm -f {}", shell_quote(kubeconfig.as_os_str())),
    ]
}

/// Checks a cluster name the way kind does (`^[a-z0-9.-]+$`).
pub fn validate_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-');
    ensure!(
        ok,
        "invalid kind cluster name {name:?}: kind accepts only lowercase letters, digits, '.' and '-'"
    );
    Ok(())
}

/// The version in `kind version` output (`kind v0.33.0 go1.26.8 linux/amd64` gives `v0.33.0`).
pub fn parse_kind_version(output: &str) -> Option<&str> {
    let mut words = output.split_whitespace();
    (words.next() == Some("kind")).then_some(())?;
    words.next().filter(|v| v.starts_with('v'))
}

/// A kind version (`v0.33.0`, `0.34.0-alpha.12+abc`) as the semantic version it is; `None` for
/// anything else. kind's versions are not Kubernetes versions, so not a
/// [`crate::common::kube_version::KubeVersion`]; they are read the same way.
pub fn kind_semver(version: &str) -> Option<semver::Version> {
    let version = version.trim();
    semver::Version::parse(version.strip_prefix('v').unwrap_or(version)).ok()
}

/// Whether two kind versions are the same, with or without the leading `v`; text that is no
/// version is the same as nothing.
pub fn same_version(a: &str, b: &str) -> bool {
    kind_semver(a).is_some_and(|a| kind_semver(b) == Some(a))
}

/// The Docker platform of this machine's architecture (`linux/amd64`, `linux/arm64`).
pub fn docker_platform() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Some("linux/amd64"),
        "aarch64" => Some("linux/arm64"),
        _ => None,
    }
}

// ---- waiting --------------------------------------------------------------------------------------
