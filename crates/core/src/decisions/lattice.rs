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

/// The value of a scalar input as Dynamo records it
/// (`FrameStateSizeEntry.scalar`, torch/_dynamo/pgo.py): an int, a float
/// (an unspecialised float, e.g. a module's `norm_type = 2.0`), a bool, or an
/// int beyond 64 bits.
///
/// Equality is identity of type and value: `Int(1)`, `Float(1.0)` and
/// `Bool(true)` are three atoms, a float is compared by its IEEE 754 bits
/// (NaN equals the same NaN, `0.0` differs from `-0.0`). That is Python's
/// `==` on every pair except three, where Dynamo's fold (`_merge_atom`,
/// which keeps the first of two equal values and makes unequal ones
/// dynamic) and this join part ways: numbers of different types that Python
/// calls equal (`1 == 1.0 == True`), NaN (never equal to itself in Python),
/// and `0.0 == -0.0`. Only floats and bools take part in those, so
/// [`Scalar::is_python_ambiguous`] marks them; the Python package keeps
/// Dynamo's own per-rank fold for such sources (docs/python.md). Among ints
/// alone, or among non-zero, non-NaN floats alone, this equality is Python's.
///
/// Canonical form: an int that fits in `i64` is [`Scalar::Int`], never
/// [`Scalar::BigInt`] ([`Scalar::int`] builds the canonical one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    /// An int that fits in 64 bits.
    Int(i64),
    /// A float, by its IEEE 754 bits ([`Scalar::float`], [`Scalar::as_f64`]).
    Float(u64),
    /// A bool.
    Bool(bool),
    /// An int beyond 64 bits, of magnitude below [`Scalar::BIG_INT_LIMIT`].
    BigInt(i128),
}

/// Where each kind of scalar starts in the code space of the compact wire
/// form (module `crate::protocol::compact`): ints by zigzag in `[0, 2^64)`,
/// floats at `2^64 + bits`, bools at `2^65 + b`, big ints at
/// `2^66 + zigzag(v)`; every code stays below `2^127`, so an atom is at most
/// 19 bytes on the wire.
const FLOAT_CODES: u128 = 1 << 64;
const BOOL_CODES: u128 = 1 << 65;
const BIG_INT_CODES: u128 = 1 << 66;

impl Scalar {
    /// Big ints carry magnitudes below 2^126 (the code space's bound, above).
    pub const BIG_INT_LIMIT: i128 = 1 << 126;

    /// The canonical scalar of an int: `Int` when it fits in 64 bits, else
    /// `BigInt`; `None` when its magnitude reaches [`Scalar::BIG_INT_LIMIT`].
    pub fn int(value: i128) -> Option<Self> {
        match i64::try_from(value) {
            Ok(v) => Some(Scalar::Int(v)),
            Err(_) if value.unsigned_abs() < Self::BIG_INT_LIMIT.unsigned_abs() => {
                Some(Scalar::BigInt(value))
            }
            Err(_) => None,
        }
    }

    /// A float, kept by its bits.
    pub fn float(value: f64) -> Self {
        Scalar::Float(value.to_bits())
    }

    /// The float's value, for [`Scalar::Float`].
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::Float(bits) => Some(f64::from_bits(bits)),
            _ => None,
        }
    }

    /// Whether Python's `==` may disagree with this type's equality for
    /// this value against some other scalar: true for every float and bool
    /// (see the type docs), false for ints.
    pub fn is_python_ambiguous(&self) -> bool {
        matches!(self, Scalar::Float(_) | Scalar::Bool(_))
    }

    /// Python's `==` between two scalars: ints, bools and big ints compare
    /// as integers (`True == 1`), an integer and a float compare exactly
    /// (`3 == 3.0`, `2**60 + 1 != float(2**60)`), floats by value (`0.0 ==
    /// -0.0`; a NaN equals nothing, itself included). Dynamo's
    /// `FrameStateSizeEntry._merge_atom` (torch/_dynamo/pgo.py) compares
    /// atoms this way; [`SizeEntry::fold`] uses it.
    pub fn python_eq(&self, other: &Scalar) -> bool {
        fn integer(s: &Scalar) -> Option<i128> {
            match *s {
                Scalar::Int(v) => Some(i128::from(v)),
                Scalar::Bool(b) => Some(i128::from(b)),
                Scalar::BigInt(v) => Some(v),
                Scalar::Float(_) => None,
            }
        }
        // An integral float of magnitude below 2^126 (the big-int bound) as
        // the integer it equals; any other float equals no integer.
        fn integral(f: f64) -> Option<i128> {
            const BOUND: f64 = 85_070_591_730_234_615_865_843_651_857_942_052_864.0; // 2^126
            if f.is_finite() && f.trunc() == f && f.abs() < BOUND {
                // Integral and in range: the conversion is exact.
                #[allow(clippy::cast_possible_truncation)]
                Some(f as i128)
            } else {
                None
            }
        }
        match (integer(self), integer(other), self.as_f64(), other.as_f64()) {
            (Some(a), Some(b), _, _) => a == b,
            (_, _, Some(x), Some(y)) => x == y,
            (Some(a), None, _, Some(y)) | (None, Some(a), Some(y), _) => integral(y) == Some(a),
            _ => false,
        }
    }

    fn zigzag(v: i128) -> u128 {
        // Callers pass |v| < 2^126, so neither side overflows.
        (v.unsigned_abs() << 1) - u128::from(v < 0)
    }

    fn unzigzag(code: u128) -> i128 {
        // Callers pass code < 2^127, so the half fits in i128.
        let half = i128::try_from(code >> 1).unwrap_or(i128::MAX);
        if code & 1 == 1 {
            -half - 1
        } else {
            half
        }
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Scalar::Int(v) => v.fmt(f),
            Scalar::Float(bits) => fmt::Debug::fmt(&f64::from_bits(bits), f),
            Scalar::Bool(true) => f.write_str("True"),
            Scalar::Bool(false) => f.write_str("False"),
            Scalar::BigInt(v) => v.fmt(f),
        }
    }
}

/// Scalars in the compact form: see the code space above.
impl AtomValue for Scalar {
    fn code(&self) -> u128 {
        match *self {
            Scalar::Int(v) => Scalar::zigzag(i128::from(v)),
            Scalar::Float(bits) => FLOAT_CODES + u128::from(bits),
            Scalar::Bool(b) => BOOL_CODES + u128::from(b),
            Scalar::BigInt(v) => BIG_INT_CODES + Scalar::zigzag(v),
        }
    }
    fn from_code(code: u128) -> Option<Self> {
        if code < FLOAT_CODES {
            // Below 2^64: every i64, exactly.
            i64::try_from(Scalar::unzigzag(code)).ok().map(Scalar::Int)
        } else if code < BOOL_CODES {
            u64::try_from(code - FLOAT_CODES).ok().map(Scalar::Float)
        } else if code < BIG_INT_CODES {
            match code - BOOL_CODES {
                0 => Some(Scalar::Bool(false)),
                1 => Some(Scalar::Bool(true)),
                _ => None,
            }
        } else {
            let z = code - BIG_INT_CODES;
            if z >= 1 << 127 {
                return None;
            }
            // Canonical only: a value that fits in i64 is an Int.
            match Scalar::int(Scalar::unzigzag(z))? {
                big @ Scalar::BigInt(_) => Some(big),
                _ => None,
            }
        }
    }
}

/// The human-readable (JSON) form: an int is a number (`5`, what scenario
/// files and profiles always held); the others are tagged:
/// `{"Float": 2.5}` (`"nan"`, `"inf"`, `"-inf"` for the non-finite ones;
/// a NaN reads back as the canonical quiet NaN), `{"Bool": true}`,
/// `{"BigInt": "-170141183460469231731687303715884105"}` (decimal text). The
/// binary form is the value's code (a varint), as inside an atom.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PlainScalar {
    Int(i64),
    Tagged(TaggedScalar),
}

#[derive(Serialize, Deserialize)]
enum TaggedScalar {
    Float(PlainFloat),
    Bool(bool),
    BigInt(String),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PlainFloat {
    Finite(f64),
    Text(String),
}

impl Serialize for Scalar {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !s.is_human_readable() {
            return s.serialize_u128(self.code());
        }
        match *self {
            Scalar::Int(v) => PlainScalar::Int(v),
            Scalar::Float(bits) => {
                let v = f64::from_bits(bits);
                PlainScalar::Tagged(TaggedScalar::Float(if v.is_finite() {
                    PlainFloat::Finite(v)
                } else if v.is_nan() {
                    PlainFloat::Text("nan".into())
                } else if v > 0.0 {
                    PlainFloat::Text("inf".into())
                } else {
                    PlainFloat::Text("-inf".into())
                }))
            }
            Scalar::Bool(b) => PlainScalar::Tagged(TaggedScalar::Bool(b)),
            Scalar::BigInt(v) => PlainScalar::Tagged(TaggedScalar::BigInt(v.to_string())),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        if !d.is_human_readable() {
            let code = u128::deserialize(d)?;
            return Scalar::from_code(code)
                .ok_or_else(|| D::Error::custom(format!("scalar code {code} is out of range")));
        }
        Ok(match PlainScalar::deserialize(d)? {
            PlainScalar::Int(v) => Scalar::Int(v),
            PlainScalar::Tagged(TaggedScalar::Bool(b)) => Scalar::Bool(b),
            PlainScalar::Tagged(TaggedScalar::Float(PlainFloat::Finite(v))) => Scalar::float(v),
            PlainScalar::Tagged(TaggedScalar::Float(PlainFloat::Text(t))) => {
                Scalar::float(match t.as_str() {
                    "nan" => f64::NAN,
                    "inf" => f64::INFINITY,
                    "-inf" => f64::NEG_INFINITY,
                    other => {
                        return Err(D::Error::custom(format!(
                        "a float scalar is a number, \"nan\", \"inf\" or \"-inf\", not {other:?}"
                    )))
                    }
                })
            }
            PlainScalar::Tagged(TaggedScalar::BigInt(text)) => {
                let v: i128 = text.parse().map_err(|_| {
                    D::Error::custom(format!("a BigInt scalar is decimal text, not {text:?}"))
                })?;
                match Scalar::int(v) {
                    Some(big @ Scalar::BigInt(_)) => big,
                    Some(_) => {
                        return Err(D::Error::custom(format!(
                            "BigInt {text} fits in 64 bits: write it as a number"
                        )))
                    }
                    None => {
                        return Err(D::Error::custom(format!(
                            "BigInt {text} is beyond ±2^126, the largest scalar carried"
                        )))
                    }
                }
            }
        })
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
    /// The value of a scalar input (an int, or a float, bool or big int
    /// as Dynamo records them: [`Scalar`]).
    pub scalar: Atom<Scalar>,
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
            scalar: Atom::Static(Scalar::Int(value)),
            size: Dims::Dynamic,
            stride: Dims::Dynamic,
        }
    }

    /// A scalar observation of any kind: `{scalar: v, size: Dynamic, stride:
    /// Dynamic}` (what `FrameStateSizeEntry.make_scalar` records).
    pub fn scalar(value: Scalar) -> Self {
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

    /// `self |= other` as Dynamo's fold does it
    /// (`FrameStateSizeEntry.__ior__`, torch/_dynamo/pgo.py): sizes and
    /// strides join as in [`SizeEntry::join`]; the scalar keeps `self`'s
    /// value when Python's `==` calls the two equal ([`Scalar::python_eq`]:
    /// `3` folded with `3.0` stays `3`, `0.0` with `-0.0` stays `0.0`) and
    /// becomes dynamic when it does not (a NaN folded with a NaN). Not
    /// commutative on such scalars (rank order matters), and equal to
    /// [`SizeEntry::join`] on every entry whose scalars are ints, or floats
    /// that are neither zero nor NaN, of one type.
    pub fn fold(&mut self, other: &SizeEntry) {
        self.scalar = match (&self.scalar, &other.scalar) {
            (Atom::Unset, y) => y.clone(),
            (x, Atom::Unset) => x.clone(),
            (Atom::Static(a), Atom::Static(b)) if a.python_eq(b) => Atom::Static(*a),
            _ => Atom::Dynamic,
        };
        self.size = self.size.join(&other.size);
        self.stride = self.stride.join(&other.stride);
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
