//! Whether the kubelet registered the driver on each node: upstream's driver publishes its
//! ResourceSlice as it starts, before any kubelet knows it, so a slice says nothing about
//! registration. Its plugin helper logs every gRPC call it serves at -v=6 (the DaemonSet runs
//! it so); the kubelet's `NotifyRegistrationStatus` answered OK is the registration, in the
//! driver's own words.

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::LogParams};

use super::{CONTAINER, NAMESPACE};
use crate::{
    deployed_driver::readiness::Served,
    wait::{Probe, poll_until},
};

/// How often the wait looks.
const INTERVAL: Duration = Duration::from_secs(1);

/// The kubelet's registration call, as the plugin helper names its method.
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";

/// What a log line of the driver says about its registration.
#[derive(Debug, PartialEq, Eq)]
pub enum Said<'a> {
    /// The kubelet told it that it is registered.
    Registered,
    /// The kubelet told it that the registration failed (the line).
    Refused(&'a str),
    /// Nothing about it yet.
    Nothing,
}

/// What the driver's log `log` says about its registration (the last word counts).
pub fn said(log: &str) -> Said<'_> {
    let mut said = Said::Nothing;
    for line in log.lines().filter(|l| l.contains(NOTIFY)) {
        if line.contains("\"handling request succeeded\"") {
            said = Said::Registered;
        } else if line.contains("\"handling request failed\"") {
            said = Said::Refused(line);
        }
    }
    said
}

/// Waits until the driver's log on every served node says the kubelet registered it; stops at
/// once when a kubelet refused it.
pub async fn registered(client: &Client, served: &[Served], timeout: Duration) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let params = LogParams { container: Some(CONTAINER.to_string()), ..LogParams::default() };
    let nodes: Vec<&str> = served.iter().map(|s| s.node.as_str()).collect();
    let what = format!("the kubelets of {} to register upstream's test driver", nodes.join(", "));
    poll_until(&what, timeout, INTERVAL, || async {
        let mut waiting = Vec::new();
        for s in served {
            let log = pods.logs(&s.pod, &params).await?;
            match said(&log) {
                Said::Registered => {}
                Said::Refused(line) => {
                    return Ok(Probe::Abort(format!(
                        "the kubelet of {} refused it; pod {}: {}",
                        s.node,
                        s.pod,
                        line.trim()
                    )));
                }
                Said::Nothing => waiting.push(format!("{} (pod {})", s.node, s.pod)),
            }
        }
        Ok(if waiting.is_empty() {
            Probe::Done(())
        } else {
            Probe::Pending(format!(
                "no NotifyRegistrationStatus answered OK in the log of {}",
                waiting.join(", ")
            ))
        })
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kubelet_s_answer_counts_and_the_last_word_wins() {
        let ok = r#"I1207 14:50:01.1 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=2 method="/pluginregistration.Registration/NotifyRegistrationStatus" response="""#;
        let info = r#"I1207 14:50:01.0 1 nonblockinggrpcserver.go:161] "handling request succeeded" requestID=1 method="/pluginregistration.Registration/GetInfo" response="name:\"t\"""#;
        let failed = r#"E1207 14:50:00.9 1 nonblockinggrpcserver.go:159] "handling request failed" err="failed registration process: x" requestID=1 method="/pluginregistration.Registration/NotifyRegistrationStatus""#;
        let started = r#"I1207 14:50:00.5 1 nonblockinggrpcserver.go:150] "handling request" requestID=2 method="/pluginregistration.Registration/NotifyRegistrationStatus" request="plugin_registered:true""#;
        assert_eq!(said(""), Said::Nothing);
        assert_eq!(said(info), Said::Nothing, "GetInfo is not the registration");
        assert_eq!(said(started), Said::Nothing, "a call in flight is no answer");
        assert_eq!(said(&[info, started, ok].join("\n")), Said::Registered);
        assert_eq!(said(failed), Said::Refused(failed));
        assert_eq!(
            said(&[failed, ok].join("\n")),
            Said::Registered,
            "registered on the kubelet's second try"
        );
    }
}
