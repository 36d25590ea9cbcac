//! Behaviours of the decision kinds beyond shapes (issue 9): must-agree
//! values, sharded autotuning and cache-hit agreement — the same on every
//! engine, because backends only move bytes.

use super::expect_groups;
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::cache::{CacheOptions, CompileCache, Inputs};
use compiler_collectives_core::decisions::agree::MustAgree;
use compiler_collectives_core::decisions::autotune::{autotune, Strategy};
use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_core::decisions::votes::AllVote;
use compiler_collectives_core::persistence::artifacts::{ArtifactOrigin, DiskArtifacts};
use compiler_collectives_core::Error;
use std::time::Duration;

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    MUST_AGREE_NAMES_VALUES,
    AUTOTUNE_SHARDED_SAME_WINNER,
    AUTOTUNE_LISTS_DIFFER,
    CACHE_HIT_AGREEMENT,
];

behaviour!(
    MUST_AGREE_NAMES_VALUES = must_agree_names_values,
    min_world: 2, timed: false, needs: []
);
/// Every rank agrees on two values (fast path); then rank 0 holds another
/// compiler version and every rank gets the same disagreement naming it.
fn must_agree_names_values(ctx: &Ctx) -> Result<(), String> {
    let mut ch = ctx.channel(ctx.timeout)?;
    MustAgree::new()
        .value("compiler", "ccol 0.1.0")
        .value("config", "c0ffee")
        .check(&mut ch, "startup")
        .map_err(|e| format!("agreeing values refused: {e}"))?;
    let version = if ctx.rank() == 0 { "2.13.0" } else { "2.12.1" };
    let err = MustAgree::new()
        .value("compiler", version)
        .value("config", "c0ffee")
        .check(&mut ch, "startup")
        .err()
        .ok_or("differing values accepted")?;
    let others: Vec<u32> = (1..ctx.world()).collect();
    expect_groups(
        &err,
        &[(&[0], "compiler='2.13.0'"), (&others, "compiler='2.12.1'")],
    )?;
    ensure(
        err.to_string().contains("must-agree value 'compiler'"),
        || err.to_string(),
    )
}

behaviour!(
    AUTOTUNE_SHARDED_SAME_WINNER = autotune_sharded_same_winner,
    min_world: 1, timed: false, needs: []
);
/// 3 × world candidates, sharded: every rank benchmarks exactly 3 (those
/// with index mod world = rank) and every rank adopts the winner, which only
/// the last rank measured (with that rank's own noise).
fn autotune_sharded_same_winner(ctx: &Ctx) -> Result<(), String> {
    let world = ctx.world();
    let rank = ctx.rank();
    let candidates: Vec<String> = (0..3 * world).map(|i| format!("cfg{i:03}")).collect();
    let best = 3 * world - 1; // benchmarked by rank world - 1
    let mut ch = ctx.channel(ctx.timeout)?;
    let mut ran = Vec::new();
    let choice = autotune(
        &mut ch,
        "mm@conformance",
        &candidates,
        Strategy::Sharded,
        |c| {
            let i: u32 = c[3..].parse().map_err(|e| format!("{c}: {e}"))?;
            ran.push(i);
            let us = if i == best { 10 } else { 100 + u64::from(i) };
            Ok(vec![Duration::from_micros(us + u64::from(rank))])
        },
    )
    .map_err(|e| e.to_string())?;
    let want: Vec<u32> = (0..3 * world).filter(|i| i % world == rank).collect();
    ensure(ran == want, || {
        format!("benchmarked {ran:?}, want {want:?}")
    })?;
    let winner = format!("cfg{best:03}");
    ensure(choice.winner.as_deref() == Some(winner.as_str()), || {
        format!("winner {:?}, want {winner}", choice.winner)
    })?;
    ensure(
        choice.winner_time() == Some(Duration::from_micros(10 + u64::from(world - 1))),
        || format!("winner time {:?}", choice.winner_time()),
    )
}

behaviour!(AUTOTUNE_LISTS_DIFFER = autotune_lists_differ, min_world: 2, timed: false, needs: []);
/// The last rank lists one candidate more: every rank gets the same typed
/// disagreement, at once.
fn autotune_lists_differ(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let cands: &[&str] = if ctx.rank() == odd {
        &["a", "b", "c"]
    } else {
        &["a", "b"]
    };
    let mut ch = ctx.channel(ctx.timeout)?;
    let err = autotune(&mut ch, "mm", cands, Strategy::Sharded, |_| {
        Ok(vec![Duration::from_micros(1)])
    })
    .err()
    .ok_or("differing candidate lists accepted")?;
    let others: Vec<u32> = (0..odd).collect();
    expect_groups(
        &err,
        &[(&others, r#"["a","b"]"#), (&[odd], r#"["a","b","c"]"#)],
    )?;
    ensure(
        err.to_string()
            .contains("the candidate lists of autotuning 'mm'"),
        || err.to_string(),
    )
}

behaviour!(CACHE_HIT_AGREEMENT = cache_hit_agreement, min_world: 1, timed: false, needs: []);
/// Rank 0's persistent artifact cache is warm, the others' cold: with
/// cache-hit agreement every rank compiles (and takes part in the compile's
/// exchange); once every cache holds the artifact, every rank loads it.
fn cache_hit_agreement(ctx: &Ctx) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = DiskArtifacts::open(dir.path()).map_err(|e| e.to_string())?;
    let x: Inputs = [("x".to_string(), Observation::tensor([8, 16]))].into();
    let kernel = |_: &_, ch: Option<&mut compiler_collectives_core::Channel>| {
        ch.ok_or_else(|| Error::InvalidArgument("no channel".into()))?
            .exchange("step/compile", &AllVote(true))?;
        Ok("kernel".to_string())
    };
    if ctx.rank() == 0 {
        let mut alone = CacheOptions::default();
        alone.collectives = false;
        let mut c: CompileCache<String> = CompileCache::new("step", alone);
        c.call_persistent(&x, None, &store, |_, _| Ok("kernel".to_string()))
            .map_err(|e| e.to_string())?;
    }
    let mut ch = ctx.channel(ctx.timeout)?;
    let mut origins = Vec::new();
    for _run in 0..2 {
        let mut c: CompileCache<String> = CompileCache::new("step", CacheOptions::default());
        let call = c
            .call_persistent(&x, Some(&mut ch), &store, kernel)
            .map_err(|e| e.to_string())?;
        origins.push(call.origin);
    }
    let world_one = ctx.world() == 1;
    let want = [
        Some(if world_one {
            ArtifactOrigin::Loaded
        } else {
            ArtifactOrigin::Compiled {
                local_hit: ctx.rank() == 0,
            }
        }),
        Some(ArtifactOrigin::Loaded),
    ];
    ensure(origins == want, || {
        format!("origins {origins:?}, want {want:?}")
    })?;
    let exchanges = if world_one { 4 } else { 5 };
    ensure(ch.next_seq() == exchanges, || {
        format!("{} exchanges, want {exchanges}", ch.next_seq())
    })
}
