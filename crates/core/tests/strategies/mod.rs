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

/// A scalar of every kind: small ints (so that entries often coincide), any
/// int, floats (signed zeros, NaN and infinities among them), bools and big
/// ints up to the carried bound.
#[allow(dead_code)] // not every test binary that includes this module uses it
pub(crate) fn scalar(
) -> impl Strategy<Value = compiler_collectives_core::decisions::lattice::Scalar> {
    use compiler_collectives_core::decisions::lattice::Scalar;
    let big = Scalar::BIG_INT_LIMIT - 1;
    prop_oneof![
        4 => (-2i64..3).prop_map(Scalar::Int),
        2 => any::<i64>().prop_map(Scalar::Int),
        1 => prop_oneof![Just(0.0f64), Just(-0.0), Just(1.0), Just(f64::NAN),
                         Just(f64::INFINITY), any::<f64>()].prop_map(Scalar::float),
        1 => any::<bool>().prop_map(Scalar::Bool),
        1 => prop_oneof![(i128::from(i64::MAX) + 1)..=big, -big..=(i128::from(i64::MIN) - 1)]
            .prop_map(|v| Scalar::int(v).expect("in range")),
    ]
}
