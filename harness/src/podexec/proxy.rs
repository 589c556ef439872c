//! The `hostpathplugin --proxy-endpoint` process of one socket, kept running in the proxy pod.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{sync::watch, task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{PodExecError, Runner, show_command};

/// Printed by the start script right before it becomes the proxy.
const STARTED_MARKER: &str = "dra-e2e-proxy-started";

/// How long a stop waits for an exec that is just starting, so that it can be killed.
const START_GRACE: Duration = Duration::from_secs(10);

/// Shell functions shared by the start and stop scripts. `matching ARG` prints the PIDs of the
/// processes that have exactly `ARG` as one of their arguments (`/proc/*/cmdline`, its
/// NUL-separated arguments read by one `grep -z`: a shared proxy pod runs a few processes per
/// plugin, and forking per process made a start or stop take over 30 s on a loaded node; the
/// pattern comes on stdin, so that the `grep`, which a shell may exec in the place of the
/// subshell whose PID the glob listed, does not match itself);
/// `stop_matching ARG` sends them SIGTERM, SIGKILL after 5 s, and waits until they are gone
/// (zombies have an empty cmdline, so they count as gone), looking every 20 ms: a proxy ends
/// within milliseconds of its SIGTERM, and every stop of a driver's plugins waits for this.
/// `log_of SOCKET` prints the proxy's log file: in the container's `/tmp`, named after the socket
/// (its slashes made colons), so that no script has it among its arguments (only the `tail`s
/// that follow it do, which `stop_matching` finds so).
const FUNCTIONS: &str = r#"
log_of() {
  printf '/tmp/dra-e2e-proxy%s.log' "$(printf '%s' "$1" | tr / :)"
}
matching() {
  for f in $(printf '%s\n' "$1" | grep -lzxF -f - /proc/[0-9]*/cmdline 2>/dev/null); do
    f=${f#/proc/}
    echo "${f%/cmdline}"
  done
}
stop_matching() {
  pids=$(matching "$1")
  [ -z "$pids" ] && return 0
  kill $pids 2>/dev/null
  i=0
  while [ -n "$(matching "$1")" ]; do
    i=$((i+1))
    [ "$i" -eq 250 ] && kill -9 $(matching "$1") 2>/dev/null
    if [ "$i" -ge 500 ]; then echo "still running with $1: $(matching "$1")" >&2; return 1; fi
    sleep 0.02
  done
}
"#;

/// `$1` binary, `$2` verbosity, `$3` socket (its directory is created when missing: a pod that
/// several drivers share mounts the kubelet's whole plugin directory), `$4` proxy endpoint, `$5`
/// a socket to wait for first (empty: none), looked for every 20 ms, at most 250 times (about
/// 5 s): shorter than [`START_GRACE`], so a stop during the wait still sees the start marker and
/// kills the proxy. The script's own arguments never contain `--endpoint=<socket>` as one word,
/// so it cannot match itself.
///
/// The proxy runs as the script's child, not in its place, and writes its log to a file
/// ([`FUNCTIONS`]' `log_of`) that the script follows with `tail`: the container runtime kills an
/// exec'd process when its exec stream breaks, and every exec stream of a node breaks when its
/// kubelet restarts. The child survives that, and since its output is a file, not the broken
/// stream, its next log line does not kill it: a Go program dies of SIGPIPE when it writes to a
/// broken stdout or stderr even with SIGPIPE ignored (the Go runtime respects an inherited
/// SIG_IGN only for SIGHUP and SIGINT; checked: `(trap '' PIPE; /hostpathplugin … 2>&1) | true`
/// exits with 141), which is how proxies died a few seconds after a kubelet restart. So the
/// restarted kubelet finds the plugin's sockets served. The script prints [`ALIVE_MARKER`] every
/// [`HEARTBEAT`] while its proxy runs; a stream that stays silent longer than
/// [`HEARTBEAT_TIMEOUT`] is dead, and the next start adopts the proxy that still runs instead of
/// starting another, and follows its log from there on.
const START_SCRIPT: &str = r#"
log=$(log_of "$3")
pid=$(matching "--endpoint=$3" | head -n 1)
from=0
if [ -z "$pid" ]; then
  if [ -n "$5" ]; then
    i=0
    while [ ! -S "$5" ] && [ "$i" -lt 250 ]; do i=$((i+1)); sleep 0.02; done
    [ -S "$5" ] || echo "$5 did not appear within 5s; starting anyway" >&2
  fi
  mkdir -p "${3%/*}" "${log%/*}"
  : > "$log"
  "$1" "--v=$2" "--endpoint=$3" "--proxy-endpoint=$4" >>"$log" 2>&1 </dev/null &
  pid=$!
  from=+1
fi
echo "dra-e2e-proxy-started $pid"
tail -n "$from" -f "$log" 2>/dev/null &
follower=$!
while kill -0 "$pid" 2>/dev/null; do
  echo "dra-e2e-proxy-alive"
  sleep 2
done
wait "$pid" 2>/dev/null
sleep 0.1
kill "$follower" 2>/dev/null
echo "proxy $pid ended"
"#;

/// Printed by the start script while its proxy runs, every [`HEARTBEAT`].
const ALIVE_MARKER: &str = "dra-e2e-proxy-alive";
/// How often the start script says that its proxy runs.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a start may stay silent after its first line before its exec stream counts as broken
/// (its script says something every [`HEARTBEAT`] once its proxy runs).
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first delay before a start whose exec failed is tried again (doubling up to
/// [`MAX_ATTACH_DELAY`]): the kubelet that refused it may be back in a moment.
const FIRST_ATTACH_DELAY: Duration = Duration::from_millis(250);
/// The longest delay before a failed start is tried again.
const MAX_ATTACH_DELAY: Duration = Duration::from_secs(2);

/// `$1` socket: stops its proxy, removes the socket, stops whatever follows the proxy's log and
/// removes the log.
const STOP_SCRIPT: &str = r#"
stop_matching "--endpoint=$1" && rm -f -- "$1" || exit 1
log=$(log_of "$1")
stop_matching "$log" && rm -f -- "$log"
"#;

/// What to run for one socket.
#[derive(Clone, Debug)]
pub struct ProxyProcessConfig {
    /// The proxy binary (default `/hostpathplugin`, its path in the image).
    pub binary: String,
    /// The Unix socket the kubelet connects to (`--endpoint`).
    pub socket: String,
    /// Where the tunnel connects (`--proxy-endpoint`), e.g. `tcp://:9001`.
    pub proxy_endpoint: String,
    /// `--v` (default 5: every connection is logged).
    pub verbosity: u32,
    /// First restart delay (default 1 s); doubles per restart.
    pub initial_backoff: Duration,
    /// Longest restart delay (default 30 s). A run that lasted longer resets the delay.
    pub max_backoff: Duration,
    /// A socket that must exist before the proxy starts (waited for up to 5 s per start): the
    /// registration proxy waits for the DRA socket, so the kubelet cannot learn of the plugin
    /// (and call it) before its DRA endpoint exists.
    pub after_socket: Option<String>,
}

impl ProxyProcessConfig {
    /// `/hostpathplugin --v=5 --endpoint=<socket> --proxy-endpoint=tcp://:<port>`.
    pub fn new(socket: impl Into<String>, port: u16) -> Self {
        ProxyProcessConfig {
            binary: "/hostpathplugin".into(),
            socket: socket.into(),
            proxy_endpoint: format!("tcp://:{port}"),
            verbosity: 5,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            after_socket: None,
        }
    }

    /// Sets [`ProxyProcessConfig::after_socket`].
    pub fn after_socket(mut self, socket: impl Into<String>) -> Self {
        self.after_socket = Some(socket.into());
        self
    }

    /// Sets [`ProxyProcessConfig::binary`].
    pub fn binary(mut self, binary: impl Into<String>) -> Self {
        self.binary = binary.into();
        self
    }

    /// Sets [`ProxyProcessConfig::proxy_endpoint`].
    pub fn proxy_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.proxy_endpoint = endpoint.into();
        self
    }

    fn script(&self, script: &str, args: &[&str]) -> Vec<String> {
        ["sh", "-c", &format!("{FUNCTIONS}{script}"), "sh"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect()
    }

    /// The command that (after stopping a stale instance for the same socket) becomes the proxy.
    pub fn start_command(&self) -> Vec<String> {
        let verbosity = self.verbosity.to_string();
        let after = self.after_socket.as_deref().unwrap_or_default();
        self.script(START_SCRIPT, &[&self.binary, &verbosity, &self.socket, &self.proxy_endpoint, after])
    }

    /// The command that stops every proxy for the socket and removes the socket file.
    pub fn stop_command(&self) -> Vec<String> {
        self.script(STOP_SCRIPT, &[&self.socket])
    }
}

/// What the run loop of a [`ProxyProcess`] is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    /// Keep the proxy running.
    Run,
    /// Leave it alone: a [`ProxyControl::hold`] stops it.
    Hold,
}

/// Keeps `hostpathplugin --endpoint=<socket> --proxy-endpoint=<endpoint>` running through a
/// [`Runner`] (restarted with backoff when it ends) until [`ProxyProcess::stop`], which kills it
/// and removes the socket. Closing an exec stream does not kill the remote process, so the
/// process is found and killed by its `--endpoint=<socket>` argument; a start adopts an instance
/// for the same socket that still runs (its exec stream broke). A start whose exec failed is
/// tried again within a few seconds. [`ProxyControl::restart`] kills it and starts it
/// again at once: a fresh listener, without the connections queued on the old one.
#[derive(Debug)]
pub struct ProxyProcess {
    control: ProxyControl,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// Restarts the process of a [`ProxyProcess`] from another task ([`ProxyProcess::control`]).
#[derive(Clone, Debug)]
pub struct ProxyControl {
    inner: Arc<ControlShared>,
}

#[derive(Debug)]
struct ControlShared {
    config: ProxyProcessConfig,
    runner: Arc<dyn Runner>,
    starts: watch::Receiver<u64>,
    control: watch::Sender<Control>,
    /// Whether the run loop has let go of the proxy (after a [`Control::Hold`]).
    idle: watch::Receiver<bool>,
}

impl ProxyProcess {
    /// Starts the process (the first run starts at once).
    pub fn start(runner: Arc<dyn Runner>, config: ProxyProcessConfig) -> ProxyProcess {
        let cancel = CancellationToken::new();
        let (starts_tx, starts) = watch::channel(0);
        let (control, control_rx) = watch::channel(Control::Run);
        let (idle_tx, idle) = watch::channel(false);
        let looped = RunLoop { runner: runner.clone(), config: config.clone(), cancel: cancel.clone() };
        let task = tokio::spawn(looped.run(starts_tx, control_rx, idle_tx));
        let control =
            ProxyControl { inner: Arc::new(ControlShared { config, runner, starts, control, idle }) };
        ProxyProcess { control, cancel, task: Some(task) }
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyProcessConfig {
        &self.control.inner.config
    }

    /// How often the process was started so far.
    pub fn starts(&self) -> u64 {
        self.control.starts()
    }

    /// Changes whenever the process was (re)started: a tunnel can dial right away then.
    pub fn started(&self) -> watch::Receiver<u64> {
        self.control.inner.starts.clone()
    }

    /// Waits until the process was started at least `n` times.
    pub async fn wait_starts(&self, n: u64, timeout: Duration) -> Result<(), PodExecError> {
        self.control.wait_starts(n, timeout).await
    }

    /// A handle that restarts the process from another task.
    pub fn control(&self) -> ProxyControl {
        self.control.clone()
    }

    /// Stops restarting, kills the process and removes its socket.
    pub async fn stop(mut self) -> Result<(), PodExecError> {
        self.cancel.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(START_GRACE + Duration::from_secs(1), &mut task).await.is_err()
        {
            task.abort();
        }
        let shared = &self.control.inner;
        shared.runner.checked(shared.config.stop_command()).await?;
        tracing::debug!(socket = %shared.config.socket, place = %shared.runner.place(), "proxy process stopped");
        Ok(())
    }
}

impl ProxyControl {
    /// How often the process was started so far.
    pub fn starts(&self) -> u64 {
        *self.inner.starts.borrow()
    }

    /// Waits until the process was started at least `n` times.
    pub async fn wait_starts(&self, n: u64, timeout: Duration) -> Result<(), PodExecError> {
        let shared = &self.inner;
        let mut rx = shared.starts.clone();
        let _waiting = crate::framework::waiting(format!("start #{n} of a proxied process"), Some(timeout));
        match tokio::time::timeout(timeout, rx.wait_for(|s| *s >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(PodExecError::Timeout {
                command: format!("start #{n} of {}", show_command(&shared.config.start_command()[4..])),
                place: shared.runner.place(),
                timeout,
            }),
        }
    }

    /// Kills the process and starts it again at once ([`ProxyControl::hold`], then
    /// [`ProxyControl::resume`]): a fresh listener, without the connections queued on the old
    /// one.
    pub async fn restart(&self, timeout: Duration) -> Result<(), PodExecError> {
        if let Err(e) = self.hold().await {
            self.release();
            return Err(e);
        }
        self.resume(timeout).await
    }

    /// Kills the process, removes its socket and keeps it stopped until
    /// [`ProxyControl::resume`] (or [`ProxyControl::release`]). A start in flight gets a few
    /// seconds to get far enough to be killed.
    pub async fn hold(&self) -> Result<(), PodExecError> {
        let shared = &self.inner;
        shared.control.send_replace(Control::Hold);
        let mut idle = shared.idle.clone();
        let _ = tokio::time::timeout(START_GRACE + Duration::from_secs(1), idle.wait_for(|idle| *idle)).await;
        shared.runner.checked(shared.config.stop_command()).await?;
        tracing::debug!(socket = %shared.config.socket, place = %shared.runner.place(), "proxy process held");
        Ok(())
    }

    /// Starts the process again after [`ProxyControl::hold`] and waits (at most `timeout`)
    /// until it started.
    pub async fn resume(&self, timeout: Duration) -> Result<(), PodExecError> {
        let before = self.starts();
        self.release();
        self.wait_starts(before + 1, timeout).await
    }

    /// Lets the process run again after [`ProxyControl::hold`], without waiting.
    pub fn release(&self) {
        self.inner.control.send_replace(Control::Run);
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
            tracing::warn!(
                socket = %self.control.inner.config.socket,
                place = %self.control.inner.runner.place(),
                "proxy process dropped without stop(); it may keep running there"
            );
        }
    }
}

/// How one start of the script ended.
enum Attempt {
    /// The exec ended (the proxy ended, or the script failed); `started`: after the start marker.
    Ended { started: bool, result: Result<super::ExitStatus, PodExecError> },
    /// The stream went silent after the start: broken, the proxy may still run.
    Silent(Duration),
    /// Told to stop, or to hold.
    Interrupted,
}

/// The task that keeps one proxy running.
struct RunLoop {
    runner: Arc<dyn Runner>,
    config: ProxyProcessConfig,
    cancel: CancellationToken,
}

impl RunLoop {
    async fn run(
        self,
        starts: watch::Sender<u64>,
        mut control: watch::Receiver<Control>,
        idle: watch::Sender<bool>,
    ) {
        let name = format!("proxy {}", self.config.socket);
        let mut backoff = self.config.initial_backoff;
        let mut attach_delay = FIRST_ATTACH_DELAY;
        loop {
            // Held: wait until told to run again.
            idle.send_replace(*control.borrow_and_update() == Control::Hold);
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                held = control.wait_for(|c| *c == Control::Run) => if held.is_err() { return },
            }
            idle.send_replace(false);
            let began = Instant::now();
            let delay = match self.attempt(&name, &starts, &mut control).await {
                Attempt::Interrupted if self.cancel.is_cancelled() => return,
                Attempt::Interrupted => continue,
                Attempt::Silent(quiet) => {
                    // The stream broke without ending (the node's kubelet restarted, say); the
                    // proxy may still run: the next start adopts it, at once.
                    tracing::info!(process = %name, silent_for = ?quiet, "proxy process's exec stream went silent; attaching again");
                    backoff = self.config.initial_backoff;
                    continue;
                }
                Attempt::Ended { started: false, result } => {
                    let error =
                        result.err().map(|e| e.to_string()).unwrap_or_else(|| "no start marker".into());
                    tracing::info!(process = %name, %error, retry_in = ?attach_delay, "proxy process did not start; trying again");
                    let delay = attach_delay;
                    attach_delay = (attach_delay * 2).min(MAX_ATTACH_DELAY);
                    delay
                }
                Attempt::Ended { started: true, result: Err(e) } => {
                    // The stream broke; the proxy may still run: adopt it at once.
                    tracing::info!(process = %name, error = %e, "proxy process's exec stream broke; attaching again");
                    attach_delay = FIRST_ATTACH_DELAY;
                    continue;
                }
                Attempt::Ended { started: true, result: Ok(status) } => {
                    let ran = began.elapsed();
                    tracing::info!(process = %name, %status, ?ran, retry_in = ?backoff, "proxy process ended; restarting it");
                    attach_delay = FIRST_ATTACH_DELAY;
                    if ran >= self.config.max_backoff {
                        backoff = self.config.initial_backoff;
                    }
                    let delay = backoff;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                    delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.cancel.cancelled() => return,
                _ = control.changed() => {}
            }
        }
    }

    /// One start of the script, followed until it ends, goes silent or is interrupted.
    async fn attempt(
        &self,
        name: &str,
        starts: &watch::Sender<u64>,
        control: &mut watch::Receiver<Control>,
    ) -> Attempt {
        let argv = self.config.start_command();
        let started = Arc::new(AtomicBool::new(false));
        // When the script last said something: its heartbeat proves that the stream still works.
        // Before its first line the stream is not judged (an exec may take long to attach on a
        // loaded node; a stream that breaks ends by itself).
        let heard: Arc<std::sync::Mutex<Option<Instant>>> = Arc::new(std::sync::Mutex::new(None));
        let on_line = {
            let (started, starts, heard) = (started.clone(), starts.clone(), heard.clone());
            move |line: &str| {
                *heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
                if line.starts_with(STARTED_MARKER) && !started.swap(true, Ordering::AcqRel) {
                    starts.send_modify(|n| *n += 1);
                }
                line != ALIVE_MARKER
            }
        };
        let silent = async {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                let last = *heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(last) = last
                    && last.elapsed() > HEARTBEAT_TIMEOUT
                {
                    return last.elapsed();
                }
            }
        };
        let running = self.runner.run_logged(argv, name, &on_line);
        tokio::pin!(running);
        let interrupted = async {
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = control.wait_for(|c| *c == Control::Hold) => {}
            }
        };
        tokio::select! {
            result = &mut running => Attempt::Ended { started: started.load(Ordering::Acquire), result },
            quiet = silent => Attempt::Silent(quiet),
            () = interrupted => {
                if !started.load(Ordering::Acquire) {
                    // Let a start in flight get far enough to be killed by the stop command.
                    let mut rx = starts.subscribe();
                    let before = *rx.borrow_and_update();
                    let _ = tokio::time::timeout(START_GRACE, async {
                        tokio::select! {
                            _ = &mut running => {}
                            _ = rx.wait_for(|n| *n > before) => {}
                        }
                    })
                    .await;
                }
                Attempt::Interrupted
            }
        }
    }
}
