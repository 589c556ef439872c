//! k: churn. N rounds (`--churn-rounds`, default 10) of: a claim and a pod using it, the pod
//! runs (with the checks of "prepares the claim of a pod"), the pod is deleted gracefully (the
//! kubelet removes it only once NodeUnprepareResources succeeded) and the claim is deleted; each
//! waited for. After the last round nothing may be left: no CDI device written for any round's
//! claim, and no CDI spec file named after its UID, still on the node (after at most 10 s); no
//! pod using a claim and no claim in the namespace; interposed, every claim prepared once and
//! unprepared once and none still prepared, and the counts add up: N successful prepares, N
//! successful unprepares, nothing failed.
//!
//! A driver that leaks one CDI spec per claim (the example driver with `--break
//! skip-unprepare`) fails here, with the leftovers named by round.

use std::{sync::Arc, time::Duration};

use harness::{
    calls::{CallLog, Method},
    framework::{Ctx, SpecResult, step},
    wait::{self, Attempt},
};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{Api, ResourceExt as _, api::ListParams};

use super::{
    Target,
    cdi::{CdiDevices, still_defined},
    pods::start_pod,
    session::Session,
};

/// The default number of rounds.
pub const DEFAULT_ROUNDS: u32 = 10;

/// The spec's timeout for `rounds` rounds: two minutes, and one more per round (a round takes a
/// few seconds on a healthy node).
pub fn timeout(rounds: u32) -> Duration {
    Duration::from_secs(120 + 60 * u64::from(rounds))
}

/// How long the CDI devices of the last rounds may outlive their pods: the kubelet removed each
/// pod only once the driver answered NodeUnprepareResources, so this only covers reading the
/// node's files.
const LEFTOVER_GRACE: Duration = Duration::from_secs(10);
/// How often the node's CDI files are read meanwhile.
const READ_EVERY: Duration = Duration::from_secs(2);

/// One round's claim: its name, UID and the CDI devices written for it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Round {
    number: u32,
    claim: String,
    uid: String,
    per_claim: Vec<String>,
}

/// k: see the module documentation.
pub async fn churn(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    expect!(target.churn_rounds >= 1, "--churn-rounds must be at least 1, not {}", target.churn_rounds);
    let s = Session::start(&ctx, &target).await?;
    let mut rounds = Vec::new();
    for number in 1..=target.churn_rounds {
        harness::framework::step(format!("round {number} of {}", target.churn_rounds));
        let running = start_pod(&s).await?;
        s.delete_pod(&running.pod, None).await?;
        s.delete_claim(&running.claim.name_any()).await?;
        rounds.push(Round {
            number,
            claim: running.claim.name_any(),
            uid: running.uid.clone(),
            per_claim: running.prepared.per_claim.clone(),
        });
    }

    let what =
        format!("the CDI devices of the {} rounds' claims to be gone from node {}", rounds.len(), s.node);
    let gone = wait::poll(what, LEFTOVER_GRACE, READ_EVERY, || async {
        match s.cdi.devices().await {
            Ok(devices) => match leftovers(&rounds, &devices) {
                left if left.is_empty() => Attempt::Done(()),
                left => Attempt::Retry(left.join("; ")),
            },
            Err(e) => Attempt::Retry(e.to_string()),
        }
    })
    .await;
    if gone.is_err() {
        let left = leftovers(&rounds, &s.cdi.devices().await?);
        fail!(
            "after {} rounds of create, run and delete on node {}, the CDI devices of {} round(s) are still defined \
             {LEFTOVER_GRACE:?} after the last pod was gone: {}{}",
            rounds.len(),
            s.node,
            left.len(),
            left.join("; "),
            s.call_log()
        );
    }
    expect_nothing_left(&s).await?;
    if let Some(calls) = s.calls() {
        expect_calls_add_up(&calls.log(), &rounds)?;
    }
    step(format!(
        "{} rounds on node {} left no CDI device of their claims, no pod and no claim{}",
        rounds.len(),
        s.node,
        if s.calls().is_some() { "; each claim was prepared once and unprepared once" } else { "" }
    ));
    Ok(())
}

/// What of `rounds` the node's CDI files still define, one entry per round: the CDI devices
/// written for its claim, and every device of a spec file whose path names its claim UID.
fn leftovers(rounds: &[Round], devices: &CdiDevices) -> Vec<String> {
    rounds
        .iter()
        .filter_map(|round| {
            let mut left = still_defined(devices, &round.per_claim);
            let named = devices
                .iter()
                .filter(|(id, d)| d.file.contains(&round.uid) && !round.per_claim.contains(id))
                .map(|(id, d)| format!("{id} (in {})", d.file));
            left.extend(named);
            (!left.is_empty()).then(|| {
                format!(
                    "round {} (claim {}, UID {}): {}",
                    round.number,
                    round.claim,
                    round.uid,
                    left.join(", ")
                )
            })
        })
        .collect()
}

/// No pod that uses a claim, and no claim, is left in the namespace.
async fn expect_nothing_left(s: &Session) -> SpecResult {
    let pods: Api<Pod> = Api::namespaced(s.ctx.client().clone(), s.ctx.namespace());
    let claims: Api<ResourceClaim> = Api::namespaced(s.ctx.client().clone(), s.ctx.namespace());
    let with_claims: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            p.spec.as_ref().is_some_and(|spec| spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()))
        })
        .map(|p| p.name_any())
        .collect();
    let left: Vec<String> =
        claims.list(&ListParams::default()).await?.items.iter().map(|c| c.name_any()).collect();
    expect!(
        with_claims.is_empty() && left.is_empty(),
        "after the rounds, pods {with_claims:?} and claims {left:?} are left in namespace {}",
        s.ctx.namespace()
    );
    Ok(())
}

/// Interposed: each round's claim prepared once and unprepared once, none still prepared; in
/// all, as many successful prepares and unprepares as rounds and no failed call.
fn expect_calls_add_up(log: &CallLog, rounds: &[Round]) -> SpecResult {
    for round in rounds {
        let history = log.claim(&round.uid);
        expect!(
            history.prepared() == 1
                && history.unprepared() == 1
                && history.prepare_failures() == 0
                && history.unprepare_failures() == 0
                && !history.is_prepared(),
            "round {}: claim {} must be prepared once and unprepared once, successfully: {history}\ncall log:\n{log}",
            round.number,
            round.claim
        );
    }
    let n = rounds.len();
    for method in [Method::NodePrepareResources, Method::NodeUnprepareResources] {
        log.expect_count(method.clone().succeeded(), n)?;
        log.expect_count(method.failed(), 0)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::{super::cdi::CdiDevice, *};

    #[test]
    fn the_rounds_default_to_ten_and_are_at_least_one() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: super::super::UnderTestArgs,
        }
        let parse =
            |line: &[&str]| Cli::try_parse_from([&["dra-e2e"], line].concat()).map(|c| c.args.churn_rounds);
        assert_eq!(parse(&["--driver", "d.example.com"]).unwrap(), DEFAULT_ROUNDS);
        assert_eq!(parse(&["--driver", "d.example.com", "--churn-rounds", "3"]).unwrap(), 3);
        assert!(parse(&["--driver", "d.example.com", "--churn-rounds", "0"]).is_err());
        assert!(parse(&["--churn-rounds", "3"]).is_err(), "needs --driver");
    }

    #[test]
    fn leftovers_name_their_round_claim_and_file() {
        let round = |number: u32, uid: &str| Round {
            number,
            claim: format!("claim-{number}"),
            uid: uid.into(),
            per_claim: vec![format!("d/test=claim-{uid}-device")],
        };
        let rounds = [round(1, "u1"), round(2, "u2"), round(3, "u3")];
        let file =
            |uid: &str| CdiDevice { file: format!("/var/run/cdi/d-{uid}-device.json"), env: Vec::new() };
        let devices: CdiDevices = [
            ("d/test=claim-u2-device".to_owned(), file("u2")),
            ("d/other=u3-extra".to_owned(), file("u3")),
            ("d/device=static".to_owned(), CdiDevice { file: "/etc/cdi/d.json".into(), env: Vec::new() }),
        ]
        .into();
        assert_eq!(
            leftovers(&rounds, &devices),
            [
                "round 2 (claim claim-2, UID u2): d/test=claim-u2-device (in /var/run/cdi/d-u2-device.json)",
                "round 3 (claim claim-3, UID u3): d/other=u3-extra (in /var/run/cdi/d-u3-device.json)",
            ]
        );
        assert!(leftovers(&rounds, &CdiDevices::new()).is_empty());
    }
}
