//! Generated code for the kubelet gRPC APIs in `kubelet-plugin/proto/`, one module per
//! proto package (messages, clients and servers).
//!
//! | module | proto package | registration string |
//! |---|---|---|
//! | [`dra_v1`] | `k8s.io.kubelet.pkg.apis.dra.v1` | `v1.DRAPlugin` |
//! | [`dra_v1beta1`] | `k8s.io.kubelet.pkg.apis.dra.v1beta1` | `v1beta1.DRAPlugin` |
//! | [`health_v1alpha1`] | `v1alpha1` | `v1alpha1.DRAResourceHealth` |
//! | [`health_v1`] | `v1` | `v1.DRAResourceHealth` |
//! | [`registration`] | `pluginregistration` | — |

/// DRA kubelet plugin API v1 (`k8s.io.kubelet.pkg.apis.dra.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod dra_v1 {
    include!(concat!(env!("OUT_DIR"), "/dra_v1/k8s.io.kubelet.pkg.apis.dra.v1.rs"));

    /// The string a plugin lists in `supported_versions` for this service.
    pub const SERVICE_VERSION: &str = "v1.DRAPlugin";
}

/// DRA kubelet plugin API v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod dra_v1beta1 {
    include!(concat!(env!("OUT_DIR"), "/dra_v1beta1/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"));

    /// The string a plugin lists in `supported_versions` for this service.
    pub const SERVICE_VERSION: &str = "v1beta1.DRAPlugin";
}

/// DRA device health API v1alpha1 (proto package `v1alpha1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod health_v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/health_v1alpha1/v1alpha1.rs"));

    /// The string a plugin lists in `supported_versions` for this service.
    pub const SERVICE_VERSION: &str = "v1alpha1.DRAResourceHealth";
}

/// DRA device health API v1 (proto package `v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod health_v1 {
    include!(concat!(env!("OUT_DIR"), "/health_v1/v1.rs"));

    /// The string a plugin lists in `supported_versions` for this service.
    pub const SERVICE_VERSION: &str = "v1.DRAResourceHealth";
}

/// Kubelet plugin registration API (proto package `pluginregistration`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod registration {
    include!(concat!(env!("OUT_DIR"), "/registration/pluginregistration.rs"));

    /// `PluginInfo.type` of a DRA driver.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
}
