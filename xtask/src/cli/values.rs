//! The values of the command line's enum flags (`--provider`, `--lane`, `--cap-shim`, `--break`): clap's
//! mirrors of the plain enums the commands take, with the same variants, default and doc comments
//! (which are the help of each possible value), converted with `From`.

use clap::ValueEnum;

use crate::{example_driver::Break, kind::engine::CapShim, provider::Provider, test::TestLane};

/// Which kind of cluster to use (`--provider`; [`Provider`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ProviderArg {
    /// The embedded cluster built from official Kubernetes Go modules (no Docker): the nodes
    /// kind.yaml lists, each a real kubelet in its own namespaces.
    #[default]
    Local,
    /// A kind cluster created from the repository's kind.yaml (needs docker and kind).
    Kind,
}

impl From<ProviderArg> for Provider {
    fn from(value: ProviderArg) -> Self {
        match value {
            ProviderArg::Local => Provider::Local,
            ProviderArg::Kind => Provider::Kind,
        }
    }
}

/// Which clusters `cargo xtask test` runs on (`--lane`; [`TestLane`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum TestLaneArg {
    /// The unit and protocol tests, the local cluster's tests and lanes, then the kind lane
    /// (what CI runs).
    #[default]
    All,
    /// The unit and protocol tests and the local cluster's tests and lanes.
    Local,
    /// Only the kind lane (what the e2e-kind workflow runs): root, or a Docker engine in
    /// `DOCKER_HOST`; the node image is built first if missing.
    Kind,
    /// Only the driver lane on the local cluster: the example driver as a DaemonSet, tested as
    /// a real driver (with and without interposing, after a kubelet restart, broken on purpose).
    Driver,
}

impl From<TestLaneArg> for TestLane {
    fn from(value: TestLaneArg) -> Self {
        match value {
            TestLaneArg::All => TestLane::All,
            TestLaneArg::Local => TestLane::Local,
            TestLaneArg::Kind => TestLane::Kind,
            TestLaneArg::Driver => TestLane::Driver,
        }
    }
}

/// Whether containers run through the capability shim (`--cap-shim`; [`CapShim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum CapShimArg {
    /// Only where root lacks a capability that privileged containers ask for.
    #[default]
    Auto,
    /// Never (privileged containers then fail where root lacks a capability).
    Off,
}

impl From<CapShimArg> for CapShim {
    fn from(value: CapShimArg) -> Self {
        match value {
            CapShimArg::Auto => CapShim::Auto,
            CapShimArg::Off => CapShim::Off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The possible values of a flag, in order.
    fn names<T: ValueEnum>() -> Vec<String> {
        T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|v| v.get_name().to_string())
            .collect()
    }

    #[test]
    fn each_value_maps_to_the_plain_enum_with_the_same_default() {
        assert_eq!(names::<ProviderArg>(), ["local", "kind"]);
        assert_eq!(
            ProviderArg::value_variants().iter().map(|&v| Provider::from(v)).collect::<Vec<_>>(),
            [Provider::Local, Provider::Kind]
        );
        assert_eq!(Provider::from(ProviderArg::default()), Provider::default());

        assert_eq!(names::<TestLaneArg>(), ["all", "local", "kind", "driver"]);
        assert_eq!(
            TestLaneArg::value_variants().iter().map(|&v| TestLane::from(v)).collect::<Vec<_>>(),
            [TestLane::All, TestLane::Local, TestLane::Kind, TestLane::Driver]
        );
        assert_eq!(TestLane::from(TestLaneArg::default()), TestLane::default());

        assert_eq!(names::<CapShimArg>(), ["auto", "off"]);
        assert_eq!(
            CapShimArg::value_variants().iter().map(|&v| CapShim::from(v)).collect::<Vec<_>>(),
            [CapShim::Auto, CapShim::Off]
        );
        assert_eq!(CapShim::from(CapShimArg::default()), CapShim::default());
    }
}

/// How the example driver is broken on purpose (`--break`; [`Break`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BreakArg {
    /// NodeUnprepareResources answers OK but leaves the claim's CDI spec file in place.
    SkipUnprepare,
    /// NodeUnprepareResources fails with an error.
    FailUnprepare,
}

impl From<BreakArg> for Break {
    fn from(value: BreakArg) -> Self {
        match value {
            BreakArg::SkipUnprepare => Break::SkipUnprepare,
            BreakArg::FailUnprepare => Break::FailUnprepare,
        }
    }
}
