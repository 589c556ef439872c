//! Tests of the kind provider: commands, dry runs, errors, fake docker and kind, the workflow.

#![allow(clippy::unwrap_used, reason = "tests may unwrap; helpers outside #[test] functions too")]

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
use kube::api::ObjectMeta;

use super::*;

const REPO: &str = "/src/dra-e2e";

fn args(name: &str) -> KindOptions {
    KindOptions { name: name.to_string(), image: None, kind_version: None, kind_from_path: false }
}

/// A host with `path` as PATH and a cache no test writes to (tests that install use their own).
fn host_with_path(path: &str) -> Host {
    Host {
        path: Some(path.into()),
        repo: crate::repo::repo_root(),
        kind_yaml: cluster_config::default_path(),
        cache: PathBuf::from("/nonexistent/dra-e2e-test-cache"),
        docker_host: None,
    }
}

/// Whether `err` is a usage error (exit code 2) with exactly `sentence`.
fn is_usage_error(err: &anyhow::Error) -> bool {
    err.downcast_ref::<UsageError>().is_some()
}

#[test]
fn create_command_is_exact() {
    let cmd = create_cluster_cmd(
        "dra-e2e",
        Path::new("/src/dra-e2e/kind.yaml"),
        None,
        Path::new("/src/dra-e2e/.e2e/kind-dra-e2e.kubeconfig"),
    );
    assert_eq!(
        cmd.to_string(),
        "kind create cluster --name dra-e2e --config /src/dra-e2e/kind.yaml \
         --kubeconfig /src/dra-e2e/.e2e/kind-dra-e2e.kubeconfig --wait 5m"
    );
    let with_image =
        create_cluster_cmd("n", Path::new("k.yaml"), Some("kindest/node:v1.37.2"), Path::new("kc"));
    assert_eq!(
        with_image.args,
        [
            "create",
            "cluster",
            "--name",
            "n",
            "--config",
            "k.yaml",
            "--image",
            "kindest/node:v1.37.2",
            "--kubeconfig",
            "kc",
            "--wait",
            "5m"
        ]
        .map(OsString::from)
    );
}

#[test]
fn dry_run_lines_are_exact() {
    let repo = Path::new(REPO);
    let lines = up_lines(
        "dra-e2e",
        &repo.join("kind.yaml"),
        Some("dra/node:latest"),
        &kubeconfig_path(repo, "dra-e2e"),
    );
    assert_eq!(
        lines,
        [
            "docker image inspect --format '{{.Id}}' registry.k8s.io/sig-storage/hostpathplugin:v1.17.1 >/dev/null 2>&1 \
             || docker pull registry.k8s.io/sig-storage/hostpathplugin:v1.17.1",
            "docker image inspect --format '{{.Id}}' registry.k8s.io/e2e-test-images/busybox:1.37.0-2 >/dev/null 2>&1 \
             || docker pull registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
            "kind create cluster --name dra-e2e --config /src/dra-e2e/kind.yaml --image dra/node:latest \
             --kubeconfig /src/dra-e2e/.e2e/kind-dra-e2e.kubeconfig --wait 5m",
            "kind load docker-image --name dra-e2e registry.k8s.io/sig-storage/hostpathplugin:v1.17.1",
            "kind load docker-image --name dra-e2e registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
        ]
    );
    assert_eq!(
        down_lines("dra-e2e", &kubeconfig_path(repo, "dra-e2e")),
        [
            "kind delete cluster --name dra-e2e --kubeconfig /src/dra-e2e/.e2e/kind-dra-e2e.kubeconfig",
            "rm -f /src/dra-e2e/.e2e/kind-dra-e2e.kubeconfig",
        ]
    );
}

#[test]
fn other_commands_are_exact() {
    let kc = Path::new("/r/.e2e/kind-x.kubeconfig");
    assert_eq!(
        export_kubeconfig_cmd("x", kc).to_string(),
        "kind export kubeconfig --name x --kubeconfig /r/.e2e/kind-x.kubeconfig"
    );
    assert_eq!(get_nodes_cmd("x").to_string(), "kind get nodes --name x");
    assert_eq!(
        save_image_cmd("busybox:1", "linux/amd64", Path::new("/t/i.tar")).to_string(),
        "docker image save --platform linux/amd64 --output /t/i.tar busybox:1"
    );
    assert_eq!(
        load_archive_cmd("x", Path::new("/t/i.tar")).to_string(),
        "kind load image-archive --name x /t/i.tar"
    );
    assert_eq!(
        build_node_image_cmd("dra/node:latest", Path::new("/go/src/k8s.io/kubernetes")).to_string(),
        "kind build node-image --image dra/node:latest /go/src/k8s.io/kubernetes"
    );
}

#[test]
fn shell_quoting() {
    assert_eq!(shell_quote(OsStr::new("a/b-c_d.e:f@1")), "a/b-c_d.e:f@1");
    assert_eq!(shell_quote(OsStr::new("with space")), "'with space'");
    assert_eq!(shell_quote(OsStr::new("it's")), r"'it'\''s'");
    assert_eq!(shell_quote(OsStr::new("")), "''");
}

#[tokio::test]
async fn a_lane_s_gates_go_into_a_derived_kind_config() {
    let host = host_with_path("");
    let overrides = crate::overrides::OverrideArgs {
        feature_gates: Some("GenericWorkload=true".into()),
        runtime_config: Some("scheduling.k8s.io/v1beta1=true".into()),
        ..Default::default()
    }
    .parse()
    .unwrap()
    .unwrap();
    let mut out = Vec::new();
    up_in(&host, &args("dra-e2e-lane-test"), &overrides, None, network::HostNeeds::default(), true, &mut out)
        .await
        .unwrap();
    let derived = host.repo.join(".e2e").join("kind-dra-e2e-lane-test.yaml");
    let printed = String::from_utf8(out).unwrap();
    assert!(printed.contains(&format!("--config {}", derived.display())), "{printed}");
    let config = ClusterConfig::load(&derived).unwrap();
    std::fs::remove_file(&derived).unwrap();
    assert!(config.feature_gates["GenericWorkload"]);
    assert_eq!(config.runtime_config["scheduling.k8s.io/v1beta1"], "true");
}

#[tokio::test]
async fn dry_run_prints_the_commands_without_docker_or_kind() {
    let host = host_with_path(""); // nothing on PATH
    let mut out = Vec::new();
    let kubeconfig = up_in(
        &host,
        &args("dra-e2e"),
        &Overrides::default(),
        None,
        network::HostNeeds::default(),
        true,
        &mut out,
    )
    .await
    .unwrap();
    let repo = crate::repo::repo_root();
    assert_eq!(kubeconfig, repo.join(".e2e").join("kind-dra-e2e.kubeconfig"));
    let printed = String::from_utf8(out).unwrap();
    let expected = up_lines("dra-e2e", &repo.join("kind.yaml"), None, &kubeconfig).join("\n") + "\n";
    assert_eq!(printed, expected);
    assert!(printed.contains(&format!(
        "kind create cluster --name dra-e2e --config {}",
        repo.join("kind.yaml").display()
    )));

    let mut out = Vec::new();
    down_in(&host, &args("dra-e2e"), true, &mut out).await.unwrap();
    assert!(String::from_utf8(out).unwrap().starts_with("kind delete cluster --name dra-e2e --kubeconfig "));

    let mut out = Vec::new();
    let build =
        BuildNodeImageOptions { k8s_source: "/k8s".into(), image: "dra/node:latest".into(), dry_run: true };
    build_node_image_in(&host, &build, &mut out).await.unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "kind build node-image --image dra/node:latest /k8s\n");
}

#[tokio::test]
async fn empty_path_gives_one_sentence_saying_what_to_install() {
    let host = host_with_path("");
    let err = up_in(
        &host,
        &args("dra-e2e"),
        &Overrides::default(),
        None,
        network::HostNeeds::default(),
        false,
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(is_usage_error(&err));
    let text = format!("{err:#}");
    assert_eq!(
        text,
        "docker was not found on PATH: the kind provider runs its nodes as Docker containers, so install Docker \
         Engine (https://docs.docker.com/engine/install/), start the run's own engine with `cargo xtask docker up` \
         (as root on Debian), or use `--provider local`, which needs no Docker."
    );
    assert_eq!(text.matches(". ").count(), 0, "one sentence: {text}");
    let down = down_in(&host, &args("dra-e2e"), false, &mut Vec::new()).await;
    assert_eq!(format!("{:#}", down.unwrap_err()), text);
    let status = status_in(&host, &args("dra-e2e"), &mut Vec::new()).await;
    assert_eq!(format!("{:#}", status.unwrap_err()), text);
    let mut host_none = host.clone();
    host_none.path = None;
    assert!(
        host_none
            .tools(None, false)
            .await
            .unwrap_err()
            .to_string()
            .starts_with("docker was not found on PATH")
    );
}

#[cfg(unix)]
fn fake_tool(dir: &Path, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[cfg(unix)]
#[tokio::test]
async fn a_non_executable_docker_is_no_docker() {
    let dir = tempfile::tempdir().unwrap();
    fake_tool(dir.path(), "kind", "exit 0");
    std::fs::write(dir.path().join("docker"), "not executable").unwrap();
    let host = host_with_path(dir.path().to_str().unwrap());
    let err = host.tools(None, false).await.unwrap_err();
    assert!(is_usage_error(&err));
    let err = err.to_string();
    assert!(err.starts_with("docker was not found on PATH:"), "{err}");
    assert!(err.contains("--provider local"), "{err}");
}

#[cfg(unix)]
#[tokio::test]
async fn kind_from_path_with_another_version_or_none_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    fake_tool(dir.path(), "docker", "echo 'id|/var/lib/docker'");
    fake_tool(dir.path(), "kind", "echo 'kind v0.31.0 go1.25.5 linux/amd64'");
    let host = host_with_path(dir.path().to_str().unwrap());
    let mut wanted = args("dra-e2e");
    wanted.kind_from_path = true;
    let err = up_in(
        &host,
        &wanted,
        &Overrides::default(),
        None,
        network::HostNeeds::default(),
        false,
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(is_usage_error(&err));
    let err = err.to_string();
    assert!(err.starts_with(&format!("kind v0.31.0 is on PATH ({}/kind)", dir.path().display())), "{err}");
    assert!(err.contains("but v0.33.0 is required (--kind-version / KIND_VERSION)"), "{err}");
    assert!(
        err.contains(
            "--kind-from-path forbids installing it: install it with `go install sigs.k8s.io/kind@v0.33.0`"
        ),
        "{err}"
    );
    assert_eq!(err.matches(". ").count(), 0, "one sentence: {err}");

    std::fs::remove_file(dir.path().join("kind")).unwrap();
    let err = host.tools(None, true).await.unwrap_err();
    assert!(is_usage_error(&err));
    assert!(
        err.to_string().starts_with("kind was not found on PATH and --kind-from-path forbids installing it"),
        "{err}"
    );

    // Without --kind-from-path the provider installs kind, which needs Go: none on this PATH.
    let err = host.tools(Some("v0.33.0"), false).await.unwrap_err();
    assert!(is_usage_error(&err));
    assert_eq!(
        err.to_string(),
        "kind v0.33.0 is needed and kind is not on PATH, and Go is not on PATH to install it: install Go 1.26 \
         (https://go.dev/dl/) or put kind v0.33.0 on PATH."
    );
    let err = host.tools(Some("latest"), false).await.unwrap_err();
    assert!(is_usage_error(&err), "{err}");
}

#[cfg(unix)]
#[tokio::test]
async fn a_missing_or_other_kind_is_installed_into_the_cache_with_go() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("go.log");
    fake_tool(dir.path(), "docker", "echo 'id|/var/lib/docker'");
    fake_tool(dir.path(), "kind", "echo 'kind v0.31.0 go1.25.5 linux/amd64'");
    // A fake `go install` that writes a kind of the asked version into $GOBIN.
    fake_tool(
        dir.path(),
        "go",
        &format!(
            "echo \"GOBIN=$GOBIN go $*\" >> '{}'\n\
             v=${{2#sigs.k8s.io/kind@}}\n\
             printf '#!/bin/sh\\necho kind %s go1.26 linux/amd64\\n' \"$v\" > \"$GOBIN/kind\"\n\
             /bin/chmod +x \"$GOBIN/kind\"",
            log.display()
        ),
    );
    let cache = tempfile::tempdir().unwrap();
    let mut host = host_with_path(dir.path().to_str().unwrap());
    host.cache = cache.path().to_path_buf();
    let tools = host.tools(None, false).await.unwrap();
    let cached = cache.path().join("kind/v0.33.0/kind");
    assert_eq!(tools.kind, cached);
    assert_eq!(tools.daemon, "id|/var/lib/docker");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("GOBIN={} go install sigs.k8s.io/kind@v0.33.0\n", cached.parent().unwrap().display())
    );
    // The second time the cached one is used; a kind of the wanted version on PATH wins.
    assert_eq!(host.tools(None, false).await.unwrap().kind, cached);
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
    fake_tool(dir.path(), "kind", "echo 'kind v0.33.0 go1.26.8 linux/amd64'");
    assert_eq!(host.tools(None, false).await.unwrap().kind, dir.path().join("kind"));
}

#[cfg(unix)]
#[tokio::test]
async fn a_dead_docker_daemon_is_a_usage_error_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    fake_tool(
        dir.path(),
        "docker",
        "echo 'Cannot connect to the Docker daemon at unix:///run/x.sock. Is the docker daemon running?' >&2; exit 1",
    );
    fake_tool(dir.path(), "kind", "echo 'kind v0.33.0 go1.26.8 linux/amd64'");
    let mut host = host_with_path(dir.path().to_str().unwrap());
    host.docker_host = Some("unix:///run/x.sock".into());
    let err = up_in(
        &host,
        &args("dra-e2e"),
        &Overrides::default(),
        None,
        network::HostNeeds::default(),
        false,
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(is_usage_error(&err));
    assert_eq!(
        err.to_string(),
        "the Docker daemon at unix:///run/x.sock does not answer (docker info: Cannot connect to the Docker daemon \
         at unix:///run/x.sock): start it (or, for the run's own engine, `cargo xtask docker down` and `cargo xtask \
         docker up` as root), or point DOCKER_HOST at one that runs."
    );
}

/// Fake docker and kind that append their arguments to `log`; kind knows clusters `existing`.
#[cfg(unix)]
fn fake_tools(dir: &Path, log: &Path, existing: &str) {
    let log = log.display();
    fake_tool(
        dir,
        "docker",
        &format!(
            "echo \"docker $*\" >> '{log}'\n\
             case \"$1\" in info) echo 'engine-id|/var/lib/docker' ;; image) exit 1 ;; esac"
        ),
    );
    fake_tool(
        dir,
        "kind",
        &format!(
            "echo \"kind $*\" >> '{log}'\n\
             case \"$1 $2\" in\n\
             'version ') echo 'kind v0.33.0 go1.26.8 linux/amd64' ;;\n\
             'get clusters') echo '{existing}' ;;\n\
             esac"
        ),
    );
}

#[cfg(unix)]
#[tokio::test]
async fn up_runs_the_dry_run_commands_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.log");
    fake_tools(dir.path(), &log, "some-other-cluster");
    let repo = tempfile::tempdir().unwrap();
    let host = Host {
        path: Some(dir.path().as_os_str().to_owned()),
        repo: repo.path().to_path_buf(),
        kind_yaml: cluster_config::default_path(),
        cache: PathBuf::from("/nonexistent/dra-e2e-test-cache"),
        docker_host: Some("unix:///run/dra-e2e-test/docker.sock".into()),
    };
    let mut wanted = args("t");
    wanted.kind_version = Some("0.33.0".into());
    // The fake kind lists no nodes, so `up` stops before waiting for the API server.
    let err = format!(
        "{:#}",
        up_in(
            &host,
            &wanted,
            &Overrides::default(),
            None,
            network::HostNeeds::default(),
            false,
            &mut Vec::new()
        )
        .await
        .unwrap_err()
    );
    assert_eq!(err, "kind reports no nodes for cluster \"t\"");

    let kubeconfig = kubeconfig_path(repo.path(), "t");
    let unquoted = |cmd: Cmd| {
        let args: Vec<String> = cmd.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        format!("{} {}", cmd.program, args.join(" "))
    };
    let mut expected = vec![
        unquoted(docker_info_cmd()),
        unquoted(kind_version_cmd()),
        unquoted(get_clusters_cmd()),
        unquoted(container_names_cmd()),
    ];
    for image in SUITE_IMAGES {
        expected.push(unquoted(image_present_cmd(image)));
        expected.push(unquoted(pull_cmd(image)));
    }
    expected.push(unquoted(create_cluster_cmd("t", &host.kind_yaml, None, &kubeconfig)));
    expected.push(unquoted(get_nodes_cmd("t")));
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.lines().collect::<Vec<_>>(), expected);

    // Every docker and kind command got the engine's DOCKER_HOST.
    let env = dir.path().join("env.log");
    fake_tool(
        dir.path(),
        "docker",
        &format!("echo \"$DOCKER_HOST\" >> '{}'; echo 'engine-id|/x'", env.display()),
    );
    host.tools(None, false).await.unwrap();
    assert_eq!(std::fs::read_to_string(&env).unwrap(), "unix:///run/dra-e2e-test/docker.sock\n");

    // The cluster it created is reused: its kubeconfig is exported instead of creating it.
    assert_eq!(std::fs::read_to_string(owner_path(repo.path(), "t")).unwrap(), "engine-id|/var/lib/docker\n");
    std::fs::remove_file(&log).unwrap();
    fake_tools(dir.path(), &log, "t");
    up_in(&host, &wanted, &Overrides::default(), None, network::HostNeeds::default(), false, &mut Vec::new())
        .await
        .unwrap_err();
    let calls = std::fs::read_to_string(&log).unwrap();
    assert!(calls.contains(&unquoted(export_kubeconfig_cmd("t", &kubeconfig))), "{calls}");
    assert!(!calls.contains("kind create"), "{calls}");

    // A cluster of that name it did not create (no owner file, or another daemon's) is in use.
    for owner in [None, Some("other-id|/var/lib/docker\n")] {
        match owner {
            Some(text) => std::fs::write(owner_path(repo.path(), "t"), text).unwrap(),
            None => std::fs::remove_file(owner_path(repo.path(), "t")).unwrap(),
        }
        let err = up_in(
            &host,
            &wanted,
            &Overrides::default(),
            None,
            network::HostNeeds::default(),
            false,
            &mut Vec::new(),
        )
        .await
        .unwrap_err();
        assert!(is_usage_error(&err));
        assert_eq!(err.to_string(), name_in_use_sentence("t"));
    }
    assert_eq!(
        name_in_use_sentence("t"),
        "a kind cluster named \"t\" already exists on this Docker daemon and was not created by `cargo xtask cluster \
         up`: delete it (`cargo xtask cluster down --provider kind --name t`) if it is yours to delete, or choose \
         another name with --name (KIND_CLUSTER_NAME)."
    );

    // Containers named like the nodes, without a cluster kind lists, are a usage error too.
    fake_tools(dir.path(), &log, "");
    fake_tool(
        dir.path(),
        "docker",
        "case \"$1\" in info) echo 'engine-id|/var/lib/docker' ;; container) printf 'web\\nt-control-plane\\n' ;; esac",
    );
    let err = up_in(
        &host,
        &wanted,
        &Overrides::default(),
        None,
        network::HostNeeds::default(),
        false,
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(is_usage_error(&err));
    assert_eq!(
        err.to_string(),
        "containers named as the nodes of kind cluster \"t\" already exist (t-control-plane) though kind lists no \
         such cluster: remove them (`docker rm -f t-control-plane`) or choose another name with --name \
         (KIND_CLUSTER_NAME)."
    );
}

#[test]
fn node_names_of_a_cluster_are_recognised() {
    let names: Vec<String> = [
        "t-control-plane",
        "t-worker",
        "t-worker3",
        "t-external-load-balancer",
        "t-workers",
        "tt-worker",
        "t-web",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        node_name_conflicts("t", &names),
        ["t-control-plane", "t-worker", "t-worker3", "t-external-load-balancer"]
    );
    assert!(node_name_conflicts("dra-e2e", &names).is_empty());
}

#[test]
fn versions_and_names() {
    assert_eq!(parse_kind_version("kind v0.33.0 go1.26.8 linux/amd64\n"), Some("v0.33.0"));
    assert_eq!(
        parse_kind_version("kind v0.34.0-alpha.12+abc go1.26 linux/arm64"),
        Some("v0.34.0-alpha.12+abc")
    );
    assert_eq!(parse_kind_version("something else"), None);
    assert!(same_version("v0.33.0", "0.33.0") && same_version("0.33.0\n", "v0.33.0"));
    assert!(!same_version("v0.33.0", "v0.33.1"));
    assert!(same_version("v0.34.0-alpha.12+abc", "0.34.0-alpha.12+abc"));
    assert!(!same_version("v0.34.0-alpha.12", "v0.34.0"));
    assert!(!same_version("latest", "latest"));
    validate_name("dra-e2e").unwrap();
    validate_name("a.b-1").unwrap();
    for bad in ["", "Dra", "dra_e2e", "a b"] {
        assert!(validate_name(bad).is_err(), "{bad:?}");
    }
}

fn node(name: &str, ready: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        status: ready.map(|status| NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: status.into(),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

#[test]
fn readiness_accounts_for_every_expected_node() {
    let expected: Vec<String> = ["cp", "w1", "w2"].map(String::from).to_vec();
    let listed = [node("cp", Some("True")), node("w1", Some("False")), node("other", Some("True"))];
    assert_eq!(
        readiness(&listed, &expected),
        (false, "cp Ready, w1 NotReady, w2 not registered".to_string())
    );
    let listed = [node("cp", Some("True")), node("w1", Some("True")), node("w2", Some("True"))];
    assert!(readiness(&listed, &expected).0);
    assert!(!readiness(&[node("cp", None)], &expected[..1]).0);
}

/// A one-endpoint API server: answers every request with `nodes` as a NodeList.
async fn fake_api_server(nodes: Vec<Node>) -> (tempfile::TempDir, PathBuf) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes})
        .to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
            });
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             users:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .unwrap();
    (dir, kubeconfig)
}

#[tokio::test]
async fn wait_nodes_ready_asks_the_api_server() {
    let expected: Vec<String> = ["cp", "w1"].map(String::from).to_vec();

    let (_dir, kubeconfig) = fake_api_server(vec![node("cp", Some("True")), node("w1", Some("True"))]).await;
    wait_nodes_ready(&kubeconfig, &expected, Duration::from_secs(30)).await.unwrap();

    let (_dir, kubeconfig) = fake_api_server(vec![node("cp", Some("True")), node("w1", Some("False"))]).await;
    let err =
        wait_nodes_ready(&kubeconfig, &expected, Duration::from_millis(300)).await.unwrap_err().to_string();
    assert_eq!(
        err,
        "timed out after 300ms waiting for nodes cp, w1 to be Ready; last seen: cp Ready, w1 NotReady"
    );
}

#[test]
fn without_wait_drops_kind_s_wait_only() {
    let cmd = create_cluster_cmd("c", Path::new("k.yaml"), Some("img"), Path::new("kc"));
    assert!(cmd.to_string().ends_with(" --wait 5m"));
    let cut = without_wait(cmd).to_string();
    assert_eq!(cut, "kind create cluster --name c --config k.yaml --image img --kubeconfig kc");
}
