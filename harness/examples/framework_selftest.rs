//! A tiny spec binary on the real runner, used by the framework's cluster
//! tests (`harness/tests/cluster/framework.rs`) to check Ctrl-C handling and
//! the command line end to end.
//!
//! Every spec labels its namespace and creates a DeviceClass, both labelled
//! `dra-e2e.k8s.io/selftest=$FRAMEWORK_SELFTEST_RUN`, registers the class's
//! deletion and then waits until it is cancelled (timeout or Ctrl-C). With
//! `FRAMEWORK_SELFTEST_HANGING_CLEANUP` set, each spec also registers a
//! cleanup that never ends.
//!
//! ```text
//! FRAMEWORK_SELFTEST_RUN=x cargo run -p harness --example framework_selftest -- \
//!     --kubeconfig /var/lib/dra-e2e/local/admin.kubeconfig -p 2 --timeout 30s
//! ```

use std::{collections::BTreeMap, time::Duration};

use clap::Parser;
use harness::framework::{Ctx, Registry, RunnerArgs, SpecResult};
use k8s_openapi::api::{
    core::v1::Namespace,
    resource::v1::{DeviceClass, DeviceClassSpec},
};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};

/// Label on everything the self-test creates; its value is `$FRAMEWORK_SELFTEST_RUN`.
const RUN_LABEL: &str = "dra-e2e.k8s.io/selftest";

/// Runs the framework self-test specs.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    runner: RunnerArgs,
}

async fn create_class_and_wait(ctx: Ctx) -> SpecResult {
    let run = std::env::var("FRAMEWORK_SELFTEST_RUN").unwrap_or_else(|_| "manual".to_owned());
    let labels = BTreeMap::from([(RUN_LABEL.to_owned(), run)]);
    let namespaces: Api<Namespace> = Api::all(ctx.client().clone());
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    namespaces.patch(ctx.namespace(), &PatchParams::default(), &Patch::Merge(&patch)).await?;

    let classes: Api<DeviceClass> = Api::all(ctx.client().clone());
    let name = ctx.unique_name("selftest");
    let class = DeviceClass {
        metadata: ObjectMeta { name: Some(name.clone()), labels: Some(labels), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec::default()),
    };
    classes.create(&PostParams::default(), &class).await?;
    ctx.delete_at_cleanup(classes, name.clone());
    if std::env::var_os("FRAMEWORK_SELFTEST_HANGING_CLEANUP").is_some() {
        // Runs first (cleanups run last registered first) and never ends: a
        // run that is cleaning up, for tests of the second Ctrl-C.
        ctx.defer_with_timeout("hang", Duration::from_secs(600), std::future::pending());
    }
    tracing::info!("created DeviceClass {name}; waiting until cancelled");
    ctx.cancelled().await;
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let mut registry = Registry::new();
    registry.describe_with_labels("[framework]", ["DRA"], |r| {
        r.context("self-test", |r| {
            r.it("waits with a DeviceClass 1", async |ctx| create_class_and_wait(ctx).await);
            r.it("waits with a DeviceClass 2", async |ctx| create_class_and_wait(ctx).await);
            r.it("waits with a DeviceClass 3", async |ctx| create_class_and_wait(ctx).await).label("Slow");
        });
    });
    harness::framework::run(registry, cli.runner).await
}
