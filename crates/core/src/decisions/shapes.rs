//! Shape decisions: observations of compiler inputs, the per-frame state
//! that accumulates them, and the static/dynamic decision per dimension.
//!
//! A [`FrameState`] maps each source (compiler input name, e.g. `L['x']`) to
//! a [`SizeEntry`]. It is the [`Join`] that automatic-dynamic shapes
//! exchange: a source absent on a rank contributes nothing; a source seen
//! differently on two ranks becomes dynamic where it differed.

use crate::decisions::frame_wire::Table;
use crate::decisions::lattice::{Scalar, SizeEntry};
use crate::error::DecodeError;
use crate::protocol::join::{Join, Sealed};
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
    /// A float input, by its IEEE 754 bits ([`Observation::float`]; as
    /// [`Scalar::Float`]). Dynamo records it as an int is recorded
    /// (`FrameStateSizeEntry.make_scalar` in `wrap_symfloat`,
    /// torch/_dynamo/variables/builder.py) and compiles it symbolically when
    /// its entry is dynamic, except a NaN or an infinity, which it always
    /// specialises ([`decide`]).
    Float(u64),
    /// A bool input. Dynamo records no frame-state entry for a bool (it is a
    /// constant guarded by identity, `BOOL_MATCH`), so it contributes ⊥ and
    /// is always compiled static.
    Bool(bool),
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

    /// A float input.
    pub fn float(value: f64) -> Self {
        Observation::Float(value.to_bits())
    }

    /// The size entry recorded for this observation (`None` and a bool
    /// contribute ⊥).
    pub fn entry(&self) -> SizeEntry {
        match self {
            Observation::Tensor { sizes, strides } => SizeEntry::tensor(sizes, strides.as_deref()),
            Observation::Int(v) => SizeEntry::int(*v),
            Observation::Float(bits) => SizeEntry::scalar(Scalar::Float(*bits)),
            Observation::Bool(_) | Observation::None => SizeEntry::unset(),
        }
    }

    /// Whether Dynamo records an entry for this observation (a tensor, an
    /// int or a float; not `None`, not a bool).
    pub fn is_recorded(&self) -> bool {
        !matches!(self, Observation::None | Observation::Bool(_))
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

/// Everything known about the sources of one frame (one compiled function):
/// source name → [`SizeEntry`], in name order.
///
/// Join: per source, missing = ⊥ (PyTorch's `FrameStateSizeEntry` join per
/// source, torch/_dynamo/pgo.py). Its wire kind is `"shape.frame_state"`.
///
/// A state is kept in its canonical wire form, the exact bytes of its
/// postcard encoding (module docs of `decisions`), so that an exchange
/// moves and merges a few contiguous buffers: sending a state copies its
/// bytes, and a join is one pass over two sorted byte strings that copies
/// every entry the other side does not change. Reading an entry
/// ([`FrameState::get`], [`FrameState::iter`]) decodes it. Costs: `get`
/// and `record` find a source by binary search (O(log n) names read);
/// `record` of a new source, or one whose entry changes, moves the bytes
/// after it (O(size of the state)), so building an n-source state by
/// `record` in no particular name order is O(n²) bytes moved (2000 tensor
/// sources: about 33 KB per state, a few milliseconds); `collect` from
/// `(name, entry)` pairs sorts once. Equality is byte equality, which is
/// value equality because the bytes are canonical.
///
/// Its serde form is a struct with one field `entries`, a map of source
/// names to entries (postcard: the payload's bytes; JSON:
/// `{"entries": {"x": {...}}}`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FrameState {
    table: Table,
}

impl FrameState {
    /// `self ← self ⊔ decode(payload)`, joining another rank's payload (its
    /// canonical postcard encoding, [`crate::protocol::encode_payload`])
    /// straight from its bytes: one pass over both sorted source lists (see
    /// the type docs). Accepts exactly what
    /// [`crate::protocol::decode_payload`] accepts, with the same result as
    /// decoding, then [`Join::join`] (property-tested). The exchange joins
    /// every gathered payload with it.
    ///
    /// # Errors
    /// [`DecodeError::Payload`] naming the kind and what does not read; `self`
    /// is then unchanged.
    pub fn join_encoded(&mut self, payload: &[u8]) -> Result<(), DecodeError> {
        let mut out = Table::default();
        out.merge_payload(&self.table, payload)
            .map_err(payload_error)?;
        self.table = out;
        Ok(())
    }

    /// `self ← self ⊔ every payload`, where `payloads` holds every rank's
    /// canonical payload (index = rank) and `payloads[own]` is meant to be
    /// this state's: each peer's payload is joined in rank order, in one
    /// pass over this state's bytes and the peer's (an entry whose bytes
    /// equal this state's costs a comparison; a payload equal to this
    /// rank's own is skipped). `payloads[own]` is not read again once a
    /// comparison showed it is this state's encoding; should it not be,
    /// every payload is read. The result and the payloads accepted are those
    /// of reading every payload in rank order, then joining all but `own`'s
    /// (property-tested). [`Channel::exchange_in_place`](crate::Channel::exchange_in_place)
    /// joins with it.
    ///
    /// # Errors
    /// `(index, DecodeError::Payload)` for the first payload, in rank order,
    /// that does not read; `self` is then unchanged.
    pub fn join_payloads(
        &mut self,
        own: usize,
        payloads: &[&[u8]],
    ) -> Result<(), (usize, DecodeError)> {
        if let Some(t) = crate::decisions::frame_wire::join_payloads(&self.table, own, payloads)
            .map_err(|(rank, detail)| (rank, payload_error(detail)))?
        {
            self.table = t;
        }
        Ok(())
    }
}

/// The frame state's wire hooks are its byte-level reader, writer and joins
/// (see the type docs); the exchange reaches them through the sealed hooks.
impl Join for FrameState {
    const KIND: &'static str = "shape.frame_state";

    /// One pass over both states' bytes (see the type docs): an entry of
    /// `other` equal to this state's entry costs a comparison; `self ⊔ self`
    /// and `⊥ ⊔ other` cost a comparison and a copy.
    fn join(&mut self, other: &Self) {
        if other.table.len() == 0 || self.table == other.table {
            return;
        }
        if self.table.len() == 0 {
            self.table.clone_from(&other.table);
            return;
        }
        let mut out = Table::default();
        match out.merge_table(&self.table, &other.table) {
            Ok(()) => self.table = out,
            // Both tables hold canonical entries (the type's invariant).
            Err(e) => debug_assert!(false, "a frame state's own bytes do not read: {e}"),
        }
    }

    fn join_encoded(&mut self, payload: &[u8], _: Sealed) -> Result<(), DecodeError> {
        FrameState::join_encoded(self, payload)
    }

    fn join_payloads(
        &mut self,
        own: usize,
        payloads: &[&[u8]],
        _: Sealed,
    ) -> Result<(), (usize, DecodeError)> {
        FrameState::join_payloads(self, own, payloads)
    }

    /// The same value and the same acceptance as postcard's
    /// (property-tested), stored canonically.
    fn read_payload(payload: &[u8], _: Sealed) -> Result<Self, DecodeError> {
        Table::read(payload)
            .map(|table| FrameState { table })
            .map_err(payload_error)
    }

    /// postcard's bytes: the count, then the stored bytes as they are.
    fn write_payload(&self, out: &mut Vec<u8>, _: Sealed) -> Result<(), String> {
        self.table.write_payload(out);
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

impl Serialize for FrameState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeStruct};
        struct Entries<'a>(&'a FrameState);
        impl Serialize for Entries<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (name, e) in self.0.iter() {
                    m.serialize_entry(name, &e)?;
                }
                m.end()
            }
        }
        let mut st = s.serialize_struct("FrameState", 1)?;
        st.serialize_field("entries", &Entries(self))?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for FrameState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename = "FrameState")]
        struct Raw {
            #[serde(deserialize_with = "entries_in_bulk")]
            entries: Vec<(String, SizeEntry)>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(FrameState {
            table: Table::from_sorted(raw.entries.iter().map(|(k, v)| (k.as_str(), v))),
        })
    }
}

impl fmt::Debug for FrameState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Entries<'a>(&'a FrameState);
        impl fmt::Debug for Entries<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_map().entries(self.0.iter()).finish()
            }
        }
        f.debug_struct("FrameState")
            .field("entries", &Entries(self))
            .finish()
    }
}

impl<S: AsRef<str>> FromIterator<(S, SizeEntry)> for FrameState {
    /// A state holding these entries; a name given twice keeps its last
    /// entry (as a map's `collect` does). Sorts once.
    fn from_iter<I: IntoIterator<Item = (S, SizeEntry)>>(iter: I) -> Self {
        let mut v: Vec<(S, SizeEntry)> = iter.into_iter().collect();
        sorted_last_wins(&mut v);
        FrameState {
            table: Table::from_sorted(v.iter().map(|(k, e)| (k.as_ref(), e))),
        }
    }
}

/// Sorts by name, keeping the last of equal names.
fn sorted_last_wins<S: AsRef<str>>(v: &mut Vec<(S, SizeEntry)>) {
    // A stable sort keeps equal names in their order: the last one wins.
    v.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
    let mut out: Vec<(S, SizeEntry)> = Vec::with_capacity(v.len());
    for kv in v.drain(..) {
        match out.last_mut() {
            Some(last) if last.0.as_ref() == kv.0.as_ref() => *last = kv,
            _ => out.push(kv),
        }
    }
    *v = out;
}

/// Reads the entries as a list sorted by name. Binary forms (the exchange
/// payload, profiles) must be canonical: names strictly increasing, else an
/// error. Human-readable forms (JSON) may list names in any order; a
/// repeated name keeps its last entry.
fn entries_in_bulk<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<(String, SizeEntry)>, D::Error> {
    struct Entries {
        strict: bool,
    }
    impl<'de> serde::de::Visitor<'de> for Entries {
        type Value = Vec<(String, SizeEntry)>;
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
            if !self.strict {
                sorted_last_wins(&mut v);
            }
            Ok(v)
        }
    }
    let strict = !d.is_human_readable();
    d.deserialize_map(Entries { strict })
}

impl FrameState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `obs` for `source` (joins it into what is there).
    /// `Observation::None` and a bool record nothing
    /// ([`Observation::is_recorded`]).
    pub fn record(&mut self, source: &str, obs: &Observation) {
        if !obs.is_recorded() {
            return;
        }
        self.record_entry(source, &obs.entry());
    }

    /// Joins an entry (an observation or a mark-dynamic hint) into `source`.
    pub fn record_entry(&mut self, source: &str, entry: &SizeEntry) {
        self.table.join_entry(source, entry);
    }

    /// Sets the entry of `source` (no join); returns the entry it replaces.
    /// The entry is kept as given, ⊥ ([`SizeEntry::unset`]) too: the source
    /// is then listed ([`FrameState::contains`], [`FrameState::len`]) and
    /// the state differs from one without it (as a Dynamo frame state with
    /// an all-`auto_unset` entry differs from one without the key), so a
    /// rank that inserts ⊥ where its peers hold nothing does not take the
    /// fast path; [`FrameState::remove`] takes a source out.
    pub fn insert(&mut self, source: &str, entry: &SizeEntry) -> Option<SizeEntry> {
        self.table.insert(source, entry)
    }

    /// Removes `source`; returns its entry.
    pub fn remove(&mut self, source: &str) -> Option<SizeEntry> {
        self.table.remove(source)
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
        self.entry(source).unwrap_or_default()
    }

    /// The entry of `source`, `None` when never seen.
    pub fn entry(&self, source: &str) -> Option<SizeEntry> {
        let i = self.table.find(source).ok()?;
        self.table.get(i).map(|(_, e)| e)
    }

    /// Whether `source` was seen.
    pub fn contains(&self, source: &str) -> bool {
        self.table.find(source).is_ok()
    }

    /// Number of sources.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no source was seen.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    /// Every source with its entry, in name order (each entry decoded).
    pub fn iter(&self) -> impl Iterator<Item = (&str, SizeEntry)> + '_ {
        (0..self.table.len()).filter_map(|i| self.table.get(i))
    }

    /// Every source name, in order.
    pub fn sources(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.table.len()).map(|i| self.table.name_str(i))
    }

    /// The join of `states` (⊥ for none): the same value as folding
    /// [`Join::join`] over them, by two-way merges into two buffers used in
    /// turn (so two allocations in all, where the fold makes one per
    /// state). The join of many ranks' states: 64 × 1000 sources in about a
    /// millisecond on the project's machine (docs/performance.md).
    pub fn join_all<'a>(states: impl IntoIterator<Item = &'a FrameState>) -> FrameState {
        let states: Vec<&FrameState> = states.into_iter().filter(|s| !s.is_empty()).collect();
        let tables: Vec<&Table> = states.iter().map(|s| &s.table).collect();
        match crate::decisions::frame_wire::join_tables(&tables) {
            Ok(table) => FrameState { table },
            // Tables hold canonical entries (the type's invariant); were one
            // not to read, join them one by one.
            Err(e) => {
                debug_assert!(false, "a frame state's own bytes do not read: {e}");
                let mut acc = FrameState::new();
                for s in states {
                    acc.join(s);
                }
                acc
            }
        }
    }

    /// The entries' wire bytes (the payload without its count), canonical:
    /// equal states have equal bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.table.bytes()
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
    /// A float: whether it is compiled symbolically.
    Float {
        /// `true` = symbolic.
        dynamic: bool,
    },
    /// A bool: always a constant.
    Bool,
    /// The source is `None` on this rank.
    None,
}

/// Decides each dimension of `obs` from the merged `entry` (docs/semantics.md);
/// `ov` beats the merge.
///
/// - size dim `i` is dynamic iff the size tuple is `Dynamic` or its atom `i` is;
/// - stride dim `i` is dynamic only if every size atom is concrete and the
///   stride tuple (or its atom `i`) is `Dynamic`;
/// - an int is dynamic iff `scalar` is `Dynamic`;
/// - a float is dynamic iff `scalar` is `Dynamic` and the value is finite:
///   Dynamo specialises a NaN or an infinity whatever its entry says
///   (`wrap_symfloat`, torch/_dynamo/variables/builder.py), and
///   `force_dynamic` does not change that;
/// - a bool is a constant.
pub fn decide(entry: &SizeEntry, obs: &Observation, ov: Option<Override>) -> SourceDecision {
    match obs {
        Observation::None => SourceDecision::None,
        Observation::Bool(_) => SourceDecision::Bool,
        Observation::Float(bits) => SourceDecision::Float {
            dynamic: f64::from_bits(*bits).is_finite()
                && match ov {
                    Some(Override::ForceStatic) => false,
                    Some(Override::ForceDynamic) => true,
                    None => entry.is_scalar_dynamic(),
                },
        },
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
