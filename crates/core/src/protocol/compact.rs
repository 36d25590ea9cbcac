//! The compact wire form of lattice atoms.
//!
//! In binary formats (postcard, the exchange payload) an atom (the lattice's
//! `Atom`, which serialises as a [`Compact`]) is one unsigned varint: `0` = `Unset`, `1` = `Dynamic`, `2 + code(v)` =
//! `Static(v)`, where [`AtomValue::code`] maps sizes as themselves, ints by
//! zigzag (`0, −1, 1, −2, …` → `0, 1, 2, 3, …`) and strides as `2·n` for
//! `Int(n)`, `2·j + 1` for `Infer(j)`. A typical size or stride atom is then
//! one byte instead of two or three (the derived enum form), which puts a
//! state's envelope under a quarter of the pickle PyTorch sends for the same
//! state (`ccol bench` prints both).
//!
//! Human-readable formats (JSON) keep the plain enum form
//! (`"Unset"`, `{"Static": 5}`, `"Dynamic"`).
//!
//! Decoding is strict: a code whose value does not fit the atom's type is an
//! error, never a wrapped or truncated value.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A value an atom can hold, with its code in the compact wire form
/// (implemented here for sizes and ints, and by the lattice for strides).
pub trait AtomValue: Sized + Serialize + DeserializeOwned {
    /// The value's code (see the module docs).
    fn code(&self) -> u128;
    /// The value of a code, `None` when it is out of range.
    fn from_code(code: u128) -> Option<Self>;
}

impl AtomValue for u64 {
    fn code(&self) -> u128 {
        u128::from(*self)
    }
    fn from_code(code: u128) -> Option<Self> {
        u64::try_from(code).ok()
    }
}

impl AtomValue for i64 {
    fn code(&self) -> u128 {
        // zigzag: the sign goes to the lowest bit.
        let v = i128::from(*self);
        u128::try_from(if v < 0 { -2 * v - 1 } else { 2 * v }).unwrap_or(0)
    }
    fn from_code(code: u128) -> Option<Self> {
        let half = i128::try_from(code / 2).ok()?;
        let v = if code % 2 == 1 { -half - 1 } else { half };
        i64::try_from(v).ok()
    }
}

/// The plain enum form, for human-readable formats.
#[derive(Serialize, Deserialize)]
#[serde(rename = "Atom")]
enum Plain<V> {
    Unset,
    Static(V),
    Dynamic,
}

/// An atom in its wire form: no information, one value, or dynamic. The
/// lattice's `Atom` converts to and from it in its serde impls, so the
/// protocol owns the form without depending on the lattice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compact<V> {
    /// Code 0.
    Unset,
    /// Code `2 + code(v)`.
    Static(V),
    /// Code 1.
    Dynamic,
}

impl<V: AtomValue> Serialize for Compact<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize(self.as_ref(), s)
    }
}

impl<V> Compact<V> {
    /// The same atom, borrowing its value.
    pub fn as_ref(&self) -> Compact<&V> {
        match self {
            Compact::Unset => Compact::Unset,
            Compact::Static(v) => Compact::Static(v),
            Compact::Dynamic => Compact::Dynamic,
        }
    }
}

/// Serialises a borrowed atom in the compact form (binary formats) or the
/// plain enum form (human-readable ones).
///
/// # Errors
/// The serializer's.
pub fn serialize<V: AtomValue, S: Serializer>(atom: Compact<&V>, s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        return match atom {
            Compact::Unset => Plain::<&V>::Unset,
            Compact::Static(v) => Plain::Static(v),
            Compact::Dynamic => Plain::Dynamic,
        }
        .serialize(s);
    }
    let code = match atom {
        Compact::Unset => 0,
        Compact::Dynamic => 1,
        // A value code is below 2^65, so this cannot overflow.
        Compact::Static(v) => v.code().saturating_add(2),
    };
    // The same varint either way; the 64-bit one is the faster to write.
    match u64::try_from(code) {
        Ok(small) => s.serialize_u64(small),
        Err(_) => s.serialize_u128(code),
    }
}

impl<'de, V: AtomValue> Deserialize<'de> for Compact<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            return Ok(match Plain::<V>::deserialize(d)? {
                Plain::Unset => Compact::Unset,
                Plain::Static(v) => Compact::Static(v),
                Plain::Dynamic => Compact::Dynamic,
            });
        }
        match u128::deserialize(d)? {
            0 => Ok(Compact::Unset),
            1 => Ok(Compact::Dynamic),
            c => V::from_code(c - 2)
                .map(Compact::Static)
                .ok_or_else(|| D::Error::custom(format!("atom code {c} is out of range"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decisions::lattice::{Atom, Stride};

    fn round_trip<V: AtomValue + PartialEq + std::fmt::Debug + Clone>(a: Atom<V>) -> usize {
        let bytes = postcard::to_allocvec(&a).unwrap();
        assert_eq!(postcard::from_bytes::<Atom<V>>(&bytes).unwrap(), a);
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Atom<V>>(&text).unwrap(), a);
        bytes.len()
    }

    #[test]
    fn atoms_round_trip_and_small_ones_take_one_byte() {
        assert_eq!(round_trip::<u64>(Atom::Unset), 1);
        assert_eq!(round_trip::<u64>(Atom::Dynamic), 1);
        assert_eq!(round_trip(Atom::Static(16u64)), 1);
        assert_eq!(round_trip(Atom::Static(Stride::Infer(2))), 1);
        assert_eq!(round_trip(Atom::Static(Stride::Int(1))), 1);
        assert_eq!(round_trip(Atom::Static(-3i64)), 1);
        for v in [0u64, 1, 125, 126, u64::MAX] {
            round_trip(Atom::Static(v));
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            round_trip(Atom::Static(v));
        }
        for s in [
            Stride::Int(u64::MAX),
            Stride::Infer(u32::MAX),
            Stride::Int(0),
        ] {
            round_trip(Atom::Static(s));
        }
        assert_eq!(
            serde_json::to_string(&Atom::Static(5u64)).unwrap(),
            r#"{"Static":5}"#
        );
    }

    #[test]
    fn out_of_range_codes_are_errors() {
        // u64::MAX + 3 is no u64 size.
        let big = postcard::to_allocvec(&(u128::from(u64::MAX) + 3)).unwrap();
        assert!(postcard::from_bytes::<Atom<u64>>(&big).is_err());
        // An Infer index above u32::MAX.
        let infer = postcard::to_allocvec(&(2 * (u128::from(u32::MAX) + 1) + 1 + 2)).unwrap();
        assert!(postcard::from_bytes::<Atom<Stride>>(&infer).is_err());
        let huge = postcard::to_allocvec(&u128::MAX).unwrap();
        assert!(postcard::from_bytes::<Atom<i64>>(&huge).is_err());
    }
}
