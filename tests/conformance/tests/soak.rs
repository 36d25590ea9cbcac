//! In-process soak: 2 ranks (threads), 1,000 warm-up exchanges, then
//! 100,000 more; resident memory may grow by less than 1 MiB. Its own test
//! binary, so nothing else allocates in the process meanwhile.

use compiler_collectives_conformance::process::soak;
use compiler_collectives_core::{Channel, ChannelOptions, InProcessGroup};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const WARMUP: u64 = 1_000;
const EXCHANGES: u64 = 100_000;
const MAX_GROWTH_KIB: u64 = 1024;

#[test]
fn in_process_soak_keeps_memory_flat() {
    let ranks = InProcessGroup::create(2).expect("group");
    let start = Instant::now();
    // Both ranks measure between the same two barriers, so the process's
    // RSS is read while neither rank is mid-exchange.
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let opts = ChannelOptions::default().with_timeout(Duration::from_secs(60));
                let mut ch = Channel::with_options(Arc::new(t), opts).map_err(|e| e.to_string())?;
                barrier.wait();
                soak(&mut ch, WARMUP, EXCHANGES)
            })
        })
        .collect();
    let results: Vec<(u64, u64)> = handles
        .into_iter()
        .map(|h| h.join().expect("rank thread").expect("soak"))
        .collect();
    let before = results.iter().map(|r| r.0).min().expect("two ranks");
    let after = results.iter().map(|r| r.1).max().expect("two ranks");
    let growth = after.saturating_sub(before);
    println!(
        "in-process soak: {WARMUP} warm-up + {EXCHANGES} exchanges x 2 ranks in {:.1} s; \
         VmRSS {before} KiB -> {after} KiB (+{growth} KiB, limit {MAX_GROWTH_KIB} KiB)",
        start.elapsed().as_secs_f64()
    );
    assert!(growth < MAX_GROWTH_KIB, "RSS grew by {growth} KiB");
}
