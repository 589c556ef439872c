//! Protocol tests of the in-process plugin and the tunnel against real peers (real Unix sockets,
//! real grpc-go and C-core clients, the real hostpathplugin proxy), in one test binary: linking one binary
//! instead of seven saves minutes on two cores.

#[path = "../../../kubelet-plugin/tests/clients/mod.rs"]
mod clients;
#[path = "../common/mod.rs"]
mod common;
#[path = "../tunnel_support/mod.rs"]
mod tunnel_support;

mod authority;
mod concurrency;
mod errors;
mod interop;
mod kubelet;
mod metadata;
mod per_claim_faults;
mod plugin_tunnel;
mod rolling_update;
mod tunnel_host;
