//! Whether a node's kubelet registered the plugin, from the node's call log.

use crate::calls::{CallLog, Method};

/// Whether the call log holds a successful `NotifyRegistrationStatus` that says registered
/// (upstream's `BeRegistered`).
pub(super) fn is_registered(log: &CallLog) -> bool {
    registered_since(log, 0)
}

/// Whether the call log holds, from call id `first` on, a successful
/// `NotifyRegistrationStatus` that says registered: e.g. the registration through a replacement
/// proxy pod (`first` = [`ProxyMove::first_call`](super::ProxyMove::first_call)).
pub fn registered_since(log: &CallLog, first: u64) -> bool {
    log.matching(Method::NotifyRegistrationStatus).iter().any(|r| {
        r.id >= first
            && r.succeeded()
            && r.request.as_ref().is_some_and(|req| {
                ["plugin_registered", "pluginRegistered"]
                    .iter()
                    .any(|k| req.get(k).and_then(serde_json::Value::as_bool) == Some(true))
            })
    })
}
