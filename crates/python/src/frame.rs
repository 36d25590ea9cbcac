//! Dynamo's `LocalState` ↔ the state this package exchanges.
//!
//! A `LocalState.automatic_dynamic` maps source names to
//! `FrameStateSizeEntry(scalar, size, stride)` (torch/_dynamo/pgo.py, torch
//! 2.13). Sizes and strides map one to one onto core's lattice
//! (`compiler_collectives_core::decisions::lattice`, the same join — the
//! PyTorch oracle checks it): `auto_unset` = ⊥ (`Unset`), `auto_dynamic` =
//! ⊤ (`Dynamic`), an int = `Static`, `InferStride(dim)` = `Stride::Infer`.
//! A scalar is wider than core's int atom: Dynamo records ints, floats
//! (unspecialised float attributes, e.g. a module's `norm_type = 2.0`) and,
//! in principle, bools and ints beyond 64 bits; [`Scalar`] carries each
//! exactly (floats by their bits), so every rank's state reaches Dynamo as
//! that rank recorded it.
//!
//! The entry's `excluded_sizes` / `excluded_scalar` are not carried: they
//! are not compared, and Dynamo's `|=` reads only the other side's
//! `scalar`, `size` and `stride` (what an exchanged state is used for).

use compiler_collectives_core::decisions::lattice::{Atom, Dims, Stride};
use compiler_collectives_core::Join;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyTuple};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A `FrameStateSizeEntry.scalar`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Scalar {
    /// `auto_unset`.
    Unset,
    /// `auto_dynamic`.
    Dynamic,
    /// An int that fits in 64 bits.
    Int(i64),
    /// A float, by its IEEE 754 bits.
    Float(u64),
    /// A bool.
    Bool(bool),
    /// An int beyond 64 bits, in decimal.
    BigInt(String),
}

/// One source's entry, as exchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    scalar: Scalar,
    size: Dims<u64>,
    stride: Dims<Stride>,
}

/// A frame's `LocalState.automatic_dynamic`, as exchanged: source name →
/// entry, in name order (the canonical encoding).
///
/// Join (the protocol needs one; Dynamo does its own merging of every
/// rank's state): per source, missing = ⊥; scalars equal or else dynamic,
/// sizes and strides as core's lattice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DynamoState {
    entries: BTreeMap<String, Entry>,
}

impl Join for DynamoState {
    const KIND: &'static str = "torch.local_state";

    fn join(&mut self, other: &Self) {
        for (name, theirs) in &other.entries {
            match self.entries.get_mut(name) {
                None => {
                    self.entries.insert(name.clone(), theirs.clone());
                }
                Some(mine) if mine == theirs => {}
                Some(mine) => {
                    mine.scalar = match (&mine.scalar, &theirs.scalar) {
                        (Scalar::Unset, t) => t.clone(),
                        (m, Scalar::Unset) => m.clone(),
                        (m, t) if m == t => m.clone(),
                        _ => Scalar::Dynamic,
                    };
                    mine.size = mine.size.join(&theirs.size);
                    mine.stride = mine.stride.join(&theirs.stride);
                }
            }
        }
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

    /// Reads `local_state.automatic_dynamic`.
    ///
    /// # Errors
    /// `TypeError` naming the source and field whose value is not one of
    /// the atoms above.
    pub(crate) fn state(&self, local_state: &Bound<'_, PyAny>) -> PyResult<DynamoState> {
        let py = local_state.py();
        let entries = local_state.getattr("automatic_dynamic")?;
        let entries = entries
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err("LocalState.automatic_dynamic is not a dict"))?;
        let mut state = DynamoState::default();
        for (name, entry) in entries.iter() {
            let name: String = name.extract()?;
            let scalar = self.scalar(py, &entry.getattr("scalar")?, &name)?;
            let size = self.dims(py, &entry.getattr("size")?, &name, "size", |v| {
                v.extract::<u64>().ok()
            })?;
            let stride = self.dims(py, &entry.getattr("stride")?, &name, "stride", |v| {
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
            state.entries.insert(
                name,
                Entry {
                    scalar,
                    size,
                    stride,
                },
            );
        }
        Ok(state)
    }

    fn scalar(&self, py: Python<'_>, v: &Bound<'_, PyAny>, source: &str) -> PyResult<Scalar> {
        Ok(if v.is(self.auto_unset.bind(py)) {
            Scalar::Unset
        } else if v.is(self.auto_dynamic.bind(py)) {
            Scalar::Dynamic
        } else if let Ok(b) = v.cast::<PyBool>() {
            Scalar::Bool(b.is_true())
        } else if let Ok(f) = v.cast::<PyFloat>() {
            Scalar::Float(f.value().to_bits())
        } else if let Ok(i) = v.cast::<PyInt>() {
            match i.extract::<i64>() {
                Ok(n) => Scalar::Int(n),
                Err(_) => Scalar::BigInt(i.str()?.to_string()),
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
        } else if v.is_instance_of::<pyo3::types::PyBool>() {
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

    /// A `LocalState` holding `state`'s entries.
    pub(crate) fn local_state<'py>(
        &self,
        py: Python<'py>,
        state: &DynamoState,
    ) -> PyResult<Bound<'py, PyAny>> {
        let entries = PyDict::new(py);
        for (name, entry) in &state.entries {
            let kwargs = PyDict::new(py);
            let int =
                |v: i128| -> PyResult<Bound<'py, PyAny>> { Ok(v.into_pyobject(py)?.into_any()) };
            let scalar = match &entry.scalar {
                Scalar::Unset => self.auto_unset.bind(py).clone(),
                Scalar::Dynamic => self.auto_dynamic.bind(py).clone(),
                Scalar::Int(v) => int(i128::from(*v))?,
                Scalar::Float(bits) => PyFloat::new(py, f64::from_bits(*bits)).into_any(),
                Scalar::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
                Scalar::BigInt(text) => py.get_type::<PyInt>().call1((text.as_str(),))?,
            };
            kwargs.set_item("scalar", scalar)?;
            kwargs.set_item(
                "size",
                self.dims_obj(py, &entry.size, |v| int(i128::from(*v)))?,
            )?;
            kwargs.set_item(
                "stride",
                self.dims_obj(py, &entry.stride, |v| match v {
                    Stride::Int(i) => int(i128::from(*i)),
                    Stride::Infer(j) => self.infer_stride.bind(py).call1((*j,)),
                })?,
            )?;
            entries.set_item(name, self.size_entry.bind(py).call((), Some(&kwargs))?)?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("automatic_dynamic", entries)?;
        self.local_state.bind(py).call((), Some(&kwargs))
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
         int, auto_dynamic, auto_unset, a tuple of them or an InferStride"
    ))
}
