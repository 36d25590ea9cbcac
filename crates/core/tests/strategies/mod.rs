//! proptest strategies for lattice values, shared by the property tests
//! (`mod strategies;`).

use compiler_collectives_core::decisions::lattice::{Atom, Dims};
use proptest::prelude::*;

/// `Unset`, `Dynamic` or a value of `v` (four times as often).
pub(crate) fn atom<V: std::fmt::Debug + Clone + 'static>(
    v: impl Strategy<Value = V> + 'static,
) -> impl Strategy<Value = Atom<V>> {
    prop_oneof![
        1 => Just(Atom::Unset),
        1 => Just(Atom::Dynamic),
        4 => v.prop_map(Atom::Static),
    ]
}

/// An `Unset` or `Dynamic` tuple, or (six times as often) a known tuple of
/// fewer than `max_len` atoms of `a`.
pub(crate) fn dims<V: std::fmt::Debug + Clone + 'static>(
    a: impl Strategy<Value = Atom<V>> + 'static,
    max_len: usize,
) -> impl Strategy<Value = Dims<V>> {
    prop_oneof![
        1 => Just(Dims::Unset),
        1 => Just(Dims::Dynamic),
        6 => proptest::collection::vec(a, 0..max_len).prop_map(Dims::Known),
    ]
}
