//! The hierarchical (tree) exchange: where it runs, and that it gives the
//! flat exchange's results and errors.

use super::state;
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::{Channel, ChannelOptions, FlatReason, Topology};
use std::sync::Arc;

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[TREE_EXCHANGE_MATCHES_FLAT];

behaviour!(
    TREE_EXCHANGE_MATCHES_FLAT = tree_exchange_matches_flat,
    min_world: 2, timed: false, needs: []
);
/// The hierarchical (tree) exchange over this transport's send/recv gives the
/// flat exchange's result: merged values, fast path, desync text.
fn tree_exchange_matches_flat(ctx: &Ctx) -> Result<(), String> {
    let channel = |from: u32| {
        Channel::with_options(
            Arc::clone(&ctx.transport),
            ChannelOptions::default()
                .with_timeout(ctx.timeout)
                .with_hierarchical_from(from),
        )
        .map_err(|e| e.to_string())
    };
    let (mut tree, mut flat) = (channel(2)?, channel(u32::MAX)?);
    // The tree runs only over cheap point-to-point; elsewhere the channel
    // says why it stays flat.
    let want = if ctx.transport.capabilities().cheap_point_to_point {
        Topology::Tree
    } else {
        Topology::Flat(FlatReason::NoCheapPointToPoint {
            backend: ctx.transport.backend(),
        })
    };
    ensure(*tree.topology() == want, || {
        format!("tree channel: {:?}, want {want:?}", tree.topology())
    })?;
    let below = Topology::Flat(FlatReason::BelowHierarchicalFrom {
        world: ctx.world(),
        from: u32::MAX,
    });
    ensure(*flat.topology() == below, || {
        format!("flat channel: {:?}", flat.topology())
    })?;
    let local = state(5 + u64::from(ctx.rank()));
    for (ch, what) in [(&mut tree, "tree"), (&mut flat, "flat")] {
        let g = ch
            .exchange_with(
                "step",
                &local,
                &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
            )
            .map_err(|e| format!("{what}: {e}"))?;
        ensure(!g.fast_path(), || {
            format!("{what}: fast path on differing states")
        })?;
        ensure(g.merged().get("x").size.to_string() == "(Dyn,10)", || {
            format!("{what}: merged {:?}", g.merged())
        })?;
        let eight = state(8);
        let same = ch
            .exchange_with(
                "step",
                &eight,
                &compiler_collectives_core::ExchangeOptions::default().with_config("cfg"),
            )
            .map_err(|e| format!("{what}: {e}"))?;
        ensure(same.fast_path() && *same.merged() == state(8), || {
            format!("{what}: identical states gave {:?}", same.merged())
        })?;
    }
    let key = if ctx.rank() + 1 == ctx.world() {
        "eval"
    } else {
        "train"
    };
    let text = |ch: &mut Channel| match ch.exchange(key, &local) {
        Ok(_) => Err("exchange under different compile keys succeeded".to_string()),
        Err(e) => Ok(e.to_string()),
    };
    let (t, f) = (text(&mut tree)?, text(&mut flat)?);
    ensure(t == f && t.contains("desync"), || {
        format!("tree: {t}\nflat: {f}")
    })
}
