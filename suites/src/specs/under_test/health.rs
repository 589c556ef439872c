//! g: device health (`DRAResourceHealth`): when the driver serves it, the kubelet's
//! `NodeWatchResources` stream through the interposer gets its first snapshot. Only interposed:
//! without the interposer the stream cannot be seen, and the spec is skipped saying so.

use std::{sync::Arc, time::Duration};

use harness::{
    calls::Method,
    framework::{Ctx, Skip, SpecResult},
};

use super::{Target, session::Session};

/// How long the kubelet has to open the health stream after the interposer registered.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the driver has to send its first snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(60);

/// The first snapshot of the health stream arrives.
pub async fn first_snapshot(ctx: Ctx, target: Arc<Target>) -> SpecResult {
    if !target.interpose {
        return Err(Skip::because(
            "the health stream is only seen through the interposer: run with --interpose",
        ));
    }
    let s = Session::start(&ctx, &target).await?;
    let Some(calls) = s.calls() else { return Err(Skip::because("not interposed")) };
    if calls.wait_at_least(Method::NodeWatchResources, 1, OPEN_TIMEOUT).await.is_err() {
        return Err(Skip::because(format!(
            "the kubelet opened no NodeWatchResources stream within {OPEN_TIMEOUT:?}: driver {} does not serve DRAResourceHealth",
            target.driver
        )));
    }
    let log = calls.log();
    let unimplemented = log
        .matching(Method::NodeWatchResources)
        .iter()
        .all(|r| r.status.as_ref().is_some_and(|st| format!("{:?}", st.code) == "Unimplemented"));
    if unimplemented {
        return Err(Skip::because(format!(
            "driver {} answers NodeWatchResources with Unimplemented",
            target.driver
        )));
    }
    let what = "a first NodeWatchResources snapshot from the driver";
    calls
        .wait_for(
            what,
            |log| log.matching(Method::NodeWatchResources).iter().any(|r| r.responses >= 1),
            SNAPSHOT_TIMEOUT,
        )
        .await?;
    Ok(())
}
