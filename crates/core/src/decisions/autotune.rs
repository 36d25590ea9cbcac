//! Best-choice and sharded autotuning (docs/semantics.md, Other decision
//! kinds): every rank adopts the
//! same winner per op, whatever its own timings were.
//!
//! A compiler that picks among candidate implementations of an op (GEMM tile
//! configurations, fusion choices) by benchmarking them would pick by its own
//! timing noise, so ranks could compile different kernels. [`autotune_ops`]
//! benchmarks, exchanges the timings once, and picks on every rank by one
//! rule:
//!
//! - each benchmark returns samples; a rank's time for a candidate is their
//!   **median** (the mean of the two middle samples, rounded down, for an even
//!   count), in whole nanoseconds;
//! - the **aggregate** of a candidate is the **maximum over ranks** of those
//!   medians: in data-parallel training the slowest rank sets the step time,
//!   and a maximum merges in any order ([`Timings`] is the [`Join`]);
//! - the **winner** is the candidate with the lowest aggregate, ties broken by
//!   the candidate key (byte order) — never by rank order or timing noise;
//! - a candidate whose benchmark failed (an `Err`, or no samples) on a rank is
//!   excluded on every rank and reported in [`Choice::failed`] with the ranks
//!   and the reason; an op whose candidates all failed has no winner.
//!
//! [`Strategy::EveryRank`] (best choice): every rank benchmarks every
//! candidate. [`Strategy::Sharded`]: candidate `i` is benchmarked only by rank
//! `i mod N` (`i` counts candidates across all ops of the call, in the order
//! given), so N ranks share the tuning time; the others' results arrive
//! with the exchange.
//!
//! **Candidate lists must be equal on every rank** (the same ops, candidates
//! and order, and the same strategy). Their canonical text is the exchange's
//! configuration, so ranks whose lists differ all get the same typed
//! [`Error::Disagreement`] — "the candidate lists of autotuning 'KEY'",
//! naming each distinct list with its ranks — instead of adopting different
//! winners or waiting on each other. (The alternative, a local fallback with a
//! warning, would let ranks compile different kernels.) Lists longer than
//! 64 KiB of text are compared by their 128-bit hash.
//!
//! Cost: one exchange — one all_gather of one slot (4096 bytes), which holds
//! the timings when they fit (a few bytes per candidate), else one more of
//! the timings — and the benchmarks this rank runs.
//!
//! ```
//! use compiler_collectives_core::decisions::autotune::{autotune, Strategy};
//! use compiler_collectives_core::{Channel, InProcessGroup, Transport};
//! use std::time::Duration;
//!
//! // 4 ranks, 12 GEMM configurations: each rank benchmarks 3 of them.
//! let candidates: Vec<String> = (0..12).map(|i| format!("gemm_tile_{i:02}")).collect();
//! let ranks = InProcessGroup::create(4)?;
//! let handles: Vec<_> = ranks.into_iter().map(|t| {
//!     let candidates = candidates.clone();
//!     std::thread::spawn(move || {
//!         let rank = u64::from(t.rank());
//!         let mut channel = Channel::new(std::sync::Arc::new(t))?;
//!         let choice = autotune(&mut channel, "mm@model.rs:12", &candidates, Strategy::Sharded,
//!             |cand: &str| {
//!                 // A fake benchmark: tile 07 is fastest; each rank adds its own noise.
//!                 let n: u64 = cand[10..].parse().unwrap();
//!                 let us = if n == 7 { 50 } else { 100 + n };
//!                 Ok(vec![Duration::from_micros(us + rank); 3])
//!             })?;
//!         Ok::<_, compiler_collectives_core::Error>((choice.winner, choice.benchmarked.len()))
//!     })
//! }).collect();
//! for h in handles {
//!     let (winner, benchmarked) = h.join().unwrap()?;
//!     assert_eq!(winner.as_deref(), Some("gemm_tile_07"));    // the same on every rank
//!     assert_eq!(benchmarked, 3);
//! }
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

use crate::decisions::join_map;
use crate::error::{Error, Result};
use crate::protocol::join::Join;
use crate::protocol::Channel;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Who benchmarks which candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Best choice: every rank benchmarks every candidate.
    EveryRank,
    /// Sharded: candidate `i` (counted across the call's ops) is benchmarked
    /// only by rank `i mod N`.
    Sharded,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::EveryRank => "every_rank",
            Strategy::Sharded => "sharded",
        }
    }
}

/// One candidate's result: a time, or a failure.
///
/// Ordered for the join: `Nanos` ascending, then any `Failed` (a failure on
/// one rank excludes the candidate everywhere); of two failures the one whose
/// reason sorts first is kept, so the join is deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Measure {
    /// A median time in nanoseconds (after the join: the maximum over ranks).
    Nanos(u64),
    /// The benchmark failed; the reason (at most 200 bytes).
    Failed(String),
}

impl Measure {
    fn join(&mut self, other: &Measure) {
        match (&mut *self, other) {
            (Measure::Nanos(a), Measure::Nanos(b)) => *a = (*a).max(*b),
            (Measure::Nanos(_), Measure::Failed(_)) => *self = other.clone(),
            (Measure::Failed(_), Measure::Nanos(_)) => {}
            (Measure::Failed(a), Measure::Failed(b)) => {
                if b < a {
                    a.clone_from(b);
                }
            }
        }
    }
}

/// The autotuning decision kind: op → candidate → [`Measure`]. A candidate a
/// rank did not benchmark is absent (⊥).
///
/// Join: per candidate, the larger [`Measure`] (commutative, associative,
/// idempotent — property-tested).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings(pub BTreeMap<String, BTreeMap<String, Measure>>);

impl Join for Timings {
    const KIND: &'static str = "autotune.timings";
    fn join(&mut self, other: &Self) {
        join_map(&mut self.0, &other.0, |mine, theirs| {
            join_map(mine, theirs, Measure::join);
        });
    }
}

/// One op to tune: its name and its candidates' keys, in the order every rank
/// lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Op {
    /// The op, e.g. `"mm_128x512x512"`.
    pub name: String,
    /// Candidate keys, unique within the op.
    pub candidates: Vec<String>,
}

impl Op {
    /// An op with candidates.
    pub fn new<S: Into<String>>(
        name: impl Into<String>,
        candidates: impl IntoIterator<Item = S>,
    ) -> Self {
        Op {
            name: name.into(),
            candidates: candidates.into_iter().map(Into::into).collect(),
        }
    }
}

/// A candidate excluded because its benchmark failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The ranks whose benchmark failed, ascending (every rank, when the
    /// exchange took the fast path).
    pub ranks: Vec<u32>,
    /// The reason (the first in byte order when ranks gave several).
    pub reason: String,
}

/// The decision for one op — the same on every rank, except `benchmarked`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The winning candidate; `None` when every candidate failed (or there
    /// were none).
    pub winner: Option<String>,
    /// The aggregate per candidate: the maximum over ranks of each rank's
    /// median, in nanoseconds, or the failure.
    pub aggregate: BTreeMap<String, Measure>,
    /// Excluded candidates, with the ranks that failed them.
    pub failed: BTreeMap<String, Failure>,
    /// The candidates this rank benchmarked, in order.
    pub benchmarked: Vec<String>,
}

impl Choice {
    /// The winner's aggregate time.
    pub fn winner_time(&self) -> Option<Duration> {
        match self.aggregate.get(self.winner.as_deref()?)? {
            Measure::Nanos(n) => Some(Duration::from_nanos(*n)),
            Measure::Failed(_) => None,
        }
    }
}

/// Canonical text of the candidate lists above which their hash is sent instead.
const MAX_CONFIG_TEXT: usize = 64 << 10;
/// Longest failure reason kept, in bytes.
const MAX_REASON: usize = 200;

/// Tunes one op: [`autotune_ops`] with one op named `key`; `benchmark`
/// receives a candidate key and returns time samples (or why it failed).
///
/// # Errors
/// As [`autotune_ops`].
pub fn autotune<S, F>(
    channel: &mut Channel,
    key: &str,
    candidates: &[S],
    strategy: Strategy,
    mut benchmark: F,
) -> Result<Choice>
where
    S: AsRef<str>,
    F: FnMut(&str) -> std::result::Result<Vec<Duration>, String>,
{
    let op = Op::new(key, candidates.iter().map(|c| c.as_ref().to_owned()));
    let mut tuned = autotune_ops(channel, key, &[op], strategy, |_, c| benchmark(c))?;
    tuned.remove(key).ok_or_else(|| {
        Error::InvalidArgument(format!("autotuning '{key}' returned no choice for its op"))
    })
}

/// Tunes several ops in one exchange under compile key `key`; `benchmark`
/// receives `(op, candidate)` and returns time samples (any count ≥ 1) or why
/// it failed. Returns one [`Choice`] per op, by op name.
///
/// Every rank must call it at the same point with equal `ops` and `strategy`
/// (see the module docs for the rule that picks winners).
///
/// # Errors
/// - [`Error::Disagreement`] on every rank when ranks' candidate lists (or
///   strategies) differ, naming each distinct list with its ranks (fatal);
/// - [`Error::InvalidArgument`] on every rank holding them when op names or
///   candidate keys repeat (after taking part in the exchange, so ranks stay
///   matched);
/// - the exchange's errors ([`Error::Timeout`], [`Error::Desync`], …).
pub fn autotune_ops<F>(
    channel: &mut Channel,
    key: &str,
    ops: &[Op],
    strategy: Strategy,
    mut benchmark: F,
) -> Result<BTreeMap<String, Choice>>
where
    F: FnMut(&str, &str) -> std::result::Result<Vec<Duration>, String>,
{
    let invalid = validate(ops);
    let config = config_text(ops, strategy);
    let (rank, world) = (channel.rank(), channel.world_size().max(1));
    let mut local = Timings::default();
    let mut benchmarked: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    if invalid.is_none() {
        let mut index: u64 = 0;
        for op in ops {
            let mine = local.0.entry(op.name.clone()).or_default();
            let list = benchmarked.entry(op.name.as_str()).or_default();
            for cand in &op.candidates {
                let assigned = match strategy {
                    Strategy::EveryRank => true,
                    Strategy::Sharded => index % u64::from(world) == u64::from(rank),
                };
                index += 1;
                if !assigned {
                    continue;
                }
                let measure = match benchmark(&op.name, cand) {
                    Ok(samples) => median_nanos(&samples).map_or_else(
                        || Measure::Failed("the benchmark returned no samples".into()),
                        Measure::Nanos,
                    ),
                    Err(reason) => Measure::Failed(cut(&reason)),
                };
                if let Measure::Failed(reason) = &measure {
                    tracing::warn!(key, op = %op.name, candidate = %cand, reason = %reason,
                        "autotune: benchmark failed; the candidate is excluded on every rank");
                }
                mine.insert(cand.clone(), measure);
                list.push(cand.clone());
            }
        }
    }
    let gathered = channel
        .exchange_with(
            key,
            &local,
            &crate::ExchangeOptions::default().with_config(&config),
        )
        .map_err(|e| match e {
            Error::Disagreement { groups, .. } => Error::Disagreement {
                what: format!("the candidate lists of autotuning '{key}'"),
                groups,
            },
            other => other,
        })?;
    if let Some(msg) = invalid {
        return Err(Error::InvalidArgument(format!("autotuning '{key}': {msg}")));
    }
    let merged = gathered.merged();
    let mut choices = BTreeMap::new();
    for op in ops {
        let empty = BTreeMap::new();
        let agg = merged.0.get(&op.name).unwrap_or(&empty);
        let mut choice = Choice {
            winner: None,
            aggregate: BTreeMap::new(),
            failed: BTreeMap::new(),
            benchmarked: benchmarked.remove(op.name.as_str()).unwrap_or_default(),
        };
        let mut best: Option<(u64, &str)> = None;
        for cand in &op.candidates {
            let m = agg
                .get(cand)
                .cloned()
                .unwrap_or_else(|| Measure::Failed("no rank measured it".into()));
            match &m {
                Measure::Nanos(n) => {
                    if best.is_none_or(|b| (*n, cand.as_str()) < b) {
                        best = Some((*n, cand.as_str()));
                    }
                }
                Measure::Failed(reason) => {
                    let ranks = match gathered.per_rank().values() {
                        Some(values) => (0u32..)
                            .zip(values)
                            .filter(|(_, v)| {
                                matches!(
                                    v.0.get(&op.name).and_then(|c| c.get(cand)),
                                    Some(Measure::Failed(_))
                                )
                            })
                            .map(|(r, _)| r)
                            .collect(),
                        None => (0..world).collect(),
                    };
                    choice.failed.insert(
                        cand.clone(),
                        Failure {
                            ranks,
                            reason: reason.clone(),
                        },
                    );
                }
            }
            choice.aggregate.insert(cand.clone(), m);
        }
        choice.winner = best.map(|(_, c)| c.to_owned());
        choices.insert(op.name.clone(), choice);
    }
    Ok(choices)
}

/// The median of `samples` in whole nanoseconds (mean of the two middle
/// samples, rounded down, for an even count); `None` for no samples.
pub fn median_nanos(samples: &[Duration]) -> Option<u64> {
    let mut ns: Vec<u64> = samples
        .iter()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .collect();
    ns.sort_unstable();
    let n = ns.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(ns[n / 2]),
        _ => {
            let (a, b) = (u128::from(ns[n / 2 - 1]), u128::from(ns[n / 2]));
            u64::try_from((a + b) / 2).ok()
        }
    }
}

fn validate(ops: &[Op]) -> Option<String> {
    let mut names = BTreeSet::new();
    for op in ops {
        if !names.insert(op.name.as_str()) {
            return Some(format!("op '{}' is listed twice", op.name));
        }
        let mut seen = BTreeSet::new();
        for c in &op.candidates {
            if !seen.insert(c.as_str()) {
                return Some(format!("op '{}' lists candidate '{c}' twice", op.name));
            }
        }
    }
    None
}

/// Canonical text of the strategy and candidate lists (JSON), or its hash
/// when long.
fn config_text(ops: &[Op], strategy: Strategy) -> String {
    let lists = serde_json::to_string(ops).unwrap_or_default();
    let text = format!("autotune {} {lists}", strategy.name());
    if text.len() <= MAX_CONFIG_TEXT {
        text
    } else {
        format!(
            "autotune {} ({} ops, {} bytes of candidate lists, xxh3-128 {:032x})",
            strategy.name(),
            ops.len(),
            lists.len(),
            xxhash_rust::xxh3::xxh3_128(lists.as_bytes())
        )
    }
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_REASON {
        return text.to_owned();
    }
    let mut end = MAX_REASON;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}
