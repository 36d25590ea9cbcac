//! # compiler_collectives._native
//!
//! The extension module of the `compiler_collectives` Python package
//! (`crates/python/python/compiler_collectives`): one [`CompileChannel`] —
//! core's `Channel` over the Gloo transport, bootstrapped through the job's
//! own c10d store object — and the conversion between Dynamo's `LocalState`
//! and the state it exchanges (`frame.rs`). The Python modules build the user API
//! (`compiler_collectives.torch.enable`) on it; see
//! `docs/python.md`.
//!
//! Every method that waits on peers releases the GIL for the wait; a Ctrl-C
//! in the main thread ends the wait at once (`interrupt.rs`). Errors
//! are raised as the package's exception classes
//! (`compiler_collectives.Error` and its subclasses, one per core error
//! kind), built by `compiler_collectives._errors._from_native`. The Rust
//! side's log events reach Python's `logging` (`logs.rs`).

#![forbid(unsafe_code)]

mod frame;
mod interrupt;
mod logs;
mod notice;
mod store;

use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::decisions::votes::{AnyVote, MaxEach, TextLists};
use compiler_collectives_core::protocol::envelope::WIRE_VERSION;
use compiler_collectives_core::protocol::hierarchical_from_env;
use compiler_collectives_core::protocol::tree::DEFAULT_HIERARCHICAL_FROM;
use compiler_collectives_core::{
    Channel, ChannelOptions, DecodeError, Error, ErrorKind, ExchangeOptions, FirstFailure,
    Gathered, PerRank, RankMap, RunEnv, Topology, Transport,
};
use compiler_collectives_gloo::{
    advertised_hostname, GlooInterrupt, GlooOptions, GlooStore, GlooTransport,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// This rank's side of an exchange: its sequence number, compile key and
/// the last exchange every rank completed before it.
struct Context<'k> {
    seq: u64,
    key: &'k str,
    last_completed: Option<u64>,
}

/// The class of `compiler_collectives._errors` that core's error kind is
/// raised as: one class per kind, chosen here by the kind itself (a kind
/// added to core without a class here is raised as the base `Error`, and
/// the test `error_classes_cover_every_kind` fails until it has one).
fn error_class(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Timeout => "Timeout",
        ErrorKind::PeerLost => "PeerLost",
        ErrorKind::Desync => "Desync",
        ErrorKind::VersionMismatch => "VersionMismatch",
        ErrorKind::Disagreement => "Disagreement",
        ErrorKind::Decode => "DecodeError",
        ErrorKind::Backend => "BackendError",
        ErrorKind::InvalidArgument => "InvalidArgument",
        ErrorKind::Unsupported => "Unsupported",
        ErrorKind::ChannelUnusable => "ChannelUnusable",
        _ => "Error",
    }
}

/// Core's error as the package's exception (`compiler_collectives._errors`).
fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    to_py_in(py, e, None)
}

/// [`to_py`] for an error of the exchange `context`: an error that the
/// exchange with the peers found and that names no exchange of its own (a
/// `Desync`, a `Disagreement`, a `VersionMismatch`, a peer's message that
/// does not decode) gets this rank's `exchange`, `key` and `last_completed`;
/// one refused before anything was sent (an `InvalidArgument`) gets none.
fn to_py_in(py: Python<'_>, e: &Error, context: Option<&Context<'_>>) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let module = py.import("compiler_collectives._errors")?;
        let (seq, key, last) = match (e.exchange(), context) {
            (Some(info), _) => (Some(info.seq), Some(info.key.clone()), info.last_completed),
            (None, Some(c))
                if matches!(
                    e,
                    Error::Desync { .. }
                        | Error::Disagreement { .. }
                        | Error::VersionMismatch { .. }
                        | Error::Decode { rank: Some(_), .. }
                ) =>
            {
                (Some(c.seq), Some(c.key.to_owned()), c.last_completed)
            }
            (None, _) => (None, None, None),
        };
        let departures: Vec<(u32, String)> = e
            .departures()
            .iter()
            .map(|(r, how)| (*r, how.as_str().to_owned()))
            .collect();
        let value = module.getattr("_from_native")?.call1((
            error_class(e.kind()),
            e.kind().as_str(),
            e.to_string(),
            e.missing_ranks().to_vec(),
            seq,
            key,
            last,
            departures,
        ))?;
        Ok(PyErr::from_value(value))
    })();
    made.unwrap_or_else(|import_failed| import_failed)
}

/// Seconds (a finite, positive float) as a duration.
fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "{name} must be a positive number of seconds, not {s}"
            ))
        })
}

struct Inner {
    channel: Option<Channel>,
    /// Why `channel` is gone, for the error of a later call.
    closed: &'static str,
    /// The abort that a Ctrl-C started on a thread of its own (so that
    /// `KeyboardInterrupt` is not held up by it); `shutdown` and `abort`
    /// wait for it.
    aborting: Option<std::thread::JoinHandle<()>>,
}

impl Inner {
    /// Waits for an abort started by a Ctrl-C to finish.
    fn join_abort(&mut self) {
        if let Some(handle) = self.aborting.take() {
            let _ = handle.join();
        }
    }
}

/// One rank's channel for compile decisions: core's `Channel` over a Gloo
/// process group of its own, rendezvoused through `store`.
///
/// `CompileChannel(store, rank, world_size, *, prefix, timeout_s, hostname,
/// pgo, local_state_type)`:
/// - `store`: a c10d store object (`set`, `get`, `add`, `wait`, `check`,
///   `delete_key`), e.g. the default process group's;
/// - `prefix`: the key prefix of this group in the store (distinct per
///   group);
/// - `timeout_s`: the deadline of the rendezvous and of every exchange, in
///   seconds;
/// - `hostname`: the address peers connect to for this rank;
/// - `pgo`, `local_state_type`: `torch._dynamo.pgo` and
///   `torch._dynamo.symbolic_convert.LocalState`;
/// - `sigint`: whether a Ctrl-C (SIGINT) ends this thread's waits at once
///   (`KeyboardInterrupt`, the channel aborted); pass it from Python's main
///   thread only, when SIGINT has a Python handler.
///
/// Raises the package's `Timeout` if peers do not rendezvous in time,
/// `InvalidArgument` for a bad rank, `BackendError` for Gloo's errors.
#[pyclass(frozen, module = "compiler_collectives._native")]
struct CompileChannel {
    inner: Mutex<Inner>,
    interrupt: GlooInterrupt,
    types: frame::TorchTypes,
    rank: u32,
    world_size: u32,
    timeout: Duration,
    store: String,
}

impl CompileChannel {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the channel with the GIL released. A Ctrl-C during it
    /// (in the main thread) ends the wait, aborts the channel on a thread
    /// of its own and raises what Python's SIGINT handler raises
    /// (`KeyboardInterrupt`).
    fn with_channel<R: Send>(
        &self,
        py: Python<'_>,
        key: &str,
        f: impl FnOnce(&mut Channel) -> compiler_collectives_core::Result<R> + Send,
    ) -> PyResult<R> {
        let (outcome, interrupted, context) = py.detach(|| {
            let mut inner = self.lock();
            let closed = inner.closed;
            let Some(channel) = inner.channel.as_mut() else {
                return (
                    Err(Error::unusable(FirstFailure::Shutdown, closed)),
                    false,
                    None,
                );
            };
            let context = Context {
                seq: channel.next_seq(),
                key,
                last_completed: channel.last_completed(),
            };
            let armed = interrupt::Armed::new(&self.interrupt);
            let outcome = f(channel);
            drop(armed);
            if !self.interrupt.is_interrupted() {
                return (outcome, false, Some(context));
            }
            // Every later wait would fail at once: abort now, so that the
            // peers see this rank aborted.
            if let Some(mut channel) = inner.channel.take() {
                inner.closed = "this rank was interrupted (Ctrl-C) and aborted its channel";
                inner.aborting = std::thread::Builder::new()
                    .name("ccol-py-abort".into())
                    .spawn(move || channel.abort())
                    .ok();
            }
            (outcome, true, Some(context))
        });
        if interrupted {
            // Before any Python code runs (logging's would run the handler
            // and lose its exception).
            py.check_signals()?;
        }
        logs::flush(py)?;
        outcome.map_err(|e| to_py_in(py, &e, context.as_ref()))
    }
}

#[pymethods]
impl CompileChannel {
    #[new]
    #[pyo3(signature = (store, rank, world_size, *, prefix, timeout_s, pgo, local_state_type, sigint=false, group_ranks=None, job_rank=None, job_world_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        store: Py<PyAny>,
        rank: u32,
        world_size: u32,
        prefix: &str,
        timeout_s: f64,
        pgo: &Bound<'_, PyAny>,
        local_state_type: &Bound<'_, PyAny>,
        sigint: bool,
        group_ranks: Option<Vec<u32>>,
        job_rank: Option<u32>,
        job_world_size: Option<u32>,
    ) -> PyResult<Self> {
        // Where peers reach this rank: core's reading of torchrun's
        // variables, with torch's own rank and world size (a job started
        // without torchrun sets neither variable), then Gloo's rule.
        let job = RunEnv::from_vars(|name| match name {
            "RANK" => Some(job_rank.unwrap_or(rank).to_string()),
            "WORLD_SIZE" => Some(job_world_size.unwrap_or(world_size).to_string()),
            other => std::env::var(other).ok(),
        })
        .map_err(|e| to_py(py, &e))?;
        let hostname = advertised_hostname(&job);
        let timeout = seconds("timeout_s", timeout_s)?;
        // A channel among some of the job's ranks: `rank` and `world_size`
        // are in the group, errors name job ranks.
        let rank_map = group_ranks
            .map(RankMap::new)
            .transpose()
            .map_err(|e| to_py(py, &e))?;
        // Core's reader of CCOL_HIERARCHICAL_FROM (ChannelOptions::from_env
        // reads the same); unset, core's default.
        let hierarchical_from = hierarchical_from_env()
            .map_err(|e| to_py(py, &e))?
            .unwrap_or(DEFAULT_HIERARCHICAL_FROM);
        if sigint {
            if let Err(why) = interrupt::install() {
                tracing::warn!("Ctrl-C will not interrupt exchanges: {why}");
            }
        }
        let types = frame::TorchTypes::new(pgo, local_state_type)?;
        let store = store::PyStore::new(py, store)?;
        let described = store.describe().to_owned();
        let options = GlooOptions::default()
            .with_hostname(hostname.as_str())
            .with_connect_timeout(timeout)
            .with_prefix(prefix);
        let made = py.detach(|| {
            let gloo = GlooStore::from_store(Arc::new(store), timeout)
                .map_err(Error::from)?
                .with_description(described.clone());
            let transport =
                GlooTransport::connect(&gloo, rank, world_size, &options).map_err(|e| {
                    match &rank_map {
                        Some(map) => e.in_global_ranks(map),
                        None => e,
                    }
                })?;
            let interrupt = transport.interrupter();
            let transport: Arc<dyn Transport> = Arc::new(transport);
            // The deadline is the caller's (Python resolved `timeout`,
            // then CCOL_TIMEOUT_S, with core's parser); only the trace
            // directory comes from the environment here.
            let mut options = ChannelOptions::default()
                .with_timeout(timeout)
                .with_hierarchical_from(hierarchical_from);
            if let Some(dir) = std::env::var_os("CCOL_TRACE_DIR").filter(|d| !d.is_empty()) {
                options = options.with_trace_dir(dir);
            }
            if let Some(map) = rank_map {
                options = options.with_rank_map(map);
            }
            Ok((Channel::with_options(transport, options)?, interrupt))
        });
        logs::flush(py)?;
        let (channel, interrupt) = made.map_err(|e| to_py(py, &e))?;
        Ok(CompileChannel {
            inner: Mutex::new(Inner {
                channel: Some(channel),
                closed: "this CompileChannel was shut down (compiler_collectives.torch.disable)",
                aborting: None,
            }),
            interrupt,
            types,
            rank,
            world_size,
            timeout,
            store: described,
        })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The deadline of each exchange, in seconds.
    #[getter]
    fn timeout_s(&self) -> f64 {
        self.timeout.as_secs_f64()
    }

    /// The store the group rendezvoused through, in words.
    #[getter]
    fn store(&self) -> String {
        self.store.clone()
    }

    /// The exchange this channel runs: `"flat"`, or `"tree"` from
    /// `CCOL_HIERARCHICAL_FROM` ranks (core's default otherwise); None after
    /// `shutdown`.
    #[getter]
    fn topology(&self, py: Python<'_>) -> Option<&'static str> {
        py.detach(|| {
            self.lock().channel.as_ref().map(|c| {
                if *c.topology() == Topology::Tree {
                    "tree"
                } else {
                    "flat"
                }
            })
        })
    }

    /// The sequence number the next exchange will have (0-based), or None
    /// after `shutdown`.
    #[getter]
    fn next_exchange(&self, py: Python<'_>) -> Option<u64> {
        // The lock is held for a whole exchange: wait for it without the GIL.
        py.detach(|| self.lock().channel.as_ref().map(Channel::next_seq))
    }

    /// Exchanges a Dynamo `LocalState` under `key` and returns the states
    /// Dynamo folds (`DistributedState.all_states`): the join of every
    /// rank's state where that is what Dynamo's fold would compute, every
    /// rank's own state (index = rank) where it is not. `joinable` is
    /// whether this rank's Dynamo settings allow the join
    /// (`automatic_dynamic_shapes` on, `automatic_dynamic_exclusion_guard`
    /// off); the rule is in `frame.rs` and docs/python.md, "Which states
    /// Dynamo folds".
    ///
    /// Cost: one all_gather of a fixed slot (`ChannelOptions`' slot size)
    /// when every rank sent the same state or every state fits in the
    /// slot, else one more of the states that did not fit. Raises the
    /// package's errors (`Timeout`, `PeerLost`, `Desync` when ranks are at
    /// different keys, …) — the same on every rank.
    fn exchange_local_state<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        local_state: &Bound<'py, PyAny>,
        joinable: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        // A state this build cannot carry is this package's error (raised to
        // the caller as one), not Dynamo's internal one.
        let mut read = self.types.read(local_state, joinable).map_err(|e| {
            to_py(
                py,
                &Error::InvalidArgument(format!("cannot send the state of '{key}': {e}")),
            )
        })?;
        let outcome = self.with_channel(py, key, |c| {
            let tree = *c.topology() == Topology::Tree;
            // The tree yields the join only: keep what was sent, in case
            // every rank's state is needed after all.
            let sent = tree.then(|| read.state.clone());
            let gathered =
                c.exchange_in_place(key, &mut read.state, &ExchangeOptions::default())?;
            if gathered.fast_path() {
                return Ok(frame::Outcome::Same);
            }
            let needed = match &sent {
                None => frame::needs_per_rank(gathered.merged(), joinable),
                Some(_) => frame::needs_every_value(gathered.merged()),
            };
            if !needed {
                return Ok(frame::Outcome::Joined(None));
            }
            let values = |g: &Gathered<'_, FrameState>| match g.per_rank() {
                PerRank::Values(states) => Ok(frame::Outcome::Joined(Some(states.to_vec()))),
                // A flat exchange's payloads decoded once already.
                other => Err(Error::Unsupported(format!(
                    "every rank's state of '{key}' is not available ({other:?})"
                ))),
            };
            match &sent {
                None => values(&gathered),
                Some(sent) => {
                    drop(gathered);
                    let again = format!("{key} (every rank's state)");
                    let every = ExchangeOptions::default().with_every_value(true);
                    values(&c.exchange_with(&again, sent, &every)?)
                }
            }
        })?;
        self.types.all_states(
            local_state,
            &read,
            &outcome,
            joinable,
            self.rank as usize,
            self.world_size as usize,
        )
    }

    /// A guard vote under `key`: returns whether every rank's guards hit
    /// (`hit` is this rank's). Errors as `exchange_local_state`.
    fn vote_all_hit(&self, py: Python<'_>, key: &str, hit: bool) -> PyResult<bool> {
        let miss = AnyVote(!hit);
        let any_miss =
            self.with_channel(py, key, |c| c.exchange(key, &miss).map(|g| g.merged().0))?;
        Ok(!any_miss)
    }

    /// Every rank's list of texts under `key`, in rank order (an
    /// all_gather of `list[str]`, no pickling): `texts` is this rank's.
    /// With `config`, that text must be equal on every rank too, else every
    /// rank raises `Disagreement` naming the ranks and their texts (fatal:
    /// the channel is unusable afterwards). Cost: one all_gather of a
    /// 4096-byte slot when the lists are equal or fit it, one more of the
    /// lists otherwise. `timeout_s` (seconds) replaces the channel's
    /// deadline for this exchange (a wait that may outlast it, such as the
    /// ranks' kernel builds). Errors as `exchange_local_state`; `ValueError`
    /// for a `timeout_s` that is not a positive number of seconds.
    #[pyo3(signature = (key, texts, config=None, timeout_s=None))]
    fn gather_texts(
        &self,
        py: Python<'_>,
        key: &str,
        texts: Vec<String>,
        config: Option<&str>,
        timeout_s: Option<f64>,
    ) -> PyResult<Vec<Vec<String>>> {
        let mut options = ExchangeOptions::default().with_every_value(true);
        if let Some(config) = config {
            options = options.with_config(config);
        }
        if let Some(t) = timeout_s {
            options = options.with_timeout(seconds("timeout_s", t)?);
        }
        let world = self.world_size as usize;
        let local = TextLists::of(texts);
        self.with_channel(py, key, |c| {
            let gathered = c.exchange_with(key, &local, &options)?;
            match gathered.per_rank() {
                PerRank::Same => Ok(vec![local.one().unwrap_or_default().to_vec(); world]),
                PerRank::Values(lists) => lists
                    .iter()
                    .zip(0u32..)
                    .map(|(l, rank)| {
                        l.one()
                            .map(<[String]>::to_vec)
                            .ok_or_else(|| Error::Decode {
                                rank: Some(rank),
                                reason: DecodeError::Invalid {
                                    field: "list of texts",
                                    detail: format!(
                                        "{} lists under '{key}', where one was expected",
                                        l.0.len()
                                    ),
                                },
                            })
                    })
                    .collect(),
                other => Err(Error::Unsupported(format!(
                    "every rank's texts of '{key}' are not available ({other:?})"
                ))),
            }
        })
    }

    /// The maximum over ranks at each position of `values` (PyTorch's
    /// `all_reduce(op=MAX)` of a tensor of integers), under `key`. Cost: one
    /// all_gather of a 4096-byte slot (a few bytes per value), one more
    /// beyond it. Errors as `exchange_local_state`.
    fn max_each(&self, py: Python<'_>, key: &str, values: Vec<i64>) -> PyResult<Vec<i64>> {
        let local = MaxEach(values);
        self.with_channel(py, key, |c| {
            c.exchange(key, &local).map(|g| g.merged().0.clone())
        })
    }

    /// Checks that every rank passed the same `config` text under `key`;
    /// raises `Disagreement` naming the ranks and their values otherwise.
    fn agree(&self, py: Python<'_>, key: &str, config: &str) -> PyResult<()> {
        let options = ExchangeOptions::default().with_config(config);
        self.with_channel(py, key, |c| {
            c.exchange_with(key, &AnyVote(false), &options).map(drop)
        })
    }

    /// Sends `data` to the channel's rank `peer` under `tag`, point to
    /// point (the transport's `send`: messages between two ranks under one
    /// tag arrive in order); may return before `peer` took it. Used by
    /// `compile_once` (`_compile_once.py`): an owner's progress while it
    /// compiles, and the artifacts. Cost: one message. Raises `PeerLost`
    /// naming `peer` when it is gone, `InvalidArgument` for a bad peer,
    /// `ChannelUnusable` after an earlier error.
    fn send_bytes(
        &self,
        py: Python<'_>,
        key: &str,
        peer: u32,
        tag: u32,
        data: &[u8],
    ) -> PyResult<()> {
        let timeout = self.timeout;
        self.with_channel(py, key, |c| {
            c.transport().send(
                peer,
                tag,
                data,
                compiler_collectives_core::Deadline::after(timeout),
            )
        })
    }

    /// The next message from the channel's rank `peer` under `tag`,
    /// waiting at most `timeout_s` seconds for it. Raises `Timeout` naming
    /// `peer` past it, `PeerLost` naming `peer` as soon as the transport
    /// finds it gone (its connection closed: a killed process), a
    /// `DecodeError` naming it for a message over `max_bytes`;
    /// the channel is unusable after any error.
    fn recv_bytes<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        timeout_s: f64,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let wait = seconds("timeout_s", timeout_s)?;
        let got = self.with_channel(py, key, |c| {
            c.transport().recv(
                peer,
                tag,
                max_bytes,
                compiler_collectives_core::Deadline::after(wait),
            )
        })?;
        Ok(pyo3::types::PyBytes::new(py, &got))
    }

    /// Tells the other ranks this rank has no more exchanges and closes the
    /// group (theirs then end with `PeerLost` naming this rank, not a
    /// timeout). Later calls raise `ChannelUnusable`. Idempotent.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let taken = py.detach(|| {
            let mut inner = self.lock();
            inner.join_abort();
            inner.channel.take()
        });
        let done = match taken {
            None => Ok(()),
            Some(mut channel) => py.detach(|| channel.shutdown()),
        };
        logs::flush(py)?;
        done.map_err(|e| to_py(py, &e))
    }

    /// Closes the group without telling the others (they see a lost peer).
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let taken = py.detach(|| {
            let mut inner = self.lock();
            inner.join_abort();
            inner.channel.take()
        });
        if let Some(mut channel) = taken {
            py.detach(|| channel.abort());
        }
        logs::flush(py)
    }

    /// In a process forked from a rank: forgets the channel without
    /// closing it (Gloo's threads did not survive the fork, and closing would
    /// wait for them for ever; the parent's connections stay the parent's).
    /// Returns whether there was one to forget.
    fn forget_after_fork(&self) -> bool {
        match self.inner.try_lock() {
            Ok(mut inner) => match inner.channel.take() {
                Some(channel) => {
                    std::mem::forget(channel);
                    true
                }
                None => false,
            },
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> String {
        let open = match self.inner.try_lock() {
            Ok(inner) => {
                if inner.channel.is_some() {
                    "open"
                } else {
                    "closed"
                }
            }
            Err(_) => "in an exchange",
        };
        format!(
            "CompileChannel(rank={}, world_size={}, timeout_s={}, {open})",
            self.rank,
            self.world_size,
            self.timeout.as_secs_f64(),
        )
    }
}

/// Seconds from `CCOL_TIMEOUT_S`-style text, by core's rule (the one every
/// tool of the project uses): a finite, positive number.
///
/// Raises the package's `InvalidArgument` otherwise.
#[pyfunction]
fn parse_timeout_secs(py: Python<'_>, text: &str) -> PyResult<f64> {
    compiler_collectives_core::protocol::parse_timeout_secs(text)
        .map(|d| d.as_secs_f64())
        .map_err(|e| to_py(py, &e))
}

/// The module: `CompileChannel`, `parse_timeout_secs`, `WIRE_VERSION` (the
/// protocol's wire version), `VERSION` (this build's).
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    logs::install();
    m.add_class::<CompileChannel>()?;
    m.add_class::<notice::NoticeWatcher>()?;
    m.add_function(wrap_pyfunction!(parse_timeout_secs, m)?)?;
    m.add("WIRE_VERSION", WIRE_VERSION)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(use_gloo_adapter, m)?)?;
    let classes: Vec<(&str, &str)> = ErrorKind::ALL
        .iter()
        .map(|k| (k.as_str(), error_class(*k)))
        .collect();
    m.add("ERROR_CLASSES", classes)?;
    Ok(())
}

/// Has the Gloo transport load its adapter from the package's own directory
/// (`package_dir`, where the wheel ships it: crates/python/build.rs), never
/// from a cache file. `compiler_collectives/__init__.py` calls it at import;
/// the file is opened on the first `CompileChannel`.
///
/// Raises `BackendError` if another adapter was chosen already.
#[pyfunction]
#[pyo3(name = "_use_gloo_adapter")]
fn use_gloo_adapter(py: Python<'_>, package_dir: std::path::PathBuf) -> PyResult<()> {
    compiler_collectives_gloo::use_adapter_file(&package_dir.join(env!("CCOL_WHEEL_ADAPTER")))
        .map_err(|e| to_py(py, &Error::from(e)))
}
