//! The in-process `Store`: set/get/add/wait/delete with deadlines.

use compiler_collectives_core::{Deadline, Error, InProcessStore, Store};
use std::time::{Duration, Instant};

fn soon() -> Deadline {
    Deadline::after(Duration::from_secs(5))
}

#[test]
fn set_then_get_returns_the_value() {
    let s = InProcessStore::new();
    s.set("k", b"v1", soon()).unwrap();
    assert_eq!(s.get("k", soon()).unwrap(), b"v1");
    s.set("k", b"v2", soon()).unwrap();
    assert_eq!(s.get("k", soon()).unwrap(), b"v2");
}

#[test]
fn get_waits_for_a_later_set_from_another_thread() {
    let s = InProcessStore::new();
    let writer = s.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        writer.set("late", b"here", soon()).unwrap();
    });
    assert_eq!(s.get("late", soon()).unwrap(), b"here");
    t.join().unwrap();
}

#[test]
fn get_of_a_missing_key_times_out_at_the_deadline() {
    let s = InProcessStore::new();
    let start = Instant::now();
    let err = s
        .get("never", Deadline::after(Duration::from_millis(100)))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(100));
}

#[test]
fn add_counts_atomically_across_threads() {
    let s = InProcessStore::new();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                for _ in 0..100 {
                    s.add("n", 1, soon()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.add("n", 0, soon()).unwrap(), 800);
    assert_eq!(s.add("n", -5, soon()).unwrap(), 795);
    assert_eq!(s.get("n", soon()).unwrap(), b"795");
}

#[test]
fn add_on_a_non_counter_is_an_invalid_argument() {
    let s = InProcessStore::new();
    s.set("text", b"abc", soon()).unwrap();
    assert!(matches!(
        s.add("text", 1, soon()),
        Err(Error::InvalidArgument(_))
    ));
    s.set("big", i64::MAX.to_string().as_bytes(), soon())
        .unwrap();
    assert!(matches!(
        s.add("big", 1, soon()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn wait_returns_once_every_key_is_set() {
    let s = InProcessStore::new();
    s.set("a", b"", soon()).unwrap();
    let err = s
        .wait(&["a", "b"], Deadline::after(Duration::from_millis(50)))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }));
    s.set("b", b"", soon()).unwrap();
    s.wait(&["a", "b"], soon()).unwrap();
}

#[test]
fn delete_reports_whether_the_key_existed() {
    let s = InProcessStore::new();
    s.set("k", b"v", soon()).unwrap();
    assert!(s.delete("k", soon()).unwrap());
    assert!(!s.delete("k", soon()).unwrap());
    assert!(s.is_empty());
}

#[test]
fn store_is_usable_as_a_trait_object() {
    let s: Box<dyn Store> = Box::new(InProcessStore::new());
    s.set("k", b"v", soon()).unwrap();
    assert_eq!(s.get("k", soon()).unwrap(), b"v");
}

#[test]
fn get_within_returns_a_value_up_to_its_bound_and_refuses_a_longer_one() {
    let s = InProcessStore::new();
    s.set("k", &[1u8; 10], soon()).unwrap();
    assert_eq!(s.get_within("k", 10, soon()).unwrap(), [1u8; 10]);
    match s.get_within("k", 9, soon()) {
        Err(Error::Decode { rank: None, reason }) => assert_eq!(
            reason.to_string(),
            "value is 10 bytes, over the limit of 9 bytes"
        ),
        other => panic!("{other:?}"),
    }
}
