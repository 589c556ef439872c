//! The runner core: preflight, scheduling (`-p`, `Serial`, `--repeat`), one
//! spec's life (namespace, body with timeout and cancellation, artifacts,
//! cleanups), the JUnit report and the summary.
//!
//! It talks to the cluster only through a [`ClusterBackend`], so it runs the
//! same against [`KubeBackend`](crate::KubeBackend) and against test doubles.

use std::{collections::HashSet, path::Path, sync::Arc, time::Duration};

use tokio::{sync::Semaphore, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{
    cluster::backend::{ClusterBackend, NamespaceRequest},
    cluster::disruptions::Disruptions,
    cluster::preflight::ClusterInfo,
    duration, names,
    report::json_report::{self, JsonConfig},
    report::junit,
    report::outcome::OUTCOME_TARGET,
    report::outcome::{CheckReport, FailureKind, Outcome, RunReport, SpecReport},
    report::progress::{self, Verbosity},
    run::after_run,
    run::artifacts,
    run::capture::{self, SPEC_SPAN_TARGET},
    run::cleanup::{CleanupStack, failure_lines},
    run::deferred::Slot,
    run::monitor::{self, Monitor, Phase, SpecState},
    run::options::RunOptions,
    run::order,
    run::phases::{Phases, SetupMark},
    run::shared::RunShared,
    run::spec_end::{
        Execution, body_outcome, stop_body, with_disruptions, with_failures, write_failure_files,
    },
    run::spec_tasks::SpecTasks,
    select::selection::Selection,
    spec::ctx::{Ctx, CtxParts},
    spec::registry::{Registry, SpecDef, SuiteHooks},
    spec::requirements::{self, Precheck},
};

/// Waits at least this long (in all, per name) go into the report.
const REPORTED_WAIT: Duration = Duration::from_secs(1);

/// How long creating a spec's namespace may take.
const NAMESPACE_CREATE_TIMEOUT: Duration = Duration::from_secs(30);

struct Env {
    hooks: SuiteHooks,
    /// Cancelled by `--fail-fast` at the first failure: no new spec starts.
    stop_new: CancellationToken,
    backend: Arc<dyn ClusterBackend>,
    cluster: Arc<ClusterInfo>,
    options: RunOptions,
    interrupt: CancellationToken,
    /// What happened to the cluster meanwhile, named in failed specs' messages.
    disruptions: Option<Disruptions>,
    /// What the specs share, and what removes it when the run ends.
    run_shared: Arc<RunShared>,
}

/// Runs the selected specs of `registry` against `backend`.
///
/// Cancel `interrupt` to stop the run as the first Ctrl-C does: running
/// specs are cancelled (their cleanups still run) and reported as
/// interrupted, specs not started yet are reported as skipped. With a partition
/// ([`Selection::with_partition`]) the selected specs of other shards are reported as skipped
/// `in shard K of N`, in every round.
pub async fn run_with_backend(
    registry: Registry,
    selection: &Selection,
    options: RunOptions,
    backend: Arc<dyn ClusterBackend>,
    interrupt: CancellationToken,
) -> RunReport {
    let started = Instant::now();
    let mut report = RunReport {
        repeat: options.repeat,
        started: Some(std::time::SystemTime::now()),
        ..RunReport::default()
    };
    let stop = |mut report: RunReport, error: String| {
        report.error = Some(error);
        report.wall_time = started.elapsed();
        report
    };
    if let Err(e) = registry.validate() {
        return stop(report, e.to_string());
    }
    if options.procs == 0 || options.repeat == 0 || options.flake_attempts == 0 {
        return stop(report, "--procs, --repeat and --flake-attempts must be at least 1".to_owned());
    }
    if options.poll_progress_after.is_some() && options.poll_progress_interval.is_zero() {
        return stop(report, "--poll-progress-interval must be more than 0".to_owned());
    }
    let total = registry.len();
    let (specs, hooks) = registry.into_parts();
    let selected: Vec<Arc<SpecDef>> =
        specs.into_iter().filter(|s| selection.matches(&s.info)).map(Arc::new).collect();
    // The specs of other shards are reported as skipped in each round.
    let (mut specs, elsewhere) = selection.split(selected, |s| &s.info);
    let seed = options.seed.unwrap_or_else(order::default_seed);
    report.seed = seed;
    order::shuffle(&mut specs, seed, options.randomize_all);
    if let Some(parent) =
        options.junit.as_deref().and_then(Path::parent).filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        return stop(report, format!("cannot create the folder {} for --junit: {e}", parent.display()));
    }

    let cluster = match tokio::time::timeout(options.preflight_timeout, backend.preflight()).await {
        Ok(Ok(cluster)) => match cluster.require_apis(&hooks.required_apis) {
            Ok(()) => cluster,
            Err(e) => return stop(report, e.to_string()),
        },
        Ok(Err(e)) => return stop(report, e.to_string()),
        Err(_) => {
            return stop(
                report,
                format!(
                    "preflight did not finish within {}; is the cluster running?",
                    duration::display(options.preflight_timeout)
                ),
            );
        }
    };
    if !capture::is_installed() {
        tracing::warn!(
            "spec logs are not captured: the global tracing subscriber lacks spec_runner::capture_layer()"
        );
    }
    options.output.block(&progress::header(&progress::RunHeader {
        selected: specs.len(),
        total,
        procs: options.procs,
        procs_is_default: options.procs_is_default,
        repeat: options.repeat,
        randomize_all: options.randomize_all,
        seed,
        cluster: &cluster,
        shard: selection.partition().map(|p| (p.describe(), elsewhere.len())),
    }));
    if options.verbosity == Verbosity::Verbose {
        for (spec, reason) in &elsewhere {
            let skipped = SpecReport::never_started(&spec.info, 1, reason);
            options.output.block(&progress::spec_block(&skipped, 1, 1, Verbosity::Normal));
        }
    }

    let disruptions = backend
        .watches_disruptions()
        // The stream client sends no request again (the run's client waits out an outage,
        // which the probe must see).
        .then(|| Disruptions::watch(backend.stream_client(), std::time::SystemTime::now()));
    let env = Arc::new(Env {
        hooks,
        stop_new: CancellationToken::new(),
        backend,
        cluster: Arc::new(cluster),
        disruptions,
        options,
        interrupt,
        run_shared: Arc::default(),
    });
    let (serial, parallel): (Vec<_>, Vec<_>) = specs.iter().cloned().partition(|s| s.info.runs_alone());
    let mut not_run = 0;
    for attempt in 1..=env.options.repeat {
        if env.interrupt.is_cancelled() || env.stop_new.is_cancelled() {
            break;
        }
        let mut started_specs = HashSet::new();
        let round = Instant::now();
        let last = attempt == env.options.repeat;
        report.specs.extend(run_attempt(&env, &serial, &parallel, attempt, last, &mut started_specs).await);
        report
            .specs
            .extend(elsewhere.iter().map(|(s, reason)| SpecReport::never_started(&s.info, attempt, reason)));
        report.round_times.push(round.elapsed());
        let reason = if env.interrupt.is_cancelled() {
            "not run: the run was interrupted"
        } else {
            "not run: --fail-fast stopped the run after a failure"
        };
        for spec in specs.iter().filter(|s| !started_specs.contains(&s.info.index())) {
            not_run += 1;
            report.specs.push(SpecReport::never_started(&spec.info, attempt, reason));
        }
    }
    let problems = env.run_shared.finish().await;
    if !problems.is_empty() {
        let problems = problems.join("; ");
        report.error = Some(match report.error.take() {
            Some(e) => format!("{e}; {problems}"),
            None => problems,
        });
    }
    report.specs.sort_by_key(|s| (s.attempt, s.index));
    report.interrupted = env.interrupt.is_cancelled();
    report.wall_time = started.elapsed();
    if let Some(path) = &env.options.junit {
        match junit::write(&report, path) {
            Ok(()) => tracing::info!("wrote JUnit report {}", path.display()),
            Err(e) => report.error = Some(e.to_string()),
        }
    }
    if let Some(path) = &env.options.json_report {
        let config = JsonConfig {
            procs: env.options.procs,
            randomize_all: env.options.randomize_all,
            fail_fast: env.options.fail_fast,
            flake_attempts: env.options.flake_attempts,
            timeout: env.options.default_timeout,
            shard: selection.partition().map(|p| p.shard()),
        };
        match json_report::write(&report, total, &config, path) {
            Ok(()) => tracing::info!("wrote JSON report {}", path.display()),
            Err(e) => report.error = Some(e),
        }
    }
    let lead = if env.options.verbosity == Verbosity::Succinct { "\n" } else { "" };
    env.options.output.block(&format!("{lead}{}", progress::summary(&report, not_run)));
    after_run::run_hooks(&env.hooks.after_run, &mut report, &env.cluster, &env.options.output);
    report
}

/// Runs one attempt: the `[Serial]` specs first, then the others at most `procs` at a time, in
/// the run's order. A spec holds its slot for its body and cleanups and releases it before its
/// deferred checks, which only wait on its own objects going away. A serial spec holds every
/// slot and starts only when every spec before it has settled (ended, its settling deferred
/// checks included: its namespace and objects gone), so it finds a quiet cluster; observations
/// (the kubelet wiping a departed driver's slices) hold nothing and may still run. The parallel
/// specs start while the last serial spec's deferred checks still run (they are alone with
/// anything but another spec's body). Returns when every spec's deferred checks have finished.
async fn run_attempt(
    env: &Arc<Env>,
    serial: &[Arc<SpecDef>],
    parallel: &[Arc<SpecDef>],
    attempt: u32,
    last: bool,
    started: &mut HashSet<usize>,
) -> Vec<SpecReport> {
    let procs = u32::try_from(env.options.procs.max(1)).unwrap_or(u32::MAX);
    let semaphore = Arc::new(Semaphore::new(procs as usize));
    let mut tasks = SpecTasks::new(attempt);
    for spec in serial.iter().chain(parallel) {
        let reached = Instant::now();
        let permits = if spec.info.runs_alone() {
            tasks.settle().await;
            procs
        } else {
            1
        };
        let permit = tokio::select! {
            biased;
            () = env.interrupt.cancelled() => break,
            () = env.stop_new.cancelled() => break,
            permit = semaphore.clone().acquire_many_owned(permits) => permit,
        };
        let Ok(permit) = permit else { break };
        started.insert(spec.info.index());
        let slot = Slot::held(semaphore.clone(), permit, permits);
        let settled = CancellationToken::new();
        let queued = reached.elapsed();
        tasks.spawn(
            spec,
            settled.clone(),
            run_tries(env.clone(), spec.clone(), attempt, slot, settled, queued),
        );
    }
    // In the last attempt, once every slot is free again and no spec can be retried, no spec
    // runs a body or a clean-up any more: the run-end clean-ups run beside the last deferred
    // checks (the kubelet's 30 s before it wipes a departed driver's slices, say).
    let run_ends = async {
        if last && env.options.flake_attempts == 1 {
            let _every_slot = semaphore.acquire_many(procs).await;
            env.run_shared.run_ends().await;
        }
    };
    tokio::join!(tasks.finish(), run_ends);
    tasks.reports
}

/// Runs a spec up to `--flake-attempts` times, until it does not fail (or the run is
/// interrupted); the report is the last run's, with the failures before it. A spec that still
/// fails stops new specs with `--fail-fast`. A try's deferred checks end before the next try
/// starts (they can fail it); the next try takes the slot again. `settled` is cancelled once the
/// spec has settled (see [`run_attempt`]): by the last possible try's settling checks, else when
/// the tries end ([`SpecTasks::spawn`]). `queued` is how long it waited for its slot.
async fn run_tries(
    env: Arc<Env>,
    spec: Arc<SpecDef>,
    attempt: u32,
    mut slot: Slot,
    settled: CancellationToken,
    queued: Duration,
) -> SpecReport {
    let mut earlier = Vec::new();
    for try_number in 1.. {
        let last_try = try_number >= env.options.flake_attempts;
        let settles = last_try.then_some(&settled);
        let mut report = run_spec(env.clone(), spec.clone(), attempt, try_number, &mut slot, settles).await;

        let retry = report.outcome.is_failed()
            && try_number < env.options.flake_attempts
            && !env.interrupt.is_cancelled()
            && tokio::select! {
                biased;
                () = env.interrupt.cancelled() => false,
                taken = slot.acquire() => taken,
            };
        if retry {
            if let Outcome::Failed { message, .. } = &report.outcome {
                let at = report.artifacts.as_ref().map(|d| format!(" (artifacts: {})", d.display()));
                earlier.push(format!("try {try_number}: {message}{}", at.unwrap_or_default()));
            }
            continue;
        }
        report.tries = try_number;
        report.earlier_failures = earlier;
        if !report.phases.is_empty() {
            // Before its first try.
            report.phases.queued = Some(queued);
        }
        if report.outcome.is_failed() && env.options.fail_fast && !env.stop_new.is_cancelled() {
            tracing::warn!("--fail-fast: a spec failed, no new spec starts");
            env.stop_new.cancel();
        }
        return report;
    }
    unreachable!("the loop above returns")
}

/// One spec run, start to end: captured log, namespace, body, artifacts,
/// cleanups, then (its slot released) deferred checks, failure files, progress line.
async fn run_spec(
    env: Arc<Env>,
    spec: Arc<SpecDef>,
    attempt: u32,
    try_number: u32,
    slot: &mut Slot,
    settled: Option<&CancellationToken>,
) -> SpecReport {
    let id = capture::new_spec_id();
    capture::begin(id);
    let span = tracing::error_span!(target: SPEC_SPAN_TARGET, "spec", spec_id = id, name = %spec.info.name());
    let (started, started_at) = (Instant::now(), std::time::SystemTime::now());
    let dir = artifacts::spec_dir(
        &env.options.artifacts,
        spec.info.full_text(),
        attempt,
        env.options.repeat,
        try_number,
    );
    let cleanups = Arc::new(CleanupStack::default());
    let verbose = (env.options.verbosity == Verbosity::Verbose).then(|| env.options.output.clone());
    let state = SpecState::new(id, spec.info.full_text(), spec.info.name(), cleanups.clone(), verbose);
    if env.options.verbosity == Verbosity::Verbose {
        let again = if try_number > 1 { format!(" (try {try_number})") } else { String::new() };
        env.options.output.block(&format!("START {}{again}\n", spec.info.full_text()));
    }
    let running = Running::start(&env, state.clone());
    let mut run =
        execute(&env, &spec, attempt, &dir, &state, cleanups.clone()).instrument(span.clone()).await;
    let duration = started.elapsed();
    let deferred = if cleanups.checks.is_empty() {
        settled.inspect(|s| s.cancel());
        Vec::new()
    } else {
        // A spec that failed for good stops new specs before its slot frees one (--fail-fast).
        if run.outcome.is_failed()
            && try_number >= env.options.flake_attempts
            && env.options.fail_fast
            && !env.stop_new.is_cancelled()
        {
            tracing::warn!("--fail-fast: a spec failed, no new spec starts");
            env.stop_new.cancel();
        }
        slot.release();
        let checks_start = Instant::now();
        let reports = cleanups.checks.run_all(Some(&state), settled).instrument(span.clone()).await;
        run.phases.deferred = Some(checks_start.elapsed());
        reports
    };
    run.outcome = with_failures(run.outcome, deferred.iter().filter_map(CheckReport::failure).collect());
    if run.outcome.is_failed()
        && let Some(disruptions) = &env.disruptions
    {
        run.outcome =
            with_disruptions(run.outcome, disruptions.during(started_at, std::time::SystemTime::now()).await);
    }
    span.in_scope(|| {
        tracing::info!(
            target: OUTCOME_TARGET,
            "finished: {}",
            match &run.outcome {
                Outcome::Passed => "passed".to_owned(),
                Outcome::Skipped { reason } => format!("skipped ({reason})"),
                Outcome::Failed { kind, .. } => format!("failed ({})", kind.as_str()),
            }
        );
    });
    drop(running);
    let log = capture::take(id);
    let artifacts = if run.outcome.is_failed() {
        write_failure_files(&dir, &run, &log).await;
        Some(dir)
    } else {
        None
    };
    let report = SpecReport {
        full_text: spec.info.full_text().to_owned(),
        labels: spec.info.labels().to_vec(),
        index: spec.info.index(),
        attempt,
        outcome: run.outcome,
        started: started_at,
        duration,
        log,
        artifacts,
        tries: try_number,
        earlier_failures: Vec::new(),
        phases: run.phases,
        waits: state.waited(REPORTED_WAIT),
        deferred,
    };
    env.options.output.block(&progress::spec_block(
        &report,
        env.options.repeat,
        env.options.flake_attempts,
        env.options.verbosity,
    ));
    report
}

/// A spec in the run's [`Monitor`], with its progress poller; both end when this is dropped
/// (also when the spec's task panics).
struct Running {
    monitor: Monitor,
    state: Arc<SpecState>,
    poller: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    fn start(env: &Env, state: Arc<SpecState>) -> Self {
        env.options.monitor.add(&state);
        let poller = env.options.poll_progress_after.map(|after| {
            let (output, interval, state) =
                (env.options.output.clone(), env.options.poll_progress_interval, state.clone());
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                loop {
                    output.block(&format!("\nAutomatically polling progress:\n{}", state.report()));
                    tokio::time::sleep(interval).await;
                }
            })
        });
        Self { monitor: env.options.monitor.clone(), state, poller }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(poller) = &self.poller {
            poller.abort();
        }
        self.monitor.remove(&self.state);
    }
}

async fn execute(
    env: &Arc<Env>,
    spec: &Arc<SpecDef>,
    attempt: u32,
    dir: &Path,
    state: &Arc<SpecState>,
    cleanups: Arc<CleanupStack>,
) -> Execution {
    let info = &spec.info;
    let options = &env.options;
    tracing::info!("starting {:?} (attempt {attempt})", info.full_text());
    let mut run = Execution {
        outcome: Outcome::Passed,
        problems: Vec::new(),
        dir_ready: false,
        phases: Phases::default(),
    };

    // Requirements first: a spec the cluster cannot run creates nothing.
    let pre = Precheck::new(env.backend.client(), env.cluster.clone(), info.labels());
    if let Some(outcome) = state.scope(requirements::check(info, &spec.requirements, pre)).await {
        tracing::info!(target: OUTCOME_TARGET, "requirements not met, nothing created: {outcome:?}");
        run.outcome = outcome;
        return run;
    }

    let request = NamespaceRequest {
        generate_name: names::namespace_prefix(info.name()),
        full_text: info.full_text().to_owned(),
    };
    let create = async {
        let _waiting = monitor::waiting("the spec's namespace to be created", Some(NAMESPACE_CREATE_TIMEOUT));
        tokio::time::timeout(NAMESPACE_CREATE_TIMEOUT, env.backend.create_namespace(&request)).await
    };
    let namespace = match state.scope(create).await {
        Ok(Ok(ns)) => ns,
        Ok(Err(e)) => {
            tracing::error!(target: OUTCOME_TARGET, "cannot create the spec's namespace: {e}");
            run.outcome =
                Outcome::failed(FailureKind::Setup, format!("cannot create the spec's namespace: {e}"));
            return run;
        }
        Err(_) => {
            let message = format!(
                "timed out after {} waiting for the spec's namespace to be created",
                duration::display(NAMESPACE_CREATE_TIMEOUT)
            );
            tracing::error!(target: OUTCOME_TARGET, "{message}");
            run.outcome = Outcome::failed(FailureKind::Setup, message);
            return run;
        }
    };
    tracing::info!(namespace = %namespace.name, "created namespace");
    state.verbose_line(&format!("created namespace {}", namespace.name));

    let (backend, ns, ns_timeout) = (env.backend.clone(), namespace.clone(), options.namespace_timeout);
    let stack = cleanups.clone();
    // First registered, so it runs last. Its pods gone settles the cluster for a later serial
    // spec; the namespace itself gone (the namespace controller's few seconds) is an
    // observation. Both deferred checks are bounded by their own timeouts inside.
    cleanups.push(format!("delete namespace {}", namespace.name), options.cleanup_timeout, async move {
        backend.delete_namespace(&ns).await?;
        let bound = ns_timeout + Duration::from_secs(15);
        let (pods_backend, pods_ns) = (backend.clone(), ns.clone());
        stack.checks.push(format!("the pods of namespace {} to be gone", ns.name), bound, async move {
            pods_backend.wait_namespace_pods_gone(&pods_ns, ns_timeout).await.map_err(anyhow::Error::from)
        });
        stack.checks.push_observation(format!("namespace {} to be gone", ns.name), bound, async move {
            backend.wait_namespace_gone(&ns, ns_timeout).await.map_err(anyhow::Error::from)
        });
        Ok(())
    });

    let timeout = info.timeout().unwrap_or(options.default_timeout);
    let deadline = Instant::now() + timeout;
    let token = env.interrupt.child_token();
    let setup_mark = Arc::new(SetupMark::default());
    let ctx = Ctx::new(CtxParts {
        client: env.backend.client(),
        stream_client: env.backend.stream_client(),
        namespace: namespace.name.clone(),
        suffix: names::unique_suffix(),
        full_text: info.full_text().to_owned(),
        labels: info.labels().to_vec(),
        attempt,
        cluster: env.cluster.clone(),
        token: token.clone(),
        cleanups: cleanups.clone(),
        cleanup_timeout: options.cleanup_timeout,
        artifacts_dir: dir.to_owned(),
        deadline,
        setup: setup_mark.clone(),
        run: env.run_shared.clone(),
    });

    for hook in &env.hooks.before_each {
        hook(&ctx);
    }
    let body = spec.body.clone();
    let body_ctx = ctx.clone();
    state.set_phase(Phase::Body);
    let body_start = Instant::now();
    let body_token = token.clone();
    let mut task = tokio::spawn(
        state
            .scope(crate::spec::ctx::with_body_token(body_token, async move { body(body_ctx).await }))
            .in_current_span(),
    );
    run.outcome = tokio::select! {
        // The spec's token is only cancelled here by an interrupt (timeouts
        // cancel it below): a body that returned because of it was interrupted.
        joined = &mut task => {
            if token.is_cancelled() {
                tracing::warn!(target: OUTCOME_TARGET, "interrupted; the spec returned");
                Outcome::failed(FailureKind::Interrupted, "interrupted (Ctrl-C) while running")
            } else {
                body_outcome(joined)
            }
        }
        () = tokio::time::sleep_until(deadline) => {
            let message = format!("timed out after {}", duration::display(timeout));
            tracing::error!(target: OUTCOME_TARGET, "{message}; cancelling the spec");
            state.set_phase(Phase::Cancelling);
            stop_body(&token, task, options.cancel_grace).await;
            Outcome::failed(FailureKind::Timeout, message)
        }
        message = ctx.failed_now() => {
            tracing::error!(target: OUTCOME_TARGET, "failed: {message}; cancelling the spec");
            state.set_phase(Phase::Cancelling);
            stop_body(&token, task, options.cancel_grace).await;
            Outcome::failed(FailureKind::Error, message)
        }
        () = env.interrupt.cancelled() => {
            tracing::warn!(target: OUTCOME_TARGET, "interrupted; cancelling the spec");
            state.set_phase(Phase::Cancelling);
            stop_body(&token, task, options.cancel_grace).await;
            Outcome::failed(FailureKind::Interrupted, "interrupted (Ctrl-C) while running")
        }
    };
    let (setup, body) = setup_mark.split(body_start, Instant::now());
    (run.phases.setup, run.phases.body) = (setup, Some(body));

    // Collect what the cluster looks like now, before cleanups change it.
    if matches!(&run.outcome, Outcome::Failed { kind, .. } if *kind != FailureKind::Interrupted) {
        state.set_phase(Phase::Artifacts);
        run.problems = artifacts::collect(
            env.backend.as_ref(),
            env.options.artifact_timeout,
            &ctx.sources(),
            &namespace.name,
            dir,
        )
        .await;
        run.dir_ready = true;
    }

    let cleanup_start = Instant::now();
    let failures = cleanups.run_all_watched(Some(state), options.cleanup_bound).await;
    run.phases.cleanup = Some(cleanup_start.elapsed());
    token.cancel();
    run.outcome = with_failures(run.outcome, failure_lines(&failures));
    run
}
