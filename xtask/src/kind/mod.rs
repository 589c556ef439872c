//! The kind provider: a kind cluster created from the repository's kind.yaml.
//!
//! `cluster up --provider kind` checks that docker and kind are on PATH (and, if asked, that kind
//! has the expected version), pulls the images the suites need if they are missing, creates the
//! cluster from `kind.yaml` (or reuses an existing one of that name), waits until every node is
//! Ready, loads the images into the nodes and prints the kubeconfig path,
//! `<repo>/.e2e/kind-<name>.kubeconfig`.
//!
//! Every external command is built by a pure function ([`create_cluster_cmd`] and friends), so
//! `--dry-run` prints exactly what would run (one shell line per command) and the tests check it
//! without docker or kind.

use std::{
    ffi::{OsStr, OsString},
    fmt,
    io::Write,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};
use tracing::{debug, info, warn};

mod binary;
mod commands;
pub mod engine;
mod host;
mod image;
mod load;
mod network;
mod registry;

pub use commands::*;
use host::Host;
pub use host::{readiness, wait_nodes_ready};
pub use load::load_archives;

use crate::{
    cluster_config::{self, ClusterConfig},
    common::kube_version::KubeVersion,
    kube_api::{client_for, node_is_ready},
    overrides::Overrides,
    usage::UsageError,
    wait::{Probe, poll_until},
};

/// The kind release this project is tested with (also pinned in .github/workflows/e2e-kind.yaml).
pub const KIND_VERSION: &str = "v0.33.0";

/// The images the suites run, loaded into every node so that no pod pulls them.
pub const SUITE_IMAGES: [&str; 2] = [
    "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1",
    "registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
];

/// How long `kind create cluster --wait` waits for the control plane.
pub const CREATE_WAIT: &str = "5m";

/// How long `cluster up` waits for every node to be Ready after kind returns.
pub const NODES_READY_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// Read-only commands (`kind version`, `kind get ...`, `docker info`, `docker image inspect`).
const QUICK_TIMEOUT: Duration = Duration::from_secs(60);
const PULL_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// `kind create cluster` pulls the node image and boots four nodes; `--wait 5m` is part of it.
const CREATE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
const LOAD_TIMEOUT: Duration = Duration::from_secs(10 * 60);
const DELETE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Building Kubernetes from source inside a container takes a long time on small machines.
const BUILD_TIMEOUT: Duration = Duration::from_secs(3 * 60 * 60);
/// `cluster status` asks the API server once.
const STATUS_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of the kind provider (the command line's `--name`, `--image`, `--kind-version` and
/// `--kind-from-path`, or what `e2e` and `test` choose).
#[derive(Debug, Clone)]
pub struct KindOptions {
    /// Name of the kind cluster.
    pub name: String,
    /// Node image for kind; `None`: the image `cluster build --provider kind` builds here.
    pub image: Option<String>,
    /// The kind version to use; `None`: [`KIND_VERSION`].
    pub kind_version: Option<String>,
    /// Use the kind on PATH and never install one.
    pub kind_from_path: bool,
}

/// Options of `build-node-image`.
#[derive(Debug)]
pub struct BuildNodeImageOptions {
    /// A Kubernetes source tree.
    pub k8s_source: PathBuf,
    /// The image to build.
    pub image: String,
    /// Print the command instead of running it.
    pub dry_run: bool,
}

/// Creates the kind cluster (or reuses it), prints its kubeconfig path and returns it.
///
/// With `dry_run`, prints the commands that change anything instead (pulls, create, loads; the
/// read-only checks and the wait for Ready nodes are not printed) and needs neither docker nor kind.
pub async fn up(
    args: &KindOptions,
    overrides: Overrides,
    registry: bool,
    dry_run: bool,
) -> anyhow::Result<PathBuf> {
    if let Some(cpus) = overrides.node_cpus {
        return Err(UsageError::new(format!(
            "--node-cpus {cpus} is for the local provider (its nodes' sysfs); kind's nodes report the CPUs of the machine that runs them: leave it out"
        ))
        .into());
    }
    if let Some(mib) = overrides.node_hugepages_mib {
        return Err(UsageError::new(format!(
            "--node-hugepages {mib}Mi is for the local provider (it reserves the machine's hugepages for its nodes); kind's nodes report the hugepages of the machine that runs them: leave it out"
        ))
        .into());
    }
    let stray = crate::host_cleanup::unmounted_v1_controllers();
    if !stray.is_empty() && !dry_run {
        let list = stray.join(",");
        return Err(UsageError::new(format!(
            "the cgroup v1 controller(s) {list} sit in a hierarchy that is no longer mounted (unmounted while cgroups were left in it, by a killed local cluster for example), and systemd in kind's nodes cannot start that way: mount it (`mkdir -p /tmp/h && mount -t cgroup -o {list} cgroup /tmp/h`), remove the cgroup directories in it (`rmdir`, deepest first), `umount /tmp/h`, then try again"
        ))
        .into());
    }
    let host = Host::current();
    let mut args = args.clone();
    let own = args.image.is_none();
    let k8s = kubernetes_of(&overrides);
    if !own && (k8s.release.is_some() || k8s.source.is_some()) {
        return Err(UsageError::new(format!(
            "{overrides} builds the kind node image here, and --image (or KIND_NODE_IMAGE) {} names another: leave one of them out",
            args.image.as_deref().unwrap_or_default()
        ))
        .into());
    }
    let mut known_gates = None;
    if own {
        args.image = Some(if dry_run {
            format!("{}:<built by `cargo xtask cluster build --provider kind`>", image::REPOSITORY)
        } else {
            let built = build_in(&host, &args, k8s).await?;
            if k8s.release.is_some() || k8s.source.is_some() {
                known_gates = Some(built.known_gates);
            }
            built.tag
        });
    }
    let needs = network::HostNeeds::detect(own, registry)?;
    up_in(&host, &args, &overrides, known_gates.as_deref(), needs, dry_run, &mut std::io::stdout()).await
}

/// The Kubernetes a node image is built from, as the overrides name it.
fn kubernetes_of(overrides: &Overrides) -> image::Kubernetes<'_> {
    image::Kubernetes { release: overrides.k8s_version.as_ref(), source: overrides.k8s_source.as_deref() }
}

/// `cluster build --provider kind`: builds the node image of the pinned Kubernetes, of another
/// release or of a checkout unless it exists; prints its tag.
pub async fn build(
    args: &KindOptions,
    release: Option<&KubeVersion>,
    source: Option<&Path>,
) -> anyhow::Result<String> {
    let built = build_in(&Host::current(), args, image::Kubernetes { release, source }).await?;
    println!("{}", built.tag);
    Ok(built.tag)
}

async fn build_in(
    host: &Host,
    args: &KindOptions,
    k8s: image::Kubernetes<'_>,
) -> anyhow::Result<image::NodeImage> {
    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    let layout = crate::common::layout::Layout::from_env(host.repo.clone())?;
    image::ensure(&tools, &layout, args.kind_version.as_deref().unwrap_or(KIND_VERSION), k8s).await
}

/// Deletes the kind cluster and its kubeconfig file; with `dry_run`, prints the commands instead.
pub async fn down(args: &KindOptions, dry_run: bool) -> anyhow::Result<()> {
    down_in(&Host::current(), args, dry_run, &mut std::io::stdout()).await
}

/// What is left of kind cluster `args.name`: containers named after it (nodes, registry), kind's
/// network, its kubeconfig. Empty after a complete `cluster down`.
pub async fn leftovers(args: &KindOptions) -> anyhow::Result<Vec<String>> {
    let host = Host::current();
    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    let prefix = format!("{}-", args.name);
    let mut left: Vec<String> = tools
        .container_names()
        .await?
        .into_iter()
        .filter(|name| name.starts_with(&prefix))
        .map(|name| format!("container {name}"))
        .collect();
    let networks =
        tools.output(&Cmd::new("docker", ["network", "ls", "--format", "{{.Name}}"]), QUICK_TIMEOUT).await?;
    left.extend(networks.lines().map(str::trim).filter(|n| *n == "kind").map(|n| format!("network {n}")));
    let kubeconfig = kubeconfig_path(&host.repo, &args.name);
    if kubeconfig.exists() {
        left.push(format!("kubeconfig {}", kubeconfig.display()));
    }
    Ok(left)
}

/// `kind export logs DIR --name N`: the nodes' journals, containerd's and the kubelet's logs and
/// every pod's, for a run that failed (the cluster is deleted afterwards).
pub async fn export_logs(args: &KindOptions, dir: &Path) -> anyhow::Result<()> {
    let tools = Host::current().tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    let mut export = Cmd::new("kind", ["export", "logs"]);
    export.args.extend([dir.as_os_str().to_owned(), "--name".into(), args.name.clone().into()]);
    tools.output(&export, LOAD_TIMEOUT).await?;
    Ok(())
}

/// Says whether the kind cluster exists, how its nodes are, and the settings kind.yaml gives it;
/// returns whether the cluster exists.
pub async fn status(args: &KindOptions) -> anyhow::Result<bool> {
    status_in(&Host::current(), args, &mut std::io::stdout()).await
}

/// Wraps `kind build node-image --image IMG DIR`; prints the image name when done.
pub async fn build_node_image(args: &BuildNodeImageOptions) -> anyhow::Result<()> {
    build_node_image_in(&Host::current(), args, &mut std::io::stdout()).await
}

fn write_lines(out: &mut dyn Write, lines: &[String]) -> anyhow::Result<()> {
    for line in lines {
        writeln!(out, "{line}").context("cannot write to stdout")?;
    }
    Ok(())
}

/// `known_gates`: the gates the node image's kubelet takes, when it is another Kubernetes than
/// the one kind.yaml's gates are written for (the others are left out).
async fn up_in(
    host: &Host,
    args: &KindOptions,
    overrides: &Overrides,
    known_gates: Option<&[String]>,
    needs: network::HostNeeds,
    dry_run: bool,
    out: &mut dyn Write,
) -> anyhow::Result<PathBuf> {
    validate_name(&args.name)?;
    let derived;
    let config_path = if overrides.is_empty() && !needs.any() {
        &host.kind_yaml
    } else {
        // kind.yaml with the lane's gates, as upstream's CI lanes append them, and what this
        // host needs.
        derived = host.repo.join(".e2e").join(format!("kind-{}.yaml", args.name));
        let mut text = if overrides.is_empty() {
            std::fs::read_to_string(&host.kind_yaml)
                .with_context(|| format!("cannot read {}", host.kind_yaml.display()))?
        } else {
            overrides.kind_config(&host.kind_yaml, known_gates)?
        };
        if needs.any() {
            text = network::apply_host_needs(&text, needs)?;
        }
        std::fs::create_dir_all(host.repo.join(".e2e")).context("create .e2e")?;
        std::fs::write(&derived, text).with_context(|| format!("write {}", derived.display()))?;
        &derived
    };
    let settings = ClusterConfig::load(config_path)?;
    debug!("settings from {}:\n{settings}", config_path.display());
    let kubeconfig = kubeconfig_path(&host.repo, &args.name);
    let image = args.image.as_deref();

    // Our node image has the suites' images preloaded and no kindnetd.
    let suite_images: &[&str] = if needs.own_cni { &[] } else { &SUITE_IMAGES };
    if dry_run {
        let mut lines = up_lines(&args.name, config_path, image, &kubeconfig);
        if needs.own_cni {
            lines.retain(|line| line.starts_with("kind create"));
        }
        write_lines(out, &lines)?;
        info!(
            "dry run: would then wait up to {NODES_READY_TIMEOUT:?} for every node to be Ready and print {}",
            kubeconfig.display()
        );
        return Ok(kubeconfig);
    }

    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    let daemon = &tools.daemon;
    let owner = owner_path(&host.repo, &args.name);
    let exists = tools.cluster_exists(&args.name).await?;
    if exists && std::fs::read_to_string(&owner).ok().as_deref().map(str::trim) != Some(daemon.as_str()) {
        return Err(UsageError::new(name_in_use_sentence(&args.name)).into());
    }
    if !exists {
        let taken = node_name_conflicts(&args.name, &tools.container_names().await?);
        if !taken.is_empty() {
            return Err(UsageError::new(names_taken_sentence(&args.name, &taken)).into());
        }
    }
    for image in suite_images {
        tools.pull_if_missing(image).await?;
    }

    if exists {
        info!(
            "kind cluster {:?} exists; reusing it (run `cargo xtask cluster down --provider kind` first to apply kind.yaml changes)",
            args.name
        );
        if let Some(image) = image {
            warn!("--image {image} is ignored for the existing cluster {:?}", args.name);
        }
        tools.run(&export_kubeconfig_cmd(&args.name, &kubeconfig), QUICK_TIMEOUT).await?;
    } else {
        info!(
            "creating kind cluster {:?} from {} (this takes a few minutes)",
            args.name,
            config_path.display()
        );
        if needs.cgroup_v1 {
            info!("{}", network::CGROUP_V1_SENTENCE);
        }
        let mut create = create_cluster_cmd(&args.name, config_path, image, &kubeconfig);
        if needs.own_cni {
            // No node is Ready before the xtask gives it a pod network: kind must not wait.
            create = without_wait(create);
        }
        if let Err(err) = tools.run(&create, CREATE_TIMEOUT).await {
            // kind removes the nodes of a cluster it failed to create, not its network.
            if let Err(net) = network::remove_unused_kind_network(&tools).await {
                warn!("{net:#}");
            }
            return Err(err);
        }
        if let Some(dir) = owner.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::write(&owner, format!("{daemon}\n"))
            .with_context(|| format!("write {}", owner.display()))?;
    }

    let nodes = tools.nodes(&args.name).await?;
    ensure!(!nodes.is_empty(), "kind reports no nodes for cluster {:?}", args.name);
    if needs.own_cni {
        info!("configuring the pod network of {} nodes", nodes.len());
        network::setup_pod_network(&tools, &kubeconfig, &nodes, NODES_READY_TIMEOUT).await?;
    }
    info!("waiting for {} nodes to be Ready", nodes.len());
    wait_nodes_ready(&kubeconfig, &nodes, NODES_READY_TIMEOUT)
        .await
        .with_context(|| format!("kind cluster {:?} did not become ready", args.name))?;

    for image in suite_images {
        tools.load_image(&args.name, image).await?;
    }
    if needs.own_cni {
        network::wait_coredns(&kubeconfig, NODES_READY_TIMEOUT).await?;
    }
    if needs.registry {
        let layout = crate::common::layout::Layout::from_env(host.repo.clone())?;
        registry::ensure(&tools, &layout, &host.repo, &args.name, &nodes).await?;
    }
    info!("kind cluster {:?} is ready", args.name);
    writeln!(out, "{}", kubeconfig.display()).context("cannot write to stdout")?;
    Ok(kubeconfig)
}

async fn down_in(host: &Host, args: &KindOptions, dry_run: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    validate_name(&args.name)?;
    let kubeconfig = kubeconfig_path(&host.repo, &args.name);
    if dry_run {
        return write_lines(out, &down_lines(&args.name, &kubeconfig));
    }
    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    // kind deletes nothing and succeeds when the cluster does not exist.
    tools.run(&delete_cluster_cmd(&args.name, &kubeconfig), DELETE_TIMEOUT).await?;
    registry::remove(&tools, &host.repo, &args.name).await?;
    network::remove_unused_kind_network(&tools).await?;
    for file in [&kubeconfig, &owner_path(&host.repo, &args.name)] {
        match std::fs::remove_file(file) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(err).with_context(|| format!("cannot remove {}", file.display()));
            }
        }
    }
    info!("kind cluster {:?} deleted", args.name);
    Ok(())
}

async fn status_in(host: &Host, args: &KindOptions, out: &mut dyn Write) -> anyhow::Result<bool> {
    validate_name(&args.name)?;
    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    let kubeconfig = kubeconfig_path(&host.repo, &args.name);
    let mut lines = Vec::new();
    let exists = tools.cluster_exists(&args.name).await?;
    if !exists {
        lines.push(format!(
            "kind cluster {:?}: not found (create it with `cargo xtask cluster up --provider kind --name {}`)",
            args.name, args.name
        ));
    } else {
        lines.push(format!("kind cluster {:?}: exists", args.name));
        let nodes = tools.nodes(&args.name).await?;
        lines.push(if kubeconfig.is_file() {
            format!("kubeconfig: {}", kubeconfig.display())
        } else {
            format!(
                "kubeconfig: {} is missing (`cargo xtask cluster up --provider kind` writes it)",
                kubeconfig.display()
            )
        });
        let seen = if kubeconfig.is_file() {
            let probe = async {
                let api: Api<Node> = Api::all(client_for(&kubeconfig).await?);
                let listed = api.list(&ListParams::default()).await.context("listing nodes")?;
                anyhow::Ok(readiness(&listed.items, &nodes).1)
            };
            match tokio::time::timeout(STATUS_TIMEOUT, probe).await {
                Ok(Ok(seen)) => seen,
                Ok(Err(err)) => format!("{} (API server: {err:#})", nodes.join(", ")),
                Err(_) => {
                    format!("{} (the API server did not answer within {STATUS_TIMEOUT:?})", nodes.join(", "))
                }
            }
        } else {
            nodes.join(", ")
        };
        lines.push(format!("nodes: {seen}"));
    }
    let settings = ClusterConfig::load(&host.kind_yaml)?;
    lines.push(format!("settings from {}:", host.kind_yaml.display()));
    lines.extend(settings.to_string().lines().map(|line| format!("  {line}")));
    write_lines(out, &lines)?;
    Ok(exists)
}

async fn build_node_image_in(
    host: &Host,
    args: &BuildNodeImageOptions,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let cmd = build_node_image_cmd(&args.image, &args.k8s_source);
    if args.dry_run {
        return write_lines(out, &[cmd.to_string()]);
    }
    let go_mod = args.k8s_source.join("go.mod");
    let module = std::fs::read_to_string(&go_mod).with_context(|| {
        format!(
            "{} is not a Kubernetes source tree (cannot read {})",
            args.k8s_source.display(),
            go_mod.display()
        )
    })?;
    ensure!(
        module.lines().any(|line| line.trim() == "module k8s.io/kubernetes"),
        "{} is not a Kubernetes source tree ({} is not module k8s.io/kubernetes)",
        args.k8s_source.display(),
        go_mod.display()
    );
    let tools = host.tools(None, false).await?;
    info!("building node image {} from {} (this takes a long time)", args.image, args.k8s_source.display());
    tools.run(&cmd, BUILD_TIMEOUT).await?;
    writeln!(out, "{}", args.image).context("cannot write to stdout")?;
    Ok(())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod workflow_tests;
