//! The out-of-band notice path: when one rank's exchange fails (or the rank
//! dies of an uncaught exception), every other rank says why at once,
//! whatever it is doing — waiting in a torch collective, in `backward()`,
//! in a sleep — before torch's own error (Gloo's "Connection closed by
//! peer") ends it.
//!
//! The failing rank writes one notice into the job's store, at the root
//! (under the run id, the restart count and the `enable` generation; the
//! package's `_notice.py` chooses the key and writes it with
//! `compare_set`, so the first failure wins). Each rank watches that key
//! from a thread that needs no GIL: with torch's `TCPStore`, a
//! [`NoticeWatcher`], which holds its own connection to the store (torch's
//! client serialises every call on one connection, so a watcher sharing it
//! would wait behind the job's own store calls) and waits on the key in
//! slices of [`POLL`]. When the key is set by another rank, the watcher
//! writes the notice's line to stderr (one fixed-format line, written
//! whole) and queues the same line as an INFO event `ccol::notice` for
//! Python's `logging` (`logs.rs`; not WARNING, which Python's last-resort
//! handler would print on stderr a second time), then stops. A normal job end writes no
//! notice, so nothing is printed; [`NoticeWatcher::stop`] ends the thread
//! within [`POLL`].
//!
//! The notice's value is `<job rank>\n<line>`; a value that does not parse
//! (another writer, a damaged store) is reported as it is. Either is cut to
//! [`MAX_NOTICE_BYTES`], and its control characters (a terminal's escape
//! sequences) become spaces: a peer writes it.

use compiler_collectives_core::{Deadline, ErrorKind, Store};
use compiler_collectives_tcpstore::TcpStoreClient;
use pyo3::prelude::*;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long one wait on the key lasts before the watcher checks whether it
/// was stopped.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// How long reading a notice that is known to be set may take.
const READ_LIMIT: Duration = Duration::from_secs(5);
/// The longest notice reported (bytes); a longer value is cut.
pub(crate) const MAX_NOTICE_BYTES: usize = 4096;

/// What a notice's value says: the job rank that wrote it, and its line.
fn parse(value: &[u8]) -> (Option<u32>, String) {
    let cut = &value[..value.len().min(MAX_NOTICE_BYTES)];
    let text = String::from_utf8_lossy(cut);
    match text.split_once('\n') {
        Some((rank, line)) => match rank.trim().parse::<u32>() {
            Ok(r) => (Some(r), line.trim_end().to_owned()),
            Err(_) => (None, text.trim_end().to_owned()),
        },
        None => (None, text.trim_end().to_owned()),
    }
}

/// Reports `value` unless this rank wrote it: one line on stderr, one
/// `ccol::notice` event.
fn report(value: &[u8], own_rank: u32) {
    let (rank, line) = parse(value);
    if rank == Some(own_rank) {
        return;
    }
    // Another rank wrote it: no control character (a terminal escape)
    // reaches this rank's terminal.
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // One write of the whole line, so that ranks sharing a terminal do not
    // interleave inside it.
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
    tracing::info!(target: "ccol::notice", "{line}");
}

/// A thread that watches one notice key in a TCPStore, over its own
/// connection (see the module docs). Python: `NoticeWatcher(host, port,
/// key, rank, connect_timeout_s)`, then `stop()` at `disable` or exit.
#[pyclass(module = "compiler_collectives._native")]
pub(crate) struct NoticeWatcher {
    stop: Arc<AtomicBool>,
}

#[pymethods]
impl NoticeWatcher {
    /// Connects to the TCPStore at `host:port` (within `connect_timeout_s`
    /// seconds) and starts watching `key` (a root key: torch's client
    /// prefix `/` is added, as torch's `TCPStore` adds it). `rank` is this
    /// rank's job rank: its own notice is not reported.
    ///
    /// Raises the package's `BackendError` when the store cannot be
    /// reached, `InvalidArgument` for a bad timeout.
    #[new]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        key: String,
        rank: u32,
        connect_timeout_s: f64,
    ) -> PyResult<Self> {
        let timeout = crate::seconds("connect_timeout_s", connect_timeout_s)?;
        let client = py
            .detach(|| TcpStoreClient::connect(&host, port, Deadline::after(timeout)))
            .map_err(|e| crate::to_py(py, &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("ccol-notice".to_owned())
            .spawn(move || watch(&client, &key, rank, &flag))
            .map_err(|e| {
                crate::to_py(py, &compiler_collectives_core::Error::backend("notice", e))
            })?;
        Ok(NoticeWatcher { stop })
    }

    /// Stops watching (the thread ends within 200 ms; nothing is printed
    /// after this returns).
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Whether `stop` was called.
    #[getter]
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

impl Drop for NoticeWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn watch(client: &TcpStoreClient, key: &str, rank: u32, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match client.wait(&[key], Deadline::after(POLL)) {
            Ok(()) => {
                if let Ok(value) = client.get(key, Deadline::after(READ_LIMIT)) {
                    if !stop.load(Ordering::SeqCst) {
                        report(&value, rank);
                    }
                }
                return;
            }
            Err(e) if e.kind() == ErrorKind::Timeout => {}
            // The store is gone (the job is ending) or broken: nothing to say.
            Err(_) => return,
        }
    }
}
