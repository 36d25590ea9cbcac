//! The size-entry lattice: what one rank saw of one source, and how two such
//! observations combine.
//!
//! The lattice matches PyTorch's automatic-dynamic frame state
//! (`FrameStateSizeEntry` in `torch/_dynamo/pgo.py`): three independent fields
//! (`scalar`, `size`, `stride`), each built from atoms ordered
//! `Unset` (⊥, no information) < a concrete value < `Dynamic` (⊤).
//!
//! | left ⊔ right              | result                         |
//! |---------------------------|--------------------------------|
//! | `Unset ⊔ y`, `x ⊔ Unset`  | the other side                 |
//! | `Dynamic ⊔ _`             | `Dynamic`                      |
//! | `v ⊔ v`                   | `v`                            |
//! | `v ⊔ w` with `v ≠ w`      | `Dynamic`                      |
//!
//! Tuples (`size`, `stride`) join element-wise; an `Unset` tuple is the
//! identity, a `Dynamic` tuple absorbs, and tuples of different lengths join
//! to a `Dynamic` tuple (the number of dimensions changed).

use crate::protocol::compact::{AtomValue, Compact};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// One atom of the lattice: no information, one concrete value, or dynamic.
/// Its serde form is [`Compact`]'s (one varint on the wire,
/// [`crate::protocol::compact`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Atom<V> {
    /// ⊥: nothing was observed.
    Unset,
    /// A concrete value (a size in elements, a stride, an int).
    Static(V),
    /// ⊤: the value differed between observations; compile it symbolically.
    Dynamic,
}

impl<V: PartialEq + Clone> Atom<V> {
    /// `self ⊔ other`.
    #[must_use]
    pub fn join(&self, other: &Self) -> Self {
        match (self, other) {
            (Atom::Unset, y) => y.clone(),
            (x, Atom::Unset) => x.clone(),
            (Atom::Static(a), Atom::Static(b)) if a == b => Atom::Static(a.clone()),
            _ => Atom::Dynamic,
        }
    }

    /// True for [`Atom::Dynamic`].
    pub fn is_dynamic(&self) -> bool {
        matches!(self, Atom::Dynamic)
    }

    /// The concrete value, if there is one.
    pub fn value(&self) -> Option<&V> {
        match self {
            Atom::Static(v) => Some(v),
            _ => None,
        }
    }
}

impl<V: fmt::Display> fmt::Display for Atom<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Unset => f.write_str("?"),
            Atom::Static(v) => v.fmt(f),
            Atom::Dynamic => f.write_str("Dyn"),
        }
    }
}

impl<V: AtomValue> Serialize for Atom<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let form = match self {
            Atom::Unset => Compact::Unset,
            Atom::Static(v) => Compact::Static(v),
            Atom::Dynamic => Compact::Dynamic,
        };
        crate::protocol::compact::serialize(form, s)
    }
}

impl<'de, V: AtomValue> Deserialize<'de> for Atom<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Compact::<V>::deserialize(d)? {
            Compact::Unset => Atom::Unset,
            Compact::Static(v) => Atom::Static(v),
            Compact::Dynamic => Atom::Dynamic,
        })
    }
}

/// A tuple of atoms (sizes or strides), or the tuple as a whole unset or
/// dynamic.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(bound = "V: AtomValue")]
pub enum Dims<V> {
    /// ⊥: no tensor was observed.
    Unset,
    /// ⊤: the number of dimensions (or the kind of value) differed.
    Dynamic,
    /// One atom per dimension.
    Known(Vec<Atom<V>>),
}

impl<V: PartialEq + Clone> Dims<V> {
    /// `self ⊔ other`: `Unset` is the identity, `Dynamic` absorbs, tuples of
    /// different lengths give `Dynamic`, equal lengths join element-wise.
    #[must_use]
    pub fn join(&self, other: &Self) -> Self {
        match (self, other) {
            (Dims::Unset, y) => y.clone(),
            (x, Dims::Unset) => x.clone(),
            (Dims::Dynamic, _) | (_, Dims::Dynamic) => Dims::Dynamic,
            (Dims::Known(a), Dims::Known(b)) => {
                if a.len() != b.len() {
                    Dims::Dynamic
                } else {
                    Dims::Known(a.iter().zip(b).map(|(x, y)| x.join(y)).collect())
                }
            }
        }
    }

    /// Whether dimension `i` is dynamic: the whole tuple is, or its atom `i` is.
    pub fn is_dynamic_at(&self, i: usize) -> bool {
        match self {
            Dims::Dynamic => true,
            Dims::Unset => false,
            Dims::Known(v) => v.get(i).is_some_and(Atom::is_dynamic),
        }
    }

    /// True when the tuple is known and every atom holds a concrete value.
    pub fn all_static(&self) -> bool {
        match self {
            Dims::Known(v) => v.iter().all(|a| matches!(a, Atom::Static(_))),
            _ => false,
        }
    }

    /// A known tuple of concrete values.
    pub fn from_values(values: impl IntoIterator<Item = V>) -> Self {
        Dims::Known(values.into_iter().map(Atom::Static).collect())
    }
}

impl<V: fmt::Display> fmt::Display for Dims<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dims::Unset => f.write_str("?"),
            Dims::Dynamic => f.write_str("Dyn"),
            Dims::Known(v) => {
                f.write_str("(")?;
                for (i, a) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    a.fmt(f)?;
                }
                if v.len() == 1 {
                    f.write_str(",")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// One recorded stride: a number of elements, or "whatever dimension `j`'s
/// size times stride is" after [`canonical_strides`].
///
/// `InferStride(j)` equals only `InferStride(j)`: a stride that changed only
/// because a size changed stays the same atom (PyTorch's `InferStride`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Stride {
    /// A concrete stride, in elements.
    Int(u64),
    /// `stride[j] * size[j]` of the same tensor.
    Infer(u32),
}

impl fmt::Display for Stride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stride::Int(v) => v.fmt(f),
            Stride::Infer(j) => write!(f, "S({j})"),
        }
    }
}

/// Strides in the compact form: `2·n` for `Int(n)`, `2·j + 1` for `Infer(j)`.
impl AtomValue for Stride {
    fn code(&self) -> u128 {
        match *self {
            Stride::Int(n) => 2 * u128::from(n),
            Stride::Infer(j) => 2 * u128::from(j) + 1,
        }
    }
    fn from_code(code: u128) -> Option<Self> {
        if code % 2 == 0 {
            u64::try_from(code / 2).ok().map(Stride::Int)
        } else {
            u32::try_from(code / 2).ok().map(Stride::Infer)
        }
    }
}

/// Rewrites the strides of a tensor so that a stride that follows from a
/// size change does not look like a new value (docs/semantics.md, Stride canonicalisation; PyTorch's stride
/// recording in `torch/_dynamo/pgo.py`).
///
/// Dimensions are visited by (stride, −index) ascending. A stride equal to
/// `stride[j]·size[j]` of an earlier-visited dimension `j` is recorded as
/// [`Stride::Infer(j)`](Stride::Infer); any other stride as the number.
///
/// `sizes` and `strides` must have the same length (callers validate it);
/// extra elements of the longer slice are ignored. Products that overflow
/// `u64` are not recorded as inferable.
///
/// ```
/// use compiler_collectives_core::decisions::lattice::{canonical_strides, Stride::*};
/// assert_eq!(canonical_strides(&[2, 3], &[3, 1]), vec![Infer(1), Int(1)]);
/// assert_eq!(canonical_strides(&[4, 4], &[1, 4]), vec![Int(1), Infer(0)]);
/// ```
pub fn canonical_strides(sizes: &[u64], strides: &[u64]) -> Vec<Stride> {
    let n = sizes.len().min(strides.len());
    let mut order: Vec<usize> = (0..n).collect();
    // (stride, -index) ascending == stride ascending, then index descending.
    order.sort_by(|&a, &b| strides[a].cmp(&strides[b]).then(b.cmp(&a)));
    let mut known: Vec<(u64, u32)> = Vec::with_capacity(n);
    let mut out = vec![Stride::Int(0); n];
    for i in order {
        let s = strides[i];
        out[i] = match known.iter().find(|(v, _)| *v == s) {
            Some(&(_, j)) => Stride::Infer(j),
            None => Stride::Int(s),
        };
        if let Some(product) = s.checked_mul(sizes[i]) {
            if !known.iter().any(|(v, _)| *v == product) {
                // ndim is bounded by the caller's limits (≤ 64 by default).
                let j = u32::try_from(i).unwrap_or(u32::MAX);
                known.push((product, j));
            }
        }
    }
    out
}

/// The contiguous (row-major) strides of `sizes`, in elements.
///
/// Saturates at `u64::MAX` instead of overflowing.
pub fn contiguous_strides(sizes: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; sizes.len()];
    let mut acc: u64 = 1;
    for i in (0..sizes.len()).rev() {
        out[i] = acc;
        acc = acc.saturating_mul(sizes[i].max(1));
    }
    out
}

/// What is known about one source (one compiler input) across observations.
///
/// `scalar` describes an int input, `size` and `stride` a tensor input. A
/// field nobody observed stays `Unset`. Join is field-wise, so a source that
/// was a tensor on one rank and an int on another becomes dynamic in every
/// field.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SizeEntry {
    /// The value of an int input.
    pub scalar: Atom<i64>,
    /// The sizes of a tensor input, in elements.
    pub size: Dims<u64>,
    /// The canonical strides of a tensor input ([`canonical_strides`]).
    pub stride: Dims<Stride>,
}

impl Default for SizeEntry {
    fn default() -> Self {
        Self::unset()
    }
}

impl SizeEntry {
    /// ⊥: nothing observed (identity of [`SizeEntry::join`]).
    pub const fn unset() -> Self {
        SizeEntry {
            scalar: Atom::Unset,
            size: Dims::Unset,
            stride: Dims::Unset,
        }
    }

    /// A tensor observation: `{scalar: Dynamic, size, stride: canonical}`.
    ///
    /// `strides` are in elements; `None` means contiguous. The caller checks
    /// that `strides` has as many elements as `sizes`.
    pub fn tensor(sizes: &[u64], strides: Option<&[u64]>) -> Self {
        let contiguous;
        let strides = match strides {
            Some(s) => s,
            None => {
                contiguous = contiguous_strides(sizes);
                &contiguous
            }
        };
        SizeEntry {
            scalar: Atom::Dynamic,
            size: Dims::from_values(sizes.iter().copied()),
            stride: Dims::from_values(canonical_strides(sizes, strides)),
        }
    }

    /// An int observation: `{scalar: v, size: Dynamic, stride: Dynamic}`.
    pub fn int(value: i64) -> Self {
        SizeEntry {
            scalar: Atom::Static(value),
            size: Dims::Dynamic,
            stride: Dims::Dynamic,
        }
    }

    /// A mark-dynamic hint for dimension `dim` of a tensor with `ndim`
    /// dimensions: `{scalar: Unset, size: (Unset…, Dynamic at dim, …),
    /// stride: Unset}` (PyTorch's `torch._dynamo.mark_dynamic`).
    ///
    /// A `dim` outside `0..ndim` gives a hint that only fixes `ndim`.
    pub fn mark_dynamic(ndim: usize, dim: usize) -> Self {
        let size = (0..ndim)
            .map(|i| if i == dim { Atom::Dynamic } else { Atom::Unset })
            .collect();
        SizeEntry {
            scalar: Atom::Unset,
            size: Dims::Known(size),
            stride: Dims::Unset,
        }
    }

    /// `self ⊔ other`, field by field.
    #[must_use]
    pub fn join(&self, other: &Self) -> Self {
        SizeEntry {
            scalar: self.scalar.join(&other.scalar),
            size: self.size.join(&other.size),
            stride: self.stride.join(&other.stride),
        }
    }

    /// Whether size dimension `i` is dynamic (docs/semantics.md).
    pub fn is_size_dynamic(&self, i: usize) -> bool {
        self.size.is_dynamic_at(i)
    }

    /// Whether stride dimension `i` is dynamic: only when every size atom is
    /// concrete and the stride tuple (or its atom `i`) is dynamic (docs/semantics.md).
    pub fn is_stride_dynamic(&self, i: usize) -> bool {
        self.size.all_static() && self.stride.is_dynamic_at(i)
    }

    /// Whether an int source is dynamic: iff `scalar` is `Dynamic`.
    pub fn is_scalar_dynamic(&self) -> bool {
        self.scalar.is_dynamic()
    }
}

impl fmt::Display for SizeEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{scalar: {}, size: {}, stride: {}}}",
            self.scalar, self.size, self.stride
        )
    }
}
