//! Tests of the registry: registration, labels, focus texts and validation.

use rstest::rstest;

use super::*;

fn sample() -> Registry {
    let mut reg = Registry::new();
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context("control plane", |r| {
            r.it("supports claim and class parameters", async |_| Ok(())).labels(["ConformanceCandidate"]);
            r.it("supports reusing resources", async |_| Ok(()));
        });
        r.context_with_labels("kubelet", ["Feature:DynamicResourceAllocation"], |r| {
            r.it("must retry NodePrepareResources", async |_| Ok(()));
            r.context("with rolling update", |r| {
                r.it("keeps slices", async |_| Ok(()))
                    .labels(["KubeletMinVersion:1.33", "Slow"])
                    .label("Serial")
                    .timeout(Duration::from_secs(600));
            });
        });
    });
    reg.describe("CRUD Tests", |r| {
        r.it("resource.k8s.io/v1 DeviceClass", async |_| Ok(())).labels(["Conformance", "DRA"]);
    });
    reg.it("top level", async |_| Ok(()));
    reg
}

#[rstest]
#[case(0, "[sig-node] [DRA] control plane supports claim and class parameters [ConformanceCandidate]", &["sig-node", "DRA", "ConformanceCandidate"])]
#[case(1, "[sig-node] [DRA] control plane supports reusing resources", &["sig-node", "DRA"])]
#[case(2, "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] must retry NodePrepareResources", &["sig-node", "DRA", "Feature:DynamicResourceAllocation"])]
#[case(3, "[sig-node] [DRA] kubelet [Feature:DynamicResourceAllocation] with rolling update keeps slices [KubeletMinVersion:1.33] [Slow] [Serial]", &["sig-node", "DRA", "Feature:DynamicResourceAllocation", "KubeletMinVersion:1.33", "Slow", "Serial"])]
#[case(4, "CRUD Tests resource.k8s.io/v1 DeviceClass [Conformance] [DRA]", &["Conformance", "DRA"])]
#[case(5, "top level", &[])]
fn renders_full_text_and_inherits_labels(#[case] index: usize, #[case] text: &str, #[case] labels: &[&str]) {
    let reg = sample();
    let spec = reg.specs().nth(index).unwrap();
    assert_eq!(spec.full_text(), text);
    assert_eq!(spec.labels(), labels);
    assert_eq!(spec.index(), index);
}

#[test]
fn keeps_timeouts_and_serial() {
    let reg = sample();
    let spec = reg.specs().nth(3).unwrap();
    assert_eq!(spec.timeout(), Some(Duration::from_secs(600)));
    assert!(spec.is_serial());
    assert_eq!(spec.name(), "keeps slices");
    assert!(!reg.specs().next().unwrap().is_serial());
    assert!(spec.runs_alone() && !reg.specs().next().unwrap().runs_alone());
    assert!(reg.validate().is_ok());
}

#[test]
fn a_spec_declared_to_run_alone_keeps_its_name_and_labels() {
    let mut reg = Registry::new();
    reg.it("needs the whole node", async |_| Ok(())).runs_alone("a node's allocatable CPU");
    let spec = reg.specs().next().unwrap();
    assert!(spec.runs_alone() && !spec.is_serial());
    assert_eq!(spec.full_text(), "needs the whole node");
    assert!(spec.labels().is_empty());
    assert_eq!(spec.alone_because(), Some("a node's allocatable CPU"));
}

#[test]
fn reports_invalid_labels_and_duplicates() {
    let mut reg = Registry::new();
    reg.describe_with_labels("a", ["x|y"], |r| {
        r.it("b", async |_| Ok(())).labels(["[Slow]"]);
        r.it("b", async |_| Ok(()));
    });
    reg.it(" ", async |_| Ok(()));
    let err = reg.validate().unwrap_err();
    assert_eq!(err.problems.len(), 4, "{err}");
    assert!(err.to_string().contains("two specs are named \"a b\""), "{err}");
    assert!(err.to_string().contains("label \"x|y\" contains '|'"), "{err}");
}

/// Upstream's `control plane` context with `WithFeatureGate(DRAResourcePoolStatus)` and a
/// nested context with two more gates (dra.go, v1.37.2): the container's gate stays in
/// place, its level, `OffByDefault` and dependencies go to the end, sorted, once, and a
/// dependency the text already shows is not repeated.
#[test]
fn renders_trailing_labels_at_the_end_sorted_once() {
    let gate = [
        Label::new("FeatureGate:DRAResourcePoolStatus"),
        Label::trailing("Alpha"),
        Label::trailing("Feature:OffByDefault"),
        Label::trailing("FeatureGate:DynamicResourceAllocation"),
    ];
    let mut reg = Registry::new();
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("control plane", gate.clone(), |r| {
            r.it("should filter by pool name", async |_| Ok(()));
        });
        r.context_with_labels("control plane views", gate, |r| {
            let typed = [
                Label::new("FeatureGate:DRAPartitionableDevices"),
                Label::trailing("Beta"),
                Label::trailing("FeatureGate:DynamicResourceAllocation"),
                Label::new("FeatureGate:DRAPartitionableDevicesType"),
                Label::trailing("Alpha"),
                Label::trailing("Feature:OffByDefault"),
                Label::trailing("FeatureGate:DRAResourcePoolStatus"),
            ];
            r.context_with_labels("partitionable typed view", typed, |r| {
                r.it("should report partitionSummary", async |_| Ok(()))
                    .labels([Label::new("KubeletMinVersion:1.36"), Label::trailing("Serial")]);
            });
        });
    });
    let specs: Vec<_> = reg.specs().collect();
    assert_eq!(
        specs[0].full_text(),
        "[sig-node] [DRA] control plane [FeatureGate:DRAResourcePoolStatus] should filter by pool name [Alpha] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation]"
    );
    assert_eq!(
        specs[0].labels(),
        [
            "sig-node",
            "DRA",
            "FeatureGate:DRAResourcePoolStatus",
            "Alpha",
            "Feature:OffByDefault",
            "FeatureGate:DynamicResourceAllocation"
        ]
    );
    assert_eq!(
        specs[1].full_text(),
        "[sig-node] [DRA] control plane views [FeatureGate:DRAResourcePoolStatus] partitionable typed view [FeatureGate:DRAPartitionableDevices] [FeatureGate:DRAPartitionableDevicesType] should report partitionSummary [KubeletMinVersion:1.36] [Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:DynamicResourceAllocation] [Serial]"
    );
    assert!(specs[1].is_serial());
    assert!(reg.validate().is_ok());
}

#[test]
fn hidden_labels_select_but_are_not_shown() {
    let mut reg = Registry::new();
    let gate = [
        Label::new("FeatureGate:GenericWorkload"),
        Label::trailing("Beta"),
        Label::trailing("Feature:OffByDefault"),
        Label::hidden("BetaOffByDefault"),
    ];
    reg.context_with_labels("kubelet", gate, |r| {
        r.it("allocates devices for PodGroups", async |_| Ok(()));
    });
    let spec = reg.specs().next().unwrap();
    assert_eq!(
        spec.full_text(),
        "kubelet [FeatureGate:GenericWorkload] allocates devices for PodGroups [Beta] [Feature:OffByDefault]"
    );
    assert!(spec.labels().iter().any(|l| l == "BetaOffByDefault"), "{:?}", spec.labels());
    assert!(reg.validate().is_ok());
}

#[rstest]
#[case("[sig-node]", Some("sig-node"))]
#[case(" [sig-api-machinery] ", Some("sig-api-machinery"))]
#[case("[sig-]", None)]
#[case("[sig-node] [DRA]", None)]
#[case("[DRA]", None)]
#[case("sig-node", None)]
fn recognizes_sig_containers(#[case] text: &str, #[case] expected: Option<&str>) {
    assert_eq!(sig_label(text), expected);
}

#[test]
fn rejects_always_trailing_labels_in_place_on_containers() {
    let mut reg = Registry::new();
    reg.context_with_labels("control plane", ["FeatureGate:X", "Alpha"], |r| {
        r.it("a", async |_| Ok(()));
    });
    let err = reg.validate().unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert!(err.problems[0].contains("\"Alpha\" of container \"control plane\""), "{err}");
}

#[test]
fn accepts_capturing_bodies() {
    let mut reg = Registry::new();
    for n in [1, 2] {
        let param = format!("param {n}");
        reg.it(&format!("table {n}"), move |_ctx| {
            let param = param.clone();
            async move {
                assert!(!param.is_empty());
                Ok(())
            }
        });
    }
    assert_eq!(reg.len(), 2);
}

/// The gates of two made-up versions: `Dep` is GA then removed, `X` beta then GA.
const OLD: crate::GateTable = crate::GateTable {
    version: "v1.37.2",
    gates: &[
        crate::Gate { name: "Dep", stability: crate::Stability::Ga, default: true, depends_on: &[] },
        crate::Gate { name: "X", stability: crate::Stability::Beta, default: true, depends_on: &["Dep"] },
        crate::Gate { name: "Y", stability: crate::Stability::Alpha, default: false, depends_on: &["X"] },
    ],
    removed: &[],
};
const NEW: crate::GateTable = crate::GateTable {
    version: "v1.38.0",
    gates: &[
        crate::Gate { name: "X", stability: crate::Stability::Ga, default: true, depends_on: &[] },
        crate::Gate { name: "Y", stability: crate::Stability::Alpha, default: false, depends_on: &["X"] },
    ],
    removed: &["Dep"],
};

fn gated(table: &'static crate::GateTable) -> Vec<String> {
    let mut reg = Registry::for_version(table);
    reg.describe_with_labels("[sig-node]", ["DRA"], |r| {
        r.context_with_labels("kubelet", [Label::gate("X")], |r| {
            r.it("a", async |_| Ok(())).label(Label::gate("Y"));
            r.it("b", async |_| Ok(())).label(Label::gate("Dep"));
        });
    });
    reg.validate().unwrap();
    reg.specs().map(|s| s.full_text().to_owned()).collect()
}

#[test]
fn composes_gate_labels_with_the_versions_table() {
    assert_eq!(
        gated(&OLD),
        [
            "[sig-node] [DRA] kubelet [FeatureGate:X] a [FeatureGate:Y] [Alpha] [Beta] [Feature:OffByDefault] [FeatureGate:Dep]",
            "[sig-node] [DRA] kubelet [FeatureGate:X] b [FeatureGate:Dep] [Beta]",
        ]
    );
    assert_eq!(
        gated(&NEW),
        [
            "[sig-node] [DRA] kubelet [FeatureGate:X] a [FeatureGate:Y] [Alpha] [Feature:OffByDefault]",
            "[sig-node] [DRA] kubelet [FeatureGate:X] b",
        ]
    );
    let mut reg = Registry::for_version(&NEW);
    assert!(reg.targets_at_least(1, 38) && !reg.targets_at_least(1, 39));
    reg.it("c", async |_| Ok(())).label(Label::gate("Typo"));
    assert!(
        reg.validate()
            .unwrap_err()
            .to_string()
            .contains("\"Typo\" is not in the gate table of Kubernetes v1.38.0")
    );
    let mut reg = Registry::new();
    reg.it("d", async |_| Ok(())).label(Label::gate("X"));
    assert!(reg.validate().unwrap_err().to_string().contains("needs the gate table"));
}

#[test]
fn a_description_stays_out_of_the_full_text() {
    let mut reg = Registry::new();
    reg.it("checks a driver", async |_| Ok(())).description("what it asserts");
    let spec = reg.specs().next().unwrap();
    assert_eq!((spec.full_text(), spec.description()), ("checks a driver", Some("what it asserts")));
    assert_eq!(sample().specs().next().unwrap().description(), None);
}
