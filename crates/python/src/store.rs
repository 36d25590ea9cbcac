//! The job's own c10d store (a Python `torch.distributed.Store` object) as a
//! core [`Store`], so that Gloo rendezvouses through it.
//!
//! Every call attaches to the interpreter for the span of the Python call
//! only; the store's own methods release the GIL while they block (c10d's
//! bindings do). Deadlines: c10d's `wait(keys, timeout)` reads a zero timeout
//! as "no timeout", so an expired deadline is checked here and never passed
//! on as zero.

use compiler_collectives_core::{Deadline, Error, Result, Store};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use std::fmt;
use std::time::{Duration, Instant};

/// The smallest timeout handed to c10d (a zero one would wait forever).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// A Python c10d store seen through core's [`Store`] trait.
pub(crate) struct PyStore {
    store: Py<PyAny>,
    /// `datetime.timedelta`.
    timedelta: Py<PyAny>,
    /// What the store is, for messages (`FileStore`, `TCPStore`, …).
    described: String,
}

impl fmt::Debug for PyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyStore")
            .field("store", &self.described)
            .finish_non_exhaustive()
    }
}

impl PyStore {
    /// Wraps `store` (any object with c10d's `set`/`get`/`add`/`wait`/
    /// `check`/`delete_key` methods).
    pub(crate) fn new(py: Python<'_>, store: Py<PyAny>) -> PyResult<Self> {
        let timedelta = py.import("datetime")?.getattr("timedelta")?.unbind();
        let described = store
            .bind(py)
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "store".to_owned());
        Ok(PyStore {
            store,
            timedelta,
            described: format!("the job's {described} (the default process group's store)"),
        })
    }

    /// What this store is, for messages.
    pub(crate) fn describe(&self) -> &str {
        &self.described
    }

    fn call<R>(
        &self,
        what: &str,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>) -> PyResult<R>,
    ) -> Result<R> {
        let outcome =
            Python::try_attach(|py| f(py, self.store.bind(py)).map_err(|e| e.to_string()));
        match outcome {
            Some(Ok(v)) => Ok(v),
            Some(Err(text)) => {
                Err(self.failed(format!("{what} in {} failed: {text}", self.described)))
            }
            None => Err(self.failed(format!(
                "cannot {what} in {}: the Python interpreter is shutting down",
                self.described
            ))),
        }
    }

    fn failed(&self, text: String) -> Error {
        Error::Backend {
            backend: "python-store",
            message: text,
            engine: None,
        }
    }

    fn timedelta<'py>(&self, py: Python<'py>, d: Duration) -> PyResult<Bound<'py, PyAny>> {
        let d = d.max(MIN_WAIT);
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("seconds", d.as_secs_f64())?;
        self.timedelta.bind(py).call((), Some(&kwargs))
    }

    /// Whether every key is set now.
    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.call("check keys", |py, s| {
            s.call_method1("check", (PyList::new(py, keys)?,))?
                .extract()
        })
    }

    fn timed_out(&self, keys: &[&str], start: Instant) -> Error {
        let named = match keys {
            [k] => format!("key '{k}'"),
            _ => format!("keys {keys:?}"),
        };
        Error::timeout(Vec::new(), Vec::new(), start.elapsed())
            .waiting_for(format!("{named} in {}", self.described))
    }
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8], _deadline: Deadline) -> Result<()> {
        // c10d's set carries no deadline; Gloo's bound (GlooStore::from_store)
        // covers a store that stops answering.
        self.call(&format!("set key '{key}'"), |py, s| {
            s.call_method1("set", (key, PyBytes::new(py, value)))?;
            Ok(())
        })
    }

    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>> {
        self.wait(&[key], deadline)?;
        self.call(&format!("get key '{key}'"), |_py, s| {
            s.call_method1("get", (key,))?.extract::<Vec<u8>>()
        })
    }

    fn add(&self, key: &str, delta: i64, _deadline: Deadline) -> Result<i64> {
        self.call(&format!("add to key '{key}'"), |_py, s| {
            s.call_method1("add", (key, delta))?.extract()
        })
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        let start = Instant::now();
        if self.check(keys)? {
            return Ok(());
        }
        if deadline.expired() {
            return Err(self.timed_out(keys, start));
        }
        // Ok(None): every key came; Ok(Some(text)): the wait raised a
        // RuntimeError (c10d's DistStoreError when it ran out, or a lost
        // connection): look again below before reading it as a timeout.
        let waited = self.call("wait for keys", |py, s| {
            let td = self.timedelta(py, deadline.remaining())?;
            match s.call_method1("wait", (PyList::new(py, keys)?, td)) {
                Ok(_) => Ok(None),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyRuntimeError>(py) => {
                    Ok(Some(e.to_string()))
                }
                Err(e) => Err(e),
            }
        })?;
        match waited {
            None => Ok(()),
            Some(_) if self.check(keys)? => Ok(()),
            Some(_) if deadline.expired() => Err(self.timed_out(keys, start)),
            Some(text) => Err(self.failed(format!(
                "waiting for {keys:?} in {} failed after {:?}, before the deadline: {text}",
                self.described,
                start.elapsed()
            ))),
        }
    }

    fn delete(&self, key: &str, _deadline: Deadline) -> Result<bool> {
        self.call(&format!("delete key '{key}'"), |_py, s| {
            s.call_method1("delete_key", (key,))?.extract()
        })
    }

    fn try_get(&self, key: &str, _deadline: Deadline) -> Result<Option<Vec<u8>>> {
        if !self.check(&[key])? {
            return Ok(None);
        }
        self.call(&format!("get key '{key}'"), |_py, s| {
            s.call_method1("get", (key,))?.extract::<Vec<u8>>()
        })
        .map(Some)
    }
}
