//! Which calls a count, an expectation, a wait or a fault applies to: a [`Method`] of the kubelet
//! plugin APIs (any API version, or exactly one), optionally narrowed to one claim and to one
//! outcome ([`CallFilter`]). Full method paths are built from the generated service names
//! ([`DraApi`], [`HealthApi`]), never typed by hand.
//!
//! ```
//! use kubelet_plugin::calls::Method;
//! let filter = Method::NodePrepareResources.for_claim_uid("uid-1").succeeded();
//! assert_eq!(filter.to_string(), "NodePrepareResources for claim UID uid-1 that succeeded");
//! ```

use std::fmt;

use crate::grpc::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, registration};

use super::{CallOutcome, CallRecord, ClaimRef};

/// `/<service>/<method>`, the path of a gRPC call.
fn path(service: &str, method: &str) -> String {
    format!("/{service}/{method}")
}

/// A version of the kubelet's DRA gRPC service `DRAPlugin`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DraApi {
    /// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, registered as `v1.DRAPlugin`.
    V1,
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`, registered as `v1beta1.DRAPlugin`.
    V1beta1,
}

impl DraApi {
    /// Every version, newest first (the order a plugin advertises them in).
    pub const ALL: [DraApi; 2] = [DraApi::V1, DraApi::V1beta1];

    /// The full gRPC service name, from the generated server.
    pub fn service(self) -> &'static str {
        match self {
            DraApi::V1 => dra_v1::dra_plugin_server::SERVICE_NAME,
            DraApi::V1beta1 => dra_v1beta1::dra_plugin_server::SERVICE_NAME,
        }
    }

    /// The string a plugin lists in `supported_versions` for this version.
    pub fn registration(self) -> &'static str {
        match self {
            DraApi::V1 => dra_v1::SERVICE_VERSION,
            DraApi::V1beta1 => dra_v1beta1::SERVICE_VERSION,
        }
    }

    /// The other version.
    pub fn other(self) -> Self {
        match self {
            DraApi::V1 => DraApi::V1beta1,
            DraApi::V1beta1 => DraApi::V1,
        }
    }

    /// Exactly this version's `NodePrepareResources`.
    pub fn prepare(self) -> Method {
        Method::Exact(path(self.service(), Method::NodePrepareResources.name()))
    }

    /// Exactly this version's `NodeUnprepareResources`.
    pub fn unprepare(self) -> Method {
        Method::Exact(path(self.service(), Method::NodeUnprepareResources.name()))
    }
}

impl fmt::Display for DraApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.registration())
    }
}

/// A version of the kubelet's device health gRPC service `DRAResourceHealth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthApi {
    /// Proto package `v1`, registered as `v1.DRAResourceHealth`.
    V1,
    /// Proto package `v1alpha1`, registered as `v1alpha1.DRAResourceHealth`.
    V1alpha1,
}

impl HealthApi {
    /// Every version, newest first.
    pub const ALL: [HealthApi; 2] = [HealthApi::V1, HealthApi::V1alpha1];

    /// The full gRPC service name, from the generated server.
    pub fn service(self) -> &'static str {
        match self {
            HealthApi::V1 => health_v1::dra_resource_health_server::SERVICE_NAME,
            HealthApi::V1alpha1 => health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
        }
    }

    /// The string a plugin lists in `supported_versions` for this version.
    pub fn registration(self) -> &'static str {
        match self {
            HealthApi::V1 => health_v1::SERVICE_VERSION,
            HealthApi::V1alpha1 => health_v1alpha1::SERVICE_VERSION,
        }
    }

    /// The other version.
    pub fn other(self) -> Self {
        match self {
            HealthApi::V1 => HealthApi::V1alpha1,
            HealthApi::V1alpha1 => HealthApi::V1,
        }
    }

    /// Exactly this version's `NodeWatchResources`.
    pub fn watch(self) -> Method {
        Method::Exact(path(self.service(), Method::NodeWatchResources.name()))
    }
}

impl fmt::Display for HealthApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.registration())
    }
}

/// A gRPC method of the kubelet plugin APIs, or one exact full method path.
///
/// The named variants match every API version: [`Method::NodePrepareResources`] matches
/// `NodePrepareResources` of both [`DraApi`] versions. For one version, use
/// [`DraApi::prepare`], [`DraApi::unprepare`] or [`HealthApi::watch`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `pluginregistration.Registration/GetInfo`.
    GetInfo,
    /// `pluginregistration.Registration/NotifyRegistrationStatus`.
    NotifyRegistrationStatus,
    /// `DRAPlugin/NodePrepareResources`, any version.
    NodePrepareResources,
    /// `DRAPlugin/NodeUnprepareResources`, any version.
    NodeUnprepareResources,
    /// `DRAResourceHealth/NodeWatchResources`, any version.
    NodeWatchResources,
    /// Exactly this full method path (`/package.Service/Method`); build it with [`DraApi`] or
    /// [`HealthApi`].
    Exact(String),
}

impl Method {
    /// The method name without package and service, or the full path for [`Method::Exact`].
    pub fn name(&self) -> &str {
        match self {
            Method::GetInfo => "GetInfo",
            Method::NotifyRegistrationStatus => "NotifyRegistrationStatus",
            Method::NodePrepareResources => "NodePrepareResources",
            Method::NodeUnprepareResources => "NodeUnprepareResources",
            Method::NodeWatchResources => "NodeWatchResources",
            Method::Exact(full) => full,
        }
    }

    /// The services a named method belongs to (empty for [`Method::Exact`]).
    fn services(&self) -> &'static [&'static str] {
        const REGISTRATION: [&str; 1] = [registration::registration_server::SERVICE_NAME];
        const DRA: [&str; 2] =
            [dra_v1::dra_plugin_server::SERVICE_NAME, dra_v1beta1::dra_plugin_server::SERVICE_NAME];
        const HEALTH: [&str; 2] = [
            health_v1::dra_resource_health_server::SERVICE_NAME,
            health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
        ];
        match self {
            Method::GetInfo | Method::NotifyRegistrationStatus => &REGISTRATION,
            Method::NodePrepareResources | Method::NodeUnprepareResources => &DRA,
            Method::NodeWatchResources => &HEALTH,
            Method::Exact(_) => &[],
        }
    }

    /// Every full method path this method matches.
    pub fn paths(&self) -> Vec<String> {
        match self {
            Method::Exact(full) => vec![full.clone()],
            named => named.services().iter().map(|service| path(service, named.name())).collect(),
        }
    }

    /// Whether a full method path (`/package.Service/Method`) is this method.
    pub fn matches(&self, full_method: &str) -> bool {
        match self {
            Method::Exact(full) => full == full_method,
            named => full_method.strip_prefix('/').and_then(|p| p.rsplit_once('/')).is_some_and(
                |(service, method)| method == named.name() && named.services().contains(&service),
            ),
        }
    }

    /// Restricts this method to calls whose request names a claim with this UID.
    pub fn for_claim_uid(self, uid: impl Into<String>) -> CallFilter {
        CallFilter::from(self).for_claim_uid(uid)
    }

    /// Restricts this method to calls whose request names a claim with this name.
    pub fn for_claim_name(self, name: impl Into<String>) -> CallFilter {
        CallFilter::from(self).for_claim_name(name)
    }

    /// Its calls that succeeded (see [`CallOutcome::Succeeded`]).
    pub fn succeeded(self) -> CallFilter {
        CallFilter::from(self).succeeded()
    }

    /// Its calls that failed (see [`CallOutcome::Failed`]).
    pub fn failed(self) -> CallFilter {
        CallFilter::from(self).failed()
    }

    /// Its calls that carry an injected fault (see [`CallOutcome::Injected`]).
    pub fn injected(self) -> CallFilter {
        CallFilter::from(self).injected()
    }

    /// Its calls that have not finished yet.
    pub fn in_progress(self) -> CallFilter {
        CallFilter::from(self).in_progress()
    }

    /// Its calls held by a block now.
    pub fn blocked(self) -> CallFilter {
        CallFilter::from(self).blocked()
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which claim a [`CallFilter`] requires in the request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClaimSelector {
    /// A claim with this UID.
    Uid(String),
    /// A claim with this name (any namespace).
    Name(String),
}

/// Selects calls: a [`Method`], optionally narrowed to requests that name a given claim (only
/// DRA prepare/unprepare requests name claims) and to one [`CallOutcome`] (of the named claim,
/// when there is one). Every API that takes a filter also takes a plain [`Method`]; the builder
/// methods combine in any order: `Method::NodePrepareResources.for_claim_uid(uid).succeeded()`.
///
/// Counts, expectations and waits use all three parts; faults use the method and the claim (a
/// call's outcome is not known before it is handled), so an outcome in a fault's filter is
/// ignored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CallFilter {
    /// The method.
    pub method: Method,
    /// The claim the request must name, if any.
    pub claim: Option<ClaimSelector>,
    /// The outcome the call must have (for the claim, if one is named), if any.
    pub outcome: Option<CallOutcome>,
}

impl CallFilter {
    /// Restricts the filter to calls whose request names a claim with this UID.
    pub fn for_claim_uid(self, uid: impl Into<String>) -> CallFilter {
        CallFilter { claim: Some(ClaimSelector::Uid(uid.into())), ..self }
    }

    /// Restricts the filter to calls whose request names a claim with this name.
    pub fn for_claim_name(self, name: impl Into<String>) -> CallFilter {
        CallFilter { claim: Some(ClaimSelector::Name(name.into())), ..self }
    }

    /// Restricts the filter to calls with this outcome.
    pub fn with_outcome(self, outcome: CallOutcome) -> CallFilter {
        CallFilter { outcome: Some(outcome), ..self }
    }

    /// Only the calls that succeeded (see [`CallOutcome::Succeeded`]).
    pub fn succeeded(self) -> CallFilter {
        self.with_outcome(CallOutcome::Succeeded)
    }

    /// Only the calls that failed (see [`CallOutcome::Failed`]).
    pub fn failed(self) -> CallFilter {
        self.with_outcome(CallOutcome::Failed)
    }

    /// Only the calls that carry an injected fault (see [`CallOutcome::Injected`]).
    pub fn injected(self) -> CallFilter {
        self.with_outcome(CallOutcome::Injected)
    }

    /// Only the calls that have not finished yet.
    pub fn in_progress(self) -> CallFilter {
        self.with_outcome(CallOutcome::InProgress)
    }

    /// Only the calls held by a block now.
    pub fn blocked(self) -> CallFilter {
        self.with_outcome(CallOutcome::Blocked)
    }

    /// The same filter without its outcome: which calls, however they ended.
    pub fn any_outcome(&self) -> CallFilter {
        CallFilter { outcome: None, ..self.clone() }
    }

    /// Whether a call with this full method path and these request claims is one the filter
    /// selects, its outcome aside (what faults match on).
    pub fn matches(&self, full_method: &str, claims: &[ClaimRef]) -> bool {
        if !self.method.matches(full_method) {
            return false;
        }
        match &self.claim {
            None => true,
            Some(ClaimSelector::Uid(uid)) => claims.iter().any(|c| &c.uid == uid),
            Some(ClaimSelector::Name(name)) => claims.iter().any(|c| &c.name == name),
        }
    }

    /// Whether a recorded call matches: method, claim and outcome.
    pub fn matches_record(&self, record: &CallRecord) -> bool {
        if !self.matches(&record.method, &record.claims) {
            return false;
        }
        let Some(outcome) = self.outcome else { return true };
        match &self.claim {
            None => outcome.holds(record, None),
            Some(ClaimSelector::Uid(uid)) => outcome.holds(record, Some(uid)),
            Some(ClaimSelector::Name(name)) => {
                record.claims.iter().filter(|c| &c.name == name).any(|c| outcome.holds(record, Some(&c.uid)))
            }
        }
    }
}

impl From<Method> for CallFilter {
    fn from(method: Method) -> Self {
        CallFilter { method, claim: None, outcome: None }
    }
}

impl fmt::Display for CallFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.method)?;
        match &self.claim {
            None => {}
            Some(ClaimSelector::Uid(uid)) => write!(f, " for claim UID {uid}")?,
            Some(ClaimSelector::Name(name)) => write!(f, " for claim {name}")?,
        }
        match self.outcome {
            None => Ok(()),
            Some(outcome) => write!(f, " {outcome}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const V1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
    const V1BETA1_PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources";
    const V1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";
    const V1BETA1_UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources";

    /// The generated service names are the wire names of upstream's protos.
    #[test]
    fn paths_from_generated_service_names_are_the_wire_paths() {
        assert_eq!(DraApi::V1.prepare(), Method::Exact(V1_PREPARE.into()));
        assert_eq!(DraApi::V1beta1.prepare(), Method::Exact(V1BETA1_PREPARE.into()));
        assert_eq!(DraApi::V1.unprepare(), Method::Exact(V1_UNPREPARE.into()));
        assert_eq!(DraApi::V1beta1.unprepare(), Method::Exact(V1BETA1_UNPREPARE.into()));
        assert_eq!(HealthApi::V1.watch(), Method::Exact("/v1.DRAResourceHealth/NodeWatchResources".into()));
        assert_eq!(
            HealthApi::V1alpha1.watch(),
            Method::Exact("/v1alpha1.DRAResourceHealth/NodeWatchResources".into())
        );
        assert_eq!(Method::GetInfo.paths(), ["/pluginregistration.Registration/GetInfo"]);
        assert_eq!(DraApi::V1.other().registration(), "v1beta1.DRAPlugin");
        assert_eq!(HealthApi::V1alpha1.other().registration(), "v1.DRAResourceHealth");
        assert_eq!(DraApi::V1.to_string(), "v1.DRAPlugin");
    }

    #[rstest]
    #[case(Method::NodePrepareResources, V1_PREPARE, true)]
    #[case(Method::NodePrepareResources, V1BETA1_PREPARE, true)]
    #[case(Method::NodePrepareResources, V1_UNPREPARE, false)]
    #[case(Method::NodeUnprepareResources, V1BETA1_UNPREPARE, true)]
    #[case(Method::NodePrepareResources, "/other.DRAPlugin/NodePrepareResources", false)]
    #[case(Method::GetInfo, "/pluginregistration.Registration/GetInfo", true)]
    #[case(Method::GetInfo, "/other.Registration/GetInfo", false)]
    #[case(
        Method::NotifyRegistrationStatus,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        true
    )]
    #[case(Method::NodeWatchResources, "/v1alpha1.DRAResourceHealth/NodeWatchResources", true)]
    #[case(Method::NodeWatchResources, "/v1.DRAResourceHealth/NodeWatchResources", true)]
    #[case(HealthApi::V1.watch(), "/v1.DRAResourceHealth/NodeWatchResources", true)]
    #[case(HealthApi::V1.watch(), "/v1alpha1.DRAResourceHealth/NodeWatchResources", false)]
    #[case(DraApi::V1.prepare(), V1BETA1_PREPARE, false)]
    fn method_matching(#[case] method: Method, #[case] path: &str, #[case] expected: bool) {
        assert_eq!(method.matches(path), expected);
    }

    #[test]
    fn claim_filter() {
        let claims = vec![ClaimRef { namespace: "ns".into(), name: "a".into(), uid: "uid-a".into() }];
        assert!(Method::NodePrepareResources.for_claim_uid("uid-a").matches(V1_PREPARE, &claims));
        assert!(!Method::NodePrepareResources.for_claim_uid("uid-b").matches(V1_PREPARE, &claims));
        assert!(Method::NodePrepareResources.for_claim_name("a").matches(V1_PREPARE, &claims));
        assert!(!Method::NodePrepareResources.for_claim_name("a").matches(V1_PREPARE, &[]));
        assert_eq!(
            Method::NodePrepareResources.for_claim_uid("u").to_string(),
            "NodePrepareResources for claim UID u"
        );
    }

    /// Claim and outcome combine in either order; the outcome is no part of what faults match.
    #[test]
    fn outcome_filters_combine_with_claims_in_any_order() {
        let claims = vec![ClaimRef { namespace: "ns".into(), name: "a".into(), uid: "uid-a".into() }];
        let one = Method::NodePrepareResources.for_claim_uid("uid-a").injected();
        let other = Method::NodePrepareResources.injected().for_claim_uid("uid-a");
        assert_eq!(one, other);
        assert_eq!(one.outcome, Some(CallOutcome::Injected));
        assert!(one.matches(V1_PREPARE, &claims), "faults ignore the outcome");
        assert_eq!(one.any_outcome(), Method::NodePrepareResources.for_claim_uid("uid-a"));
        assert_eq!(
            Method::NodeUnprepareResources.for_claim_name("a").failed().to_string(),
            "NodeUnprepareResources for claim a that failed"
        );
        assert_eq!(Method::GetInfo.blocked().to_string(), "GetInfo held by a block");
        assert_eq!(Method::GetInfo.in_progress().outcome, Some(CallOutcome::InProgress));
        assert_eq!(Method::GetInfo.succeeded().outcome, Some(CallOutcome::Succeeded));
    }
}
