//! Per-spec captured logs: a `tracing` layer that routes every event emitted
//! inside a spec's span to that spec's buffer.
//!
//! The runner wraps each spec (body, artifact collection, cleanups) in a span
//! with target [`SPEC_SPAN_TARGET`] and a `spec_id` field; events anywhere
//! below it (including tasks spawned with `.in_current_span()`) are captured.
//! The buffer is printed when the spec fails, written to `spec.log` in its
//! artifact folder and to the JUnit `system-out`.
//!
//! Which events are captured is set by `DRA_E2E_SPEC_LOG` (same syntax as
//! `RUST_LOG` without span filters, default [`DEFAULT_SPEC_LOG`]); `RUST_LOG`
//! keeps controlling the console independently.

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{
        LazyLock, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Instant,
};

use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{
    EnvFilter, Layer,
    filter::{LevelFilter, Targets},
    layer::{Context, SubscriberExt as _},
    registry::LookupSpan,
    util::SubscriberInitExt as _,
};

/// Target of the span the runner opens around each spec.
pub const SPEC_SPAN_TARGET: &str = "dra_e2e::spec";
/// Environment variable selecting what goes into spec logs.
pub const SPEC_LOG_ENV: &str = "DRA_E2E_SPEC_LOG";
/// What goes into spec logs when [`SPEC_LOG_ENV`] is unset.
pub const DEFAULT_SPEC_LOG: &str = "info,harness=debug,suites=debug,dra_e2e=debug";
/// Console filter when `RUST_LOG` is unset: specs' logs are captured, the
/// console shows progress lines and warnings, but neither the runner's
/// per-spec outcome messages (the progress lines repeat them) nor kube-rs'
/// request errors (the caller reports every one of them).
pub const DEFAULT_CONSOLE_LOG: &str = "warn,dra_e2e::outcome=off,kube_client=off";

/// Spec logs larger than this are cut (with a note) to bound memory.
const MAX_LOG_BYTES: usize = 16 << 20;

static INSTALLED: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static STORE: LazyLock<Mutex<HashMap<u64, SpecLog>>> = LazyLock::new(Default::default);

struct SpecLog {
    start: Instant,
    text: String,
    truncated: bool,
    /// Where the last line starts in `text`.
    last_start: usize,
}

/// A fresh id for a spec's span.
pub(crate) fn new_spec_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn store() -> std::sync::MutexGuard<'static, HashMap<u64, SpecLog>> {
    STORE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts capturing for a spec id.
pub(crate) fn begin(id: u64) {
    store()
        .insert(id, SpecLog { start: Instant::now(), text: String::new(), truncated: false, last_start: 0 });
}

/// Ends capturing for a spec id and returns what was captured.
pub(crate) fn take(id: u64) -> String {
    store().remove(&id).map(|l| l.text).unwrap_or_default()
}

fn append(id: u64, line: impl FnOnce(f64) -> String) {
    let mut store = store();
    let Some(log) = store.get_mut(&id) else { return };
    if log.truncated {
        return;
    }
    let line = line(log.start.elapsed().as_secs_f64());
    if log.text.len() + line.len() > MAX_LOG_BYTES {
        log.text.push_str("... (log truncated: more than 16 MiB)\n");
        log.truncated = true;
        return;
    }
    log.last_start = log.text.len();
    log.text.push_str(&line);
}

/// The last line captured for a spec id (for progress reports).
pub(crate) fn last_line(id: u64) -> Option<String> {
    let store = store();
    let log = store.get(&id)?;
    log.text.get(log.last_start..).filter(|l| !l.is_empty()).map(str::to_owned)
}

/// Whether a [`CaptureLayer`] is part of the installed global subscriber.
pub(crate) fn is_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// The layer that captures spec logs. Use [`capture_layer`] to get it with
/// its filter, or [`init_tracing`] for the whole default set-up.
#[derive(Debug, Default)]
pub struct CaptureLayer {
    _private: (),
}

/// The spec id a span carries (only on spec spans).
struct SpecId(u64);
/// A span's fields, formatted once when it is created.
struct SpanFields(String);

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, _subscriber: &tracing::Dispatch) {
        INSTALLED.store(true, Ordering::Relaxed);
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = FieldText::default();
        attrs.record(&mut fields);
        let mut ext = span.extensions_mut();
        if attrs.metadata().target() == SPEC_SPAN_TARGET
            && let Some(spec) = fields.spec_id
        {
            ext.insert(SpecId(spec));
        }
        ext.insert(SpanFields(fields.text));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else { return };
        let mut spans = Vec::new();
        let mut spec = None;
        for span in scope {
            let ext = span.extensions();
            if let Some(SpecId(id)) = ext.get::<SpecId>() {
                spec = Some(*id);
                break;
            }
            let fields = ext.get::<SpanFields>().map(|f| f.0.as_str()).unwrap_or_default();
            spans.push(if fields.is_empty() {
                span.name().to_owned()
            } else {
                format!("{}{{{fields}}}", span.name())
            });
        }
        let Some(spec) = spec else { return };
        let mut fields = FieldText::default();
        event.record(&mut fields);
        let meta = event.metadata();
        append(spec, |secs| {
            let mut line = format!("[{secs:>9.3}s] {:<5} {}: ", meta.level().as_str(), meta.target());
            for span in spans.iter().rev() {
                let _ = write!(line, "{span}: ");
            }
            line.push_str(&fields.message);
            if !fields.text.is_empty() {
                if !fields.message.is_empty() {
                    line.push(' ');
                }
                line.push_str(&fields.text);
            }
            line.push('\n');
            line
        });
    }
}

#[derive(Default)]
struct FieldText {
    message: String,
    text: String,
    spec_id: Option<u64>,
}

impl FieldText {
    fn push(&mut self, field: &Field, value: std::fmt::Arguments<'_>) {
        if field.name() == "message" {
            let _ = self.message.write_fmt(value);
            return;
        }
        if !self.text.is_empty() {
            self.text.push(' ');
        }
        let _ = write!(self.text, "{}=", field.name());
        let _ = self.text.write_fmt(value);
    }
}

impl Visit for FieldText {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "spec_id" {
            self.spec_id = Some(value);
        }
        self.push(field, format_args!("{value}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.push(field, format_args!("{value:?}"));
    }
}

/// The capture layer with its filter: `DRA_E2E_SPEC_LOG` (or
/// [`DEFAULT_SPEC_LOG`]), plus always the spec spans themselves.
pub fn capture_layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let spec = std::env::var(SPEC_LOG_ENV).ok();
    let targets = spec
        .as_deref()
        .and_then(|s| match s.parse::<Targets>() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("ignoring {SPEC_LOG_ENV}={s:?} ({e}); using {DEFAULT_SPEC_LOG:?}");
                None
            }
        })
        .or_else(|| DEFAULT_SPEC_LOG.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
        .with_target(SPEC_SPAN_TARGET, LevelFilter::TRACE);
    CaptureLayer::default().with_filter(targets)
}

/// Installs the default global subscriber: console output on stderr filtered
/// by `RUST_LOG` (default [`DEFAULT_CONSOLE_LOG`]) plus [`capture_layer`].
///
/// Returns `false` if a global subscriber was already installed (then spec
/// logs are captured only if it includes [`capture_layer`]).
pub fn init_tracing() -> bool {
    let console = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_CONSOLE_LOG));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(console))
        .with(capture_layer())
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use tracing::Instrument as _;

    use super::*;

    #[test]
    fn routes_events_to_the_spec_of_their_span() {
        let subscriber = tracing_subscriber::registry().with(capture_layer());
        let (a, b) = (new_spec_id(), new_spec_id());
        begin(a);
        begin(b);
        tracing::subscriber::with_default(subscriber, || {
            let span_a = tracing::error_span!(target: SPEC_SPAN_TARGET, "spec", spec_id = a);
            let span_b = tracing::error_span!(target: SPEC_SPAN_TARGET, "spec", spec_id = b);
            span_a.in_scope(|| {
                tracing::info!(claim = "c1", "prepared");
                tracing::info_span!("cleanup", what = "delete namespace").in_scope(|| {
                    tracing::warn!("slow");
                });
                // below the default level of other crates: not captured
                tracing::trace!(target: "hyper", "noise");
            });
            span_b.in_scope(|| tracing::error!(code = 3, "broken"));
            tracing::info!("outside any spec");
            // futures instrumented with the span are captured too
            futures::executor::block_on(async { tracing::info!("async") }.instrument(span_a.clone()));
        });
        let log_a = take(a);
        let log_b = take(b);
        let lines: Vec<_> = log_a.lines().collect();
        assert_eq!(lines.len(), 3, "{log_a}");
        assert!(lines[0].ends_with("INFO  spec_runner::run::capture::tests: prepared claim=c1"), "{log_a}");
        assert!(
            lines[1]
                .ends_with("WARN  spec_runner::run::capture::tests: cleanup{what=delete namespace}: slow")
        );
        assert!(lines[2].ends_with(": async"), "{log_a}");
        assert!(log_b.contains("ERROR spec_runner::run::capture::tests: broken code=3"), "{log_b}");
        assert!(!log_a.contains("outside") && !log_b.contains("outside"));
        assert_eq!(take(a), "", "taken once");
    }
}
