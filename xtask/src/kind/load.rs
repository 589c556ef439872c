//! `cluster load --provider kind ARCHIVE…`: `kind load image-archive --name N ARCHIVE` for each
//! archive (kind imports it into every node's containerd); `--dry-run` prints the commands.

use std::{io::Write, path::PathBuf};

use tracing::info;

use super::{KindOptions, LOAD_TIMEOUT, host::Host, load_archive_cmd, validate_name, write_lines};

/// Loads `archives` into every node of the kind cluster.
pub async fn load_archives(args: &KindOptions, archives: &[PathBuf], dry_run: bool) -> anyhow::Result<()> {
    load_in(&Host::current(), args, archives, dry_run, &mut std::io::stdout()).await
}

async fn load_in(
    host: &Host,
    args: &KindOptions,
    archives: &[PathBuf],
    dry_run: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    validate_name(&args.name)?;
    let cmds: Vec<_> = archives.iter().map(|a| load_archive_cmd(&args.name, a)).collect();
    if dry_run {
        return write_lines(out, &cmds.iter().map(ToString::to_string).collect::<Vec<_>>());
    }
    let tools = host.tools(args.kind_version.as_deref(), args.kind_from_path).await?;
    for (cmd, archive) in cmds.iter().zip(archives) {
        tools.run(cmd, LOAD_TIMEOUT).await?;
        info!("loaded {} into kind cluster {:?}", archive.display(), args.name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dry_run_prints_one_kind_load_per_archive() {
        let args =
            KindOptions { name: "dra-e2e".into(), image: None, kind_version: None, kind_from_path: false };
        let archives = [PathBuf::from("/tmp/a.tar"), PathBuf::from("/tmp/b c.tar")];
        let mut out = Vec::new();
        // A host without docker or kind: the dry run must not need them.
        let host = Host::current();
        load_in(&host, &args, &archives, true, &mut out).await.unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "kind load image-archive --name dra-e2e /tmp/a.tar\nkind load image-archive --name dra-e2e '/tmp/b c.tar'\n"
        );
    }
}
