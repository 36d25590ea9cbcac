//! What the Gloo test files share (`mod common;`); the one-process tests of
//! `tests/gloo-libtorch` include it by path.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use std::sync::Arc;
use std::time::Duration;

/// One rank of our Gloo transport, connected over `store` with `opts`:
/// records `x` with the shape `shape`, exchanges it under `name` (a 30 s
/// channel timeout) and shuts down. Its merged size of `x`.
pub(crate) fn exchange_x(
    store: &GlooStore,
    (rank, world): (u32, u32),
    opts: &GlooOptions,
    name: &str,
    shape: [u64; 2],
) -> String {
    let t = GlooTransport::connect(store, rank, world, opts).expect("connect");
    let mut ch = Channel::with_options(
        Arc::new(t),
        ChannelOptions::default().with_timeout(Duration::from_secs(30)),
    )
    .expect("channel");
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor(shape));
    let merged = ch.exchange(name, &s).expect("exchange").into_merged();
    ch.shutdown().expect("shutdown");
    merged.get("x").size.to_string()
}
