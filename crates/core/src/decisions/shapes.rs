//! Shape decisions: observations of compiler inputs, the per-frame state
//! that accumulates them, and the static/dynamic decision per dimension.
//!
//! A [`FrameState`] maps each source (compiler input name, e.g. `L['x']`) to
//! a [`SizeEntry`]. It is the [`Join`] that automatic-dynamic shapes
//! exchange: a source absent on a rank contributes nothing; a source seen
//! differently on two ranks becomes dynamic where it differed.

use crate::decisions::lattice::{Dims, SizeEntry};
use crate::error::DecodeError;
use crate::protocol::join::Join;
use serde::de::Error as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// What one rank passes for one source at one call.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Observation {
    /// A tensor: sizes and strides in elements (`strides: None` = contiguous).
    Tensor {
        /// Sizes, one per dimension.
        sizes: Vec<u64>,
        /// Strides, one per dimension; `None` = row-major contiguous.
        strides: Option<Vec<u64>>,
    },
    /// An int input.
    Int(i64),
    /// The source was passed as `None` (absent on this rank).
    None,
}

impl Observation {
    /// A contiguous tensor of the given sizes.
    pub fn tensor(sizes: impl Into<Vec<u64>>) -> Self {
        Observation::Tensor {
            sizes: sizes.into(),
            strides: None,
        }
    }

    /// A tensor with explicit strides (in elements).
    pub fn strided(sizes: impl Into<Vec<u64>>, strides: impl Into<Vec<u64>>) -> Self {
        Observation::Tensor {
            sizes: sizes.into(),
            strides: Some(strides.into()),
        }
    }

    /// The size entry recorded for this observation (`None` contributes ⊥).
    pub fn entry(&self) -> SizeEntry {
        match self {
            Observation::Tensor { sizes, strides } => SizeEntry::tensor(sizes, strides.as_deref()),
            Observation::Int(v) => SizeEntry::int(*v),
            Observation::None => SizeEntry::unset(),
        }
    }

    /// The strides of a tensor, contiguous ones filled in.
    pub fn strides(&self) -> Option<Vec<u64>> {
        match self {
            Observation::Tensor { sizes, strides } => Some(
                strides
                    .clone()
                    .unwrap_or_else(|| crate::decisions::lattice::contiguous_strides(sizes)),
            ),
            _ => None,
        }
    }
}

/// A per-source rule that beats the merged result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Override {
    /// Always compile this source static (specialised).
    ForceStatic,
    /// Always compile every dimension (or the int) of this source dynamic.
    ForceDynamic,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Override::ForceStatic => "force_static",
            Override::ForceDynamic => "force_dynamic",
        })
    }
}

/// Everything known about the sources of one frame (one compiled function).
///
/// Join: per source, missing = ⊥. Its wire kind is `"shape.frame_state"`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameState {
    /// Source name → entry, in name order (canonical encoding).
    #[serde(deserialize_with = "entries_in_bulk")]
    pub entries: BTreeMap<String, SizeEntry>,
}

impl Join for FrameState {
    const KIND: &'static str = "shape.frame_state";
    fn join(&mut self, other: &Self) {
        // ⊥ ⊔ other = other: copy the tree whole instead of inserting
        // entry by entry.
        if self.entries.is_empty() {
            self.entries.clone_from(&other.entries);
            return;
        }
        // Ranks usually saw the same sources: walk both maps in step, in one
        // pass. Should the names part, the general walk below finishes the
        // join; joining an entry twice changes nothing (idempotence).
        if self.entries.len() == other.entries.len() {
            let mut same = true;
            for ((name, mine), (source, theirs)) in self.entries.iter_mut().zip(&other.entries) {
                if name != source {
                    same = false;
                    break;
                }
                if mine != theirs {
                    join_in_place(mine, theirs);
                }
            }
            if same {
                return;
            }
        }
        for (source, entry) in &other.entries {
            match self.entries.get_mut(source) {
                // Equal entries join to themselves (idempotence): skip the rebuild.
                Some(mine) if mine == entry => {}
                Some(mine) => join_in_place(mine, entry),
                None => {
                    self.entries.insert(source.clone(), entry.clone());
                }
            }
        }
    }

    /// Joins another rank's payload straight from its bytes: one pass over
    /// both sorted source lists, names read in place, so a source this
    /// state already holds costs no allocation (a new source costs its
    /// entry). Accepts exactly what [`crate::protocol::decode_payload`]
    /// accepts, with the same result as decoding then [`Join::join`]
    /// (property-tested against postcard).
    fn join_encoded(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        crate::decisions::frame_wire::join_into(&mut self.entries, payload).map_err(payload_error)
    }

    /// Joins every peer's payload in place, in two passes: each is read in
    /// step with this rank's own payload (an entry whose bytes equal this
    /// rank's costs a comparison; any other is read strictly), then the
    /// entries that differ are joined. This rank's own payload is not read
    /// again: the frame state's writer writes only what its reader accepts
    /// (property-tested). Same acceptance and result as the provided
    /// version (property-tested).
    fn join_payloads(
        &mut self,
        own: usize,
        payloads: &[&[u8]],
    ) -> Result<(), (usize, DecodeError)> {
        crate::decisions::frame_wire::join_payloads(&mut self.entries, own, payloads)
            .map_err(|(rank, detail)| (rank, payload_error(detail)))
    }

    /// Reads a payload by hand: the same value and the same acceptance as
    /// postcard's (property-tested).
    fn read_payload(payload: &[u8]) -> Result<Self, DecodeError> {
        crate::decisions::frame_wire::read(payload)
            .map(|entries| FrameState { entries })
            .map_err(payload_error)
    }

    /// Writes postcard's bytes by hand (property-tested).
    fn write_payload(&self, out: &mut Vec<u8>) -> Result<(), String> {
        crate::decisions::frame_wire::write(&self.entries, out);
        Ok(())
    }
}

fn payload_error(detail: String) -> DecodeError {
    DecodeError::Payload {
        kind: FrameState::KIND.to_owned(),
        detail,
    }
}

/// The message of a binary payload whose source names are not strictly
/// increasing (the canonical encoding of a map sorted by name).
fn out_of_order(name: &str, previous: &str) -> String {
    format!("source '{name}' after '{previous}': names must be strictly increasing")
}

/// Reads the entries as a list, then builds the map in one pass (the
/// encoding is sorted by name, so this skips a search per entry). Binary
/// forms (the exchange payload, profiles) must be canonical: names strictly
/// increasing, else an error. Human-readable forms (JSON) may list names in
/// any order; a repeated name keeps its last entry.
fn entries_in_bulk<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, SizeEntry>, D::Error> {
    struct Entries {
        strict: bool,
    }
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = BTreeMap<String, SizeEntry>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of source names to size entries")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            // The size hint comes from the peer: cap what it may make us reserve.
            let mut v: Vec<(String, SizeEntry)> =
                Vec::with_capacity(m.size_hint().unwrap_or(0).min(4096));
            while let Some(kv) = m.next_entry::<String, SizeEntry>()? {
                if let (true, Some((p, _))) = (self.strict, v.last()) {
                    if kv.0 <= *p {
                        return Err(A::Error::custom(out_of_order(&kv.0, p)));
                    }
                }
                v.push(kv);
            }
            Ok(v.into_iter().collect())
        }
    }
    let strict = !d.is_human_readable();
    d.deserialize_map(Entries { strict })
}

/// `mine ← mine ⊔ theirs` without rebuilding tuples of equal length (the
/// same result as [`SizeEntry::join`]).
fn join_in_place(mine: &mut SizeEntry, theirs: &SizeEntry) {
    fn dims<V: PartialEq + Clone>(a: &mut Dims<V>, b: &Dims<V>) {
        match (&mut *a, b) {
            (Dims::Known(xs), Dims::Known(ys)) if xs.len() == ys.len() => {
                for (x, y) in xs.iter_mut().zip(ys) {
                    if x != y {
                        *x = x.join(y);
                    }
                }
            }
            _ => *a = a.join(b),
        }
    }
    mine.scalar = mine.scalar.join(&theirs.scalar);
    dims(&mut mine.size, &theirs.size);
    dims(&mut mine.stride, &theirs.stride);
}

impl FrameState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `obs` for `source` (joins it into what is there).
    /// `Observation::None` records nothing.
    pub fn record(&mut self, source: &str, obs: &Observation) {
        if matches!(obs, Observation::None) {
            return;
        }
        self.record_entry(source, &obs.entry());
    }

    /// Joins an entry (an observation or a mark-dynamic hint) into `source`.
    pub fn record_entry(&mut self, source: &str, entry: &SizeEntry) {
        match self.entries.get_mut(source) {
            Some(mine) => *mine = mine.join(entry),
            None => {
                self.entries.insert(source.to_owned(), entry.clone());
            }
        }
    }

    /// The state of one call's inputs, everything static (the preflight pass).
    pub fn from_inputs<'a>(
        inputs: impl IntoIterator<Item = (&'a String, &'a Observation)>,
    ) -> Self {
        let mut s = FrameState::new();
        for (source, obs) in inputs {
            s.record(source, obs);
        }
        s
    }

    /// The entry of `source` (⊥ when never seen).
    pub fn get(&self, source: &str) -> SizeEntry {
        self.entries.get(source).cloned().unwrap_or_default()
    }
}

/// The decision for one source, for the inputs it was made with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceDecision {
    /// A tensor: per dimension, whether its size / stride is dynamic.
    Tensor {
        /// `true` = compile this size symbolically.
        dynamic_sizes: Vec<bool>,
        /// `true` = compile this stride symbolically.
        dynamic_strides: Vec<bool>,
    },
    /// An int: whether it is compiled symbolically.
    Int {
        /// `true` = symbolic.
        dynamic: bool,
    },
    /// The source is `None` on this rank.
    None,
}

/// Decides each dimension of `obs` from the merged `entry` (docs/semantics.md);
/// `ov` beats the merge.
///
/// - size dim `i` is dynamic iff the size tuple is `Dynamic` or its atom `i` is;
/// - stride dim `i` is dynamic only if every size atom is concrete and the
///   stride tuple (or its atom `i`) is `Dynamic`;
/// - an int is dynamic iff `scalar` is `Dynamic`.
pub fn decide(entry: &SizeEntry, obs: &Observation, ov: Option<Override>) -> SourceDecision {
    match obs {
        Observation::None => SourceDecision::None,
        Observation::Int(_) => SourceDecision::Int {
            dynamic: match ov {
                Some(Override::ForceStatic) => false,
                Some(Override::ForceDynamic) => true,
                None => entry.is_scalar_dynamic(),
            },
        },
        Observation::Tensor { sizes, .. } => {
            let n = sizes.len();
            let (dynamic_sizes, dynamic_strides) = match ov {
                Some(Override::ForceStatic) => (vec![false; n], vec![false; n]),
                Some(Override::ForceDynamic) => (vec![true; n], vec![false; n]),
                None => (
                    (0..n).map(|i| entry.is_size_dynamic(i)).collect(),
                    (0..n).map(|i| entry.is_stride_dynamic(i)).collect(),
                ),
            };
            SourceDecision::Tensor {
                dynamic_sizes,
                dynamic_strides,
            }
        }
    }
}

/// Canonical text of a set of overrides, e.g. `x=force_dynamic,y=force_static`
/// (sorted by source), for the configuration every rank must share.
pub fn overrides_text(overrides: &BTreeMap<String, Override>) -> String {
    let mut out = String::new();
    for (i, (k, v)) in overrides.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(&v.to_string());
    }
    out
}
