//! The adapter embedded in this crate (feature `embedded-adapter`), written
//! to a private cache file on first use.

use crate::GlooError;
use std::path::{Path, PathBuf};

static ADAPTER: &[u8] = include_bytes!(env!("CCOL_GLOO_ADAPTER_SO"));

/// Writes the adapter into the first usable cache directory (see
/// [`cache_dirs`]); its path.
///
/// # Errors
/// [`GlooError::Load`] naming each directory and why it was not usable.
pub(super) fn write() -> Result<PathBuf, GlooError> {
    let mut errors = Vec::new();
    cache_dirs()
        .into_iter()
        .find_map(|d| match write_adapter(&d) {
            Ok(p) => Some(p),
            Err(e) => {
                errors.push(format!("{}: {e}", d.display()));
                None
            }
        })
        .ok_or_else(|| GlooError::Load(format!("cannot write the adapter: {}", errors.join("; "))))
}

/// Where the adapter is written: the project's cache directories in core's
/// order ([`compiler_collectives_core::persistence::paths::cache_dirs`]: `$CCOL_CACHE`, else
/// `$XDG_CACHE_HOME/compiler-collectives`, else `$HOME/.cache/compiler-collectives`),
/// else `compiler-collectives-<uid>` in the temporary directory. A directory is
/// used only if this user owns it and nobody else can write it (see [`private_dir`]).
fn cache_dirs() -> Vec<PathBuf> {
    let mut dirs = compiler_collectives_core::persistence::paths::cache_dirs();
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    dirs.push(std::env::temp_dir().join(format!("compiler-collectives-{uid}")));
    dirs
}

/// Creates `dir` (mode 0700) if needed and checks that it is a directory
/// owned by this user that no other user can write: another user who could
/// write it could plant a library in it for this process to load.
///
/// # Errors
/// An I/O error, or `PermissionDenied` naming what is wrong.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "not a private directory (owner uid {}, mode {:o}; this process runs as uid {uid}): \
                 the adapter library is only written to and loaded from a directory that no \
                 other user can write",
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Writes the embedded adapter into `dir` unless an identical file is
/// already there, and returns its path. A file of that name with other
/// contents (a stale or planted one) is replaced.
fn write_adapter(dir: &Path) -> std::io::Result<PathBuf> {
    private_dir(dir)?;
    let digest = xxhash_rust::xxh3::xxh3_64(ADAPTER);
    let path = dir.join(format!("gloo-adapter-{digest:016x}.so"));
    let same = std::fs::symlink_metadata(&path)
        .is_ok_and(|m| m.is_file() && m.len() == ADAPTER.len() as u64)
        && std::fs::read(&path).is_ok_and(|bytes| bytes == ADAPTER);
    if same {
        return Ok(path);
    }
    // Write under a unique name, then rename: concurrent ranks never load a
    // half-written file.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".gloo-adapter-{digest:016x}."))
        .tempfile_in(dir)?;
    std::io::Write::write_all(&mut tmp, ADAPTER)?;
    tmp.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("shared");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = write_adapter(&dir).expect_err("a world-writable directory");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("mode 777"), "{e}");
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } != 0 {
            println!("skipped: only root can give a directory to another user");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("theirs");
        std::fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let e = write_adapter(&dir).expect_err("another user's directory");
        assert!(e.to_string().contains("owner uid 65534"), "{e}");
    }

    #[test]
    fn a_planted_file_of_the_right_size_is_replaced() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        let digest = xxhash_rust::xxh3::xxh3_64(ADAPTER);
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let planted = dir.join(format!("gloo-adapter-{digest:016x}.so"));
        std::fs::write(&planted, vec![0u8; ADAPTER.len()]).expect("plant");
        let path = write_adapter(&dir).expect("write");
        assert_eq!(path, planted);
        assert!(std::fs::read(&path).expect("read") == ADAPTER);
    }
}
