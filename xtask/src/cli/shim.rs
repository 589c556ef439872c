//! `xtask runc-shim --runc REAL [--drop CAP]… -- RUNC-ARGS…`: the command line of the engine's
//! capability shim ([`shim`]), parsed before anything else in `main`, converted into the plain
//! [`ShimOptions`] the shim runs with.

use std::{
    ffi::{OsStr, OsString},
    path::PathBuf,
    process::ExitCode,
};

use clap::Parser;

use crate::kind::engine::shim::{self, ShimOptions};

/// The shim's command line: `xtask runc-shim --runc REAL [--drop CAP]… -- RUNC-ARGS…`.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask runc-shim", about = "runc with capabilities this machine lacks removed")]
pub struct ShimArgs {
    /// The real runc.
    #[arg(long)]
    pub runc: PathBuf,
    /// A capability to remove from containers (repeatable), for example CAP_SYS_RESOURCE.
    #[arg(long = "drop", value_name = "CAP")]
    pub drop: Vec<String>,
    /// runc's own arguments, passed on unchanged.
    #[arg(last = true, allow_hyphen_values = true, value_parser = clap::value_parser!(OsString))]
    pub args: Vec<OsString>,
}

impl From<ShimArgs> for ShimOptions {
    fn from(args: ShimArgs) -> Self {
        let ShimArgs { runc, drop, args } = args;
        Self { runc, drop, args }
    }
}

/// Runs the shim if this process was started as `xtask runc-shim …` (before anything else in
/// `main`: no logging, no async runtime, every file descriptor left as runc expects it).
pub fn main_if_invoked() -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let program = argv.next()?;
    if argv.next().as_deref() != Some(OsStr::new(shim::SUBCOMMAND)) {
        return None;
    }
    let args = ShimArgs::parse_from(std::iter::once(program).chain(argv));
    Some(shim::run(args.into()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::CommandFactory;

    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_command_line_is_consistent() {
        ShimArgs::command().debug_assert();
    }

    #[test]
    fn what_the_script_runs_parses_back() {
        let text = shim::script(
            Path::new("/var/lib/dra-e2e/docker/bin/xtask"),
            Path::new("/usr/sbin/runc"),
            &[caps::Capability::CAP_SYS_RESOURCE],
        );
        assert!(
            text.contains(" runc-shim --runc /usr/sbin/runc --drop CAP_SYS_RESOURCE -- \"$@\"\n"),
            "{text}"
        );
        // What the script runs parses back into the same shim options.
        let parsed = ShimArgs::try_parse_from([
            "xtask",
            "--runc",
            "/usr/sbin/runc",
            "--drop",
            "CAP_SYS_RESOURCE",
            "--",
            "--root",
            "/r",
            "exec",
            "-p",
            "/tmp/p",
            "id",
        ])
        .unwrap();
        let options = ShimOptions::from(parsed);
        assert_eq!(options.runc, Path::new("/usr/sbin/runc"));
        assert_eq!(options.drop, ["CAP_SYS_RESOURCE"]);
        assert_eq!(options.args, os(&["--root", "/r", "exec", "-p", "/tmp/p", "id"]));
    }
}
