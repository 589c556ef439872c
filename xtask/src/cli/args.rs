//! The options of `cluster …`, `build-node-image`, `test`, `upstream-specs` and `mutants` as clap parses them,
//! and their conversion into the plain option structs the commands take ([`kind::KindOptions`],
//! [`overrides::OverrideArgs`], [`test::TestOptions`], …). The doc comments of the fields are the
//! help texts.

use std::path::PathBuf;

use clap::Args;

use super::values::{BreakArg, ProviderArg, TestLaneArg};
use crate::{kind, mutants, overrides, test, upstream_specs};

/// Options of the kind provider.
#[derive(Debug, Args)]
pub struct KindArgs {
    /// Name of the kind cluster.
    #[arg(long, env = "KIND_CLUSTER_NAME", default_value = "dra-e2e")]
    pub name: String,
    /// Node image for kind (for example kindest/node:v1.37.2); unset: the image `cluster build
    /// --provider kind` builds here (built first if missing), with its own pod network.
    #[arg(long, env = "KIND_NODE_IMAGE")]
    pub image: Option<String>,
    /// The kind version to use (default v0.33.0): the kind on PATH if it has that version, else
    /// installed with `go install sigs.k8s.io/kind@VERSION` into dra-e2e's cache.
    #[arg(long, env = "KIND_VERSION")]
    pub kind_version: Option<String>,
    /// Use the kind on PATH and never install one: a missing kind or another version than
    /// --kind-version is an error.
    #[arg(long)]
    pub kind_from_path: bool,
}

impl From<KindArgs> for kind::KindOptions {
    fn from(args: KindArgs) -> Self {
        let KindArgs { name, image, kind_version, kind_from_path } = args;
        Self { name, image, kind_version, kind_from_path }
    }
}

/// Options of `build-node-image`.
#[derive(Debug, Args)]
pub struct BuildNodeImageArgs {
    /// A Kubernetes source tree.
    #[arg(long)]
    pub k8s_source: PathBuf,
    /// The image to build.
    #[arg(long, default_value = "dra/node:latest")]
    pub image: String,
    /// Print the command instead of running it.
    #[arg(long)]
    pub dry_run: bool,
}

impl From<BuildNodeImageArgs> for kind::BuildNodeImageOptions {
    fn from(args: BuildNodeImageArgs) -> Self {
        let BuildNodeImageArgs { k8s_source, image, dry_run } = args;
        Self { k8s_source, image, dry_run }
    }
}

/// `--feature-gates`, `--runtime-config` and `--kubelet-version` of `cluster up`.
#[derive(Debug, Args)]
pub struct OverrideArgs {
    /// Feature gates in addition to kind.yaml's, for every component: `A=true,B=false`.
    #[arg(long, value_name = "GATE=BOOL,...")]
    pub feature_gates: Option<String>,
    /// API versions the apiserver serves in addition to kind.yaml's: `scheduling.k8s.io/v1beta1=true`.
    #[arg(long, value_name = "GROUP/VERSION=VALUE,...")]
    pub runtime_config: Option<String>,
    /// Kubelet versions of the workers, in order: `v1.34.4` makes kind-worker's kubelet v1.34.4
    /// and leaves the other workers at the cluster's version; `v1.37.2,v1.35.4` changes only
    /// kind-worker2. Wins over kind.yaml's per-node `image: kindest/node:vX.Y.Z`. Supported: the
    /// versions under xtask/local-cluster/kubelet/ (v1.34.4, v1.35.4, v1.36.3), each built once
    /// from its k8s.io/kubernetes module and cached. The kind provider sets the workers' images
    /// to kindest/node:V instead.
    #[arg(long, value_name = "VERSION,...")]
    pub kubelet_version: Option<String>,
    /// The Kubernetes release the cluster runs (local provider): `v1.38.0-beta.0` builds its
    /// control plane and kubelets from k8s.io/kubernetes@v1.38.0-beta.0 with the Go toolchain
    /// its go.mod asks for (fetched by go); default: the release xtask/local-cluster/go.mod pins.
    /// Feature gates of kind.yaml that the release does not accept are left out, with a note.
    #[arg(long, value_name = "VERSION")]
    pub k8s_version: Option<String>,
    /// Build the cluster from this Kubernetes checkout (local provider; its staging modules
    /// included), with the version `git describe` gives it (or KUBE_GIT_VERSION). Every `cluster
    /// up` rebuilds what changed since the last build.
    #[arg(long, value_name = "DIR", conflicts_with = "k8s_version")]
    pub k8s_source: Option<PathBuf>,
    /// The CPUs each node reports as its capacity (local provider), as a VM's kubelet reports its
    /// vCPUs: its containerd and kubelet see a sysfs with that many; pods still share the
    /// machine's CPUs. Default 8, as upstream's kind nodes; 0: the machine's own.
    #[arg(long, value_name = "N")]
    pub node_cpus: Option<usize>,
    /// The 2 MiB hugepages the nodes report (local provider): the machine's pool is grown to this
    /// size (never shrunk) and, on cgroup v1, the hugetlb controller mounted, until `cluster
    /// down`. Default 512Mi; 0: the machine's pool, left as it is.
    #[arg(long, value_name = "SIZE")]
    pub node_hugepages: Option<String>,
}

impl From<OverrideArgs> for overrides::OverrideArgs {
    fn from(args: OverrideArgs) -> Self {
        let OverrideArgs {
            feature_gates,
            runtime_config,
            kubelet_version,
            k8s_version,
            k8s_source,
            node_cpus,
            node_hugepages,
        } = args;
        Self {
            feature_gates,
            runtime_config,
            kubelet_version,
            k8s_version,
            k8s_source,
            node_cpus,
            node_hugepages,
        }
    }
}

/// Options shared by `cluster up`, `down` and `status`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The cluster provider.
    #[arg(long, value_enum, default_value_t)]
    pub provider: ProviderArg,
    /// The kind provider's options.
    #[command(flatten)]
    pub kind: KindArgs,
    /// Print the commands instead of running them (kind provider).
    #[arg(long)]
    pub dry_run: bool,
    /// Number of nodes of the local cluster (`up`): one control plane and N-1 workers; default:
    /// the nodes kind.yaml lists.
    #[arg(long)]
    pub nodes: Option<usize>,
}

/// Options of `cluster up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// The options `cluster up` shares with `down` and `status`.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Gates and API versions on top of kind.yaml's, as upstream's CI lanes add them.
    #[command(flatten)]
    pub overrides: OverrideArgs,
    /// Also run a registry: push to localhost:PORT, pods pull `localhost:PORT/…` (PORT 5000; with
    /// kind 5001 unless the cluster is named kind, as kubevirtci's providers). Local provider:
    /// added to a running cluster; kind: the cluster must be created with it.
    #[arg(long)]
    pub registry: bool,
}

/// Options of `cluster restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// The component, as `cluster status` names it: `kubelet-kind-worker`, `kube-apiserver`.
    pub component: String,
    /// Kill it (SIGKILL at once, as a crash does) instead of SIGTERM and its grace period.
    #[arg(long)]
    pub kill: bool,
    /// The cluster provider (only the local one has components to restart).
    #[arg(long, value_enum, default_value_t)]
    pub provider: ProviderArg,
}

/// Options of `cluster build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The cluster provider: its binaries (local) or its node image (kind).
    #[arg(long, value_enum, default_value_t)]
    pub provider: ProviderArg,
    /// The kind provider's options.
    #[command(flatten)]
    pub kind: KindArgs,
    /// Also build these older kubelets (as `cluster up --kubelet-version` takes them:
    /// `v1.34.4,v1.36.3`).
    #[arg(long, value_name = "V1,V2,...")]
    pub kubelet_version: Option<String>,
    /// Build this Kubernetes release instead of the pinned one (as `cluster up --k8s-version`).
    #[arg(long, value_name = "VERSION")]
    pub k8s_version: Option<String>,
    /// Build from this Kubernetes checkout (as `cluster up --k8s-source`).
    #[arg(long, value_name = "DIR", conflicts_with = "k8s_version")]
    pub k8s_source: Option<PathBuf>,
}

/// Options of `cluster load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Image archives: tars as `docker save` writes them, or OCI image layouts in a tar.
    #[arg(required = true, value_name = "IMAGE-ARCHIVE")]
    pub archives: Vec<PathBuf>,
    /// The cluster provider.
    #[arg(long, value_enum, default_value_t)]
    pub provider: ProviderArg,
    /// The kind provider's options.
    #[command(flatten)]
    pub kind: KindArgs,
    /// Print the commands instead of running them (kind provider).
    #[arg(long)]
    pub dry_run: bool,
}

/// Options of `cargo xtask test`.
#[derive(Debug, Args)]
pub struct TestArgs {
    /// Run only the tests that need no cluster.
    #[arg(long)]
    pub no_cluster: bool,
    /// What to run: `all` (CI's run), `local` (no kind), `kind` (the kind lane alone) or `driver`
    /// (the driver lane alone, on the local cluster).
    #[arg(long, value_enum, default_value_t)]
    pub lane: TestLaneArg,
    /// Leave the local cluster running afterwards (the kind lane's cluster is always deleted).
    #[arg(long)]
    pub keep_cluster: bool,
    /// Run machine M's share of the run split over N machines (1 <= M <= N <= 6), e.g. a CI
    /// matrix's job: every machine computes the same plan from the measured step costs, so the
    /// N machines together run every step once; each brings up and builds only what its share
    /// needs (docs/lanes.md has the machines of N = 3, docs/ci.md example matrices).
    #[arg(long, value_name = "M/N")]
    pub partition: Option<String>,
}

impl TryFrom<TestArgs> for test::TestOptions {
    type Error = crate::usage::UsageError;

    fn try_from(args: TestArgs) -> Result<Self, Self::Error> {
        let TestArgs { no_cluster, lane, keep_cluster, partition } = args;
        let partition = partition.as_deref().map(test::partition::Partition::parse).transpose()?;
        Ok(Self { no_cluster, lane: lane.into(), keep_cluster, partition })
    }
}

/// `cargo xtask upstream-specs`.
#[derive(Debug, Args)]
pub struct UpstreamSpecsArgs {
    /// The Kubernetes version, as its tag: v1.37.2, v1.38.0-beta.0.
    pub version: String,
    /// Where to write the list (default: suites/upstream/specs-V.txt in the repository); the
    /// gates go beside it as gates-V.txt.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

impl From<UpstreamSpecsArgs> for upstream_specs::UpstreamSpecsOptions {
    fn from(args: UpstreamSpecsArgs) -> Self {
        let UpstreamSpecsArgs { version, out } = args;
        Self { version, out }
    }
}

/// `cargo xtask mutants`.
#[derive(Debug, Args)]
pub struct MutantsArgs {
    /// The Kubernetes checkout to put the bugs into (each is taken out again). Default: a
    /// checkout of --k8s-version assembled from Go's module cache.
    #[arg(long, value_name = "DIR", conflicts_with = "k8s_version")]
    pub k8s_source: Option<PathBuf>,
    /// The release of the assembled checkout (default: the pinned one, xtask/local-cluster/go.mod).
    #[arg(long, value_name = "VERSION")]
    pub k8s_version: Option<String>,
    /// Only this mutant (repeatable); `--list` names them.
    #[arg(long, value_name = "NAME")]
    pub only: Vec<String>,
    /// Do not run the lanes on the unmutated checkout first (the table says so: no failure is
    /// then known to pass without the bug).
    #[arg(long)]
    pub no_baseline: bool,
    /// Print the mutants and exit.
    #[arg(long)]
    pub list: bool,
    /// Assemble the checkout and build the cluster's binaries from it; start nothing.
    #[arg(long)]
    pub build_only: bool,
    /// Where to write the Markdown table (default: target/e2e/mutants.md).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl From<MutantsArgs> for mutants::MutantsOptions {
    fn from(args: MutantsArgs) -> Self {
        let MutantsArgs { k8s_source, k8s_version, only, no_baseline, list, build_only, output } = args;
        Self { k8s_source, k8s_version, only, no_baseline, list, build_only, output }
    }
}

/// `cargo xtask example-driver …`.
#[derive(Debug, clap::Subcommand)]
pub enum ExampleDriverAction {
    /// Build the example driver and its image, import it into the local cluster's nodes, apply
    /// manifests/example-driver.yaml and wait until every worker runs the driver, registered with
    /// its kubelet and with its ResourceSlice published. Deploying again with another --break
    /// rolls the pods.
    Deploy(ExampleDriverDeployArgs),
    /// Delete everything deploy created and wait until the driver's pods and slices are gone.
    Remove(DriverClusterArgs),
}

/// `cargo xtask upstream-driver …`.
#[derive(Debug, clap::Subcommand)]
pub enum UpstreamDriverAction {
    /// Build upstream's DRA test driver and its image at the local cluster's configured
    /// Kubernetes version from the cluster's Go module, without a cluster; prints the image's
    /// name, archive and digest.
    Build,
    /// Build upstream's DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver) at the
    /// cluster's version from the cluster's own Go module, import its image into the local
    /// cluster's nodes, apply upstream's plugin permissions and manifests/upstream-test-driver.yaml,
    /// and wait until every worker runs the driver, registered with its kubelet and with its
    /// ResourceSlice published.
    Deploy(DriverClusterArgs),
    /// Delete everything deploy created and wait until the driver's pods and slices are gone.
    Remove(DriverClusterArgs),
}

/// The cluster of `example-driver` and `upstream-driver`.
#[derive(Debug, Args)]
pub struct DriverClusterArgs {
    /// The cluster's kubeconfig (default: the local cluster's admin kubeconfig); the image goes
    /// into the local cluster's nodes.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Options of `example-driver deploy`.
#[derive(Debug, Args)]
pub struct ExampleDriverDeployArgs {
    /// The cluster.
    #[command(flatten)]
    pub cluster: DriverClusterArgs,
    /// Break the driver on purpose (default: it works).
    #[arg(long = "break", value_enum)]
    pub brk: Option<BreakArg>,
    /// Static CDI devices: the driver writes one CDI spec for all of a node's devices when it
    /// starts and none per claim (default: a spec per claim).
    #[arg(long)]
    pub static_cdi: bool,
    /// Also publish devices of DRA's optional features (partitions of a shared counter, a
    /// device shared by capacity, a tainted device), for the driver-under-test specs of those
    /// features (default: plain devices only).
    #[arg(long)]
    pub optional_devices: bool,
}
