//! How the `dra-e2e` processes that xtask runs ([`run_runner`](super::run_runner)) learn of the
//! interrupts xtask receives.
//!
//! Each dra-e2e runs in a process group of its own, so a terminal's Ctrl-C reaches xtask only,
//! and xtask passes every SIGINT it receives while a dra-e2e runs on to it, once ([`pass_on`]):
//! dra-e2e's first SIGINT cancels its run and cleans up, the second exits at once. A SIGINT sent
//! to xtask alone (`kill -INT`, a CI runner, a parent script) so reaches dra-e2e as Ctrl-C does;
//! with the shared process group it never did, and dra-e2e ran its whole selection while xtask
//! said it waited for the clean-up.
//!
//! SIGTERM has one policy for the whole process ([`pass_on_sigterm`]), since tokio's listener
//! for a signal, once installed, lasts as long as the process: from the first SIGTERM on no
//! dra-e2e starts any more, every SIGTERM goes on to the dra-e2e processes running (dra-e2e's
//! first cancels and cleans up, a second exits at once), and xtask exits 143 (128 + SIGTERM) once
//! none runs, at once when none did.

use std::{
    os::unix::process::ExitStatusExt as _,
    process::ExitStatus,
    sync::{LazyLock, Once},
};

use anyhow::{Result, bail};
use rustix::process::{Pid, Signal, kill_process};
use tokio::{
    process::{Child, Command},
    signal::unix::{self, SignalKind},
    sync::watch,
};

/// The exit code after SIGTERM: 128 + its number, as the default action's.
pub(crate) const TERMINATED: i32 = 143;

/// The dra-e2e processes running now, and whether SIGTERM came.
#[derive(Debug, Default)]
pub(super) struct Runners {
    pids: Vec<Pid>,
    terminated: bool,
}

/// A set of running dra-e2e processes: the process's ([`RUNNERS`]), or a test's own.
pub(super) type RunnerSet = watch::Sender<Runners>;

/// The dra-e2e processes this process runs.
pub(super) static RUNNERS: LazyLock<RunnerSet> = LazyLock::new(|| watch::Sender::new(Runners::default()));

/// A dra-e2e process in its [`RunnerSet`] until dropped: after the process was reaped, or when
/// the future that waited for it is dropped.
pub(super) struct Registered<'a> {
    pid: Pid,
    set: &'a RunnerSet,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let pid = self.pid;
        self.set.send_modify(|runners| runners.pids.retain(|p| *p != pid));
    }
}

/// Starts `command` in a process group of its own and adds it to `set`; fails once SIGTERM came
/// (xtask is ending: no new run starts). One step, so that a SIGTERM finds every dra-e2e started.
pub(super) fn spawn<'a>(command: &mut Command, set: &'a RunnerSet) -> Result<(Child, Registered<'a>)> {
    command.process_group(0);
    let mut spawned = None;
    set.send_if_modified(|runners| {
        if runners.terminated {
            return false;
        }
        let child = command.spawn().map_err(anyhow::Error::from);
        let pid = child.as_ref().ok().and_then(pid_of);
        runners.pids.extend(pid);
        spawned = Some(child.map(|child| (child, pid)));
        pid.is_some()
    });
    match spawned {
        None => bail!("xtask was terminated (SIGTERM): no new dra-e2e run starts"),
        Some(Err(e)) => Err(e),
        Some(Ok((child, Some(pid)))) => Ok((child, Registered { pid, set })),
        Some(Ok((_, None))) => bail!("dra-e2e started without a process id"),
    }
}

fn pid_of(child: &Child) -> Option<Pid> {
    child.id().and_then(|id| i32::try_from(id).ok()).and_then(Pid::from_raw)
}

/// Passes a SIGINT that xtask received on to `child`, unless it has been reaped.
pub(super) fn pass_on(child: &Child) {
    let Some(pid) = pid_of(child) else { return };
    match kill_process(pid, Signal::INT) {
        Ok(()) => eprintln!(
            "interrupted (SIGINT): passed on to dra-e2e, waiting for it to clean up (Ctrl-C again stops it at once)"
        ),
        Err(e) => eprintln!("warning: cannot pass SIGINT on to dra-e2e: {e}"),
    }
}

/// dra-e2e's exit code; 128 + the signal's number for one that a signal ended, as the shell's
/// `$?` (130 after SIGINT: interrupted).
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(1)
}

/// Installs the process's SIGTERM policy (see the module's comment), once; the commands that run
/// dra-e2e call it before they start anything, the others keep SIGTERM's default (and the hidden
/// `netns-forward` its own handler, which a second listener would race).
pub(crate) fn pass_on_sigterm() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| match unix::signal(SignalKind::terminate()) {
        Ok(sigterm) => {
            tokio::spawn(async move { std::process::exit(terminations(sigterm, &RUNNERS).await) });
        }
        Err(e) => {
            eprintln!("warning: cannot listen for SIGTERM ({e}); it would leave a running dra-e2e alone")
        }
    });
}

/// From the first SIGTERM on: no dra-e2e of `set` starts any more, every SIGTERM goes on to those
/// running; returns [`TERMINATED`] once none runs.
pub(super) async fn terminations(mut sigterm: unix::Signal, set: &RunnerSet) -> i32 {
    let mut running = set.subscribe();
    if sigterm.recv().await.is_none() {
        return std::future::pending().await;
    }
    loop {
        let mut pids = Vec::new();
        set.send_modify(|runners| {
            runners.terminated = true;
            pids.clone_from(&runners.pids);
        });
        if pids.is_empty() {
            return TERMINATED;
        }
        eprintln!("terminated (SIGTERM): passed on to dra-e2e, waiting for it to clean up");
        for pid in pids {
            if let Err(e) = kill_process(pid, Signal::TERM) {
                eprintln!("warning: cannot pass SIGTERM on to dra-e2e ({pid:?}): {e}");
            }
        }
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = running.wait_for(|runners| runners.pids.is_empty()) => return TERMINATED,
        }
    }
}
