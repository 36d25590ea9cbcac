//! Debian's Gloo and libtorch's c10d Gloo in one process, in both orders.

use compiler_collectives_core::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use compiler_collectives_gloo_libtorch::c10d_gloo_allreduce;
use std::sync::Arc;
use std::time::Duration;

/// Two ranks of our Gloo transport as threads, on a Gloo HashStore; each
/// exchanges a rank-dependent shape and must see dim 0 dynamic.
fn debian_gloo_exchange(prefix: &str) {
    let store = GlooStore::hash().expect("hash store");
    let handles: Vec<_> = (0..2u32)
        .map(|rank| {
            let store = store.clone();
            let prefix = prefix.to_owned();
            std::thread::spawn(move || {
                let opts = GlooOptions::default()
                    .with_prefix(prefix)
                    .with_connect_timeout(Duration::from_secs(30));
                let t = GlooTransport::connect(&store, rank, 2, &opts).expect("connect");
                let mut ch = Channel::with_options(
                    Arc::new(t),
                    ChannelOptions::default().with_timeout(Duration::from_secs(30)),
                )
                .expect("channel");
                let mut s = FrameState::new();
                s.record("x", &Observation::tensor([8 + u64::from(rank), 3]));
                let merged = ch
                    .exchange("one-process", "", &s)
                    .expect("exchange")
                    .into_merged();
                ch.shutdown().expect("shutdown");
                merged.get("x").size.to_string()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("rank thread"), "(Dyn,3)");
    }
}

fn c10d_allreduce() {
    let sums = c10d_gloo_allreduce(2).expect("c10d allreduce");
    // Ranks contribute 1s and 2s over 4 elements: 4 * (1 + 2) = 12 on each.
    assert_eq!(sums, vec![12.0, 12.0]);
}

#[test]
fn c10d_then_debian_gloo_then_c10d_again() {
    c10d_allreduce();
    debian_gloo_exchange("order-a");
    c10d_allreduce();
    debian_gloo_exchange("order-a2");
}
