//! A kubelet's Prometheus metrics, read through the API server's node proxy
//! (`/api/v1/nodes/<node>/proxy/metrics`, which needs `nodes/proxy`), and the samples of one
//! metric in them.

use harness::framework::ClusterAccess;
use kube::{api::GetParams, core::Request};

/// The text of the kubelet's `/metrics` on `node`, or why it cannot be read (naming the path).
pub(crate) async fn read(from: &impl ClusterAccess, node: &str) -> Result<String, String> {
    let path = format!("/api/v1/nodes/{node}/proxy");
    let request = Request::new(&path).get("metrics", &GetParams::default()).map_err(|e| e.to_string())?;
    from.client().request_text(request).await.map_err(|e| format!("GET {path}/metrics: {e}"))
}

/// One sample of a metric: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// The labels, in the order of the text.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether the sample has every label of `labels` with its value.
    pub fn has(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(name, value)| self.label(name) == Some(value))
    }
}

/// The samples of `metric` (exactly that name) in Prometheus text.
pub(crate) fn samples(text: &str, metric: &str) -> Vec<Sample> {
    text.lines().filter(|line| !line.starts_with('#')).filter_map(|line| parse(line, metric)).collect()
}

/// The sum of the samples of `metric` that have `labels` (0 when there is none).
pub(crate) fn sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, metric)
        .iter()
        .filter(|s| s.has(labels))
        .map(|s| s.value)
        // Not `sum()`: the empty sum of floats is -0.0, which reads oddly in the log.
        .fold(0.0, |sum, v| sum + v)
}

/// `metric{a="x",b="y"} value` (labels optional), when the line is a sample of `metric`.
fn parse(line: &str, metric: &str) -> Option<Sample> {
    let rest = line.strip_prefix(metric)?;
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => parse_labels(inner)?,
        None if rest.starts_with(' ') => (Vec::new(), rest),
        None => return None,
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample { labels, value })
}

/// The labels up to the closing `}` and the text after it.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(rest) = text.strip_prefix('}') {
            return Some((labels, rest));
        }
        let (name, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim().to_owned(), value));
        text = &rest[end + 1..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // A panic in a test is a failure with a location.
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE dra_node_prepare_skips_total counter
dra_node_prepare_skips_total{driver_name=\"a.k8s.io\"} 2
dra_node_prepare_skips_total{driver_name=\"b.k8s.io\"} 5
dra_node_prepare_skips_total_other{driver_name=\"a.k8s.io\"} 7
dra_grpc_operations_duration_seconds_count{driver_name=\"a.k8s.io\",grpc_status_code=\"OK\",method_name=\"/x.DRAPlugin/NodePrepareResources\"} 3
plugin_manager_total_plugins{socket_path=\"/var/lib/kubelet/plugins_registry/a,b \\\"q\\\".sock\",state=\"actual_state_of_world\"} 1
up 1
";

    #[test]
    fn reads_the_samples_of_one_metric_by_their_labels() {
        assert_eq!(sum(TEXT, "dra_node_prepare_skips_total", &[("driver_name", "a.k8s.io")]), 2.0);
        assert_eq!(sum(TEXT, "dra_node_prepare_skips_total", &[]), 7.0);
        assert_eq!(
            sum(TEXT, "dra_node_prepare_skips_total", &[("driver_name", "c.k8s.io")]).to_string(),
            "0"
        );
        let ok = [("driver_name", "a.k8s.io"), ("grpc_status_code", "OK")];
        assert_eq!(sum(TEXT, "dra_grpc_operations_duration_seconds_count", &ok), 3.0);
        let plugins = samples(TEXT, "plugin_manager_total_plugins");
        assert_eq!(plugins[0].label("socket_path"), Some("/var/lib/kubelet/plugins_registry/a,b \"q\".sock"));
        assert_eq!(plugins[0].label("state"), Some("actual_state_of_world"));
        assert_eq!(samples(TEXT, "up"), [Sample { labels: Vec::new(), value: 1.0 }]);
        assert!(samples("dra_x{broken 1", "dra_x").is_empty());
    }
}
