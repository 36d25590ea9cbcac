//! The on-disk artifact store's bounds: what it refuses to write, and the
//! temporary files killed writers leave.

use compiler_collectives_core::persistence::artifacts::{
    ArtifactStore, DiskArtifacts, STALE_TEMP_AGE,
};
use std::time::SystemTime;

#[test]
fn an_artifact_over_the_read_limit_is_refused_not_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DiskArtifacts::open(dir.path())
        .expect("open")
        .with_max_bytes(64);
    // 8 magic + 4 length + 3 key + 49 bytes = 64: the largest that reads back.
    store.store("key", &[7; 49]).expect("at the limit");
    assert_eq!(store.load("key").expect("load"), Some(vec![7; 49]));
    let e = store.store("big", &[7; 50]).expect_err("one byte over");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("65 bytes is over"), "{e}");
    assert!(!store.path_of("big").exists());
    assert_eq!(store.load("big").expect("load"), None);
}

#[test]
fn opening_removes_only_stale_temporary_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let stale = dir.path().join(".ccol-artifact-tmp-killed");
    let fresh = dir.path().join(".ccol-artifact-tmp-writing");
    let other = dir.path().join("notes.txt");
    for p in [&stale, &fresh, &other] {
        std::fs::write(p, b"partial").expect("write");
    }
    let old = SystemTime::now() - STALE_TEMP_AGE - std::time::Duration::from_secs(1);
    for p in [&stale, &other] {
        std::fs::File::options()
            .write(true)
            .open(p)
            .and_then(|f| f.set_modified(old))
            .expect("set mtime");
    }
    DiskArtifacts::open(dir.path()).expect("open");
    assert!(!stale.exists(), "a killed writer's file stays");
    assert!(fresh.exists(), "a live writer's file was removed");
    assert!(other.exists(), "a file that is not the store's was removed");
}
