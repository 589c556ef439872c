//! The process that holds a run's Lease, written into the Lease ([`HOLDER_ANNOTATION`]) so that a
//! run on the same machine can tell at once that the holder died (SIGKILLed, say) instead of
//! waiting up to [`LEASE_DURATION`](crate::LEASE_DURATION) for its Lease to expire: the machine's
//! boot id, the PID namespace, the pid and the process's start time (so that a reused pid is not
//! taken for the holder). A holder on another machine, another boot or in another PID namespace
//! is never judged: only its Lease says whether it lives.

use std::ffi::OsStr;

use procfs::process::Process;

/// Annotation on a run's Lease: the [`Holder`] that renews it.
pub const HOLDER_ANNOTATION: &str = "dra-e2e.k8s.io/holder";

/// A process, named so that another process on the same machine can tell whether it still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `/proc/sys/kernel/random/boot_id`: the machine and its boot.
    boot_id: String,
    /// The PID namespace's inode and device (pids mean something only inside it).
    pid_namespace: (u64, u64),
    /// The pid, in that namespace.
    pid: i32,
    /// The process's start time (clock ticks after boot, `/proc/<pid>/stat`).
    start_ticks: u64,
}

impl Holder {
    /// This process; `None` where /proc cannot tell (the Lease then carries no holder).
    pub fn current() -> Option<Self> {
        let me = Process::myself().ok()?;
        let namespace =
            me.namespaces().ok()?.0.get(OsStr::new("pid")).map(|ns| (ns.identifier, ns.device_id))?;
        Some(Holder {
            boot_id: procfs::sys::kernel::random::boot_id().ok()?.trim().to_owned(),
            pid_namespace: namespace,
            pid: me.pid(),
            start_ticks: me.stat().ok()?.starttime,
        })
    }

    /// The annotation's value: `boot=<id> pidns=<inode>:<dev> pid=<pid> start=<ticks>`.
    pub fn annotation(&self) -> String {
        let (inode, dev) = self.pid_namespace;
        format!("boot={} pidns={inode}:{dev} pid={} start={}", self.boot_id, self.pid, self.start_ticks)
    }

    /// Reads [`Holder::annotation`]'s format; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_whitespace().map(|f| f.split_once('='));
        let mut next = |key: &str| match fields.next() {
            Some(Some((k, v))) if k == key => Some(v),
            _ => None,
        };
        let boot_id = next("boot")?.to_owned();
        let (inode, dev) = next("pidns")?.split_once(':')?;
        let pid_namespace = (inode.parse().ok()?, dev.parse().ok()?);
        let pid = next("pid")?.parse().ok()?;
        let start_ticks = next("start")?.parse().ok()?;
        Some(Holder { boot_id, pid_namespace, pid, start_ticks })
    }

    /// Why this holder is known to be dead, seen from `here` (the process asking): only when both
    /// are in the same boot of the same machine and the same PID namespace, and its pid runs no
    /// process or one that started at another time (`start_of(pid)` gives the start time of a
    /// pid of this namespace, `None` when none runs).
    pub fn dead_reason(&self, here: &Holder, start_of: impl Fn(i32) -> Option<u64>) -> Option<String> {
        if self.boot_id != here.boot_id || self.pid_namespace != here.pid_namespace {
            return None;
        }
        match start_of(self.pid) {
            None => Some(format!("its process (pid {}) on this machine is gone", self.pid)),
            Some(start) if start != self.start_ticks => Some(format!(
                "its process (pid {}) on this machine is gone; the pid is another process's now",
                self.pid
            )),
            Some(_) => None,
        }
    }
}

/// The start time of a pid of this process's PID namespace, from /proc; `None` when none runs.
pub fn start_of(pid: i32) -> Option<u64> {
    Process::new(pid).ok()?.stat().ok().map(|stat| stat.starttime)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    fn holder(boot: &str, ns: u64, pid: i32, start: u64) -> Holder {
        Holder { boot_id: boot.into(), pid_namespace: (ns, 4), pid, start_ticks: start }
    }

    #[test]
    fn the_annotation_reads_back() {
        let me = Holder::current().expect("this process, from /proc");
        assert_eq!(Holder::parse(&me.annotation()), Some(me.clone()));
        assert_eq!(Holder::parse("pid 12 on host h"), None);
        assert_eq!(Holder::parse("boot=b pidns=1 pid=2 start=3"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_gone_pid_is_dead() {
        let me = Holder::current().unwrap();
        assert_eq!(me.dead_reason(&me, start_of), None);
        let gone = Holder { pid: i32::MAX, ..me.clone() };
        let why = gone.dead_reason(&me, start_of).unwrap();
        assert!(why.contains(&format!("pid {}", i32::MAX)), "{why}");
        let reused = Holder { start_ticks: me.start_ticks + 1, ..me.clone() };
        assert!(reused.dead_reason(&me, start_of).unwrap().contains("another process's"));
    }

    #[test]
    fn a_holder_elsewhere_is_never_judged() {
        let here = holder("boot-a", 1, 10, 100);
        let nothing_runs = |_| None;
        assert_eq!(
            holder("boot-b", 1, 20, 5).dead_reason(&here, nothing_runs),
            None,
            "another machine or boot"
        );
        assert_eq!(
            holder("boot-a", 2, 20, 5).dead_reason(&here, nothing_runs),
            None,
            "another PID namespace"
        );
        assert!(holder("boot-a", 1, 20, 5).dead_reason(&here, nothing_runs).is_some());
        assert_eq!(holder("boot-a", 1, 20, 5).dead_reason(&here, |_| Some(5)), None, "still runs");
    }
}
