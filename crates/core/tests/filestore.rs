//! `FileStore`: a `Store` on a directory shared by the ranks, pure Rust.

use compiler_collectives_core::{Deadline, Error, FileStore, Store};
use std::time::{Duration, Instant};

#[test]
fn file_store_set_get_add_wait_delete() {
    let dir = tempfile::tempdir().unwrap();
    let a = FileStore::new(dir.path()).unwrap();
    let b = FileStore::new(dir.path()).unwrap();
    let d = Deadline::after(Duration::from_secs(5));
    a.set("x/y", b"hello", d).unwrap();
    assert_eq!(b.get("x/y", d).unwrap(), b"hello");
    a.set("x/y", b"again", d).unwrap();
    assert_eq!(b.get("x/y", d).unwrap(), b"again");
    // Concurrent adds from two handles never lose an increment.
    let handles: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                (0..50).for_each(|_| {
                    s.add("n", 1, d).unwrap();
                })
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(a.add("n", 0, d).unwrap(), 100);
    assert!(matches!(a.add("x/y", 1, d), Err(Error::InvalidArgument(_))));
    b.wait(&["x/y", "n"], d).unwrap();
    assert!(a.delete("x/y", d).unwrap());
    assert!(!a.delete("x/y", d).unwrap());
    let start = Instant::now();
    let err = b
        .wait(&["x/y"], Deadline::after(Duration::from_millis(200)))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_millis(1200));
}

#[test]
fn file_store_takes_keys_longer_than_a_file_name() {
    // torchrun's run id is part of every key and may be long.
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path()).unwrap();
    let d = Deadline::after(Duration::from_secs(5));
    let long = format!("ccol/nccl/{}/0/unique_id", "r".repeat(300));
    let other = format!("ccol/nccl/{}/0/unique_id", "s".repeat(300));
    store.set(&long, b"one", d).unwrap();
    store.set(&other, b"two", d).unwrap();
    assert_eq!(store.get(&long, d).unwrap(), b"one");
    assert_eq!(store.get(&other, d).unwrap(), b"two");
    assert_eq!(store.add(&format!("{long}/n"), 3, d).unwrap(), 3);
    store.wait(&[long.as_str(), other.as_str()], d).unwrap();
    assert!(store.delete(&long, d).unwrap());
}

#[test]
fn file_store_reads_at_most_the_value_limit() {
    // Whoever can write the directory controls the value files.
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path())
        .unwrap()
        .with_max_value_bytes(128);
    let d = Deadline::after(Duration::from_secs(5));
    store.set("id", &[7; 128], d).unwrap();
    assert_eq!(store.get("id", d).unwrap(), [7; 128]);
    store.set("id", &[7; 129], d).unwrap();
    let err = store.get("id", d).unwrap_err();
    assert!(
        matches!(&err, Error::Backend { backend: "file-store", message, .. } if message.contains("more than 128 bytes")),
        "{err:?}"
    );
    store.set("n", &[b'1'; 129], d).unwrap();
    assert!(matches!(store.add("n", 1, d), Err(Error::Backend { .. })));
}
