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
