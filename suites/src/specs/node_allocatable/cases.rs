//! Upstream's tables (dra_node_allocatable_resources.go): the devices each spec publishes, the
//! pod it runs, and what the kubelet must make of them. Quantities are upstream's strings;
//! `""` means "not set".

use k8s_openapi::api::resource::v1::Device;
use serde_json::{Value, json};

/// CPU and memory requests and limits (upstream's `cgroups.ContainerResources`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Res {
    /// CPU request.
    pub cpu_req: &'static str,
    /// CPU limit.
    pub cpu_lim: &'static str,
    /// Memory request.
    pub mem_req: &'static str,
    /// Memory limit.
    pub mem_lim: &'static str,
}

/// [`Res`] from its four fields.
const fn res(
    cpu_req: &'static str,
    cpu_lim: &'static str,
    mem_req: &'static str,
    mem_lim: &'static str,
) -> Res {
    Res { cpu_req, cpu_lim, mem_req, mem_lim }
}

/// Expected cgroup values: CPU request (weight), CPU limit (quota), memory limit.
const fn cg(cpu_req: &'static str, cpu_lim: &'static str, mem_lim: &'static str) -> Res {
    Res { cpu_req, cpu_lim, mem_req: "", mem_lim }
}

impl Res {
    /// As a Kubernetes `ResourceRequirements` (upstream's `ResourceRequirements()`): maps only
    /// for what is set.
    pub fn requirements(&self) -> Value {
        let list = |cpu: &str, mem: &str| {
            let mut m = serde_json::Map::new();
            if !cpu.is_empty() {
                m.insert("cpu".into(), json!(cpu));
            }
            if !mem.is_empty() {
                m.insert("memory".into(), json!(mem));
            }
            m
        };
        let mut out = serde_json::Map::new();
        let limits = list(self.cpu_lim, self.mem_lim);
        let requests = list(self.cpu_req, self.mem_req);
        if !limits.is_empty() {
            out.insert("limits".into(), Value::Object(limits));
        }
        if !requests.is_empty() {
            out.insert("requests".into(), Value::Object(requests));
        }
        Value::Object(out)
    }
}

/// The claims: upstream's pod claim names, each backed by one external claim.
pub const CPU_MEM: &str = "cpu-mem-claim";
/// The second claim.
pub const CPU_MEM_2: &str = "cpu-mem-claim-2";
/// The hugepages claim.
pub const HUGEPAGES: &str = "hugepages-claim";

/// One container of the test pod.
#[derive(Clone, Debug)]
pub struct ContainerCase {
    /// Its name.
    pub name: &'static str,
    /// Its resources (`None`: no requests, no limits).
    pub resources: Option<Res>,
    /// The pod claims it uses.
    pub claims: &'static [&'static str],
    /// Its hugepages-2Mi request and limit (`""`: none).
    pub hugepages: &'static str,
}

const fn ctr(name: &'static str, resources: Option<Res>, claims: &'static [&'static str]) -> ContainerCase {
    ContainerCase { name, resources, claims, hugepages: "" }
}

/// Which devices a spec publishes.
#[derive(Clone, Copy, Debug)]
pub enum Devices {
    /// `overheadDevices`.
    Overhead,
    /// `directDevices`.
    Direct,
    /// `directDevices2`.
    Direct2,
    /// `combinedDevices`.
    Combined,
    /// `mappingAndOverheadDevice`.
    MappingAndOverhead,
    /// `hugepageDevices`.
    Hugepages,
}

fn overhead(per_pod: &str, per_container: &str) -> Value {
    json!({ "overhead": { "perPod": per_pod, "perContainer": per_container } })
}

fn mapping(multiplier: &str) -> Value {
    json!({ "mapping": { "deviceMultiplier": multiplier } })
}

fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut a), Value::Object(b)) => {
            a.extend(b);
            Value::Object(a)
        }
        (a, _) => a,
    }
}

impl Devices {
    /// The devices as the ResourceSlice carries them.
    pub fn devices(self) -> Result<Vec<Device>, serde_json::Error> {
        let dev =
            |name: &str, resources: Value| json!({ "name": name, "nodeAllocatableResources": resources });
        let overhead_cpu_mem =
            || json!({ "memory": overhead("100Mi", "100Mi"), "cpu": overhead("100m", "100m") });
        let direct = |mem: &str, cpu: &str| json!({ "memory": mapping(mem), "cpu": mapping(cpu) });
        let devices = match self {
            Devices::Overhead => json!([dev("device-01", overhead_cpu_mem())]),
            Devices::Direct => json!([dev("device-01", direct("1000Mi", "1"))]),
            Devices::Direct2 => json!([
                dev("device-01", direct("1000Mi", "100m")),
                dev("device-02", direct("2000Mi", "100m")),
            ]),
            Devices::Combined => json!([
                dev("device-direct-01", direct("1000Mi", "1")),
                dev("device-overhead-01", overhead_cpu_mem()),
            ]),
            Devices::MappingAndOverhead => json!([dev(
                "device-mapping-overhead-01",
                json!({
                    "memory": merge(mapping("1000Mi"), overhead("100Mi", "100Mi")),
                    "cpu": merge(mapping("1"), overhead("100m", "100m")),
                })
            )]),
            Devices::Hugepages => {
                json!([dev("device-hugepages-01", json!({ "hugepages-2Mi": overhead("100Mi", "50Mi") }))])
            }
        };
        serde_json::from_value(devices)
    }
}

/// One `verifies cgroup inflation and container OOM adjustment with ...` spec.
#[derive(Clone, Debug)]
pub struct CgroupCase {
    /// The end of the spec's name.
    pub name: &'static str,
    /// What the driver publishes.
    pub devices: Devices,
    /// Pod-level resources.
    pub pod_resources: Option<Res>,
    /// The containers.
    pub containers: Vec<ContainerCase>,
    /// Claims of the pod no container uses.
    pub unreferenced: &'static [&'static str],
    /// The pod cgroup.
    pub pod_cgroup: Res,
    /// Per container: its cgroup.
    pub container_cgroups: Vec<Res>,
    /// Per container: the memory request (MiB) its Burstable OOM score derives from.
    pub score_mem_request_mi: Vec<i128>,
    /// Hugepages: the pod's hugetlb limit and each container's, in bytes (`None`: no hugepages).
    pub hugepages: Option<(&'static str, Vec<&'static str>)>,
}

const R100M: Res = res("100m", "200m", "1Gi", "2Gi");
const R1: Res = res("1", "2", "1Gi", "2Gi");
const R2: Res = res("2", "4", "2Gi", "4Gi");
const R2500M: Res = res("2500m", "4", "2500Mi", "4Gi");
const REQ1: Res = res("1000m", "", "1Gi", "");
const GUARANTEED1: Res = res("1", "1", "1Gi", "1Gi");

fn two(resources: Option<Res>, claims: &'static [&'static str]) -> Vec<ContainerCase> {
    vec![ctr("c1", resources, claims), ctr("c2", resources, claims)]
}

/// Upstream's `doNodeAllocatableCgroupsTests` table, in its order.
pub fn cgroup_cases() -> Vec<CgroupCase> {
    let case = |name, devices, containers, pod_cgroup, container: Res, score: i128| CgroupCase {
        name,
        devices,
        pod_resources: None,
        containers,
        unreferenced: &[],
        pod_cgroup,
        container_cgroups: vec![container, container],
        score_mem_request_mi: vec![score, score],
        hugepages: None,
    };
    let both: &[&str] = &[CPU_MEM, CPU_MEM_2];
    let none = cg("", "", "");
    vec![
        case(
            "direct mappings",
            Devices::Direct,
            two(Some(R1), &[CPU_MEM]),
            cg("3000m", "5000m", "5096Mi"),
            cg("1000m", "3000m", "3048Mi"),
            1524,
        ),
        case(
            "overhead mappings",
            Devices::Overhead,
            two(Some(R1), &[CPU_MEM]),
            cg("2300m", "4300m", "4396Mi"),
            cg("1000m", "2200m", "2248Mi"),
            1174,
        ),
        case(
            "combined direct and overhead mappings",
            Devices::Combined,
            two(Some(R1), both),
            cg("3300m", "5300m", "5396Mi"),
            cg("1000m", "3200m", "3248Mi"),
            1674,
        ),
        case(
            "single device with both mapping and overhead",
            Devices::MappingAndOverhead,
            two(Some(R1), &[CPU_MEM]),
            cg("3300m", "5300m", "5396Mi"),
            cg("1000m", "3200m", "3248Mi"),
            1674,
        ),
        CgroupCase {
            unreferenced: &[CPU_MEM],
            ..case(
                "unreferenced overhead claim",
                Devices::Overhead,
                two(Some(R1), &[]),
                cg("2100m", "4100m", "4196Mi"),
                cg("1000m", "2", "2Gi"),
                1024,
            )
        },
        CgroupCase {
            pod_resources: Some(R2),
            ..case(
                "pod-level resources specified, container-level limits omitted",
                Devices::Direct,
                two(None, &[CPU_MEM]),
                cg("2000m", "4000m", "4096Mi"),
                cg("", "4", "4Gi"),
                1024,
            )
        },
        CgroupCase {
            pod_resources: Some(R2500M),
            ..case(
                "pod-level resources specified, container-level limits specified",
                Devices::Overhead,
                two(Some(R1), &[CPU_MEM]),
                cg("2500m", "4000m", "4096Mi"),
                cg("1000m", "2200m", "2248Mi"),
                1250,
            )
        },
        CgroupCase {
            containers: vec![
                ContainerCase { hugepages: "2Mi", ..ctr("c1", Some(R1), &[HUGEPAGES]) },
                ctr("c2", Some(R1), &[HUGEPAGES]),
            ],
            hugepages: Some(("211812352", vec!["159383552", "157286400"])),
            ..case(
                "hugepages overhead mapping",
                Devices::Hugepages,
                Vec::new(),
                cg("2000m", "4000m", "4096Mi"),
                cg("1000m", "2000m", "2Gi"),
                1024,
            )
        },
        case(
            "container-level requests and limits omitted (BestEffort)",
            Devices::Direct,
            two(None, &[CPU_MEM]),
            none,
            none,
            0,
        ),
        case(
            "container-level CPU/Memory limits omitted (Burstable)",
            Devices::Direct,
            two(Some(REQ1), &[CPU_MEM]),
            cg("3000m", "", ""),
            cg("1000m", "", ""),
            1524,
        ),
        CgroupCase {
            hugepages: Some(("209715200", vec!["157286400", "157286400"])),
            ..case(
                "hugepages overhead mapping with container limits omitted",
                Devices::Hugepages,
                two(None, &[HUGEPAGES]),
                none,
                none,
                0,
            )
        },
        case(
            "Guaranteed QoS pod with direct mapping",
            Devices::Direct,
            two(Some(GUARANTEED1), &[CPU_MEM]),
            cg("3000m", "3000m", "3048Mi"),
            cg("1000m", "2000m", "2024Mi"),
            0,
        ),
        CgroupCase {
            containers: vec![ctr("c1", Some(R100M), &[CPU_MEM]), ctr("c2", Some(R100M), &[CPU_MEM_2])],
            container_cgroups: vec![cg("100m", "300m", "3048Mi"), cg("100m", "300m", "4048Mi")],
            score_mem_request_mi: vec![2024, 3024],
            ..case(
                "direct mapping multiple claims",
                Devices::Direct2,
                Vec::new(),
                cg("400m", "600m", "7096Mi"),
                none,
                0,
            )
        },
    ]
}

/// One `verifies cgroup settings and pod status after resize with ...` spec (one container).
#[derive(Clone, Debug)]
pub struct ResizeCase {
    /// The end of the spec's name.
    pub name: &'static str,
    /// What the driver publishes.
    pub devices: Devices,
    /// Pod-level resources before and after.
    pub pod_resources: (Option<Res>, Option<Res>),
    /// The container's resources before and after (it uses [`CPU_MEM`]).
    pub container: (Option<Res>, Option<Res>),
    /// The pod cgroup after the resize.
    pub pod_cgroup: Res,
    /// The container cgroup after the resize.
    pub container_cgroup: Res,
    /// `status.allocatedResources` of the pod after the resize: CPU, memory.
    pub pod_allocated: (&'static str, &'static str),
}

/// Upstream's `doNodeAllocatableResizeTests` table, in its order.
pub fn resize_cases() -> Vec<ResizeCase> {
    let pod2 = Some(res("2", "4", "2Gi", "4Gi"));
    let c1 = Some(res("1", "2", "1Gi", "2Gi"));
    vec![
        ResizeCase {
            name: "direct mappings with resize",
            devices: Devices::Direct,
            pod_resources: (None, None),
            container: (
                Some(res("500m", "1000m", "500Mi", "1000Mi")),
                Some(res("500m", "1500m", "1000Mi", "2000Mi")),
            ),
            pod_cgroup: cg("1500m", "2500m", "3000Mi"),
            container_cgroup: cg("500m", "2500m", "3000Mi"),
            pod_allocated: ("1500m", "2000Mi"),
        },
        ResizeCase {
            name: "overhead mappings with resize",
            devices: Devices::Overhead,
            pod_resources: (None, None),
            container: (c1, Some(res("1500m", "2500m", "1500Mi", "3000Mi"))),
            pod_cgroup: cg("1700m", "2700m", "3200Mi"),
            container_cgroup: cg("1500m", "2700m", "3200Mi"),
            pod_allocated: ("1700m", "1700Mi"),
        },
        ResizeCase {
            name: "pod-level resources resize with container level request/limit omitted",
            devices: Devices::Direct,
            pod_resources: (pod2, Some(res("3", "5", "3Gi", "5Gi"))),
            container: (None, None),
            pod_cgroup: cg("3000m", "5000m", "5120Mi"),
            container_cgroup: cg("", "5", "5Gi"),
            pod_allocated: ("3", "3Gi"),
        },
        ResizeCase {
            name: "Pod level resize, container level request/limit present",
            devices: Devices::Direct,
            pod_resources: (pod2, Some(res("3", "6", "3Gi", "6Gi"))),
            container: (c1, c1),
            pod_cgroup: cg("3000m", "6000m", "6Gi"),
            container_cgroup: cg("1000m", "3000m", "3048Mi"),
            pod_allocated: ("3", "3Gi"),
        },
        ResizeCase {
            name: "pod level resources present, container level resize",
            devices: Devices::Direct,
            pod_resources: (pod2, pod2),
            container: (None, c1),
            pod_cgroup: cg("2000m", "4000m", "4Gi"),
            container_cgroup: cg("1000m", "3000m", "3048Mi"),
            pod_allocated: ("2", "2Gi"),
        },
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    #[test]
    fn every_device_set_deserializes() {
        for d in [
            Devices::Overhead,
            Devices::Direct,
            Devices::Direct2,
            Devices::Combined,
            Devices::MappingAndOverhead,
            Devices::Hugepages,
        ] {
            let devices = d.devices().unwrap();
            assert!(
                devices.iter().all(|d| d.node_allocatable_resources.as_ref().is_some_and(|r| !r.is_empty())),
                "{d:?}"
            );
        }
        let both = &Devices::MappingAndOverhead.devices().unwrap()[0];
        let cpu = &both.node_allocatable_resources.as_ref().unwrap()["cpu"];
        assert!(cpu.mapping.is_some() && cpu.overhead.is_some());
    }

    #[test]
    fn tables_have_one_expectation_per_container() {
        let cases = cgroup_cases();
        assert_eq!(cases.len(), 13);
        for c in &cases {
            assert_eq!(c.containers.len(), 2, "{}", c.name);
            assert_eq!(c.container_cgroups.len(), 2, "{}", c.name);
            assert_eq!(c.score_mem_request_mi.len(), 2, "{}", c.name);
        }
        assert_eq!(resize_cases().len(), 5);
    }

    #[test]
    fn requirements_hold_only_what_is_set() {
        assert_eq!(REQ1.requirements(), json!({ "requests": { "cpu": "1000m", "memory": "1Gi" } }));
        assert_eq!(cg("", "", "").requirements(), json!({}));
    }
}
