//! Debian's Gloo first in a fresh process, then libtorch's c10d Gloo.

use compiler_collectives_core::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use compiler_collectives_gloo_libtorch::c10d_gloo_allreduce;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn debian_gloo_then_c10d() {
    let store = GlooStore::hash().expect("hash store");
    let handles: Vec<_> = (0..3u32)
        .map(|rank| {
            let store = store.clone();
            std::thread::spawn(move || {
                let opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(30));
                let t = GlooTransport::connect(&store, rank, 3, &opts).expect("connect");
                let mut ch = Channel::with_options(
                    Arc::new(t),
                    ChannelOptions::default().with_timeout(Duration::from_secs(30)),
                )
                .expect("channel");
                let mut s = FrameState::new();
                s.record("x", &Observation::tensor([4, 2 + u64::from(rank)]));
                let merged = ch
                    .exchange("debian-first", "", &s)
                    .expect("exchange")
                    .into_merged();
                merged.get("x").size.to_string()
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("rank thread"), "(4,Dyn)");
    }
    let sums = c10d_gloo_allreduce(3).expect("c10d allreduce");
    // 4 elements × (1 + 2 + 3).
    assert_eq!(sums, vec![24.0, 24.0, 24.0]);
}
