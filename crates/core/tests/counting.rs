//! `CountingTransport`: payload bytes per rank and the last gather's
//! longest contribution (the envelope size a benchmark reports), over a
//! transport the caller keeps using too.

use compiler_collectives_core::transport::counting::CountingTransport;
use compiler_collectives_core::{Deadline, InProcessGroup, Transport};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn counts_bytes_and_the_longest_contribution_of_the_last_gather() {
    let handles: Vec<_> = InProcessGroup::create(3)
        .unwrap()
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let t = Arc::new(t);
                let counting = CountingTransport::shared(Arc::clone(&t));
                let counts = counting.counts();
                let d = || Deadline::after(Duration::from_secs(10));
                let me = counting.rank() as usize;
                assert_eq!(counts.last_gather_longest(), 0);
                // Rank r contributes 2r + 1 bytes: 1, 3, 5.
                counting
                    .all_gather(&vec![7u8; 2 * me + 1], 64, d())
                    .unwrap();
                assert_eq!(counts.last_gather_longest(), 5);
                assert_eq!(counts.received(), 9 - (2 * me as u64 + 1));
                assert_eq!(counts.sent(), 2 * (2 * me as u64 + 1));
                // The caller's own calls on the shared transport are not counted.
                t.all_gather(&[0u8; 40], 64, d()).unwrap();
                assert_eq!(counts.last_gather_longest(), 5);
                counting.all_gather(&[], 64, d()).unwrap();
                assert_eq!(counts.last_gather_longest(), 0);
                counts.reset();
                assert_eq!((counts.received(), counts.sent()), (0, 0));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn the_sized_gather_and_broadcast_are_forwarded_and_counted() {
    let handles: Vec<_> = InProcessGroup::create(3)
        .unwrap()
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let counting = CountingTransport::new(t);
                let counts = counting.counts();
                let d = || Deadline::after(Duration::from_secs(10));
                let me = counting.rank() as usize;
                // Rank r contributes r + 1 bytes.
                let lens = [1, 2, 3];
                let got = counting
                    .all_gather_sized(&vec![7u8; me + 1], &lens, d())
                    .unwrap();
                let want: Vec<Vec<u8>> = (0..3).map(|r| vec![7u8; r + 1]).collect();
                assert_eq!(got, want);
                assert_eq!(counts.received(), 6 - (me as u64 + 1));
                assert_eq!(counts.sent(), 2 * (me as u64 + 1));
                counts.reset();
                // Rank 1 broadcasts 4 bytes.
                let out = counting.broadcast(&[9u8; 4], 1, 16, d()).unwrap();
                assert_eq!(out, [9u8; 4]);
                let want = if me == 1 { (0, 8) } else { (4, 0) };
                assert_eq!((counts.received(), counts.sent()), want);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// The names of the methods a trait or impl block declares: the `fn` lines
/// one indent deep between `header` and the block's closing brace.
fn methods(source: &str, header: &str) -> Vec<String> {
    let start = source
        .find(header)
        .unwrap_or_else(|| panic!("no {header:?}"));
    source[start..]
        .lines()
        .skip(1)
        .take_while(|l| *l != "}")
        .filter_map(|l| l.strip_prefix("    fn "))
        .map(|l| l.split(['(', '<']).next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn every_transport_method_is_forwarded_by_the_counting_wrapper() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/transport/");
    let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
    let declared = methods(&read("traits.rs"), "pub trait Transport:");
    let forwarded = methods(
        &read("counting.rs"),
        "impl<T: Transport + ?Sized> Transport for CountingTransport<T> {",
    );
    assert!(declared.len() >= 12, "{declared:?}");
    let missing: Vec<&String> = declared.iter().filter(|m| !forwarded.contains(m)).collect();
    assert!(
        missing.is_empty(),
        "CountingTransport does not forward {missing:?}: a provided method left out runs the \
         default over the wrapper instead of the inner transport's own"
    );
}
