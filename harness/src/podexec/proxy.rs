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
/// processes that have exactly `ARG` as one of their arguments (`/proc/*/cmdline`);
/// `stop_matching ARG` sends them SIGTERM, SIGKILL after 5 s, and waits until they are gone
/// (zombies have an empty cmdline, so they count as gone), looking every 20 ms: a proxy ends
/// within milliseconds of its SIGTERM, and every stop of a driver's plugins waits for this.
const FUNCTIONS: &str = r#"
matching() {
  for d in /proc/[0-9]*; do
    if tr '\000' '\n' < "$d/cmdline" 2>/dev/null | grep -qxF -e "$1"; then echo "${d#/proc/}"; fi
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
/// a socket to wait for
/// first (empty: none), looked for every 20 ms, at most 250 times (about 5 s): shorter than
/// [`START_GRACE`], so a stop during the wait still sees the start marker and kills the proxy.
/// The script's own arguments never contain `--endpoint=<socket>` as one word, so it cannot
/// match itself.
///
/// The proxy runs as the script's child, not in its place: the container runtime kills an exec'd
/// process when its exec stream breaks, and every exec stream of a node breaks when its kubelet
/// restarts. The child survives that (with SIGPIPE ignored, so that its next log line to the
/// broken stream does not kill it either: a Go program then gets EPIPE), so the restarted kubelet
/// finds the plugin's sockets served. The script watches it and prints
/// [`ALIVE_MARKER`] every [`HEARTBEAT`]; a stream that stays silent longer than
/// [`HEARTBEAT_TIMEOUT`] is dead, and the next start adopts the proxy that still runs instead of
/// starting another (its log lines then no longer reach this process).
const START_SCRIPT: &str = r#"
pid=$(matching "--endpoint=$3" | head -n 1)
if [ -z "$pid" ]; then
  if [ -n "$5" ]; then
    i=0
    while [ ! -S "$5" ] && [ "$i" -lt 250 ]; do i=$((i+1)); sleep 0.02; done
    [ -S "$5" ] || echo "$5 did not appear within 5s; starting anyway" >&2
  fi
  mkdir -p "${3%/*}"
  (trap '' PIPE; exec "$1" "--v=$2" "--endpoint=$3" "--proxy-endpoint=$4") &
  pid=$!
fi
echo "dra-e2e-proxy-started $pid"
while kill -0 "$pid" 2>/dev/null; do
  echo "dra-e2e-proxy-alive"
  sleep 2
done
wait "$pid" 2>/dev/null
echo "proxy $pid ended"
"#;

/// Printed by the start script while its proxy runs, every [`HEARTBEAT`].
const ALIVE_MARKER: &str = "dra-e2e-proxy-alive";
/// How often the start script says that its proxy runs.
const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a start may stay silent before its exec stream counts as broken.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// `$1` socket.
const STOP_SCRIPT: &str = r#"
stop_matching "--endpoint=$1" && rm -f -- "$1"
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

/// Keeps `hostpathplugin --endpoint=<socket> --proxy-endpoint=<endpoint>` running through a
/// [`Runner`] (restarted with backoff when it ends) until [`ProxyProcess::stop`], which kills it
/// and removes the socket. Closing an exec stream does not kill the remote process, so the
/// process is found and killed by its `--endpoint=<socket>` argument; a start kills a stale
/// instance for the same socket first.
#[derive(Debug)]
pub struct ProxyProcess {
    config: ProxyProcessConfig,
    runner: Arc<dyn Runner>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    starts: watch::Receiver<u64>,
}

impl ProxyProcess {
    /// Starts the process (the first run starts at once).
    pub fn start(runner: Arc<dyn Runner>, config: ProxyProcessConfig) -> ProxyProcess {
        let cancel = CancellationToken::new();
        let (starts_tx, starts) = watch::channel(0);
        let task = tokio::spawn(run(runner.clone(), config.clone(), cancel.clone(), starts_tx));
        ProxyProcess { config, runner, cancel, task: Some(task), starts }
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyProcessConfig {
        &self.config
    }

    /// How often the process was started so far.
    pub fn starts(&self) -> u64 {
        *self.starts.borrow()
    }

    /// Changes whenever the process was (re)started: a tunnel can dial right away then.
    pub fn started(&self) -> watch::Receiver<u64> {
        self.starts.clone()
    }

    /// Waits until the process was started at least `n` times.
    pub async fn wait_starts(&self, n: u64, timeout: Duration) -> Result<(), PodExecError> {
        let mut rx = self.starts.clone();
        let _waiting = crate::framework::waiting(format!("start #{n} of a proxied process"), Some(timeout));
        match tokio::time::timeout(timeout, rx.wait_for(|s| *s >= n)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(PodExecError::Timeout {
                command: format!("start #{n} of {}", show_command(&self.config.start_command()[4..])),
                place: self.runner.place(),
                timeout,
            }),
        }
    }

    /// Stops restarting, kills the process and removes its socket.
    pub async fn stop(mut self) -> Result<(), PodExecError> {
        self.cancel.cancel();
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(START_GRACE + Duration::from_secs(1), &mut task).await.is_err()
        {
            task.abort();
        }
        self.runner.checked(self.config.stop_command()).await?;
        tracing::debug!(socket = %self.config.socket, place = %self.runner.place(), "proxy process stopped");
        Ok(())
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
            tracing::warn!(
                socket = %self.config.socket,
                place = %self.runner.place(),
                "proxy process dropped without stop(); it may keep running there"
            );
        }
    }
}

async fn run(
    runner: Arc<dyn Runner>,
    config: ProxyProcessConfig,
    cancel: CancellationToken,
    starts: watch::Sender<u64>,
) {
    let argv = config.start_command();
    let name = format!("proxy {}", config.socket);
    let mut backoff = config.initial_backoff;
    loop {
        let began = Instant::now();
        let started = Arc::new(AtomicBool::new(false));
        // When the script last said something: its heartbeat proves that the stream still works.
        let heard = Arc::new(std::sync::Mutex::new(Instant::now()));
        let on_line = {
            let started = started.clone();
            let starts = starts.clone();
            let heard = heard.clone();
            move |line: &str| {
                *heard.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
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
                if started.load(Ordering::Acquire) && last.elapsed() > HEARTBEAT_TIMEOUT {
                    return last.elapsed();
                }
            }
        };
        let running = runner.run_logged(argv.clone(), &name, &on_line);
        tokio::pin!(running);
        let ended = tokio::select! {
            ended = &mut running => ended,
            quiet = silent => {
                // The stream broke without ending (the node's kubelet restarted, say); the proxy
                // may still run: the next start adopts it, at once.
                tracing::info!(process = %name, silent_for = ?quiet, "proxy process's exec stream went silent; attaching again");
                backoff = config.initial_backoff;
                continue;
            }
            _ = cancel.cancelled() => {
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
                return;
            }
        };
        let ran = began.elapsed();
        match ended {
            Ok(status) => {
                tracing::info!(process = %name, %status, ?ran, retry_in = ?backoff, "proxy process ended; restarting it")
            }
            Err(e) => {
                tracing::info!(process = %name, error = %e, ?ran, retry_in = ?backoff, "proxy process failed; restarting it")
            }
        }
        if ran >= config.max_backoff {
            backoff = config.initial_backoff;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = cancel.cancelled() => return,
        }
        backoff = (backoff * 2).min(config.max_backoff);
    }
}
