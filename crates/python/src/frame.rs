//! Dynamo's `LocalState` ↔ core's [`FrameState`].
//!
//! A `LocalState.automatic_dynamic` maps source names to
//! `FrameStateSizeEntry(scalar, size, stride)` (torch/_dynamo/pgo.py, torch
//! 2.13). Its atoms map one to one onto core's lattice
//! (`compiler_collectives_core::decisions::lattice`, the same join — the
//! PyTorch oracle checks it): `auto_unset` = ⊥ (`Unset`), `auto_dynamic` =
//! ⊤ (`Dynamic`), an int = `Static`, `InferStride(dim)` = `Stride::Infer`.
//! The entry's `excluded_sizes` / `excluded_scalar` are not carried: they
//! are not compared, and Dynamo's `|=` reads only the other side's
//! `scalar`, `size` and `stride` (what an exchanged state is used for).

use compiler_collectives_core::decisions::lattice::{Atom, Dims, SizeEntry, Stride};
use compiler_collectives_core::decisions::shapes::FrameState;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

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
    pub(crate) fn frame_state(&self, local_state: &Bound<'_, PyAny>) -> PyResult<FrameState> {
        let py = local_state.py();
        let entries = local_state.getattr("automatic_dynamic")?;
        let entries = entries
            .cast::<PyDict>()
            .map_err(|_| PyTypeError::new_err("LocalState.automatic_dynamic is not a dict"))?;
        let mut state = FrameState::new();
        for (name, entry) in entries.iter() {
            let name: String = name.extract()?;
            let scalar = self.atom(py, &entry.getattr("scalar")?, &name, "scalar", |v| {
                v.extract::<i64>().ok()
            })?;
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
                SizeEntry {
                    scalar,
                    size,
                    stride,
                },
            );
        }
        Ok(state)
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
        state: &FrameState,
    ) -> PyResult<Bound<'py, PyAny>> {
        let entries = PyDict::new(py);
        for (name, entry) in &state.entries {
            let kwargs = PyDict::new(py);
            let int =
                |v: i128| -> PyResult<Bound<'py, PyAny>> { Ok(v.into_pyobject(py)?.into_any()) };
            kwargs.set_item(
                "scalar",
                self.atom_obj(py, &entry.scalar, |v| int(i128::from(*v)))?,
            )?;
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
