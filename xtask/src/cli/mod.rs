//! The command line of `cargo xtask` and the dispatch to each subcommand.
//!
//! clap lives here only: the commands below take plain option structs
//! ([`kind::KindOptions`], [`overrides::OverrideArgs`], [`test::TestOptions`],
//! [`e2e::E2eOptions`], …), which the clap structs of [`args`], [`docker`], [`runner`] and
//! [`values`] are converted into where a command is dispatched. [`parse`] reads the command
//! line; [`shim`] is the command line of the engine's runc shim, parsed before the rest.

pub mod args;
pub mod docker;
pub mod parse;
pub mod runner;
pub mod shim;
pub mod values;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

use self::{
    args::{
        BuildArgs, BuildNodeImageArgs, ClusterArgs, DriverClusterArgs, ExampleDriverAction,
        ExampleDriverDeployArgs, LoadArgs, MutantsArgs, RestartArgs, TestArgs, UpArgs, UpstreamDriverAction,
        UpstreamSpecsArgs,
    },
    docker::DockerAction,
    runner::{BenchAction, E2eArgs},
};
use crate::{
    bench, deployed_driver, e2e, example_driver, image_archive, kind, kubectl, local, mutants, overrides,
    provider::Provider, test, upstream_driver, upstream_specs, usage::UsageError,
};

/// cargo xtask: clusters, e2e runs and the project's tests for dra-e2e.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
pub struct Cli {
    /// Log at debug level (RUST_LOG overrides).
    #[arg(long, short, global = true)]
    pub verbose: bool,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `cargo xtask [-v] kubectl ARGS…` without clap: every argument after `kubectl` is kubectl's,
    /// also the ones that look like xtask's own global flags (`kubectl -v 6 get nodes`). None for
    /// every other command line.
    pub fn kubectl_verbatim(argv: Vec<String>) -> Option<Self> {
        let mut verbose = false;
        let mut rest = argv.into_iter().skip(1);
        for arg in rest.by_ref() {
            match arg.as_str() {
                "-v" | "--verbose" => verbose = true,
                "kubectl" => {
                    return Some(Self { verbose, command: Command::Kubectl { args: rest.collect() } });
                }
                _ => return None,
            }
        }
        None
    }
}

/// The subcommands of `cargo xtask`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Bring a cluster up or down, or say what runs.
    Cluster {
        /// What to do with the cluster.
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// The run's own Docker engine for the kind provider: `docker up` starts a dockerd with its own
    /// data root and socket (installing Debian's docker.io as root if there is no dockerd) and
    /// prints its DOCKER_HOST; `docker down` stops it and removes what it left; `docker status`.
    Docker {
        /// What to do with the engine.
        #[command(subcommand)]
        action: DockerAction,
    },
    /// Build a kind node image from a Kubernetes source tree (`kind build node-image`).
    BuildNodeImage(BuildNodeImageArgs),
    /// Run the DRA suites: build dra-e2e, bring a cluster up unless --kubeconfig names one, run the
    /// selected specs with the runner's flags as given, take the cluster down again (unless
    /// --keep-cluster, or it was running already). Every flag is checked before anything is built
    /// or started.
    #[command(mut_arg("kubeconfig", runner::e2e_kubeconfig), mut_arg("k8s_version", runner::e2e_k8s_version))]
    E2e(E2eArgs),
    /// Measure the suites: `cargo xtask bench suites [--kubeconfig PATH] [dra-e2e flags]` runs a
    /// selection, then prints where its time went.
    Bench {
        /// The benchmark.
        #[command(subcommand)]
        action: BenchAction,
    },
    /// The project's own tests (what CI runs): unit, protocol and cluster tests, and the suites.
    /// Each lane must run what its selection lists, skipping only as docs/lanes.md documents;
    /// exit 1 when a step failed, 130 when interrupted (the table names the steps not run).
    Test(TestArgs),
    /// kubectl of the cluster's Kubernetes version (built from the same module, cached with the
    /// cluster's binaries), against the local cluster unless `--kubeconfig` or $KUBECONFIG says
    /// otherwise: `cargo xtask kubectl get nodes -o wide`. Every argument goes to kubectl as is.
    #[command(disable_help_flag = true)]
    Kubectl {
        /// kubectl's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Write upstream's spec list for a Kubernetes version (suites/upstream/specs-V.txt): build
    /// its e2e test binary with the test packages that mention DRA, run its ginkgo dry run with
    /// --ginkgo.focus=DRA. Go fetches the toolchain V's go.mod asks for.
    UpstreamSpecs(UpstreamSpecsArgs),
    /// How many bugs the suites catch: put one small bug at a time into the DRA code of a
    /// Kubernetes checkout (kubelet DRA manager, scheduler plugin, resourceclaim controller),
    /// bring the local cluster up from it, run the lane that should catch it and report which
    /// specs caught it, as a Markdown table. Caught: a spec that passed on the baseline fails an
    /// assertion, and again when run once more; timeouts, interrupts, set-up or clean-up failures
    /// alone leave the bug "not checked". Ctrl-C: no verdict for the bug in progress, exit 130.
    Mutants(MutantsArgs),
    /// The crate's example DRA driver (kubelet-plugin/examples/node_driver.rs) as a DaemonSet on
    /// the local cluster's workers, working or broken on purpose: `example-driver deploy
    /// [--break skip-unprepare|fail-unprepare]`, `example-driver remove`.
    ExampleDriver {
        /// Deploy or remove.
        #[command(subcommand)]
        action: ExampleDriverAction,
    },
    /// Upstream's own DRA test driver (k8s.io/kubernetes test/e2e/dra/test-driver), built at the
    /// cluster's version, as a DaemonSet on the local cluster's workers with upstream's plugin
    /// permissions: `upstream-driver build`, `upstream-driver deploy`, `upstream-driver remove`. Then
    /// `cargo xtask e2e --driver test-driver.cdi.k8s.io [--interpose]` checks it.
    UpstreamDriver {
        /// Deploy or remove.
        #[command(subcommand)]
        action: UpstreamDriverAction,
    },
    /// Internal: forward a host TCP address into a network namespace (the local cluster's
    /// apiserver forwarder, started and stopped by `cluster up`/`down`).
    #[command(hide = true)]
    NetnsForward {
        /// The network namespace file (e.g. /run/netns/dra-e2e-kind-control-plane).
        #[arg(long)]
        netns: PathBuf,
        /// Where to listen, in the host's namespace.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// Where to connect, inside the namespace.
        #[arg(long)]
        connect: std::net::SocketAddr,
    },
}

/// `cargo xtask cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterAction {
    /// Create the cluster (idempotent) and print its kubeconfig path.
    Up(UpArgs),
    /// Import image archives (docker save or OCI layout tars) into every node's containerd.
    Load(LoadArgs),
    /// Stop the cluster and remove everything it created.
    Down(ClusterArgs),
    /// Build (or find in the cache) the binaries `cluster up --provider local` starts, and the
    /// older kubelets `--kubelet-version` names, without starting anything: a cache warmed
    /// ahead of a run, or a build checked on its own. With `--provider kind`: the kind node
    /// image `cluster up --provider kind` runs (`dra-e2e/kind-node:<version>-<hash>`).
    Build(BuildArgs),
    /// Say what runs.
    Status(ClusterArgs),
    /// Restart one component of the running local cluster (`kubelet-kind-worker`,
    /// `kube-apiserver`, `containerd-kind-worker`, …; `cluster status` names them) as it was
    /// started, and wait until it serves again: a kubelet until its node is Ready, the API server
    /// until /readyz is ok. For trying a run against a restart.
    Restart(RestartArgs),
}

/// Runs the parsed command line: converts each command's options into the plain ones it takes.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if matches!(cli.command, Command::E2e(_) | Command::Bench { .. } | Command::Test(_) | Command::Mutants(_))
    {
        // The commands that run dra-e2e pass SIGTERM on to it and wait for its clean-up.
        e2e::pass_on_sigterm();
    }
    match cli.command {
        Command::Cluster { action } => run_cluster(action).await,
        Command::Docker { action } => kind::engine::run(action.into()).await,
        Command::BuildNodeImage(args) => {
            kind::build_node_image(&args.into()).await.map(|_| ExitCode::SUCCESS)
        }
        Command::E2e(args) => e2e::run(args.into()).await,
        Command::Bench { action: BenchAction::Suites(args) } => bench::run(args.into()).await,
        Command::Test(args) => test::run(args.try_into()?).await,
        Command::Kubectl { args } => kubectl::run(args).await,
        Command::UpstreamSpecs(args) => upstream_specs::run(&args.into()),
        Command::Mutants(args) => mutants::run(args.into()).await,
        Command::ExampleDriver { action } => run_example_driver(action).await.map(|()| ExitCode::SUCCESS),
        Command::UpstreamDriver { action } => run_upstream_driver(action).await.map(|()| ExitCode::SUCCESS),
        Command::NetnsForward { netns, listen, connect } => {
            local::forward_command(netns, listen, connect).await.map(|_| ExitCode::SUCCESS)
        }
    }
}

/// Runs `cargo xtask cluster …`.
async fn run_cluster(action: ClusterAction) -> anyhow::Result<ExitCode> {
    match action {
        ClusterAction::Up(UpArgs { cluster: args, overrides, registry }) => {
            let overrides = overrides::OverrideArgs::from(overrides).parse()?;
            let kind = kind::KindOptions::from(args.kind);
            Provider::from(args.provider)
                .up(&kind, args.nodes, overrides, registry, args.dry_run)
                .await
                .map(|_| ExitCode::SUCCESS)
        }
        ClusterAction::Restart(RestartArgs { component, kill, provider }) => {
            if Provider::from(provider) == Provider::Kind {
                return Err(UsageError::new(format!(
                    "cluster restart is for the local provider, whose components are processes xtask started; on a kind node restart the kubelet with `docker exec NODE systemctl restart kubelet` (not {component})"
                ))
                .into());
            }
            let stop = if kill { local::Stop::Kill } else { local::Stop::Graceful };
            local::restart(&component, stop).await.map(|()| ExitCode::SUCCESS)
        }
        ClusterAction::Load(args) => {
            image_archive::check(&args.archives)?;
            let kind = kind::KindOptions::from(args.kind);
            Provider::from(args.provider)
                .load(&kind, &args.archives, args.dry_run)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        ClusterAction::Build(args) if Provider::from(args.provider) == Provider::Kind => {
            if args.kubelet_version.is_some() {
                return Err(UsageError::new(
                    "--kubelet-version builds older kubelets for the local provider; every node of the kind node image runs one Kubernetes (choose it with --k8s-version)",
                )
                .into());
            }
            let release = args.k8s_version.as_deref().map(local::parse_k8s_version).transpose()?;
            let kind = kind::KindOptions::from(args.kind);
            kind::build(&kind, release.as_ref(), args.k8s_source.as_deref()).await.map(|_| ExitCode::SUCCESS)
        }
        ClusterAction::Build(args) => {
            let versions = match args.kubelet_version.as_deref() {
                Some(flag) => crate::skew::parse_flag(flag)?,
                None => Vec::new(),
            };
            let release = args.k8s_version.as_deref().map(local::parse_k8s_version).transpose()?;
            local::build(release.as_ref(), args.k8s_source.as_deref(), &versions).map(|()| ExitCode::SUCCESS)
        }
        ClusterAction::Down(args) => {
            let kind = kind::KindOptions::from(args.kind);
            Provider::from(args.provider).down(&kind, args.dry_run).await.map(|()| ExitCode::SUCCESS)
        }
        ClusterAction::Status(args) => {
            let kind = kind::KindOptions::from(args.kind);
            Provider::from(args.provider).status(&kind).await.map(exit_code)
        }
    }
}

/// The kubeconfig of `example-driver` and `upstream-driver`: `--kubeconfig`, else the local
/// cluster's.
fn driver_kubeconfig(args: DriverClusterArgs) -> anyhow::Result<std::path::PathBuf> {
    match args.kubeconfig {
        Some(path) => Ok(path),
        None => deployed_driver::default_kubeconfig(),
    }
}

/// Runs `cargo xtask upstream-driver …`.
async fn run_upstream_driver(action: UpstreamDriverAction) -> anyhow::Result<()> {
    match action {
        UpstreamDriverAction::Build => upstream_driver::build().map(drop),
        UpstreamDriverAction::Deploy(cluster) => upstream_driver::deploy(&driver_kubeconfig(cluster)?).await,
        UpstreamDriverAction::Remove(cluster) => upstream_driver::remove(&driver_kubeconfig(cluster)?).await,
    }
}

/// Runs `cargo xtask example-driver …`.
async fn run_example_driver(action: ExampleDriverAction) -> anyhow::Result<()> {
    match action {
        ExampleDriverAction::Deploy(ExampleDriverDeployArgs {
            cluster,
            brk,
            static_cdi,
            optional_devices,
        }) => {
            let options = example_driver::Options { brk: brk.map(Into::into), static_cdi, optional_devices };
            example_driver::deploy_with(&driver_kubeconfig(cluster)?, options).await
        }
        ExampleDriverAction::Remove(cluster) => example_driver::remove(&driver_kubeconfig(cluster)?).await,
    }
}

/// Exit code 0 when `ok`, else 1.
fn exit_code(ok: bool) -> ExitCode {
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn kubectl_arguments_are_passed_verbatim() {
        let cli =
            Cli::kubectl_verbatim(argv(&["xtask", "kubectl", "-v", "6", "get", "nodes", "--help"])).unwrap();
        assert!(!cli.verbose);
        let Command::Kubectl { args } = cli.command else { panic!("not kubectl") };
        assert_eq!(args, ["-v", "6", "get", "nodes", "--help"]);
        let cli = Cli::kubectl_verbatim(argv(&["xtask", "-v", "kubectl"])).unwrap();
        assert!(cli.verbose);
        assert!(Cli::kubectl_verbatim(argv(&["xtask", "cluster", "up"])).is_none());
        assert!(Cli::kubectl_verbatim(argv(&["xtask", "--help"])).is_none());
    }

    #[test]
    fn cluster_load_needs_an_archive_and_takes_the_provider() {
        assert!(Cli::try_parse_from(["xtask", "cluster", "load"]).is_err());
        let cli = Cli::try_parse_from([
            "xtask",
            "cluster",
            "load",
            "a.tar",
            "b.tar",
            "--provider",
            "kind",
            "--dry-run",
        ])
        .unwrap();
        let Command::Cluster { action: ClusterAction::Load(args) } = cli.command else { panic!("not load") };
        assert_eq!(args.archives, [PathBuf::from("a.tar"), PathBuf::from("b.tar")]);
        assert_eq!(Provider::from(args.provider), Provider::Kind);
        assert!(args.dry_run);
        let cli = Cli::try_parse_from(["xtask", "cluster", "up", "--registry"]).unwrap();
        let Command::Cluster { action: ClusterAction::Up(up) } = cli.command else { panic!("not up") };
        assert!(up.registry);
    }

    #[test]
    fn cluster_build_takes_kubelet_versions() {
        let cli = Cli::try_parse_from(["xtask", "cluster", "build", "--kubelet-version", "v1.34.4"]).unwrap();
        let Command::Cluster { action: ClusterAction::Build(args) } = cli.command else {
            panic!("not build")
        };
        assert_eq!(args.kubelet_version.as_deref(), Some("v1.34.4"));
        let cli = Cli::try_parse_from(["xtask", "cluster", "build"]).unwrap();
        let Command::Cluster { action: ClusterAction::Build(args) } = cli.command else {
            panic!("not build")
        };
        assert_eq!(args.kubelet_version, None);
    }

    #[test]
    fn cluster_up_takes_worker_kubelet_versions() {
        let cli = Cli::try_parse_from([
            "xtask",
            "cluster",
            "up",
            "--provider",
            "local",
            "--kubelet-version",
            "v1.34.4,v1.36.3",
        ])
        .unwrap();
        let Command::Cluster { action: ClusterAction::Up(up) } = cli.command else { panic!("not up") };
        let overrides = overrides::OverrideArgs::from(up.overrides).parse().unwrap().unwrap();
        assert_eq!(overrides.kubelet_flag(), "v1.34.4,v1.36.3");
        let cli = Cli::try_parse_from(["xtask", "cluster", "up", "--kubelet-version", "1.34"]).unwrap();
        let Command::Cluster { action: ClusterAction::Up(up) } = cli.command else { panic!("not up") };
        assert!(overrides::OverrideArgs::from(up.overrides).parse().is_err());
    }

    #[test]
    fn example_driver_takes_a_break_and_a_kubeconfig() {
        let cli =
            Cli::try_parse_from(["xtask", "example-driver", "deploy", "--break", "fail-unprepare"]).unwrap();
        let Command::ExampleDriver { action: ExampleDriverAction::Deploy(args) } = cli.command else {
            panic!("not deploy")
        };
        assert_eq!(args.brk.map(example_driver::Break::from), Some(example_driver::Break::FailUnprepare));
        assert_eq!(args.cluster.kubeconfig, None);
        assert!(!args.static_cdi);
        let cli = Cli::try_parse_from(["xtask", "example-driver", "deploy", "--static-cdi"]).unwrap();
        let Command::ExampleDriver { action: ExampleDriverAction::Deploy(args) } = cli.command else {
            panic!("not deploy")
        };
        assert!(args.static_cdi && args.brk.is_none() && !args.optional_devices);
        let cli = Cli::try_parse_from(["xtask", "example-driver", "deploy", "--optional-devices"]).unwrap();
        let Command::ExampleDriver { action: ExampleDriverAction::Deploy(args) } = cli.command else {
            panic!("not deploy")
        };
        assert!(args.optional_devices && !args.static_cdi);
        let cli = Cli::try_parse_from(["xtask", "example-driver", "remove", "--kubeconfig", "/k"]).unwrap();
        let Command::ExampleDriver { action: ExampleDriverAction::Remove(args) } = cli.command else {
            panic!("not remove")
        };
        assert_eq!(args.kubeconfig, Some(PathBuf::from("/k")));
        assert!(Cli::try_parse_from(["xtask", "example-driver", "deploy", "--break", "nothing"]).is_err());
    }

    #[test]
    fn upstream_driver_takes_a_kubeconfig_and_nothing_to_break() {
        let cli = Cli::try_parse_from(["xtask", "upstream-driver", "deploy", "--kubeconfig", "/k"]).unwrap();
        let Command::UpstreamDriver { action: UpstreamDriverAction::Deploy(args) } = cli.command else {
            panic!("not deploy")
        };
        assert_eq!(args.kubeconfig, Some(PathBuf::from("/k")));
        let cli = Cli::try_parse_from(["xtask", "upstream-driver", "build"]).unwrap();
        assert!(matches!(cli.command, Command::UpstreamDriver { action: UpstreamDriverAction::Build }));
        assert!(Cli::try_parse_from(["xtask", "upstream-driver", "build", "--kubeconfig", "/k"]).is_err());
        let cli = Cli::try_parse_from(["xtask", "upstream-driver", "remove"]).unwrap();
        let Command::UpstreamDriver { action: UpstreamDriverAction::Remove(args) } = cli.command else {
            panic!("not remove")
        };
        assert_eq!(args.kubeconfig, None);
        assert!(
            Cli::try_parse_from(["xtask", "upstream-driver", "deploy", "--break", "skip-unprepare"]).is_err()
        );
    }

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn every_option_reaches_the_plain_options() {
        let cli = Cli::try_parse_from([
            "xtask",
            "cluster",
            "down",
            "--provider",
            "kind",
            "--name",
            "n",
            "--image",
            "i",
            "--kind-version",
            "v0.1.0",
            "--kind-from-path",
        ])
        .unwrap();
        let Command::Cluster { action: ClusterAction::Down(args) } = cli.command else { panic!("not down") };
        let kind = kind::KindOptions::from(args.kind);
        assert_eq!(
            (kind.name.as_str(), kind.image.as_deref(), kind.kind_version.as_deref(), kind.kind_from_path),
            ("n", Some("i"), Some("v0.1.0"), true)
        );

        let cli = Cli::try_parse_from([
            "xtask",
            "cluster",
            "up",
            "--feature-gates",
            "A=true",
            "--runtime-config",
            "g/v=true",
            "--kubelet-version",
            "v1.34.4",
            "--k8s-source",
            "/k",
            "--node-cpus",
            "4",
            "--node-hugepages",
            "1Gi",
        ])
        .unwrap();
        let Command::Cluster { action: ClusterAction::Up(up) } = cli.command else { panic!("not up") };
        assert_eq!(
            overrides::OverrideArgs::from(up.overrides),
            overrides::OverrideArgs {
                feature_gates: Some("A=true".into()),
                runtime_config: Some("g/v=true".into()),
                kubelet_version: Some("v1.34.4".into()),
                k8s_version: None,
                k8s_source: Some("/k".into()),
                node_cpus: Some(4),
                node_hugepages: Some("1Gi".into()),
            }
        );

        let cli = Cli::try_parse_from(["xtask", "test", "--lane", "local", "--keep-cluster"]).unwrap();
        let Command::Test(args) = cli.command else { panic!("not test") };
        assert_eq!(
            test::TestOptions::try_from(args).unwrap(),
            test::TestOptions {
                no_cluster: false,
                lane: test::TestLane::Local,
                keep_cluster: true,
                partition: None
            }
        );
        let cli = Cli::try_parse_from(["xtask", "test", "--partition", "2/3"]).unwrap();
        let Command::Test(args) = cli.command else { panic!("not test") };
        let partition = test::partition::Partition { machine: 2, machines: 3 };
        assert_eq!(
            test::TestOptions::try_from(args).unwrap(),
            test::TestOptions { partition: Some(partition), ..test::TestOptions::default() }
        );
        let cli = Cli::try_parse_from(["xtask", "test", "--partition", "3/2"]).unwrap();
        let Command::Test(args) = cli.command else { panic!("not test") };
        let err = test::TestOptions::try_from(args).unwrap_err().to_string();
        assert!(err.starts_with("--partition takes M/N") && err.ends_with("not \"3/2\""), "{err}");

        let cli = Cli::try_parse_from(["xtask", "docker", "up", "--cap-shim", "off"]).unwrap();
        let Command::Docker { action } = cli.command else { panic!("not docker") };
        assert_eq!(
            kind::engine::DockerAction::from(action),
            kind::engine::DockerAction::Up { cap_shim: kind::engine::CapShim::Off }
        );
        let cli = Cli::try_parse_from(["xtask", "docker", "down", "--purge"]).unwrap();
        let Command::Docker { action } = cli.command else { panic!("not docker") };
        assert_eq!(
            kind::engine::DockerAction::from(action),
            kind::engine::DockerAction::Down { purge: true }
        );

        let cli = Cli::try_parse_from(["xtask", "upstream-specs", "v1.37.2", "--out", "/o"]).unwrap();
        let Command::UpstreamSpecs(args) = cli.command else { panic!("not upstream-specs") };
        assert_eq!(
            upstream_specs::UpstreamSpecsOptions::from(args),
            upstream_specs::UpstreamSpecsOptions { version: "v1.37.2".into(), out: Some("/o".into()) }
        );

        let cli = Cli::try_parse_from(["xtask", "build-node-image", "--k8s-source", "/k"]).unwrap();
        let Command::BuildNodeImage(args) = cli.command else { panic!("not build-node-image") };
        let options = kind::BuildNodeImageOptions::from(args);
        assert_eq!(
            (options.k8s_source.as_path(), options.image.as_str(), options.dry_run),
            (std::path::Path::new("/k"), "dra/node:latest", false)
        );
    }
}
