//! The capability shim: the runtime the engine's dockerd uses when root lacks a capability.
//!
//! dockerd asks runc for every capability the kernel knows when it starts a `--privileged`
//! container (or execs into one); where root's bounding set lacks one (`CAP_SYS_RESOURCE` on the
//! sandboxes this project first ran on), runc fails with "unable to apply caps". The shim is a
//! two-line script in the engine's directory, registered as dockerd's default runtime, that runs
//! `cargo xtask`'s own binary as `xtask runc-shim --runc REAL --drop CAP… -- ARGS…`. That removes
//! the named capabilities from the bundle's `config.json` (on `create` and `run`) or from the
//! `--process` file (on `exec`), and then execs the real runc with every argument unchanged. Any
//! other runc call (state, kill, delete, …) is passed through untouched.

use std::{
    ffi::{OsStr, OsString},
    fs,
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, Result};
use caps::Capability;
use serde_json::Value;

use super::super::shell_quote;

/// The name dockerd knows the shim's runtime by (`--add-runtime` / `--default-runtime`).
pub const RUNTIME_NAME: &str = "dra-e2e-runc";

/// The subcommand of `cargo xtask` the shim script runs (hidden: only the script calls it).
pub const SUBCOMMAND: &str = "runc-shim";

/// What the shim was asked to do (`xtask runc-shim --runc REAL [--drop CAP]… -- RUNC-ARGS…`,
/// parsed by the command line layer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShimOptions {
    /// The real runc.
    pub runc: PathBuf,
    /// The capabilities to remove from containers, for example CAP_SYS_RESOURCE.
    pub drop: Vec<String>,
    /// runc's own arguments, passed on unchanged.
    pub args: Vec<OsString>,
}

/// The text of the shim script: run `xtask` as the shim with `runc` and the capabilities to drop.
pub fn script(xtask: &Path, runc: &Path, drop: &[Capability]) -> String {
    let drops: String = drop.iter().map(|cap| format!(" --drop {cap}")).collect();
    let caps: Vec<String> = drop.iter().map(Capability::to_string).collect();
    format!(
        "#!/bin/sh\n\
         # The runtime of dra-e2e's own Docker engine (written by `cargo xtask docker up`): removes\n\
         # {caps}, which root lacks on this machine, from each container's capabilities, then runs\n\
         # the real runc with every argument unchanged.\n\
         exec {xtask} {SUBCOMMAND} --runc {runc}{drops} -- \"$@\"\n",
        caps = caps.join(", "),
        xtask = shell_quote(xtask.as_os_str()),
        runc = shell_quote(runc.as_os_str()),
    )
}

/// Writes the shim into `dir`: a copy of the running xtask binary, so that the shim
/// keeps working when `cargo` rebuilds or cleans its target directory, and the script that runs
/// it. Returns the script's path.
pub fn install(dir: &Path, runc: &Path, drop: &[Capability]) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let binary = dir.join("xtask");
    crate::repo::copy_running_xtask(&binary)?;
    let path = dir.join(RUNTIME_NAME);
    fs::write(&path, script(&binary, runc, drop)).with_context(|| format!("write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("make {} executable", path.display()))?;
    Ok(path)
}

/// The JSON file a runc call reads capabilities from, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `create`/`run`: the bundle's `config.json` (an OCI runtime spec).
    Config(PathBuf),
    /// `exec --process FILE`: an OCI process.
    Process(PathBuf),
    /// Anything else: passed through untouched.
    None,
}

/// runc's global options that take a value (`--root DIR`, …); the rest are booleans.
const GLOBAL_WITH_VALUE: [&str; 5] = ["root", "log", "log-format", "criu", "rootless"];

/// Splits `-name`, `--name` or `--name=value` into the name and the inline value.
fn flag(arg: &OsStr) -> Option<(&str, Option<&str>)> {
    let text = arg.to_str()?;
    let name = text.strip_prefix("--").or_else(|| text.strip_prefix('-'))?;
    if name.is_empty() {
        return None;
    }
    Some(match name.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (name, None),
    })
}

/// The value of the first of `names` among `args` (inline or the next argument).
fn option_value<'a>(args: &'a [OsString], names: &[&str]) -> Option<&'a OsStr> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if let Some((name, inline)) = flag(arg)
            && names.contains(&name)
        {
            return match inline {
                Some(value) => Some(OsStr::new(value)),
                None => iter.next().map(OsString::as_os_str),
            };
        }
    }
    None
}

/// Which file of a runc call to edit: finds the subcommand after runc's global options, then its
/// `--bundle`/`-b` (default: the working directory `cwd`) or `--process`/`-p`.
pub fn target(args: &[OsString], cwd: &Path) -> Target {
    let mut index = 0;
    while let Some(arg) = args.get(index) {
        match flag(arg) {
            Some((name, None)) if GLOBAL_WITH_VALUE.contains(&name) => index += 2,
            Some(_) => index += 1,
            None => break,
        }
    }
    let Some(subcommand) = args.get(index).and_then(|a| a.to_str()) else { return Target::None };
    let rest = &args[index + 1..];
    match subcommand {
        "create" | "run" => {
            let bundle =
                option_value(rest, &["bundle", "b"]).map_or_else(|| cwd.to_path_buf(), |b| cwd.join(b));
            Target::Config(bundle.join("config.json"))
        }
        "exec" => match option_value(rest, &["process", "p"]) {
            Some(file) => Target::Process(cwd.join(file)),
            None => Target::None,
        },
        _ => Target::None,
    }
}

/// Removes the `drop` capabilities from every set (bounding, effective, …) of a capabilities
/// object; whether anything was removed.
fn drop_caps(capabilities: Option<&mut Value>, drop: &[String]) -> bool {
    let Some(Value::Object(sets)) = capabilities else { return false };
    let mut changed = false;
    for set in sets.values_mut() {
        if let Value::Array(caps) = set {
            let before = caps.len();
            caps.retain(|cap| !cap.as_str().is_some_and(|name| drop.iter().any(|d| d == name)));
            changed |= caps.len() != before;
        }
    }
    changed
}

/// The edited text of a JSON document whose capabilities object is at `pointer`, or None when it
/// has none of the `drop` capabilities.
fn edit(text: &str, pointer: &str, drop: &[String]) -> Result<Option<String>> {
    let mut doc: Value = serde_json::from_str(text).context("not valid JSON")?;
    if !drop_caps(doc.pointer_mut(pointer), drop) {
        return Ok(None);
    }
    Ok(Some(serde_json::to_string(&doc).context("cannot serialise the edited JSON")?))
}

/// A bundle's `config.json` without the `drop` capabilities (`process.capabilities`), or None
/// when there is nothing to remove.
pub fn edit_config(text: &str, drop: &[String]) -> Result<Option<String>> {
    edit(text, "/process/capabilities", drop)
}

/// An `exec --process` file without the `drop` capabilities (`capabilities`), or None when there
/// is nothing to remove.
pub fn edit_process(text: &str, drop: &[String]) -> Result<Option<String>> {
    edit(text, "/capabilities", drop)
}

/// Edits `path` in place (through a temporary file in the same directory, keeping its mode).
fn edit_file(
    path: &Path,
    drop: &[String],
    edit: fn(&str, &[String]) -> Result<Option<String>>,
) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let Some(edited) = edit(&text, drop).with_context(|| format!("edit {}", path.display()))? else {
        return Ok(());
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".dra-e2e-shim");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, edited).with_context(|| format!("write {}", tmp.display()))?;
    if let Ok(meta) = fs::metadata(path) {
        let _ = fs::set_permissions(&tmp, meta.permissions());
    }
    fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))
}

/// `xtask runc-shim …`: edits the call's JSON file, then execs the real runc; returns only if
/// that fails (with the reason on stderr, where containerd's shim picks it up).
pub fn run(args: ShimOptions) -> ExitCode {
    match prepare(&args) {
        Ok(()) => {
            let err = std::process::Command::new(&args.runc).args(&args.args).exec();
            eprintln!("dra-e2e runc shim: cannot run {}: {err}", args.runc.display());
        }
        Err(err) => eprintln!("dra-e2e runc shim: {err:#}"),
    }
    ExitCode::FAILURE
}

fn prepare(args: &ShimOptions) -> Result<()> {
    if args.drop.is_empty() {
        return Ok(());
    }
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    match target(&args.args, &cwd) {
        Target::Config(path) => edit_file(&path, &args.drop, edit_config),
        Target::Process(path) => edit_file(&path, &args.drop, edit_process),
        Target::None => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn drop() -> Vec<String> {
        vec!["CAP_SYS_RESOURCE".to_string()]
    }

    #[test]
    fn finds_the_file_of_create_run_and_exec() {
        let cwd = Path::new("/run/bundle-cwd");
        // As containerd's runc shim (go-runc) calls it.
        let create = os(&[
            "--root",
            "/run/dra-e2e-docker/exec/runtime-dra-e2e-runc/moby",
            "--log",
            "/run/x/log.json",
            "--log-format",
            "json",
            "create",
            "--bundle",
            "/run/x/bundle",
            "--pid-file",
            "/run/x/init.pid",
            "abc123",
        ]);
        assert_eq!(target(&create, cwd), Target::Config("/run/x/bundle/config.json".into()));
        let inline = os(&["--root=/r", "--systemd-cgroup", "run", "-b", "rel", "id"]);
        assert_eq!(target(&inline, cwd), Target::Config("/run/bundle-cwd/rel/config.json".into()));
        let no_bundle = os(&["--debug", "create", "id"]);
        assert_eq!(target(&no_bundle, cwd), Target::Config("/run/bundle-cwd/config.json".into()));
        let exec = os(&[
            "--root",
            "/r",
            "--log",
            "/l",
            "--log-format",
            "json",
            "exec",
            "--process",
            "/tmp/runc-process123",
            "--detach",
            "--pid-file",
            "/p",
            "abc123",
        ]);
        assert_eq!(target(&exec, cwd), Target::Process("/tmp/runc-process123".into()));
        assert_eq!(target(&os(&["exec", "--process=/tmp/p", "id"]), cwd), Target::Process("/tmp/p".into()));
        assert_eq!(target(&os(&["exec", "id", "sh"]), cwd), Target::None);
        for other in [&["--root", "/r", "state", "id"][..], &["delete", "--force", "id"], &["--version"], &[]]
        {
            assert_eq!(target(&os(other), cwd), Target::None, "{other:?}");
        }
    }

    #[test]
    fn removes_the_capability_from_every_set_of_a_config() {
        let caps = r#"["CAP_CHOWN","CAP_SYS_RESOURCE","CAP_SYS_ADMIN"]"#;
        let config = format!(
            r#"{{"ociVersion":"1.0.2","process":{{"user":{{"uid":0,"gid":0}},"args":["sh"],"capabilities":{{"bounding":{caps},"effective":{caps},"inheritable":{caps},"permitted":{caps}}},"rlimits":[{{"type":"RLIMIT_NOFILE","hard":18446744073709551615,"soft":1048576}}]}},"root":{{"path":"rootfs"}}}}"#
        );
        let edited = edit_config(&config, &drop()).unwrap().unwrap();
        let doc: Value = serde_json::from_str(&edited).unwrap();
        for set in ["bounding", "effective", "inheritable", "permitted"] {
            assert_eq!(
                doc["process"]["capabilities"][set],
                serde_json::json!(["CAP_CHOWN", "CAP_SYS_ADMIN"]),
                "{set}"
            );
        }
        // Everything else is kept, also 64-bit limits.
        assert_eq!(doc["process"]["rlimits"][0]["hard"].as_u64(), Some(u64::MAX));
        assert_eq!(doc["root"]["path"], "rootfs");
        assert_eq!(doc["process"]["args"], serde_json::json!(["sh"]));
        // Nothing to remove (an unprivileged container): the file stays as it is.
        assert_eq!(edit_config(&edited, &drop()).unwrap(), None);
        assert_eq!(edit_config(r#"{"process":{"args":["sh"]}}"#, &drop()).unwrap(), None);
        assert!(edit_config("{not json", &drop()).is_err());
    }

    #[test]
    fn removes_the_capability_from_an_exec_process() {
        let process = r#"{"args":["sh","-c","true"],"cwd":"/","capabilities":{"bounding":["CAP_SYS_RESOURCE","CAP_KILL"],"effective":["CAP_SYS_RESOURCE"],"ambient":[]}}"#;
        let edited = edit_process(process, &drop()).unwrap().unwrap();
        let doc: Value = serde_json::from_str(&edited).unwrap();
        assert_eq!(doc["capabilities"]["bounding"], serde_json::json!(["CAP_KILL"]));
        assert_eq!(doc["capabilities"]["effective"], serde_json::json!([]));
        assert_eq!(doc["args"], serde_json::json!(["sh", "-c", "true"]));
        // A config's pointer does not match a process file and vice versa.
        assert_eq!(edit_config(process, &drop()).unwrap(), None);
    }

    #[test]
    fn edits_files_in_place_and_keeps_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        fs::write(&config, r#"{"process":{"capabilities":{"bounding":["CAP_SYS_RESOURCE"]}}}"#).unwrap();
        fs::set_permissions(&config, fs::Permissions::from_mode(0o600)).unwrap();
        let args = ShimOptions {
            runc: "/bin/true".into(),
            drop: drop(),
            args: os(&["create", "--bundle", dir.path().to_str().unwrap(), "id"]),
        };
        prepare(&args).unwrap();
        assert_eq!(fs::read_to_string(&config).unwrap(), r#"{"process":{"capabilities":{"bounding":[]}}}"#);
        assert_eq!(fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
        // A missing file is an error that names it.
        let missing = ShimOptions { args: os(&["exec", "--process", "/nonexistent/p", "id"]), ..args };
        assert!(format!("{:#}", prepare(&missing).unwrap_err()).contains("/nonexistent/p"));
    }

    #[test]
    fn the_script_passes_every_argument_on() {
        let text = script(
            Path::new("/var/lib/dra-e2e/docker/bin/xtask"),
            Path::new("/usr/sbin/runc"),
            &[Capability::CAP_SYS_RESOURCE],
        );
        assert!(text.starts_with("#!/bin/sh\n"), "{text}");
        assert!(
            text.ends_with(
                "\nexec /var/lib/dra-e2e/docker/bin/xtask runc-shim --runc /usr/sbin/runc --drop CAP_SYS_RESOURCE -- \"$@\"\n"
            ),
            "{text}"
        );
        let quoted = script(Path::new("/a b/xtask"), Path::new("/usr/sbin/runc"), &[]);
        assert!(quoted.contains("exec '/a b/xtask' runc-shim"), "{quoted}");
    }

    #[cfg(unix)]
    #[test]
    fn the_script_runs_the_binary_with_the_arguments() {
        // A stand-in "xtask" that prints its arguments, one per line.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("xtask");
        fs::write(&fake, "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n").unwrap();
        fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
        let shim = dir.path().join("shim");
        fs::write(&shim, script(&fake, Path::new("/usr/sbin/runc"), &[Capability::CAP_SYS_RESOURCE]))
            .unwrap();
        fs::set_permissions(&shim, fs::Permissions::from_mode(0o755)).unwrap();
        let out =
            std::process::Command::new(&shim).args(["exec", "--process", "/tmp/a b", "id"]).output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            "runc-shim\n--runc\n/usr/sbin/runc\n--drop\nCAP_SYS_RESOURCE\n--\nexec\n--process\n/tmp/a b\nid\n"
        );
    }
}
