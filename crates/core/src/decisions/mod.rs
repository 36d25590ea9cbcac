//! Decisions: the values ranks exchange and how two of them merge. Each kind
//! implements [`Join`](crate::Join) (owned by [`crate::protocol`]) and is
//! exchanged by [`Channel::exchange`](crate::Channel::exchange); the table of
//! kinds is in [`votes`].
//!
//! | module | what |
//! |---|---|
//! | [`lattice`] | the size-entry lattice (PyTorch's `FrameStateSizeEntry`) and stride canonicalisation |
//! | [`shapes`] | observations, per-frame state, per-dimension decisions, overrides |
//! | `frame_wire` | a frame state's storage: its entries in their canonical wire form (postcard's bytes exactly), read strictly, joined by merging bytes |
//! | [`votes`] | the simple vote kinds (any, all, max, min) and the table of every kind |
//! | [`agree`] | must-agree values (compiler version, config hash, code fingerprint) |
//! | [`autotune`] | best-choice and sharded autotuning: the same winner per op on every rank |
//!
//! Depends on: [`crate::protocol`] (the trait and the channel a kind is
//! exchanged on) and the error type; nothing here does I/O but through a
//! [`Channel`](crate::Channel).

pub mod agree;
pub mod autotune;
mod frame_wire;
pub mod lattice;
pub mod shapes;
pub mod votes;

use std::collections::BTreeMap;

/// `mine ← mine ⊔ theirs` for a map whose missing key is ⊥: a key only in
/// `theirs` is copied in, a key in both has its values joined by
/// `join(mine, theirs)`. Commutative, associative and idempotent whenever
/// `join` is (the map kinds' property tests check it through them).
/// Costs O(|theirs| · log |mine|) lookups plus the joins and copies.
///
/// ```
/// use compiler_collectives_core::decisions::join_map;
/// use std::collections::BTreeMap;
/// let mut mine = BTreeMap::from([("a", 1), ("b", 5)]);
/// join_map(&mut mine, &BTreeMap::from([("b", 7), ("c", 2)]), |m, t| *m = (*m).max(*t));
/// assert_eq!(mine, BTreeMap::from([("a", 1), ("b", 7), ("c", 2)]));
/// ```
pub fn join_map<K: Ord + Clone, V: Clone>(
    mine: &mut BTreeMap<K, V>,
    theirs: &BTreeMap<K, V>,
    mut join: impl FnMut(&mut V, &V),
) {
    for (k, v) in theirs {
        match mine.get_mut(k) {
            Some(m) => join(m, v),
            None => {
                mine.insert(k.clone(), v.clone());
            }
        }
    }
}
