//! The input of `cluster load`: image archives as `docker save` writes them (manifest.json with
//! RepoTags) or OCI image layouts in a tar (oci-layout and index.json), uncompressed, which is
//! what both `ctr images import` and `kind load image-archive` read. Each file is checked before
//! anything is imported, so bad input is one sentence and no node is half-loaded.

use std::{fs::File, io::Read, path::Path};

use crate::usage::UsageError;

/// Which format an archive has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `docker save`: manifest.json at the top.
    Docker,
    /// An OCI image layout: oci-layout and index.json at the top.
    Oci,
}

/// Checks every archive; the first bad one is the error.
pub fn check(archives: &[std::path::PathBuf]) -> Result<Vec<Format>, UsageError> {
    if archives.is_empty() {
        return Err(UsageError::new("cluster load needs at least one image archive"));
    }
    archives.iter().map(|a| format_of(a)).collect()
}

/// The format of one archive, or why it is not an image archive.
pub fn format_of(path: &Path) -> Result<Format, UsageError> {
    let shown = path.display();
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(UsageError::new(format!("{shown} does not exist")));
        }
        Err(e) => return Err(UsageError::new(format!("cannot open {shown}: {e}"))),
    };
    if path.is_dir() {
        return Err(UsageError::new(format!("{shown} is a directory, not an image archive (a tar file)")));
    }
    let mut magic = [0u8; 2];
    if file.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b] {
        return Err(UsageError::new(format!(
            "{shown} is gzip-compressed; decompress it first (gunzip), cluster load takes a plain tar"
        )));
    }
    let not_image = || {
        UsageError::new(format!(
            "{shown} is not an image archive (a tar with manifest.json, as docker save writes, or an OCI layout with index.json)"
        ))
    };
    let file = File::open(path).map_err(|e| UsageError::new(format!("cannot open {shown}: {e}")))?;
    let mut archive = tar::Archive::new(file);
    let entries = archive.entries().map_err(|_| not_image())?;
    let (mut manifest, mut index, mut layout) = (false, false, false);
    for entry in entries {
        let entry = entry.map_err(|_| not_image())?;
        let name = entry.path().map_err(|_| not_image())?;
        let name = name.to_string_lossy();
        match name.trim_start_matches("./") {
            "manifest.json" => manifest = true,
            "index.json" => index = true,
            "oci-layout" => layout = true,
            _ => {}
        }
    }
    if manifest {
        Ok(Format::Docker)
    } else if index && layout {
        Ok(Format::Oci)
    } else {
        Err(not_image())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(dir: &Path, name: &str, files: &[&str]) -> std::path::PathBuf {
        let path = dir.join(name);
        let mut builder = tar::Builder::new(File::create(&path).unwrap());
        for file in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(2);
            h.set_mode(0o644);
            builder.append_data(&mut h, file, &b"{}"[..]).unwrap();
        }
        builder.into_inner().unwrap();
        path
    }

    #[test]
    fn docker_and_oci_archives_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let docker = tar_with(dir.path(), "d.tar", &["manifest.json", "abc.json"]);
        let oci = tar_with(dir.path(), "o.tar", &["./oci-layout", "./index.json", "blobs/sha256/x"]);
        assert_eq!(format_of(&docker).unwrap(), Format::Docker);
        assert_eq!(format_of(&oci).unwrap(), Format::Oci);
        assert_eq!(check(&[docker, oci]).unwrap(), [Format::Docker, Format::Oci]);
    }

    #[test]
    fn bad_input_is_one_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.tar");
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a tar at all, but long enough to be read as a tar header block").unwrap();
        let other_tar = tar_with(dir.path(), "other.tar", &["hello.txt"]);
        let gz = dir.path().join("x.tar.gz");
        std::fs::write(&gz, [0x1f, 0x8b, 8, 0]).unwrap();
        for (path, expected) in [
            (&missing, "does not exist"),
            (&text, "is not an image archive"),
            (&other_tar, "is not an image archive"),
            (&gz, "gzip-compressed"),
            (&dir.path().to_path_buf(), "is a directory"),
        ] {
            let err = format_of(path).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
            assert!(!err.contains('\n'), "one sentence: {err}");
        }
        assert!(check(&[]).is_err());
    }
}
