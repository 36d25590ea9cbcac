//! What both orders of the one-process tests run (`mod common;`).

use compiler_collectives_gloo::{GlooOptions, GlooStore};
use std::time::Duration;

/// The Gloo crate's shared test helpers.
#[path = "../../../../crates/gloo/tests/common/mod.rs"]
mod gloo;

/// `world` ranks of our Gloo transport as threads on a Gloo HashStore (with
/// the store key `prefix`, or the default one); rank r records `x` with the
/// shape `shape(r)`, exchanges it under `name` and shuts down. Each rank's
/// merged size of `x`, in rank order.
pub(crate) fn debian_gloo_exchange(
    world: u32,
    prefix: Option<&str>,
    name: &'static str,
    shape: fn(u64) -> [u64; 2],
) -> Vec<String> {
    let store = GlooStore::hash().expect("hash store");
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            let mut opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(30));
            if let Some(p) = prefix {
                opts = opts.with_prefix(p);
            }
            std::thread::spawn(move || {
                gloo::exchange_x(&store, (rank, world), &opts, name, shape(u64::from(rank)))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}
