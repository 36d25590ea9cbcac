//! The simple vote kinds, and the table of every decision kind.
//!
//! The exchange protocol ([`crate::protocol::Channel::exchange`]) is generic
//! over [`Join`]: each rank contributes one value, every rank receives every
//! value, and folds them with `join`. Because a join is commutative,
//! associative and idempotent, every rank gets the same result whatever the
//! arrival order, and identical contributions need not be sent at all (the
//! digest fast path).
//!
//! Decision kinds (docs/semantics.md — one framework, not one mechanism each):
//!
//! | kind | join | used by |
//! |---|---|---|
//! | [`AnyVote`] (`vote.any`) | or | guard votes of [`crate::cache::CompileCache`]: any miss ⇒ every rank recompiles |
//! | [`AllVote`] (`vote.all`) | and | cache-hit agreement ([`crate::persistence::artifacts`]): keep a disk hit only if every rank hit |
//! | [`Max`] / [`Min`] (`vote.max` / `vote.min`) | max / min | e.g. the largest batch any rank will see |
//! | [`MaxEach`] (`vote.max_each`) | max per position | the partitioner's saved sizes (`compiler_collectives.torch`, PyTorch's `all_reduce(MAX)` of one size per rank) |
//! | [`TextLists`] (`gather.text_lists`) | union | every rank's list of texts, read with `with_every_value` (the partitioner's saved names, autotuning winners) |
//! | [`crate::decisions::shapes::FrameState`] (`shape.frame_state`) | size-entry lattice | automatic dynamic shapes |
//! | [`crate::decisions::agree::AgreedValues`] (`agree.values`) | union per name | must-agree values ([`crate::decisions::agree::MustAgree`]) |
//! | [`crate::decisions::autotune::Timings`] (`autotune.timings`) | max per candidate | best-choice and sharded autotuning |
//!
//! Every kind goes through the same [`crate::Channel::exchange`], with the
//! same checks (desync, configuration, version), deadlines and fast path.
//!
//! ```
//! use compiler_collectives_core::decisions::votes::{AllVote, AnyVote, Max};
//! use compiler_collectives_core::{Channel, InProcessGroup, Transport};
//!
//! let ranks = InProcessGroup::create(3)?;
//! let handles: Vec<_> = ranks.into_iter().map(|t| std::thread::spawn(move || {
//!     let rank = t.rank();
//!     let mut channel = Channel::new(std::sync::Arc::new(t))?;
//!     // Rank 1's guards failed: everybody recompiles.
//!     let recompile = channel.exchange("step", &AnyVote(rank == 1))?.any();
//!     // Rank 2's disk cache is cold: nobody keeps a hit.
//!     let keep_hits = channel.exchange("step", &AllVote(rank != 2))?.all();
//!     let longest = channel.exchange("step", &Max(100 + i64::from(rank)))?.merged().0;
//!     Ok::<_, compiler_collectives_core::Error>((recompile, keep_hits, longest))
//! })).collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap()?, (true, false, 102));
//! }
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

use crate::protocol::channel::Gathered;
use crate::protocol::join::Join;
use serde::{Deserialize, Serialize};

/// "Did any rank say yes?" — a boolean or-vote. Guard collectives use it:
/// any rank whose cache missed makes every rank recompile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AnyVote(pub bool);

impl Join for AnyVote {
    const KIND: &'static str = "vote.any";
    fn join(&mut self, other: &Self) {
        self.0 |= other.0;
    }
}

/// "Did every rank say yes?" — a boolean and-vote (cache-hit agreement: keep
/// a hit only if every rank hit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AllVote(pub bool);

impl Join for AllVote {
    const KIND: &'static str = "vote.all";
    fn join(&mut self, other: &Self) {
        self.0 &= other.0;
    }
}

/// The maximum over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Max(pub i64);

impl Join for Max {
    const KIND: &'static str = "vote.max";
    fn join(&mut self, other: &Self) {
        self.0 = self.0.max(other.0);
    }
}

/// The minimum over ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Min(pub i64);

impl Join for Min {
    const KIND: &'static str = "vote.min";
    fn join(&mut self, other: &Self) {
        self.0 = self.0.min(other.0);
    }
}

/// The maximum over ranks at each position of a list: PyTorch's
/// `all_reduce(op=MAX)` of a tensor of integers. A list shorter than
/// another is joined as if it ended there (a missing position is ⊥), so
/// ranks may send different lengths; the result is as long as the longest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaxEach(pub Vec<i64>);

impl Join for MaxEach {
    const KIND: &'static str = "vote.max_each";
    fn join(&mut self, other: &Self) {
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
        if other.0.len() > self.0.len() {
            self.0.extend_from_slice(&other.0[self.0.len()..]);
        }
    }
}

/// The distinct lists of texts the ranks hold: an all_gather of a list of
/// strings without pickling. Each rank sends a set of one list; the join is
/// the union, so the merged value says whether every rank holds the same
/// list (one element) — and which lists exist — without every value; an
/// exchange `with_every_value(true)` gives each rank's list
/// ([`Gathered::per_rank`], [`TextLists::one`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TextLists(pub std::collections::BTreeSet<Vec<String>>);

impl TextLists {
    /// This rank's contribution: the one list `texts`.
    pub fn of(texts: Vec<String>) -> Self {
        Self(std::collections::BTreeSet::from([texts]))
    }

    /// The list of a value sent by [`TextLists::of`]; `None` for a join of
    /// several lists (or of none).
    pub fn one(&self) -> Option<&[String]> {
        match self.0.len() {
            1 => self.0.iter().next().map(Vec::as_slice),
            _ => None,
        }
    }
}

impl Join for TextLists {
    const KIND: &'static str = "gather.text_lists";
    fn join(&mut self, other: &Self) {
        self.0.extend(other.0.iter().cloned());
    }
}

impl Gathered<'_, AnyVote> {
    /// Whether any rank voted yes: the vote's outcome, the same on every
    /// rank.
    pub fn any(&self) -> bool {
        self.merged().0
    }
}

impl Gathered<'_, AllVote> {
    /// Whether every rank voted yes: the vote's outcome, the same on every
    /// rank.
    pub fn all(&self) -> bool {
        self.merged().0
    }
}
