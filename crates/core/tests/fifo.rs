//! A FIFO where a profile or an artifact file should be: opening it for
//! reading would block until some process writes it, so every rank would
//! wait forever. Both stores refuse anything but a regular file.

use compiler_collectives_core::persistence::artifacts::{ArtifactStore, DiskArtifacts};
use compiler_collectives_core::persistence::profile::ProfileStore;
use std::path::Path;
use std::time::Duration;

/// Makes a FIFO at `path`; `false` (the test skips) without `mkfifo`.
fn mkfifo(path: &Path) -> bool {
    match std::process::Command::new("mkfifo").arg(path).status() {
        Ok(s) if s.success() => true,
        other => {
            compiler_collectives_conformance::skip::skip_test(
                "fifo",
                compiler_collectives_conformance::skip::Missing::install(format!(
                    "mkfifo (coreutils) is not available here ({other:?})"
                )),
            );
            false
        }
    }
}

/// Runs `read` on a thread; its error text, failing if it takes over 5 s.
fn error_within_5_s<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read());
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Err(e)) => e,
        Ok(Ok(_)) => panic!("a FIFO was read as a file"),
        Err(_) => panic!("still blocked on the FIFO after 5 s"),
    }
}

#[test]
fn a_fifo_in_place_of_the_profile_is_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = ProfileStore::open(tmp.path()).expect("store");
    if !mkfifo(&store.path()) {
        return;
    }
    let err = error_within_5_s(move || store.load().map_err(|e| e.to_string()));
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn a_fifo_in_place_of_an_artifact_is_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = DiskArtifacts::open(tmp.path()).expect("store");
    if !mkfifo(&store.path_of("k")) {
        return;
    }
    let err = error_within_5_s(move || store.load("k").map_err(|e| e.to_string()));
    assert!(err.contains("not a regular file"), "{err}");
}
