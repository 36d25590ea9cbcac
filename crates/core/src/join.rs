//! The one trait every decision kind implements, and the simple vote kinds.
//!
//! The exchange protocol ([`crate::protocol::Channel::exchange`]) is generic
//! over [`Join`]: each rank contributes one value, every rank receives every
//! value, and folds them with `join`. Because a join is commutative,
//! associative and idempotent, every rank gets the same result whatever the
//! arrival order, and identical contributions need not be sent at all (the
//! digest fast path).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;

/// A decision kind: a value with a deterministic, order-independent merge.
///
/// # Laws (checked by property tests for the kinds in this crate)
/// - commutative: `a ⊔ b = b ⊔ a`
/// - associative: `(a ⊔ b) ⊔ c = a ⊔ (b ⊔ c)`
/// - idempotent: `a ⊔ a = a` (the fast path relies on it)
///
/// The wire form is the value's canonical [`postcard`] encoding, so the type
/// must serialise deterministically (use `BTreeMap`, not `HashMap`).
pub trait Join: Clone + Debug + Send + Serialize + DeserializeOwned {
    /// Stable name of the kind, carried in every envelope and checked to be
    /// the same on every rank, e.g. `"shape.frame_state"`.
    const KIND: &'static str;

    /// `self ← self ⊔ other`.
    fn join(&mut self, other: &Self);
}

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
