//! [`C10dStore`] (c10d's `TCPStore` and `PrefixStore`), its options, and its
//! core [`Store`] implementation.

use crate::error::{c_int, c_string, timed, C10dError};
use crate::sys::StoreHandle;
use compiler_collectives_core::{Deadline, Store};
use std::time::Duration;

/// The timeout of [`TcpStoreOptions`] unless set: c10d's default store
/// timeout (`Store::kDefaultTimeout`, 300 s).
pub const DEFAULT_STORE_TIMEOUT: Duration = compiler_collectives_core::protocol::DEFAULT_TIMEOUT;

/// How to open a `TCPStore` with [`C10dStore::tcp`]: the server (which also
/// connects a client to itself) or a client only, at `host:port`, for a job of
/// `world_size` processes.
///
/// ```no_run
/// use compiler_collectives_tch::{C10dStore, TcpStoreOptions};
/// use std::time::Duration;
/// // Rank 0: serve on a port the system picks, and publish it.
/// let server = C10dStore::tcp(
///     &TcpStoreOptions::server("127.0.0.1", 0, 2).with_timeout(Duration::from_secs(30)),
/// )?;
/// let port = server.port()?;
/// // The other ranks, once they know the port:
/// let client = C10dStore::tcp(&TcpStoreOptions::client("127.0.0.1", port, 2))?;
/// # Ok::<(), compiler_collectives_tch::C10dError>(())
/// ```
///
/// Unlike the other options structs there is no `Default`: the server's
/// address and the job's size have none, so [`server`](Self::server) and
/// [`client`](Self::client) take them; the rest is `with_…` setters as
/// elsewhere (one per field).
#[derive(Clone, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct TcpStoreOptions {
    /// The server's host name or address (a server listens on every
    /// interface and connects its own client here).
    /// `with_host(impl Into<String>)`.
    #[setters(into)]
    pub host: String,
    /// The server's port; for a server, 0 lets the system pick a free one
    /// (read it back with [`C10dStore::port`]).
    pub port: u16,
    /// The job's number of processes.
    pub world_size: u32,
    /// Whether these options open the server (set by
    /// [`server`](Self::server) and [`client`](Self::client)).
    pub is_server: bool,
    /// Whether to count the job in, as Python's `init_process_group` does:
    /// every store (server and clients) adds itself to c10d's worker count,
    /// and [`C10dStore::tcp`] of the server returns only once `world_size`
    /// stores have (or fails at the timeout). Use it on every store of a job
    /// or on none: a client that does not count itself in leaves such a
    /// server waiting, and a Python rank of the same job counts itself in.
    /// Default `false`.
    pub wait_workers: bool,
    /// How long connecting (and, with `wait_workers`, waiting for the job)
    /// may take; also the bound of [`C10dStore::check`] on this store and
    /// those [prefixed](C10dStore::prefixed) from it. Rounded up to the
    /// millisecond when used. Default [`DEFAULT_STORE_TIMEOUT`] (300 s).
    pub timeout: Duration,
}

impl TcpStoreOptions {
    /// The server of a `TCPStore` listening on `port` (on every interface,
    /// as c10d's does), with a client of its own connected to `host:port`.
    /// Port 0 lets the system pick a free port: read it back with
    /// [`C10dStore::port`] and hand it to the clients. Without
    /// [`with_wait_workers`](Self::with_wait_workers), timeout
    /// [`DEFAULT_STORE_TIMEOUT`].
    pub fn server(host: impl Into<String>, port: u16, world_size: u32) -> Self {
        TcpStoreOptions {
            host: host.into(),
            port,
            world_size,
            is_server: true,
            wait_workers: false,
            timeout: DEFAULT_STORE_TIMEOUT,
        }
    }

    /// A client of the `TCPStore` server at `host:port`. Without
    /// [`with_wait_workers`](Self::with_wait_workers), timeout
    /// [`DEFAULT_STORE_TIMEOUT`].
    pub fn client(host: impl Into<String>, port: u16, world_size: u32) -> Self {
        TcpStoreOptions {
            is_server: false,
            ..TcpStoreOptions::server(host, port, world_size)
        }
    }

    /// The server's host name or address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port asked for (0: the system picks, for a server).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The job's number of processes.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// Whether these options open the server.
    pub fn is_server(&self) -> bool {
        self.is_server
    }

    /// Whether stores count themselves in ([`with_wait_workers`](Self::with_wait_workers)).
    pub fn wait_workers(&self) -> bool {
        self.wait_workers
    }

    /// The timeout ([`with_timeout`](Self::with_timeout)).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// A c10d store handle (`TCPStore` or `PrefixStore`); a core [`Store`] whose
/// calls end at their deadlines, as far as libtorch allows (below).
///
/// # Deadlines: what bounds each call
/// libtorch's TCPStore client talks to its server over one blocking socket
/// with no receive or send timeout (`TCPClient::connect` in
/// `torch/csrc/distributed/c10d/TCPStore.cpp` sets none, and
/// `SocketConnectOp::tryConnect` in `socket.cpp` turns non-blocking mode off
/// after connecting), and every call holds the store's one client mutex
/// (`activeOpLock_`) for its whole exchange:
/// - `set` sends its request and reads no answer; `add`, `deleteKey` and
///   `check` send theirs and then wait in a plain `recv` for the server's
///   answer. libtorch gives none of them a timeout: a server that stopped
///   answering (stopped, partitioned, not closed) leaves them waiting for
///   ever. So the shim runs each of these four on a thread of its own and
///   waits for it at most the call's deadline: [`Store::set`],
///   [`Store::add`], [`Store::delete`] and [`check`](C10dStore::check) return a
///   timeout at their deadline (rounded up to the millisecond). Whether a call
///   that timed out still takes effect is unknown (its request may reach the
///   server later); its thread keeps the store alive until it finishes.
/// - `get` and `wait` are bounded by libtorch itself: the shim waits with
///   `wait(keys, timeout)` (the call's deadline), which polls the socket for
///   the server's answer at most that long. After that timeout libtorch sends
///   `CANCEL_WAIT` and reads the server's acknowledgement without a bound, so
///   a server that stopped answering can hold these past the deadline; a
///   server that died (its connection closed) fails them at once.
/// - A server whose connection is reset or closed fails every call at once
///   with a network error.
#[derive(Debug)]
pub struct C10dStore {
    handle: StoreHandle,
    /// The bound of [`C10dStore::check`].
    timeout: Duration,
}

impl C10dStore {
    /// Opens c10d's `TCPStore` as `opts` say (see [`TcpStoreOptions`]).
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a host with a NUL byte or a world size
    /// above `i32::MAX`; otherwise [`C10dError::Torch`] with libtorch's text
    /// (no server by the timeout, a port already bound, waiting for workers
    /// timed out).
    pub fn tcp(opts: &TcpStoreOptions) -> Result<Self, C10dError> {
        let host = c_string(&opts.host, "host")?;
        let world = c_int(opts.world_size, "world size")?;
        let handle = StoreHandle::tcp(
            &host,
            opts.port,
            world,
            opts.is_server,
            opts.wait_workers,
            opts.timeout,
        )?;
        Ok(C10dStore {
            handle,
            timeout: opts.timeout,
        })
    }

    /// The port of this `TCPStore`: the one a server bound (port 0 in
    /// [`TcpStoreOptions::server`] lets the system pick a free one, which a
    /// test or launcher then publishes to the clients), or the one a client
    /// connected to.
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a store that is not a `TCPStore` (a
    /// prefixed one).
    pub fn port(&self) -> Result<u16, C10dError> {
        self.handle.port()
    }

    /// Whether `key` is set, without waiting for it. Bounded by the store's
    /// timeout ([`TcpStoreOptions::with_timeout`]).
    ///
    /// Cost: one round trip to the store.
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a key with a NUL byte; [`C10dError::Torch`]
    /// (a timeout if the store does not answer in time).
    pub fn check(&self, key: &str) -> Result<bool, C10dError> {
        self.check_within(key, self.timeout)
    }

    /// [`check`](Self::check) bounded by `timeout`.
    pub(crate) fn check_within(&self, key: &str, timeout: Duration) -> Result<bool, C10dError> {
        let k = c_string(key, "key")?;
        self.handle.check(&[k.as_c_str()], timeout)
    }

    /// A `PrefixStore` over this store: key `k` is stored as `prefix/k`. It
    /// keeps this store's connection alive, so this handle may be dropped.
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a prefix with a NUL byte;
    /// [`C10dError::Torch`].
    pub fn prefixed(&self, prefix: &str) -> Result<Self, C10dError> {
        let p = c_string(prefix, "prefix")?;
        Ok(C10dStore {
            handle: self.handle.prefixed(&p)?,
            timeout: self.timeout,
        })
    }

    /// The shim handle, for the process group.
    pub(crate) fn handle(&self) -> &StoreHandle {
        &self.handle
    }
}

fn key(k: &str) -> compiler_collectives_core::Result<std::ffi::CString> {
    timed(|| c_string(k, "key"))
}

impl Store for C10dStore {
    fn set(
        &self,
        key_: &str,
        value: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<()> {
        let k = key(key_)?;
        timed(|| self.handle.set(&k, value, deadline.remaining()))
    }

    fn get(&self, key_: &str, deadline: Deadline) -> compiler_collectives_core::Result<Vec<u8>> {
        let k = key(key_)?;
        timed(|| self.handle.get(&k, deadline.remaining()))
    }

    fn add(
        &self,
        key_: &str,
        delta: i64,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<i64> {
        let k = key(key_)?;
        timed(|| self.handle.add(&k, delta, deadline.remaining()))
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> compiler_collectives_core::Result<()> {
        let owned = keys.iter().map(|k| key(k)).collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&std::ffi::CStr> = owned.iter().map(|c| c.as_c_str()).collect();
        timed(|| self.handle.wait(&refs, deadline.remaining()))
    }

    fn delete(&self, key_: &str, deadline: Deadline) -> compiler_collectives_core::Result<bool> {
        let k = key(key_)?;
        timed(|| self.handle.delete(&k, deadline.remaining()))
    }

    /// A `check` first (one round trip, no wait to cancel), then a `get`
    /// only when the key is set.
    fn try_get(
        &self,
        key_: &str,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Option<Vec<u8>>> {
        if !timed(|| self.check_within(key_, deadline.remaining()))? {
            return Ok(None);
        }
        self.get(key_, deadline).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compiler_collectives_core::Error;
    use std::time::Instant;

    /// The `waited` of a timeout; panics on any other error.
    fn waited(e: &Error) -> Duration {
        match e {
            Error::Timeout { waited, .. } => *waited,
            other => panic!("not a timeout: {other}"),
        }
    }

    /// A port nothing listens on (bound by the system, then released).
    fn unused_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a free port")
    }

    #[test]
    fn a_client_without_a_server_times_out_saying_how_long_it_waited() {
        let opts = TcpStoreOptions::client("127.0.0.1", unused_port(), 2)
            .with_timeout(Duration::from_secs(1));
        let started = Instant::now();
        // As `C10dJob::from_env` opens its store.
        let err = timed(|| C10dStore::tcp(&opts)).expect_err("no server listens");
        let w = waited(&err);
        assert!(
            w >= Duration::from_millis(900) && w <= started.elapsed(),
            "waited {w:?}: {err}"
        );
    }

    #[test]
    fn a_store_call_times_out_saying_how_long_it_waited() {
        let store = C10dStore::tcp(
            &TcpStoreOptions::server("127.0.0.1", 0, 1).with_timeout(Duration::from_secs(20)),
        )
        .expect("TCPStore server");
        let started = Instant::now();
        let err = Store::get(&store, "never", Deadline::after(Duration::from_secs(1)))
            .expect_err("the key is never set");
        let w = waited(&err);
        assert!(
            w >= Duration::from_millis(900) && w <= started.elapsed(),
            "waited {w:?}: {err}"
        );
    }
}
