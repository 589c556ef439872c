//! Where a proxied plugin's sockets are, as the kubelet and the proxy pod see them.

use std::path::Path;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::plugin::PluginConfig;

/// The kubelet's plugin directory; a driver's DRA socket is `<this>/<driver>/dra.sock`.
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The kubelet's plugin registry directory; a driver's registration socket is
/// `<this>/<driver>-reg.sock`.
pub const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The longest registration socket path (in bytes) that upstream's helper (kubeletplugin,
/// Kubernetes v1.37.2: `unixPathMax`) accepts when it picks a rolling-update socket name.
///
/// Note that the kernel's `sun_path` holds 108 bytes *including* the terminating NUL, so a path
/// of exactly 108 bytes cannot be bound by Go's `net.Listen` (nor by hostpathplugin); upstream
/// corrected the comparison to `< 108` after v1.37 (kubernetes#141815). We keep v1.37.2's rule,
/// as the kubelet under test pairs with that helper.
pub const UNIX_PATH_MAX: usize = 108;
/// How many bytes of SHA-256(pod UID) the second rolling-update registration socket name keeps
/// (upstream's `rollingUpdateUIDHashBytes`).
const UID_HASH_BYTES: usize = 8;
/// How many bytes of SHA-256(driver, NUL, pod UID) the shortest rolling-update registration
/// socket name keeps (upstream's `rollingUpdateRegistrarSocketHashBytes`).
const DRIVER_UID_HASH_BYTES: usize = 16;

/// The DRA socket of `driver`, as seen by the kubelet and inside the proxy pod.
pub fn dra_socket(driver: &str) -> String {
    format!("{PLUGINS_DIR}/{driver}/dra.sock")
}

/// The registration socket of `driver`, as seen by the kubelet and inside the proxy pod.
pub fn registration_socket(driver: &str) -> String {
    format!("{REGISTRY_DIR}/{driver}-reg.sock")
}

/// The DRA socket's file name in the plugin data directory: `dra.sock`, or `dra-<uid>.sock` for
/// a rolling-update instance (upstream's helper; the directory is per driver, so the name
/// needs only the UID).
pub fn dra_socket_file(rolling_update_uid: Option<&str>) -> String {
    match rolling_update_uid {
        Some(uid) if !uid.is_empty() => format!("dra-{uid}.sock"),
        _ => "dra.sock".to_owned(),
    }
}

/// `dir/file`, as Go's `path.Join` yields it for a clean absolute `dir`.
fn join(dir: &str, file: &str) -> String {
    format!("{}/{file}", dir.trim_end_matches('/'))
}

/// SHA-256 of `data`, its first `n` bytes in unpadded URL-safe base64.
fn hash_b64(data: &[u8], n: usize) -> String {
    let digest = Sha256::digest(data);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..n.min(digest.len())])
}

/// The registration socket's file name of a rolling-update instance with pod UID `uid`, as
/// upstream's helper (`RollingUpdateRegistrarSocketFile`, Kubernetes v1.37.2) picks it: the
/// first of
///
/// 1. `<driver>-<uid>-reg.sock`,
/// 2. `<driver>-<base64url(SHA-256(uid))[first 8 bytes]>-reg.sock`,
/// 3. `dra-<base64url(SHA-256(driver NUL uid))[first 16 bytes]>-reg.sock`
///
/// whose full path in `registry_dir` is at most [`UNIX_PATH_MAX`] bytes long; the last one if
/// none is (unpadded URL-safe base64: 11 and 22 characters). With the default registry
/// directory the full UID fits for driver names of up to 28 bytes, the hashed UID for up to 53
/// (kubernetes#139166).
///
/// ```
/// use harness::proxied::{REGISTRY_DIR, rolling_update_registration_file};
/// let uid = "11111111-2222-3333-4444-555555555555";
/// assert_eq!(
///     rolling_update_registration_file(REGISTRY_DIR, "short.k8s.io", uid),
///     format!("short.k8s.io-{uid}-reg.sock")
/// );
/// ```
pub fn rolling_update_registration_file(registry_dir: &str, driver: &str, uid: &str) -> String {
    let mut driver_uid = Vec::with_capacity(driver.len() + 1 + uid.len());
    driver_uid.extend_from_slice(driver.as_bytes());
    driver_uid.push(0);
    driver_uid.extend_from_slice(uid.as_bytes());
    let candidates = [
        format!("{driver}-{uid}-reg.sock"),
        format!("{driver}-{}-reg.sock", hash_b64(uid.as_bytes(), UID_HASH_BYTES)),
        format!("dra-{}-reg.sock", hash_b64(&driver_uid, DRIVER_UID_HASH_BYTES)),
    ];
    let fits = |name: &String| join(registry_dir, name).len() <= UNIX_PATH_MAX;
    match candidates.iter().find(|name| fits(name)) {
        Some(name) => name.clone(),
        None => {
            let [.., last] = candidates;
            last
        }
    }
}

/// The DRA and registration socket paths for `config`, as seen by the kubelet and inside the
/// proxy pod.
///
/// - Directories: the DRA socket goes to the directory of [`PluginConfig::dra_endpoint`] when
///   set (the plugin data directory `<root>/plugins/<driver>`; the registration socket then
///   goes to `<root>/plugins_registry`, or to [`REGISTRY_DIR`] when the endpoint is not of that
///   shape), else to `<`[`PLUGINS_DIR`]`>/<driver>` and [`REGISTRY_DIR`].
/// - Names: without [`PluginConfig::rolling_update_uid`], the endpoint's own file name (or
///   `dra.sock`) and `<driver>-reg.sock`; with it, `dra-<uid>.sock` ([`dra_socket_file`]) and
///   [`rolling_update_registration_file`].
pub fn sockets(config: &PluginConfig) -> (String, String) {
    let driver = &config.driver_name;
    let uid = config.rolling_update_uid.as_deref().filter(|uid| !uid.is_empty());
    let default_dra = dra_socket(driver);
    let endpoint = config.dra_endpoint.as_deref().unwrap_or(&default_dra);
    let dra = match uid {
        Some(_) => Path::new(endpoint).with_file_name(dra_socket_file(uid)).display().to_string(),
        None => endpoint.to_owned(),
    };
    // <root>/plugins/<driver>/<socket> -> <root>
    let root = Path::new(endpoint)
        .parent()
        .filter(|dir| dir.file_name().is_some_and(|name| name == driver.as_str()))
        .and_then(|dir| dir.parent())
        .filter(|plugins| plugins.file_name().is_some_and(|name| name == "plugins"))
        .and_then(|plugins| plugins.parent());
    let registry = match root {
        Some(root) => root.join("plugins_registry").display().to_string(),
        None => REGISTRY_DIR.to_owned(),
    };
    let file = match uid {
        Some(uid) => rolling_update_registration_file(&registry, driver, uid),
        None => format!("{driver}-reg.sock"),
    };
    (dra, join(&registry, &file))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const UID: &str = "ad4af911-5bcd-47c5-a554-f35cea869472";

    #[test]
    fn socket_paths() {
        let config = PluginConfig::new("d.k8s.io", "node", "/cdi");
        assert_eq!(
            sockets(&config),
            (
                "/var/lib/kubelet/plugins/d.k8s.io/dra.sock".to_string(),
                "/var/lib/kubelet/plugins_registry/d.k8s.io-reg.sock".to_string()
            )
        );
        let other_root = config.clone().dra_endpoint("/data/kubelet/plugins/d.k8s.io/dra.sock");
        assert_eq!(sockets(&other_root).1, "/data/kubelet/plugins_registry/d.k8s.io-reg.sock");
        let odd = config.dra_endpoint("/somewhere/dra.sock");
        assert_eq!(
            sockets(&odd),
            (
                "/somewhere/dra.sock".to_string(),
                "/var/lib/kubelet/plugins_registry/d.k8s.io-reg.sock".to_string()
            )
        );
    }

    #[test]
    fn rolling_update_socket_paths() {
        let config = PluginConfig::new("d.k8s.io", "node", "/cdi").rolling_update_uid(UID);
        assert_eq!(
            sockets(&config),
            (
                format!("/var/lib/kubelet/plugins/d.k8s.io/dra-{UID}.sock"),
                format!("/var/lib/kubelet/plugins_registry/d.k8s.io-{UID}-reg.sock"),
            )
        );
        // The driver sets the DRA endpoint to <root>/plugins/<driver>/dra.sock: the UID replaces
        // the file name, the registry follows the root.
        let other_root = config.clone().dra_endpoint("/data/kubelet/plugins/d.k8s.io/dra.sock");
        assert_eq!(
            sockets(&other_root),
            (
                format!("/data/kubelet/plugins/d.k8s.io/dra-{UID}.sock"),
                format!("/data/kubelet/plugins_registry/d.k8s.io-{UID}-reg.sock"),
            )
        );
        // Two instances never share a socket.
        let other = config.clone().rolling_update_uid("11111111-2222-3333-4444-555555555555");
        let (a, b) = (sockets(&config), sockets(&other));
        assert_ne!(a.0, b.0);
        assert_ne!(a.1, b.1);
        // An empty UID is no rolling update (upstream's RollingUpdate("")).
        let off = config.rolling_update_uid("");
        assert_eq!(off.rolling_update_uid, None);
        assert_eq!(sockets(&off).1, "/var/lib/kubelet/plugins_registry/d.k8s.io-reg.sock");
    }

    #[test]
    fn dra_socket_files() {
        assert_eq!(dra_socket_file(None), "dra.sock");
        assert_eq!(dra_socket_file(Some("")), "dra.sock");
        assert_eq!(dra_socket_file(Some(UID)), format!("dra-{UID}.sock"));
    }

    /// The expected names were computed independently (Python hashlib + urlsafe base64 without
    /// padding) and match upstream's own test cases (kubeletplugin v0.37.2).
    #[rstest]
    // Short name: the full UID fits.
    #[case("short.k8s.io", "short.k8s.io-ad4af911-5bcd-47c5-a554-f35cea869472-reg.sock")]
    // 34 bytes (upstream's LongRollingUpdateDriverName, kubernetes#139166): hashed UID.
    #[case("gpu.dra-example-driver.sigs.k8s.io", "gpu.dra-example-driver.sigs.k8s.io-Jk8-oymVURI-reg.sock")]
    // 100 bytes: only the shortest form fits.
    #[case(&"a".repeat(100), "dra-0XAjsR3nLFWHa0HL1OOe6g-reg.sock")]
    fn rolling_update_registration_files(#[case] driver: &str, #[case] expected: &str) {
        let file = rolling_update_registration_file(REGISTRY_DIR, driver, UID);
        assert_eq!(file, expected);
        assert!(join(REGISTRY_DIR, &file).len() <= UNIX_PATH_MAX);
    }

    /// With the default registry directory the full UID fits up to 28 bytes of driver name
    /// (a path of exactly 108 bytes, accepted by v1.37.2's `<=`), the hashed UID up to 53.
    #[rstest]
    #[case(28, Some(UID))]
    #[case(29, None)]
    #[case(53, None)]
    #[case(54, None)]
    fn rolling_update_registration_boundaries(#[case] len: usize, #[case] contains: Option<&str>) {
        let driver = format!("{}.io", "d".repeat(len - 3));
        assert_eq!(driver.len(), len);
        let file = rolling_update_registration_file(REGISTRY_DIR, &driver, UID);
        let path = join(REGISTRY_DIR, &file);
        assert!(path.len() <= UNIX_PATH_MAX, "{path} is {} bytes", path.len());
        assert!(file.ends_with("-reg.sock"), "{file}");
        match contains {
            Some(uid) => {
                assert_eq!(path.len(), len + 80);
                assert!(file.contains(uid), "{file}");
            }
            None if len <= 53 => {
                // <driver>-<11 characters>-reg.sock
                assert!(!file.contains(UID), "{file}");
                assert_eq!(file.len(), len + 1 + 11 + 9, "{file}");
                assert!(file.starts_with(&format!("{driver}-")), "{file}");
            }
            None => {
                // dra-<22 characters>-reg.sock
                assert!(!file.contains(&driver), "{file}");
                assert_eq!(file.len(), 4 + 22 + 9, "{file}");
                assert!(file.starts_with("dra-"), "{file}");
            }
        }
    }

    #[test]
    fn rolling_update_registration_files_depend_on_driver_uid_and_directory() {
        let uid2 = "11111111-2222-3333-4444-555555555555";
        let long = "x".repeat(60);
        assert_ne!(
            rolling_update_registration_file(REGISTRY_DIR, &long, UID),
            rolling_update_registration_file(REGISTRY_DIR, &long, uid2)
        );
        assert_eq!(
            rolling_update_registration_file(REGISTRY_DIR, &long, uid2),
            "dra-ItqPzHdekljnmN58E4rsLw-reg.sock"
        );
        assert_ne!(
            rolling_update_registration_file(REGISTRY_DIR, "one.k8s.io", UID),
            rolling_update_registration_file(REGISTRY_DIR, "two.k8s.io", UID)
        );
        assert_eq!(
            rolling_update_registration_file(REGISTRY_DIR, "gpu.example.com", uid2),
            format!("gpu.example.com-{uid2}-reg.sock")
        );
        // A longer registry directory leaves less room: the same name falls back to the hash.
        let deep = format!("/var/lib/kubelet/{}/plugins_registry", "x".repeat(20));
        assert_eq!(
            rolling_update_registration_file(&deep, "gpu.example.com", uid2),
            "gpu.example.com-Zm_2zKpbPAc-reg.sock"
        );
        // A trailing slash does not count.
        assert_eq!(
            rolling_update_registration_file(&format!("{REGISTRY_DIR}/"), "a".repeat(28).as_str(), UID),
            rolling_update_registration_file(REGISTRY_DIR, "a".repeat(28).as_str(), UID)
        );
    }

    #[test]
    fn long_driver_name_sockets() {
        // 36 bytes: the longest name whose dra-<uid>.sock path (71 + name bytes) stays below
        // 108 bytes; its registration socket uses the hashed UID.
        let driver = format!("{}.k8s.io", "n".repeat(29));
        let config = PluginConfig::new(&driver, "node", "/cdi")
            .dra_endpoint(format!("/var/lib/kubelet/plugins/{driver}/dra.sock"))
            .rolling_update_uid(UID);
        let (dra, registration) = sockets(&config);
        assert_eq!(dra.len(), 107);
        assert_eq!(registration, format!("{REGISTRY_DIR}/{driver}-Jk8-oymVURI-reg.sock"));
    }
}
