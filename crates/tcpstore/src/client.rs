//! [`TcpStoreClient`]: a client of c10d's TCPStore (torch 2.13's libuv or
//! legacy server, torchrun's agent store, or [`TcpStoreServer`](crate::TcpStoreServer)),
//! implementing core's [`Store`].
//!
//! - **Connecting** retries refused and reset connections with backoff
//!   (10 ms doubling to 500 ms) until the deadline, then sends `VALIDATE` and
//!   a `PING` whose echo proves the peer is a TCPStore, as torch's client
//!   does.
//! - **Keys** get torch's client prefix `/` ([`DEFAULT_PREFIX`]), so a key
//!   this client sets is the key a torch client of the same name reads.
//! - **Deadlines**: every call ends by its deadline. A `WAIT` that runs out
//!   returns [`Error::Timeout`] at once; its `CANCEL_WAIT` goes first on the
//!   connection's next call (which reads the late `STOP_WAITING` too), so no
//!   call blocks past its deadline and the server forgets the wait.
//! - **Reconnecting**: a call that finds its connection broken (reset,
//!   closed) reconnects once and repeats itself when repeating changes
//!   nothing (`set`, `get`, `wait`, `check`, `multi_get`, `num_keys`,
//!   `ping`); `add`, `compare_set` and `delete` report the broken
//!   connection instead.
//! - **Bounds**: every length a server sends is checked against [`Limits`]
//!   before anything is allocated; a value over
//!   [`MAX_VALUE_BYTES`](crate::wire::MAX_VALUE_BYTES) (the
//!   libuv server's limit) is refused before it is sent, naming the limit.

use crate::wire::{Limits, Query, Reader, Reply, Request, WireError, VALIDATION_MAGIC};
use compiler_collectives_core::{Deadline, Error, Result, Store};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// torch's client puts `/` before every key (`TCPStore.cpp`, `keyPrefix_`).
pub const DEFAULT_PREFIX: &str = "/";

/// Longest the handshake may take once connected: 10 s (a TCPStore answers
/// at once; a peer that says nothing is not one).
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// How long a call whose connection broke tries to connect again before
/// it reports the break: 1 s (a server that went away is reported then,
/// not at the call's deadline).
pub const RECONNECT_LIMIT: Duration = Duration::from_secs(1);

const BACKEND: &str = "tcpstore";

/// What went wrong talking to a TCPStore, carried as the `engine` of an
/// [`Error::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpStoreError {
    /// No connection could be made before the deadline.
    #[error("cannot reach the TCPStore at {host}:{port}: tried for {} ms ({}); last error: {last}", tried.as_millis(), compiler_collectives_core::counted(*attempts, "attempt", "attempts"))]
    Unreachable {
        /// The host as given.
        host: String,
        /// The port.
        port: u16,
        /// How long it tried.
        tried: Duration,
        /// Connection attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: String,
    },
    /// The peer accepted the connection but did not answer the handshake
    /// as a TCPStore does.
    #[error("{addr} is not a TCPStore (or speaks another version of its protocol): {detail}")]
    NotATcpStore {
        /// The peer.
        addr: SocketAddr,
        /// What it did instead.
        detail: String,
    },
    /// A value over the limit this client sends.
    #[error("the value for store key {key:?} is {len} bytes, over the {max} bytes a TCPStore takes (torch's libuv server closes the connection over 8 MiB)")]
    ValueTooLarge {
        /// The key (without the prefix).
        key: String,
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The connection broke during a query and could not be made again
    /// within [`RECONNECT_LIMIT`].
    #[error("the connection to the TCPStore at {addr} broke during {query} ({error}), and reconnecting failed: {reconnect}")]
    Lost {
        /// The peer.
        addr: SocketAddr,
        /// The query (`"WAIT"`, …).
        query: &'static str,
        /// How it broke.
        error: WireError,
        /// Why reconnecting failed.
        reconnect: String,
    },
    /// The connection broke during a query, or the server broke the
    /// protocol.
    #[error("TCPStore at {addr}: {query} failed: {error}")]
    Query {
        /// The peer.
        addr: SocketAddr,
        /// The query (`"GET"`, …).
        query: &'static str,
        /// What happened.
        error: WireError,
    },
}

impl From<TcpStoreError> for Error {
    fn from(e: TcpStoreError) -> Self {
        Error::backend(BACKEND, e)
    }
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    addr: SocketAddr,
    /// A `WAIT` timed out on this connection: cancel it before anything else.
    cancel_pending: bool,
    /// The `CANCEL_WAIT` was sent (a timeout after it leaves the stream out
    /// of step).
    cancel_sent: bool,
}

/// A TCPStore client (see the module docs). Calls are serialised on one
/// connection, as torch's client serialises them.
#[derive(Debug)]
pub struct TcpStoreClient {
    host: String,
    port: u16,
    prefix: String,
    limits: Limits,
    conn: Mutex<Option<Conn>>,
}

/// How a query failed: the deadline passed, or the connection broke.
enum Failure {
    Timeout,
    Broken(TcpStoreError),
}

fn nonce() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::process::id() ^ NEXT.fetch_add(1, Ordering::Relaxed).rotate_left(16)
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the server closed the connection",
    )
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Sets the socket's timeouts to what is left of `deadline` (`false` when
/// nothing is).
fn arm(stream: &TcpStream, deadline: Deadline) -> io::Result<bool> {
    let left = deadline.remaining();
    if left.is_zero() {
        return Ok(false);
    }
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))?;
    Ok(true)
}

impl TcpStoreClient {
    /// Connects to the TCPStore at `host:port` (retrying until `deadline`)
    /// and checks it is one.
    ///
    /// # Errors
    /// [`Error::Backend`] with [`TcpStoreError::Unreachable`] (host, port,
    /// how long it tried) or [`TcpStoreError::NotATcpStore`].
    pub fn connect(host: &str, port: u16, deadline: Deadline) -> Result<Self> {
        let client = TcpStoreClient {
            host: host.to_owned(),
            port,
            prefix: DEFAULT_PREFIX.to_owned(),
            limits: Limits::default(),
            conn: Mutex::new(None),
        };
        let conn = client.open(deadline)?;
        *client.lock() = Some(conn);
        Ok(client)
    }

    /// The same client with keys under `prefix` instead of `/` (e.g.
    /// `"/ccol/run/0/"`). Keys of other clients are not changed.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The same client with other bounds on what it sends and accepts
    /// (raise `max_value_bytes` only for a server without the libuv limit,
    /// such as [`TcpStoreServer`](crate::TcpStoreServer) or torch's legacy
    /// server).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The server's host and port, as given.
    pub fn server(&self) -> (&str, u16) {
        (&self.host, self.port)
    }

    /// The local address of the connection to the server (the address this
    /// host is reached at from the server's network), if connected.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.lock()
            .as_ref()
            .and_then(|c| c.stream.local_addr().ok())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn open(&self, deadline: Deadline) -> Result<Conn> {
        let start = Instant::now();
        let mut attempts = 0u32;
        let mut pause = Duration::from_millis(10);
        let mut last = String::from("the deadline passed before a connection attempt");
        loop {
            match self.try_open(deadline) {
                Ok(conn) => return Ok(conn),
                Err(Err(e)) => return Err(e),
                Err(Ok(Some(why))) => {
                    attempts += 1;
                    last = why;
                }
                Err(Ok(None)) => {}
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(TcpStoreError::Unreachable {
                    host: self.host.clone(),
                    port: self.port,
                    tried: start.elapsed(),
                    attempts,
                    last,
                }
                .into());
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// One attempt: `Err(Ok(why))` when it is worth trying again (`None`:
    /// no time was left to try).
    fn try_open(&self, deadline: Deadline) -> std::result::Result<Conn, Result<Option<String>>> {
        let addrs: Vec<SocketAddr> = match (self.host.as_str(), self.port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => return Err(Ok(Some(format!("cannot resolve {}: {e}", self.host)))),
        };
        let mut why = addrs
            .is_empty()
            .then(|| format!("{} has no address", self.host));
        for addr in addrs {
            let left = deadline.remaining();
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                Ok(stream) => return self.handshake(stream, addr, deadline).map_err(Err),
                Err(e) => why = Some(format!("{addr}: {e}")),
            }
        }
        Err(Ok(why))
    }

    fn handshake(&self, stream: TcpStream, addr: SocketAddr, deadline: Deadline) -> Result<Conn> {
        let started = Instant::now();
        let not_one = |detail: String| Error::from(TcpStoreError::NotATcpStore { addr, detail });
        let limit = Deadline::after(HANDSHAKE_LIMIT).min(deadline);
        let io = |e: io::Error| not_one(format!("handshake: {e}"));
        stream.set_nodelay(true).map_err(io)?;
        if !arm(&stream, limit).map_err(io)? {
            return Err(Error::timeout(Vec::new(), Vec::new(), Duration::ZERO));
        }
        let n = nonce();
        let mut hello = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .encode();
        hello.extend(Request::Ping { nonce: n }.encode());
        (&stream).write_all(&hello).map_err(io)?;
        let mut s = &stream;
        let got = Reader::new(&mut s, &self.limits).u32();
        match got {
            Ok(echo) if echo == n => Ok(Conn {
                stream,
                addr,
                cancel_pending: false,
                cancel_sent: false,
            }),
            Ok(echo) => Err(not_one(format!(
                "it answered the handshake's PING {n:#x} with {echo:#x}"
            ))),
            Err(WireError::Io(e)) if timed_out(&e) => Err(not_one(format!(
                "no answer to the handshake within {} ms",
                started.elapsed().as_millis()
            ))),
            Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(not_one(
                "it closed the connection after the handshake's VALIDATE and PING".into(),
            )),
            Err(e) => Err(not_one(format!("handshake: {e}"))),
        }
    }

    fn key(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    fn check_value(&self, key: &str, value: &[u8]) -> Result<()> {
        let max = self.limits.max_value_bytes;
        if value.len() > max {
            return Err(TcpStoreError::ValueTooLarge {
                key: key.to_owned(),
                len: value.len(),
                max,
            }
            .into());
        }
        Ok(())
    }

    /// Runs `op` on the connection (opening one if there is none),
    /// reconnecting once and repeating it if the connection broke and
    /// `repeatable`.
    fn call<T>(
        &self,
        query: Query,
        repeatable: bool,
        deadline: Deadline,
        op: impl Fn(&mut Conn, &Limits) -> std::result::Result<T, Failure>,
    ) -> Result<T> {
        let start = Instant::now();
        let mut guard = self.lock();
        let mut retried = false;
        loop {
            let conn = match guard.as_mut() {
                Some(c) => c,
                None => guard.insert(self.open(deadline)?),
            };
            let outcome = settle(conn, deadline).and_then(|()| match arm(&conn.stream, deadline) {
                Ok(true) => op(conn, &self.limits),
                Ok(false) => Err(Failure::Timeout),
                Err(e) => Err(broken(conn.addr, query, e)),
            });
            match outcome {
                Ok(v) => return Ok(v),
                Err(Failure::Timeout) => {
                    if !conn.cancel_pending || conn.cancel_sent {
                        // A reply may still be on its way: the stream is out of step.
                        *guard = None;
                    }
                    return Err(Error::timeout(Vec::new(), Vec::new(), start.elapsed())
                        .waiting_for(format!(
                            "the TCPStore at {}:{} to answer {}",
                            self.host,
                            self.port,
                            query.name()
                        )));
                }
                Err(Failure::Broken(e)) => {
                    *guard = None;
                    if !repeatable || retried || deadline.expired() {
                        return Err(e.into());
                    }
                    tracing::debug!(error = %e, "TCPStore connection broke: reconnecting once");
                    retried = true;
                    match self.open(Deadline::after(RECONNECT_LIMIT).min(deadline)) {
                        Ok(c) => *guard = Some(c),
                        Err(again) => {
                            return Err(match e {
                                TcpStoreError::Query { addr, query, error } => {
                                    TcpStoreError::Lost {
                                        addr,
                                        query,
                                        error,
                                        reconnect: match again {
                                            Error::Backend { message, .. } => message,
                                            other => other.to_string(),
                                        },
                                    }
                                    .into()
                                }
                                other => other.into(),
                            })
                        }
                    }
                }
            }
        }
    }

    /// Sets `key` to `value` (`SET`). `SET` has no reply, so a `PING` goes
    /// in the same write: its echo says the server applied the `SET` (it
    /// answers in order), and a connection that broke is noticed here, not
    /// by a peer waiting for the key.
    fn do_set(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()> {
        self.check_value(key, value)?;
        let n = nonce();
        let mut bytes = Request::Set {
            key: self.key(key),
            value: value.to_vec(),
        }
        .encode();
        bytes.extend(Request::Ping { nonce: n }.encode());
        self.call(Query::Set, true, deadline, |c, limits| {
            write(c, Query::Set, &bytes)?;
            echoed(c, n, limits)
        })
    }

    /// Whether every key is set now (`CHECK`).
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Backend`].
    pub fn check(&self, keys: &[&str], deadline: Deadline) -> Result<bool> {
        let bytes = Request::Check {
            keys: keys.iter().map(|k| self.key(k)).collect(),
        }
        .encode();
        self.call(Query::Check, true, deadline, |c, limits| {
            write(c, Query::Check, &bytes)?;
            match reply(c, Query::Check, 0, limits)? {
                Reply::Ready(ready) => Ok(ready),
                other => Err(odd(c, Query::Check, &other)),
            }
        })
    }

    /// What a wait for `keys` waited for, for its timeout.
    fn waited_for(&self, keys: &[&str]) -> String {
        let shown: Vec<String> = keys.iter().take(4).map(|k| format!("'{k}'")).collect();
        let more = keys.len().saturating_sub(4);
        format!(
            "store {} {}{} in the TCPStore at {}:{}",
            if keys.len() == 1 { "key" } else { "keys" },
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
            self.host,
            self.port
        )
    }

    fn do_wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        self.wait_once(keys, deadline)
            .map_err(|e| e.waiting_for(self.waited_for(keys)))
    }

    fn wait_once(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        let bytes = Request::Wait {
            keys: keys.iter().map(|k| self.key(k)).collect(),
        }
        .encode();
        self.call(Query::Wait, true, deadline, |c, limits| {
            write(c, Query::Wait, &bytes)?;
            match reply(c, Query::Wait, 0, limits) {
                Ok(Reply::StopWaiting) => Ok(()),
                Ok(other) => Err(odd(c, Query::Wait, &other)),
                Err(Failure::Timeout) => {
                    c.cancel_pending = true;
                    Err(Failure::Timeout)
                }
                Err(e) => Err(e),
            }
        })
    }

    /// The values of `keys` once every one is set (`WAIT`, then
    /// `MULTI_GET`), in order.
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Backend`].
    pub fn multi_get(&self, keys: &[&str], deadline: Deadline) -> Result<Vec<Vec<u8>>> {
        self.do_wait(keys, deadline)?;
        let bytes = Request::MultiGet {
            keys: keys.iter().map(|k| self.key(k)).collect(),
        }
        .encode();
        let n = keys.len();
        self.call(Query::MultiGet, true, deadline, |c, limits| {
            write(c, Query::MultiGet, &bytes)?;
            match reply(c, Query::MultiGet, n, limits)? {
                Reply::Values(v) => Ok(v),
                other => Err(odd(c, Query::MultiGet, &other)),
            }
        })
    }

    /// Sets `key` to `desired` if it holds `expected` (or is unset and
    /// `expected` is empty); returns the value it holds afterwards
    /// (`COMPARE_SET`). On torch's server an unset key with a non-empty
    /// `expected` stays unset and the reply is `expected`.
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Backend`] (also when the connection
    /// broke: it is not repeated).
    pub fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        deadline: Deadline,
    ) -> Result<Vec<u8>> {
        self.check_value(key, expected)?;
        self.check_value(key, desired)?;
        let bytes = Request::CompareSet {
            key: self.key(key),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        }
        .encode();
        self.call(Query::CompareSet, false, deadline, |c, limits| {
            write(c, Query::CompareSet, &bytes)?;
            match reply(c, Query::CompareSet, 0, limits)? {
                Reply::Value(v) => Ok(v),
                other => Err(odd(c, Query::CompareSet, &other)),
            }
        })
    }

    /// Number of keys the server holds, every client's and its own
    /// (`GETNUMKEYS`).
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Backend`].
    pub fn num_keys(&self, deadline: Deadline) -> Result<i64> {
        let bytes = Request::NumKeys.encode();
        self.call(Query::NumKeys, true, deadline, |c, limits| {
            write(c, Query::NumKeys, &bytes)?;
            match reply(c, Query::NumKeys, 0, limits)? {
                Reply::Int(v) => Ok(v),
                other => Err(odd(c, Query::NumKeys, &other)),
            }
        })
    }

    /// A round trip (`PING`): the server is alive and in step.
    ///
    /// # Errors
    /// [`Error::Timeout`], [`Error::Backend`].
    pub fn ping(&self, deadline: Deadline) -> Result<()> {
        let n = nonce();
        let bytes = Request::Ping { nonce: n }.encode();
        self.call(Query::Ping, true, deadline, |c, limits| {
            write(c, Query::Ping, &bytes)?;
            echoed(c, n, limits)
        })
    }
}

fn broken(addr: SocketAddr, query: Query, e: io::Error) -> Failure {
    Failure::Broken(TcpStoreError::Query {
        addr,
        query: query.name(),
        error: WireError::Io(e),
    })
}

fn unexpected(addr: SocketAddr, query: &'static str, got: u8, expected: &'static str) -> Failure {
    Failure::Broken(TcpStoreError::Query {
        addr,
        query,
        error: WireError::UnexpectedReply {
            query,
            got,
            expected,
        },
    })
}

fn write(c: &mut Conn, query: Query, bytes: &[u8]) -> std::result::Result<(), Failure> {
    match (&c.stream).write_all(bytes) {
        Ok(()) => Ok(()),
        Err(e) if timed_out(&e) => Err(Failure::Timeout),
        Err(e) => Err(broken(c.addr, query, e)),
    }
}

/// Reads the reply to `query` on `c` ([`Reply::read`]): a read that times
/// out is [`Failure::Timeout`], anything else that fails breaks the
/// connection.
fn reply(
    c: &mut Conn,
    query: Query,
    keys: usize,
    limits: &Limits,
) -> std::result::Result<Reply, Failure> {
    let mut s = &c.stream;
    match Reply::read(query, keys, &mut s, limits) {
        Ok(v) => Ok(v),
        Err(WireError::Io(e)) if timed_out(&e) => Err(Failure::Timeout),
        Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err(broken(c.addr, query, closed()))
        }
        Err(error) => Err(Failure::Broken(TcpStoreError::Query {
            addr: c.addr,
            query: query.name(),
            error,
        })),
    }
}

/// Reads a `PING`'s echo: `Ok` when it is `nonce`.
fn echoed(c: &mut Conn, nonce: u32, limits: &Limits) -> std::result::Result<(), Failure> {
    match reply(c, Query::Ping, 0, limits)? {
        Reply::Nonce(echo) if echo == nonce => Ok(()),
        Reply::Nonce(echo) => Err(unexpected(
            c.addr,
            "PING",
            echo.to_le_bytes()[0],
            "its own nonce",
        )),
        other => Err(odd(c, Query::Ping, &other)),
    }
}

/// A reply of another shape than the query's: the stream is out of step.
fn odd(c: &Conn, query: Query, got: &Reply) -> Failure {
    Failure::Broken(TcpStoreError::Query {
        addr: c.addr,
        query: query.name(),
        error: WireError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a reply of another query: {got:?}"),
        )),
    })
}

/// Cancels the wait that timed out on `c`, if any: `CANCEL_WAIT`, then the
/// late `STOP_WAITING` if the server sent one, then `WAIT_CANCELED`.
fn settle(c: &mut Conn, deadline: Deadline) -> std::result::Result<(), Failure> {
    if !c.cancel_pending {
        return Ok(());
    }
    match arm(&c.stream, deadline) {
        Ok(true) => {}
        Ok(false) => return Err(Failure::Timeout),
        Err(e) => return Err(broken(c.addr, Query::CancelWait, e)),
    }
    c.cancel_sent = true;
    write(c, Query::CancelWait, &Request::CancelWait.encode())?;
    match reply(c, Query::CancelWait, 0, &Limits::default())? {
        Reply::Canceled => {}
        other => return Err(odd(c, Query::CancelWait, &other)),
    }
    c.cancel_pending = false;
    c.cancel_sent = false;
    Ok(())
}

impl Store for TcpStoreClient {
    fn set(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()> {
        self.do_set(key, value, deadline)
    }

    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>> {
        // torch's client waits first: the legacy server drops a connection
        // that GETs an unset key.
        self.do_wait(&[key], deadline)?;
        let bytes = Request::Get { key: self.key(key) }.encode();
        self.call(Query::Get, true, deadline, |c, limits| {
            write(c, Query::Get, &bytes)?;
            match reply(c, Query::Get, 0, limits)? {
                Reply::Value(v) => Ok(v),
                other => Err(odd(c, Query::Get, &other)),
            }
        })
    }

    fn add(&self, key: &str, delta: i64, deadline: Deadline) -> Result<i64> {
        let bytes = Request::Add {
            key: self.key(key),
            delta,
        }
        .encode();
        self.call(Query::Add, false, deadline, |c, limits| {
            write(c, Query::Add, &bytes)?;
            match reply(c, Query::Add, 0, limits)? {
                Reply::Int(v) => Ok(v),
                other => Err(odd(c, Query::Add, &other)),
            }
        })
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        self.do_wait(keys, deadline)
    }

    fn delete(&self, key: &str, deadline: Deadline) -> Result<bool> {
        let bytes = Request::DeleteKey { key: self.key(key) }.encode();
        self.call(Query::DeleteKey, false, deadline, |c, limits| {
            write(c, Query::DeleteKey, &bytes)?;
            match reply(c, Query::DeleteKey, 0, limits)? {
                Reply::Int(v) => Ok(v == 1),
                other => Err(odd(c, Query::DeleteKey, &other)),
            }
        })
    }

    fn try_get(&self, key: &str, deadline: Deadline) -> Result<Option<Vec<u8>>> {
        // CHECK, then GET only if set: no wait to cancel.
        if !self.check(&[key], deadline)? {
            return Ok(None);
        }
        self.get(key, deadline).map(Some)
    }
}
