//! Ranks out of step: different compile keys, sequence numbers, decision
//! kinds or configurations give every rank the same error, its ranks in
//! groups.

use super::{expect_groups, state};
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::{decisions::votes::AnyVote, Error};

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    DESYNC_COMPILE_KEYS,
    DESYNC_SEQUENCE_NUMBERS,
    DESYNC_DECISION_KINDS,
    CONFIG_DISAGREEMENT,
];

/// Ranks below `split` in one group, the rest in the other.
fn split_groups(world: u32) -> (Vec<u32>, Vec<u32>) {
    let split = world.div_ceil(2);
    ((0..split).collect(), (split..world).collect())
}

behaviour!(DESYNC_COMPILE_KEYS = desync_compile_keys, min_world: 2, timed: false, needs: []);
fn desync_compile_keys(ctx: &Ctx) -> Result<(), String> {
    let (a, b) = split_groups(ctx.world());
    let key = if a.contains(&ctx.rank()) {
        "train_step@model.rs:88"
    } else {
        "eval_step@model.rs:120"
    };
    let mut ch = ctx.channel(ctx.timeout)?;
    let err = match ch.exchange(key, &state(8)) {
        Ok(_) => return Err("exchange under different compile keys succeeded".into()),
        Err(e) => e,
    };
    ensure(matches!(err, Error::Desync { .. }), || {
        format!("expected desync, got {err}")
    })?;
    expect_groups(
        &err,
        &[
            (&a, "#0 'train_step@model.rs:88'"),
            (&b, "#0 'eval_step@model.rs:120'"),
        ],
    )?;
    let text = err.to_string();
    ensure(text.contains("unusable"), || {
        format!("message does not say the channel is unusable: {text}")
    })
}

behaviour!(
    DESYNC_SEQUENCE_NUMBERS = desync_sequence_numbers,
    min_world: 2, timed: false, needs: []
);
fn desync_sequence_numbers(ctx: &Ctx) -> Result<(), String> {
    // Rank 0 exchanges twice on one channel; the others use a second channel
    // over the same communicator for their second exchange (a misuse that
    // puts the ranks at different sequence numbers).
    let mut ch = ctx.channel(ctx.timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map_err(|e| e.to_string())?;
    let res = if ctx.rank() == 0 {
        ch.exchange("f", &AnyVote(false))
    } else {
        let mut fresh = ctx.channel(ctx.timeout)?;
        fresh.exchange("f", &AnyVote(false))
    };
    let err = res
        .err()
        .ok_or("exchange at different sequence numbers succeeded")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "#1 'f'"), (&others, "#0 'f'")])
}

behaviour!(DESYNC_DECISION_KINDS = desync_decision_kinds, min_world: 2, timed: false, needs: []);
fn desync_decision_kinds(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    let res = if ctx.rank() == 0 {
        ch.exchange("f", &AnyVote(true)).map(|_| ())
    } else {
        ch.exchange("f", &state(4)).map(|_| ())
    };
    let err = res.err().ok_or("exchange of different kinds succeeded")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "vote.any"), (&others, "shape.frame_state")])
}

behaviour!(CONFIG_DISAGREEMENT = config_disagreement, min_world: 2, timed: false, needs: []);
fn config_disagreement(ctx: &Ctx) -> Result<(), String> {
    let cfg = if ctx.rank() == 0 {
        "overrides={x=force_static}"
    } else {
        "overrides={}"
    };
    let mut ch = ctx.channel(ctx.timeout)?;
    let err = ch
        .exchange_with(
            "f",
            &state(4),
            &compiler_collectives_core::ExchangeOptions::default().with_config(cfg),
        )
        .err()
        .ok_or("differing configuration accepted")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(&err, &[(&[0], "force_static"), (&others, "overrides={}")])
}
