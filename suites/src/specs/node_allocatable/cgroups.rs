//! What the kubelet wrote into the cgroups and `oom_score_adj` of a pod and its containers, read
//! through exec, and what upstream's cgroup helpers (test/e2e/common/node/framework/cgroups)
//! expect there: CFS quota from the CPU limit, the memory limit in bytes, a positive CPU weight,
//! and the kubelet's OOM score formula.

use std::time::Duration;

use harness::{
    builder::exec,
    wait::{self, Attempt},
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

/// Where the first container mounts the node's `/sys/fs/cgroup` (upstream's `cgroupMountPath`).
pub const HOST_CGROUP_MOUNT: &str = "/sysfscgroup";
/// The volume of that mount.
pub const HOST_CGROUP_VOLUME: &str = "sysfscgroup";
/// How long a cgroup value may take to settle (upstream: `framework.PollShortTimeout`).
const SETTLE: Duration = Duration::from_secs(60);
/// How often it is read meanwhile.
const POLL: Duration = Duration::from_secs(2);
/// The CFS period the kubelet uses (`cm.QuotaPeriod`, µs).
const QUOTA_PERIOD: i128 = 100_000;
/// The smallest quota the kubelet writes (`cm.MinQuotaPeriod`, µs).
const MIN_QUOTA: i128 = 1_000;

/// A quantity (`100m`, `1Gi`, `2500Mi`, `4`, `211812352`) in thousandths of its unit: milli-CPU
/// for CPU, milli-bytes for memory.
pub fn milli(quantity: &str) -> anyhow::Result<i128> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: i128 = match suffix {
        "m" => 1,
        "" => 1_000,
        "k" => 1_000_000,
        "M" => 1_000_000_000,
        "G" => 1_000_000_000_000,
        "T" => 1_000_000_000_000_000,
        "Ki" => 1_000 << 10,
        "Mi" => 1_000 << 20,
        "Gi" => 1_000 << 30,
        "Ti" => 1_000 << 40,
        _ => anyhow::bail!("quantity {quantity:?}: unknown suffix {suffix:?}"),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let bad = || anyhow::anyhow!("quantity {quantity:?} is not a number");
    let whole: i128 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| bad())? };
    let mut value = whole * factor;
    let mut scale = factor;
    for digit in fraction.chars() {
        scale /= 10;
        value += i128::from(digit.to_digit(10).ok_or_else(bad)?) * scale;
    }
    if number.is_empty() { Err(bad()) } else { Ok(value) }
}

/// Milli-CPU of an optional quantity (`""` is 0).
pub fn milli_cpu(quantity: &str) -> anyhow::Result<i128> {
    if quantity.is_empty() { Ok(0) } else { milli(quantity) }
}

/// Bytes of an optional quantity (`""` is 0).
pub fn bytes(quantity: &str) -> anyhow::Result<i128> {
    Ok(milli_cpu(quantity)? / 1_000)
}

/// The CFS quota the kubelet writes for a CPU limit (`cm.MilliCPUToQuota`; `-1` without limit).
fn quota(milli_cpu: i128) -> i128 {
    if milli_cpu == 0 {
        return -1;
    }
    (milli_cpu * QUOTA_PERIOD / 1_000).max(MIN_QUOTA)
}

/// The values a cgroup may hold for a CPU limit: the quota, and for limits that are not a
/// multiple of 10m also the one of the limit rounded up to 10m (upstream's
/// `getCPULimitCgroupExpectations`), in cgroup v1 (`cpu.cfs_quota_us`) or v2 (`cpu.max`) form.
pub fn cpu_limit_values(milli_cpu: i128, v2: bool) -> Vec<String> {
    let render = |q: i128| match (v2, q) {
        (false, q) => q.to_string(),
        (true, -1) => format!("max {QUOTA_PERIOD}"),
        (true, q) => format!("{q} {QUOTA_PERIOD}"),
    };
    let mut values = vec![render(quota(milli_cpu))];
    if milli_cpu != 0 && milli_cpu % 10 != 0 {
        values.push(render(quota((milli_cpu / 10 + 1) * 10)));
    }
    values
}

/// The kubelet's OOM score adjustment of a Burstable container whose memory request (with its
/// share of the claims' node-allocatable memory) is `request_mi` MiB
/// (`GetContainerOOMScoreAdjust`, as upstream's `computeExpectedOomScoreAdj`).
pub fn burstable_oom_score(request_mi: i128, node_memory_bytes: i128) -> i128 {
    if node_memory_bytes <= 0 {
        return 2;
    }
    (1_000 - 1_000 * request_mi * 1024 * 1024 / node_memory_bytes).max(2)
}

/// The cgroup files of a hierarchy: v1 (one mount per controller) or v2 (unified).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Unified hierarchy.
    pub v2: bool,
}

impl Layout {
    /// The CPU weight file, relative to a cgroup directory (v1: under the `cpu` controller).
    pub fn cpu_weight(self) -> &'static str {
        if self.v2 { "cpu.weight" } else { "cpu/cpu.shares" }
    }

    /// The CPU limit file.
    pub fn cpu_limit(self) -> &'static str {
        if self.v2 { "cpu.max" } else { "cpu/cpu.cfs_quota_us" }
    }

    /// The memory limit file.
    pub fn memory_limit(self) -> &'static str {
        if self.v2 { "memory.max" } else { "memory/memory.limit_in_bytes" }
    }

    /// The hugetlb limit file of page size `size` (`2MB`).
    pub fn hugetlb_limit(self, size: &str) -> String {
        if self.v2 { format!("hugetlb.{size}.max") } else { format!("hugetlb/hugetlb.{size}.limit_in_bytes") }
    }

    /// The memory limit as the file shows it; `None` for "no limit", which upstream does not check.
    pub fn memory_value(self, bytes: i128) -> Option<String> {
        (bytes != 0).then(|| bytes.to_string())
    }
}

/// Reads and checks cgroup files of one pod through exec in its containers.
pub struct Reader<'a> {
    /// The admin client.
    pub client: &'a kube::Client,
    /// The running pod.
    pub pod: &'a Pod,
}

impl Reader<'_> {
    fn namespace(&self) -> String {
        self.pod.namespace().unwrap_or_default()
    }

    /// The pod's first container (the one with the node's cgroup mount).
    pub fn first_container(&self) -> String {
        self.pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).unwrap_or_default()
    }

    /// Runs a shell command in `container`; its stdout, or why it failed.
    pub async fn sh(&self, container: &str, command: &str) -> Result<String, String> {
        let out = exec(
            self.client,
            &self.namespace(),
            &self.pod.name_any(),
            container,
            &["/bin/sh", "-c", command],
        )
        .await
        .map_err(|e| e.to_string())?;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(format!("`{command}` in container {container} failed: {} {}", out.message, out.stderr.trim()))
        }
    }

    /// Whether the containers see a unified (v2) hierarchy at `/sys/fs/cgroup`.
    pub async fn layout(&self) -> Result<Layout, String> {
        let out = self
            .sh(
                &self.first_container(),
                "if [ -e /sys/fs/cgroup/cgroup.controllers ]; then echo v2; else echo v1; fi",
            )
            .await?;
        Ok(Layout { v2: out.trim() == "v2" })
    }

    /// The pod's cgroup directory in the hierarchy of `controller` (v1) under the node's
    /// cgroup mount: the directory whose name holds the pod UID (upstream's `getPodCgroupPath`).
    pub async fn pod_dir(&self, layout: Layout, controller: &str) -> Result<String, String> {
        let uid = self.pod.uid().unwrap_or_default();
        let root = if layout.v2 {
            HOST_CGROUP_MOUNT.to_owned()
        } else {
            format!("{HOST_CGROUP_MOUNT}/{controller}")
        };
        // Other pods' cgroups come and go while find walks the tree (specs run side by side), and
        // find then exits 1 on the vanished directory: what counts is whether this pod's is found.
        let command =
            format!("find {root} -name '*{}*' -o -name '*{uid}*' 2>/dev/null; true", uid.replace('-', "_"));
        let out = self.sh(&self.first_container(), &command).await?;
        let dir = out.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_owned);
        dir.ok_or_else(|| format!("no cgroup directory of pod UID {uid} under {root}"))
    }

    /// Reads `path` in `container` until its first line is one of `expected` (for at most a
    /// minute, as upstream's `VerifyCgroupValue`).
    pub async fn expect_value(&self, container: &str, path: &str, expected: &[String]) -> Result<(), String> {
        let what = format!(
            "{path} in container {container} of pod {} to be one of {expected:?}",
            self.pod.name_any()
        );
        let command = format!("head -n 1 {path}");
        wait::poll(what, SETTLE, POLL, || async {
            match self.sh(container, &command).await {
                Ok(out) if expected.iter().any(|e| e == out.trim_end_matches('\n')) => Attempt::Done(()),
                Ok(out) => Attempt::Retry(format!("it holds {:?}", out.trim_end_matches('\n'))),
                Err(e) => Attempt::Retry(e),
            }
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// Reads `path` in `container` until it holds an integer; with `positive`, a positive one
    /// (upstream's `retrieveCgroupValueInt`).
    pub async fn read_int(&self, container: &str, path: &str, positive: bool) -> Result<i128, String> {
        let what = format!(
            "{path} in container {container} of pod {} to hold a positive integer",
            self.pod.name_any()
        );
        let command = format!("head -n 1 {path}");
        wait::poll(what, SETTLE, POLL, || async {
            match self.sh(container, &command).await {
                Ok(out) => match out.trim().parse::<i128>() {
                    Ok(v) if positive && v <= 0 => Attempt::Fail(format!("it holds {v}, expected > 0")),
                    Ok(v) => Attempt::Done(v),
                    Err(_) => Attempt::Fail(format!("it holds {:?}, not an integer", out.trim())),
                },
                Err(e) => Attempt::Retry(e),
            }
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// The `oom_score_adj` of the container's first process.
    pub async fn oom_score_adj(&self, container: &str) -> Result<i128, String> {
        let out = self.sh(container, "cat /proc/1/oom_score_adj").await?;
        out.trim().parse().map_err(|_| format!("oom_score_adj of container {container} is {:?}", out.trim()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn parses_quantities() {
        for (q, want) in [
            ("100m", 100),
            ("1", 1_000),
            ("2500m", 2_500),
            ("1Gi", 1_073_741_824_000),
            ("5096Mi", 5_096 * 1_048_576 * 1_000),
            ("211812352", 211_812_352_000),
            ("1.5", 1_500),
            ("0.1", 100),
        ] {
            assert_eq!(milli(q).unwrap(), want, "{q}");
        }
    }

    #[test]
    fn rejects_bad_quantities() {
        for q in ["", "1Xi", "Gi", "1.x"] {
            assert!(milli(q).is_err(), "{q}");
        }
    }

    #[test]
    fn quota_values_follow_the_kubelet() {
        assert_eq!(cpu_limit_values(0, false), vec!["-1"]);
        assert_eq!(cpu_limit_values(0, true), vec!["max 100000"]);
        assert_eq!(cpu_limit_values(2_200, false), vec!["220000"]);
        assert_eq!(cpu_limit_values(5, false), vec!["1000", "1000"]);
        assert_eq!(cpu_limit_values(1_505, true), vec!["150500 100000", "151000 100000"]);
    }

    #[test]
    fn oom_scores_match_upstreams_comments() {
        let node = 24_684_092 * 1024;
        assert_eq!(burstable_oom_score(1524, node), 1000 - 1000 * 1524 * 1024 * 1024 / node);
        assert_eq!(burstable_oom_score(1 << 30, node), 2);
    }
}
