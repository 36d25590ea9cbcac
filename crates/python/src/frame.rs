//! Dynamo's `LocalState` ↔ core's [`FrameState`], and which states Dynamo
//! is handed back.
//!
//! A `LocalState.automatic_dynamic` maps source names to
//! `FrameStateSizeEntry(scalar, size, stride)` (torch/_dynamo/pgo.py, the
//! same in torch 2.13–2.15). Each entry maps one to one onto core's
//! [`SizeEntry`]: `auto_unset` = ⊥ (`Unset`), `auto_dynamic` = ⊤
//! (`Dynamic`), an int = `Static`, `InferStride(dim)` = `Stride::Infer`,
//! and a scalar's int, float or bool = the matching [`Scalar`] (a float by
//! its bits, so it reaches every rank exactly as recorded). The exchange
//! joins the ranks' states with core's join, in place
//! (`Channel::exchange_in_place`), so one join serves both sides.
//!
//! # Which states Dynamo folds
//!
//! After the exchange Dynamo folds, for each source it meets again,
//! `update_automatic_dynamic` over `all_states` in rank order
//! (`process_automatic_dynamic`, pgo.py): `entry |= state` with
//! `FrameStateSizeEntry._merge_atom` (equal values stay, unequal ones
//! become `auto_dynamic`, Python's `==`). Handing it the join instead, one
//! state, gives the same entry (the lattice is a semilattice and the fold is
//! a chain of joins) except in three cases, where every rank's own state is
//! handed back and Dynamo folds them itself:
//!
//! 1. `automatic_dynamic_shapes` is off: the fold overwrites (the last rank
//!    wins). The whole frame is per rank.
//! 2. `automatic_dynamic_exclusion_guard` is on: `|=` also keeps
//!    `excluded_sizes` / `excluded_scalar`, which depend on the order and
//!    the number of states folded (a second equal state clears them). The
//!    whole frame is per rank.
//! 3. A scalar where Python's `==` is not [`Scalar`]'s equality: `1`,
//!    `1.0` and `True` (equal in Python, three atoms here, so the join is
//!    dynamic where the fold keeps the first), `0.0` and `-0.0` (likewise),
//!    and NaN (the fold makes a NaN met twice dynamic; the join keeps it).
//!    Only floats and bools take part, so a rank that records one marks
//!    what it sends (the reserved source [`MARKER`]); when the join is
//!    marked, every source whose joined scalar is a NaN, or dynamic with
//!    dynamic sizes (a scalar on some rank: Dynamo records a scalar with
//!    `size=auto_dynamic`), is per rank, the rest joined. A rank whose own
//!    state holds a NaN also does not fold it once for every rank: it hands
//!    every copy.
//!
//! The first two are read in the compiling thread (Dynamo reads them
//! there). After a flat exchange they decide for that rank only: each rank
//! gets what its own Dynamo would have computed from every rank's state. A
//! rank where they forbid the join marks what it sends too, for the tree:
//! from `ChannelOptions::hierarchical_from` ranks the exchange is the tree,
//! which yields the join only; when the join is marked in a way that needs
//! every rank's state ([`needs_every_value`], the same answer on every
//! rank), every rank sends its state again in a flat exchange that keeps
//! every value.
//!
//! Handed as: `[J]` for a joined frame, `J` being a copy of the local
//! state's dict with a new entry only where the join differs from this
//! rank's; `[S_0, …, S_{n-1}]` for a frame with per-rank sources, `S_0`
//! holding the joined sources too; `[local_state] * n` (the same object)
//! for a whole-frame per-rank frame that every rank sent alike, and
//! `[local_state]` for a joined one.
//!
//! The entry's `excluded_sizes` / `excluded_scalar` travel only from a rank
//! where the frame is not joinable (cases 1–2), as reserved sources: there
//! another rank's entry may become this rank's frame state as it is (the
//! first case) or be read (the second). In a joined frame Dynamo's fold
//! writes them on each rank, and reads them only with the exclusion guard
//! on.

use compiler_collectives_core::decisions::lattice::{Atom, Dims, Scalar, SizeEntry, Stride};
use compiler_collectives_core::decisions::shapes::FrameState;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyTuple};

/// The reserved source a rank adds when its frame is not plainly joinable
/// (Dynamo's source names are never empty); its scalar is an int of
/// [`AMBIGUOUS_BIT`] and [`NOT_JOINABLE_BIT`], so that the join tells every
/// rank whether any rank had either (a join of two different values is
/// dynamic: both, to be safe).
pub(crate) const MARKER: &str = "";
/// The marker's bit for a float or bool scalar (case 3 of the module docs).
const AMBIGUOUS_BIT: i64 = 1;
/// The marker's bit for a rank whose settings forbid the join (cases 1–2).
const NOT_JOINABLE_BIT: i64 = 2;

/// The prefix of the reserved sources that carry an entry's
/// `excluded_sizes` / `excluded_scalar` (as its size and scalar) in a frame
/// that is not joinable on the sending rank: Dynamo's fold there hands
/// another rank's entry object to the frame state as it is
/// (`automatic_dynamic_shapes` off), or reads them (the exclusion guard),
/// so they must arrive as that rank recorded them.
const EXCLUDED_PREFIX: char = '\u{1}';

/// Whether `name` is one of this module's reserved sources, not Dynamo's.
fn reserved(name: &str) -> bool {
    name == MARKER || name.starts_with(EXCLUDED_PREFIX)
}

/// What the join's marker says: whether some rank had the bit.
fn marked(joined: &FrameState, bit: i64) -> bool {
    match joined.entry(MARKER).map(|e| e.scalar) {
        Some(Atom::Static(Scalar::Int(v))) => v & bit != 0,
        Some(Atom::Static(_) | Atom::Dynamic) => true,
        Some(Atom::Unset) | None => false,
    }
}

/// This rank's state, read once from its `LocalState`.
pub(crate) struct Read {
    /// What this rank sends (with [`MARKER`] when it applies); the
    /// exchange joins every rank's into it.
    pub(crate) state: FrameState,
    /// Each source's entry as read, and its Python object, in name order.
    own: Vec<(String, SizeEntry, Py<PyAny>)>,
    /// Whether some scalar of this rank is a NaN.
    has_nan: bool,
}

/// What the exchange found (computed with the GIL released).
pub(crate) enum Outcome {
    /// Every rank sent exactly this rank's state.
    Same,
    /// `Read::state` is the join; every rank's state as sent, where some
    /// source is per rank on this rank.
    Joined(Option<Vec<FrameState>>),
}

/// Whether this rank needs every rank's state, after a flat exchange whose
/// join is `joined`: always when its frame is not `joinable` (cases 1–2 of
/// the module docs), else when some source is per rank (case 3).
pub(crate) fn needs_per_rank(joined: &FrameState, joinable: bool) -> bool {
    !joinable || (marked(joined, AMBIGUOUS_BIT) && joined.iter().any(|(_, e)| per_rank_scalar(&e)))
}

/// Whether every rank needs every rank's state, after a tree exchange
/// (which yields the join only) whose join is `joined`: the same answer on
/// every rank, from the join alone — some rank was not joinable, or some
/// source is per rank.
pub(crate) fn needs_every_value(joined: &FrameState) -> bool {
    marked(joined, NOT_JOINABLE_BIT)
        || (marked(joined, AMBIGUOUS_BIT) && joined.iter().any(|(_, e)| per_rank_scalar(&e)))
}

/// Case 3 of the module docs, for a joined entry of a frame where some rank
/// recorded a float or bool: a dynamic scalar that some rank may have
/// recorded as a value (a tensor's entry has a dynamic scalar and known
/// sizes; any scalar's, dynamic sizes), or a NaN.
fn per_rank_scalar(joined: &SizeEntry) -> bool {
    match joined.scalar {
        Atom::Dynamic => matches!(joined.size, Dims::Dynamic),
        Atom::Static(s) => s.as_f64().is_some_and(f64::is_nan),
        Atom::Unset => false,
    }
}

/// The torch objects a conversion needs, looked up once.
#[derive(Debug)]
pub(crate) struct TorchTypes {
    auto_dynamic: Py<PyAny>,
    auto_unset: Py<PyAny>,
    infer_stride: Py<PyAny>,
    size_entry: Py<PyAny>,
    local_state: Py<PyAny>,
}

impl TorchTypes {
    /// From `torch._dynamo.pgo` and `torch._dynamo.symbolic_convert.LocalState`.
    pub(crate) fn new(pgo: &Bound<'_, PyAny>, local_state: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(TorchTypes {
            auto_dynamic: pgo.getattr("auto_dynamic")?.unbind(),
            auto_unset: pgo.getattr("auto_unset")?.unbind(),
            infer_stride: pgo.getattr("InferStride")?.unbind(),
            size_entry: pgo.getattr("FrameStateSizeEntry")?.unbind(),
            local_state: local_state.clone().unbind(),
        })
    }

    /// Reads `local_state.automatic_dynamic`, once; `joinable`: whether this
    /// rank's settings allow the join (cases 1–2 of the module docs).
    ///
    /// # Errors
    /// `TypeError` naming the source and field whose value is not one of
    /// the atoms above, or an int of magnitude 2^126 or more.
    pub(crate) fn read(&self, local_state: &Bound<'_, PyAny>, joinable: bool) -> PyResult<Read> {
        let py = local_state.py();
        let entries = local_state.getattr("automatic_dynamic")?;
        let entries = entries
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err("LocalState.automatic_dynamic is not a dict"))?;
        let mut own = Vec::with_capacity(entries.len());
        let mut excluded = Vec::new();
        let (mut ambiguous, mut has_nan) = (false, false);
        for (name, obj) in entries.iter() {
            let name: String = name.extract()?;
            let scalar = self.scalar(py, &obj.getattr("scalar")?, &name)?;
            if let Atom::Static(s) = scalar {
                ambiguous |= s.is_python_ambiguous();
                has_nan |= s.as_f64().is_some_and(f64::is_nan);
            }
            let size = self.dims(py, &obj.getattr("size")?, &name, "size", |v| {
                v.extract::<u64>().ok()
            })?;
            let stride = self.dims(py, &obj.getattr("stride")?, &name, "stride", |v| {
                if v.is_instance(self.infer_stride.bind(py)).ok()? {
                    v.getattr("dim")
                        .ok()?
                        .extract::<u32>()
                        .ok()
                        .map(Stride::Infer)
                } else {
                    v.extract::<u64>().ok().map(Stride::Int)
                }
            })?;
            let entry = SizeEntry {
                scalar,
                size,
                stride,
            };
            if !joinable {
                if let Some(e) = self.excluded(&obj, &name)? {
                    excluded.push((format!("{EXCLUDED_PREFIX}{name}"), e));
                }
            }
            own.push((name, entry, obj.unbind()));
        }
        own.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut state: FrameState = own
            .iter()
            .map(|(n, e, _)| (n.as_str(), e.clone()))
            .chain(excluded.iter().map(|(n, e)| (n.as_str(), e.clone())))
            .collect();
        let marker =
            if ambiguous { AMBIGUOUS_BIT } else { 0 } | if joinable { 0 } else { NOT_JOINABLE_BIT };
        if marker != 0 {
            state.insert(MARKER, &SizeEntry::int(marker));
        }
        Ok(Read {
            state,
            own,
            has_nan,
        })
    }

    /// An entry's `excluded_sizes` / `excluded_scalar` (torch 2.12 on) as a
    /// reserved entry's size and scalar (`None` = `Unset`), or `None` when
    /// both are `None`.
    fn excluded(&self, obj: &Bound<'_, PyAny>, source: &str) -> PyResult<Option<SizeEntry>> {
        let (Ok(sizes), Ok(scalar)) = (
            obj.getattr("excluded_sizes"),
            obj.getattr("excluded_scalar"),
        ) else {
            return Ok(None);
        };
        if sizes.is_none() && scalar.is_none() {
            return Ok(None);
        }
        let size = if sizes.is_none() {
            Dims::Unset
        } else {
            let items = sizes
                .cast::<PyTuple>()
                .map_err(|_| bad(source, "excluded_sizes", &sizes))?;
            let mut atoms = Vec::with_capacity(items.len());
            for item in items.iter() {
                atoms.push(if item.is_none() {
                    Atom::Unset
                } else {
                    Atom::Static(
                        item.extract::<u64>()
                            .map_err(|_| bad(source, "excluded_sizes", &sizes))?,
                    )
                });
            }
            Dims::Known(atoms)
        };
        let scalar = if scalar.is_none() {
            Atom::Unset
        } else {
            Atom::Static(
                scalar
                    .extract::<i128>()
                    .ok()
                    .and_then(Scalar::int)
                    .ok_or_else(|| bad(source, "excluded_scalar", &scalar))?,
            )
        };
        Ok(Some(SizeEntry {
            scalar,
            size,
            stride: Dims::Unset,
        }))
    }

    fn scalar(&self, py: Python<'_>, v: &Bound<'_, PyAny>, source: &str) -> PyResult<Atom<Scalar>> {
        Ok(if v.is(self.auto_unset.bind(py)) {
            Atom::Unset
        } else if v.is(self.auto_dynamic.bind(py)) {
            Atom::Dynamic
        } else if let Ok(b) = v.cast::<PyBool>() {
            Atom::Static(Scalar::Bool(b.is_true()))
        } else if let Ok(f) = v.cast::<PyFloat>() {
            Atom::Static(Scalar::float(f.value()))
        } else if let Ok(i) = v.cast::<PyInt>() {
            match i.extract::<i64>() {
                Ok(n) => Atom::Static(Scalar::Int(n)),
                Err(_) => Atom::Static(
                    i.extract::<i128>()
                        .ok()
                        .and_then(Scalar::int)
                        .ok_or_else(|| bad(source, "scalar", v))?,
                ),
            }
        } else {
            return Err(bad(source, "scalar", v));
        })
    }

    fn atom<V>(
        &self,
        py: Python<'_>,
        v: &Bound<'_, PyAny>,
        source: &str,
        field: &str,
        value: impl Fn(&Bound<'_, PyAny>) -> Option<V>,
    ) -> PyResult<Atom<V>> {
        if v.is(self.auto_unset.bind(py)) {
            Ok(Atom::Unset)
        } else if v.is(self.auto_dynamic.bind(py)) {
            Ok(Atom::Dynamic)
        } else if v.is_instance_of::<PyBool>() {
            Err(bad(source, field, v))
        } else {
            value(v)
                .map(Atom::Static)
                .ok_or_else(|| bad(source, field, v))
        }
    }

    fn dims<V>(
        &self,
        py: Python<'_>,
        v: &Bound<'_, PyAny>,
        source: &str,
        field: &str,
        value: impl Fn(&Bound<'_, PyAny>) -> Option<V>,
    ) -> PyResult<Dims<V>> {
        if v.is(self.auto_unset.bind(py)) {
            return Ok(Dims::Unset);
        }
        if v.is(self.auto_dynamic.bind(py)) {
            return Ok(Dims::Dynamic);
        }
        let items = v.cast::<PyTuple>().map_err(|_| bad(source, field, v))?;
        let mut atoms = Vec::with_capacity(items.len());
        for item in items.iter() {
            atoms.push(self.atom(py, &item, source, field, &value)?);
        }
        Ok(Dims::Known(atoms))
    }

    /// `all_states` for Dynamo (module docs, "Which states Dynamo folds"):
    /// `read` is this rank's state after the exchange (`read.state` the
    /// join unless `outcome` is `Same`), `joinable` whether cases 1–2 allow
    /// a join on this rank.
    pub(crate) fn all_states<'py>(
        &self,
        local_state: &Bound<'py, PyAny>,
        read: &Read,
        outcome: &Outcome,
        joinable: bool,
        rank: usize,
        world: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = local_state.py();
        match outcome {
            Outcome::Same if joinable && !read.has_nan => PyList::new(py, [local_state]),
            Outcome::Same => PyList::new(py, vec![local_state.clone(); world]),
            Outcome::Joined(None) => {
                PyList::new(py, [self.joined_state(py, local_state, read, |_| false)?])
            }
            Outcome::Joined(Some(states)) if !joinable => {
                let all = states
                    .iter()
                    .enumerate()
                    .map(|(r, s)| {
                        if r == rank {
                            Ok(local_state.clone())
                        } else {
                            self.state_of(py, s, |_| true)
                        }
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, all)
            }
            Outcome::Joined(Some(states)) => {
                // Per-rank sources: the joined ones whose scalar is case 3.
                let per_rank: Vec<&str> = read
                    .state
                    .iter()
                    .filter(|(name, e)| !reserved(name) && per_rank_scalar(e))
                    .map(|(name, _)| name)
                    .collect();
                let is_per_rank = |name: &str| per_rank.binary_search(&name).is_ok();
                let mut all = Vec::with_capacity(world);
                // Rank 0's state: the joined sources, and its own per-rank ones.
                let first = self.joined_state(py, local_state, read, is_per_rank)?;
                let dict = first.getattr("automatic_dynamic")?;
                let dict = dict.cast::<PyDict>()?;
                // (On rank 0 they are its own, already in the copy.)
                for name in per_rank.iter().filter(|_| rank != 0) {
                    match states[0].entry(name) {
                        Some(e) => dict.set_item(*name, self.entry_obj(py, &e)?)?,
                        None => dict.del_item(*name)?,
                    }
                }
                all.push(first);
                for s in &states[1..] {
                    all.push(self.state_of(py, s, |name| is_per_rank(name))?);
                }
                PyList::new(py, all)
            }
        }
    }

    /// A `LocalState` of the join (`read.state`) but for the sources where
    /// `skip` holds: a copy of the local state's dict, with a new entry
    /// object where the join differs from this rank's entry.
    fn joined_state<'py>(
        &self,
        py: Python<'py>,
        local_state: &Bound<'py, PyAny>,
        read: &Read,
        skip: impl Fn(&str) -> bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dict = local_state
            .getattr("automatic_dynamic")?
            .cast::<PyDict>()?
            .copy()?;
        let mut own = read.own.iter().peekable();
        for (name, joined) in read.state.iter() {
            while own.next_if(|(n, _, _)| n.as_str() < name).is_some() {}
            let mine = own.next_if(|(n, _, _)| n == name);
            if reserved(name) || skip(name) || mine.is_some_and(|(_, e, _)| *e == joined) {
                continue;
            }
            dict.set_item(name, self.entry_obj(py, &joined)?)?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("automatic_dynamic", dict)?;
        self.local_state.bind(py).call((), Some(&kwargs))
    }

    /// A `LocalState` holding `state`'s sources where `keep` holds, with
    /// the excluded sizes and scalar the sending rank recorded.
    fn state_of<'py>(
        &self,
        py: Python<'py>,
        state: &FrameState,
        keep: impl Fn(&str) -> bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let dict = PyDict::new(py);
        for (name, entry) in state.iter() {
            if reserved(name) || !keep(name) {
                continue;
            }
            let obj = self.entry_obj(py, &entry)?;
            if let Some(excluded) = state.entry(&format!("{EXCLUDED_PREFIX}{name}")) {
                let int = |v: i128| -> PyResult<Bound<'py, PyAny>> {
                    Ok(v.into_pyobject(py)?.into_any())
                };
                let sizes = match &excluded.size {
                    Dims::Known(atoms) => PyTuple::new(
                        py,
                        atoms
                            .iter()
                            .map(|a| match a {
                                Atom::Static(v) => int(i128::from(*v)),
                                _ => Ok(py.None().into_bound(py)),
                            })
                            .collect::<PyResult<Vec<_>>>()?,
                    )?
                    .into_any(),
                    _ => py.None().into_bound(py),
                };
                let scalar = match excluded.scalar {
                    Atom::Static(Scalar::Int(v)) => int(i128::from(v))?,
                    Atom::Static(Scalar::BigInt(v)) => int(v)?,
                    _ => py.None().into_bound(py),
                };
                obj.setattr("excluded_sizes", sizes)?;
                obj.setattr("excluded_scalar", scalar)?;
            }
            dict.set_item(name, obj)?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("automatic_dynamic", dict)?;
        self.local_state.bind(py).call((), Some(&kwargs))
    }

    /// A `FrameStateSizeEntry(scalar, size, stride)`.
    fn entry_obj<'py>(&self, py: Python<'py>, entry: &SizeEntry) -> PyResult<Bound<'py, PyAny>> {
        let int = |v: i128| -> PyResult<Bound<'py, PyAny>> { Ok(v.into_pyobject(py)?.into_any()) };
        let scalar = self.atom_obj(py, &entry.scalar, |s| match *s {
            Scalar::Int(v) => int(i128::from(v)),
            Scalar::Float(bits) => Ok(PyFloat::new(py, f64::from_bits(bits)).into_any()),
            Scalar::Bool(b) => Ok(PyBool::new(py, b).to_owned().into_any()),
            Scalar::BigInt(v) => int(v),
        })?;
        let size = self.dims_obj(py, &entry.size, |v| int(i128::from(*v)))?;
        let stride = self.dims_obj(py, &entry.stride, |v| match v {
            Stride::Int(i) => int(i128::from(*i)),
            Stride::Infer(j) => self.infer_stride.bind(py).call1((*j,)),
        })?;
        self.size_entry.bind(py).call1((scalar, size, stride))
    }

    fn atom_obj<'py, V>(
        &self,
        py: Python<'py>,
        a: &Atom<V>,
        value: impl Fn(&V) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(match a {
            Atom::Unset => self.auto_unset.bind(py).clone(),
            Atom::Dynamic => self.auto_dynamic.bind(py).clone(),
            Atom::Static(v) => value(v)?,
        })
    }

    fn dims_obj<'py, V>(
        &self,
        py: Python<'py>,
        d: &Dims<V>,
        value: impl Fn(&V) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(match d {
            Dims::Unset => self.auto_unset.bind(py).clone(),
            Dims::Dynamic => self.auto_dynamic.bind(py).clone(),
            Dims::Known(atoms) => {
                let items = atoms
                    .iter()
                    .map(|a| self.atom_obj(py, a, &value))
                    .collect::<PyResult<Vec<_>>>()?;
                PyTuple::new(py, items)?.into_any()
            }
        })
    }
}

fn bad(source: &str, field: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let shown = v
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    PyTypeError::new_err(format!(
        "source '{source}': FrameStateSizeEntry.{field} holds {shown}, which is not an \
         int (of magnitude below 2^126), a float or bool scalar, auto_dynamic, auto_unset, \
         a tuple of them or an InferStride"
    ))
}
