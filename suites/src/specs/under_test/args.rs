//! The flags of a driver-under-test run (`--driver`, `--device-class`, `--interpose`) and what
//! they resolve to before any spec runs: the [`Target`].

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::resource::v1::DeviceClass;
use kube::{Api, ResourceExt as _, api::ListParams};

use super::class_selector::not_selecting;

/// The flags that turn `dra-e2e` into a test of a DRA driver already installed in the cluster.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct UnderTestArgs {
    /// Test the DRA driver NAME installed in the cluster: only the driver-under-test specs are
    /// registered (the harness's own specs are not).
    #[arg(long, value_name = "NAME")]
    pub driver: Option<String>,
    /// The DeviceClass the specs' claims ask for; its CEL selectors must require
    /// `device.driver == "NAME"` (default: the first such DeviceClass, by name).
    #[arg(long, value_name = "CLASS", requires = "driver")]
    pub device_class: Option<String>,
    /// Stand between the kubelet and the driver on the node under test (harness::interposer), so
    /// that the specs also assert the driver's gRPC calls; these specs run one at a time.
    #[arg(long, requires = "driver")]
    pub interpose: bool,
    /// Write the run's driver summary (each behaviour PASS, FAIL or SKIP with its reason, the
    /// driver, its DeviceClass, the cluster's version, whether interposed) to
    /// DIR/driver-summary.md and DIR/driver-summary.xml (JUnit). Default: next to --junit FILE
    /// (else --json-report FILE) as STEM-summary.md and .xml, STEM being that file's name without
    /// its extension; without any, only printed.
    #[arg(long, value_name = "DIR", requires = "driver")]
    pub driver_summary: Option<PathBuf>,
    /// How many rounds of create, run and delete the churn spec makes (at least 1).
    #[arg(long, value_name = "N", requires = "driver", default_value_t = super::churn::DEFAULT_ROUNDS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub churn_rounds: u32,
}

/// The driver under test, as the specs use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The driver name (`spec.driver` of its ResourceSlices).
    pub driver: String,
    /// The DeviceClass of the specs' claims.
    pub class: String,
    /// Whether the specs interpose and assert the driver's calls.
    pub interpose: bool,
    /// The churn spec's rounds (`--churn-rounds`).
    pub churn_rounds: u32,
}

/// Why the flags cannot be used; each says it in one sentence (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum UnderTestError {
    /// The driver name is not a valid DRA driver name.
    #[error("--driver {0:?} is not a DRA driver name (a lowercase DNS subdomain of at most 63 characters)")]
    BadDriverName(String),
    /// The DeviceClass given does not exist.
    #[error("--device-class {0:?} does not exist in the cluster")]
    NoSuchClass(String),
    /// The DeviceClass given does not select the driver's devices only.
    #[error(
        "--device-class {class:?} does not select the devices of driver {driver}: {why}; give a DeviceClass with a CEL selector that requires `device.driver == \"{driver}\"`"
    )]
    ClassNotForDriver {
        /// The class given.
        class: String,
        /// The driver under test.
        driver: String,
        /// Why the class does not select it, from the AST of its selectors.
        why: String,
    },
    /// No DeviceClass selects the driver's devices.
    #[error(
        "no DeviceClass selects the devices of driver {0} (a CEL selector that requires `device.driver == \"{0}\"`); create one or name it with --device-class"
    )]
    NoClass(String),
    /// The cluster could not be asked.
    #[error("cannot read the DeviceClasses of the cluster: {0}")]
    Cluster(String),
}

/// The placeholder class of `--list` without `--device-class` (no cluster is asked).
const CLASS_AT_RUN_TIME: &str = "(found at run time)";

/// How long finding the DeviceClass may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(30);

impl UnderTestArgs {
    /// The target these flags name, or `None` without `--driver`. Without `--device-class`
    /// the cluster of `kubeconfig` is asked for the driver's DeviceClass, unless `list` (no
    /// cluster is needed to list specs).
    pub async fn target(
        &self,
        kubeconfig: Option<&Path>,
        list: bool,
    ) -> Result<Option<Target>, UnderTestError> {
        let Some(driver) = self.driver.clone() else { return Ok(None) };
        if !is_driver_name(&driver) {
            return Err(UnderTestError::BadDriverName(driver));
        }
        let class = match (&self.device_class, list) {
            (_, true) => self.device_class.clone().unwrap_or_else(|| CLASS_AT_RUN_TIME.to_owned()),
            (Some(class), false) => given_class(&classes(kubeconfig).await?, class, &driver)?,
            (None, false) => class_of(&classes(kubeconfig).await?, &driver)
                .ok_or_else(|| UnderTestError::NoClass(driver.clone()))?,
        };
        Ok(Some(Target { driver, class, interpose: self.interpose, churn_rounds: self.churn_rounds }))
    }
}

/// Whether `name` is a DNS subdomain of at most 63 characters, as `spec.driver` must be.
fn is_driver_name(name: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    !name.is_empty() && name.len() <= 63 && name.split('.').all(label_ok)
}

/// The cluster's DeviceClasses.
async fn classes(kubeconfig: Option<&Path>) -> Result<Vec<DeviceClass>, UnderTestError> {
    let cluster = |e: &dyn std::fmt::Display| UnderTestError::Cluster(e.to_string());
    let backend = harness::framework::KubeBackend::connect(kubeconfig).await.map_err(|e| cluster(&e))?;
    let api: Api<DeviceClass> = Api::all(harness::framework::ClusterBackend::client(&backend));
    match tokio::time::timeout(LOOKUP_TIMEOUT, api.list(&ListParams::default())).await {
        Ok(Ok(list)) => Ok(list.items),
        Ok(Err(e)) => Err(cluster(&e)),
        Err(_) => Err(cluster(&format!("no answer within {LOOKUP_TIMEOUT:?}"))),
    }
}

/// `class`, when it exists and its selectors require `device.driver == "<driver>"`.
fn given_class(classes: &[DeviceClass], class: &str, driver: &str) -> Result<String, UnderTestError> {
    let given = classes.iter().find(|c| c.name_any() == class);
    let given = given.ok_or_else(|| UnderTestError::NoSuchClass(class.to_owned()))?;
    match not_selecting(given, driver) {
        None => Ok(class.to_owned()),
        Some(why) => {
            Err(UnderTestError::ClassNotForDriver { class: class.to_owned(), driver: driver.to_owned(), why })
        }
    }
}

/// The first (by name) DeviceClass whose CEL selectors require `device.driver == "<driver>"`
/// ([`class_selector`](super::class_selector)).
fn class_of(classes: &[DeviceClass], driver: &str) -> Option<String> {
    let mut names: Vec<String> = classes
        .iter()
        .filter(|class| not_selecting(class, driver).is_none())
        .map(|class| class.name_any())
        .collect();
    names.sort();
    names.into_iter().next()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn class(name: &str, expression: &str) -> DeviceClass {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "selectors": [{ "cel": { "expression": expression } }] },
        }))
        .unwrap()
    }

    #[test]
    fn the_class_is_the_first_whose_selector_names_the_driver() {
        let classes = [
            class("z", "device.driver == \"d.example.com\""),
            class("other", "device.driver == \"e.example.com\""),
            class("a", "device.attributes[\"x\"].y && device.driver=='d.example.com'"),
        ];
        assert_eq!(class_of(&classes, "d.example.com").as_deref(), Some("a"));
        assert_eq!(class_of(&classes, "f.example.com"), None);
        // The text names the driver, the AST does not require it (a substring match took both).
        let loose = [
            class("negated", "!(device.driver == \"d.example.com\")"),
            class("or-true", "device.driver == \"d.example.com\" || true"),
        ];
        assert_eq!(class_of(&loose, "d.example.com"), None);
    }

    #[test]
    fn a_given_class_that_does_not_select_the_driver_is_refused_saying_why() {
        let classes = [
            class("mine", "device.driver == \"d.example.com\""),
            class("other", "device.driver == \"e.example.com\""),
            class("negated", "!(device.driver == \"d.example.com\")"),
        ];
        assert_eq!(given_class(&classes, "mine", "d.example.com").unwrap(), "mine");
        for (name, why) in [("other", "another driver"), ("negated", "no selector requires")] {
            let err = given_class(&classes, name, "d.example.com").unwrap_err();
            assert!(matches!(err, UnderTestError::ClassNotForDriver { .. }), "{err}");
            let text = err.to_string();
            assert!(text.starts_with(&format!("--device-class \"{name}\" does not select")), "{text}");
            assert!(text.contains(why), "{text}");
        }
        assert!(matches!(
            given_class(&classes, "gone", "d.example.com"),
            Err(UnderTestError::NoSuchClass(_))
        ));
    }

    #[test]
    fn driver_names_are_dns_subdomains() {
        assert!(is_driver_name("gpu.example.com") && is_driver_name("h2.example.dra-e2e.test"));
        for bad in ["", "Gpu.example.com", "a..b", "-a.b", "a_b", &"x".repeat(64)] {
            assert!(!is_driver_name(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn list_needs_no_cluster_and_no_driver_means_no_target() {
        let args = UnderTestArgs { driver: Some("d.example.com".into()), ..Default::default() };
        let target = args.target(None, true).await.unwrap().unwrap();
        assert_eq!(target.class, CLASS_AT_RUN_TIME);
        assert_eq!(UnderTestArgs::default().target(None, false).await.unwrap(), None);
        let bad = UnderTestArgs { driver: Some("Bad".into()), ..Default::default() };
        assert!(matches!(bad.target(None, true).await, Err(UnderTestError::BadDriverName(_))));
    }
}
