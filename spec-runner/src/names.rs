//! Names derived from spec texts: artifact folders, namespace prefixes, unique suffixes.

use rand::Rng as _;

/// Longest artifact folder name before the hash (file names are limited to 255 bytes).
const MAX_DIR_NAME: usize = 120;
/// Longest namespace prefix taken from the spec name. Namespaces appear in
/// driver names (`<namespace><suffix>.k8s.io`, at most 63 characters) and in
/// Unix socket paths, so they stay short, as upstream's `dra-1234` are.
const MAX_NAMESPACE_PART: usize = 20;

/// A file-system friendly name for a spec's artifact folder: ASCII letters,
/// digits, `.` and `-` kept, every other run of characters becomes `_`; long
/// names are cut and get a hash of the full text so they stay distinct.
pub(crate) fn dir_name(full_text: &str) -> String {
    let mut out = String::new();
    let mut pending_separator = false;
    for c in full_text.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
            if pending_separator && !out.is_empty() {
                out.push('_');
            }
            pending_separator = false;
            out.push(c);
        } else {
            pending_separator = true;
        }
    }
    if out.is_empty() {
        out.push_str("spec");
    }
    if out.len() > MAX_DIR_NAME {
        out.truncate(MAX_DIR_NAME);
        out = format!("{}-{:016x}", out.trim_end_matches('_'), fnv1a(full_text));
    }
    out
}

/// The `generateName` of a spec's namespace: `dra-<name>-`, lower-case DNS label characters.
pub(crate) fn namespace_prefix(spec_name: &str) -> String {
    let mut part = String::new();
    for c in spec_name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            part.push(c);
        } else if !part.ends_with('-') && !part.is_empty() {
            part.push('-');
        }
        if part.len() >= MAX_NAMESPACE_PART {
            break;
        }
    }
    let part = part.trim_end_matches('-');
    if part.is_empty() { "dra-".to_owned() } else { format!("dra-{part}-") }
}

/// A random suffix for cluster-scoped names: 8 lower-case letters and digits.
pub(crate) fn unique_suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..8).map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())])).collect()
}

/// FNV-1a, a stable hash (std's hasher may change between releases).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case(
        "[sig-node] [DRA] control plane supports claim and class parameters [ConformanceCandidate]",
        "sig-node_DRA_control_plane_supports_claim_and_class_parameters_ConformanceCandidate"
    )]
    #[case("CRUD Tests resource.k8s.io/v1 DeviceClass", "CRUD_Tests_resource.k8s.io_v1_DeviceClass")]
    #[case("[]", "spec")]
    fn dir_names(#[case] text: &str, #[case] expected: &str) {
        assert_eq!(dir_name(text), expected);
    }

    #[test]
    fn long_dir_names_stay_distinct_and_short() {
        let a = dir_name(&format!("{} a", "x".repeat(300)));
        let b = dir_name(&format!("{} b", "x".repeat(300)));
        assert_ne!(a, b);
        assert!(a.len() <= MAX_DIR_NAME + 17, "{a}");
    }

    #[rstest]
    #[case("supports claim and class parameters", "dra-supports-claim-and-c-")]
    #[case("must retry NodePrepareResources", "dra-must-retry-nodeprepa-")]
    #[case("registers plugin", "dra-registers-plugin-")]
    #[case("resource.k8s.io/v1 DeviceClass", "dra-resource-k8s-io-v1-d-")]
    #[case("[x]", "dra-x-")]
    #[case("!!!", "dra-")]
    fn namespace_prefixes(#[case] name: &str, #[case] expected: &str) {
        assert_eq!(namespace_prefix(name), expected);
    }

    #[test]
    fn suffixes_are_dns_safe() {
        let s = unique_suffix();
        assert_eq!(s.len(), 8);
        assert!(s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
