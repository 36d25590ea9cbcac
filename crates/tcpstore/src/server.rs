//! [`TcpStoreServer`]: a TCPStore server torch 2.13's clients (and ours)
//! talk to, with the libuv server's semantics (`TCPStoreLibUvBackend.cpp`):
//! an unset key reads as an empty value, `COMPARE_SET` wakes waiters, the
//! queue commands exist, and the libuv limits apply ([`Limits`]), plus a
//! bound on a whole message and on everything stored.
//!
//! One thread accepts; each connection has a thread that reads its
//! requests. A connection must open with `VALIDATE` and the magic, as
//! torch's client does; anything else is closed without a reply. A request
//! that breaks the format or a limit closes its connection (the libuv
//! server does the same), logged at `warn` with the query and the limit.
//! Dropping the server closes every connection and joins its threads.
//!
//! No authentication, as PyTorch's: bind it to an interface only the job's
//! hosts reach.

use crate::wire::{
    put_value, Limits, Request, WireError, CHECK_NOT_READY, CHECK_READY, STOP_WAITING,
    VALIDATION_MAGIC, WAIT_CANCELED,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the server tries to write one reply to a client that does not
/// read before it closes that connection: 10 s.
pub const WRITE_LIMIT: Duration = Duration::from_secs(10);

/// How long a new connection has to send its `VALIDATE`: 10 s (torch's
/// client sends it at once; a connection that says nothing is closed, so
/// idle connections cannot use up the server's threads and descriptors).
pub const VALIDATE_LIMIT: Duration = Duration::from_secs(10);

/// A running server's options, built with `ServerOptions::default().with_…`
/// (one `with_<field>` setter per field).
#[derive(Clone, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ServerOptions {
    /// Bounds on one request (default [`Limits::default`]).
    pub limits: Limits,
    /// Most bytes of keys, values, queued values and awaited keys held in
    /// all, in bytes (default 1 GiB). A request that would pass it closes
    /// its connection.
    pub max_stored_bytes: usize,
    /// How long a new connection has to send `VALIDATE` (default
    /// [`VALIDATE_LIMIT`], 10 s).
    pub validate_limit: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            limits: Limits::default(),
            max_stored_bytes: 1 << 30,
            validate_limit: VALIDATE_LIMIT,
        }
    }
}

type ConnId = u64;

#[derive(Debug, Default)]
struct State {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    stored: usize,
    /// Connections waiting on each key (a connection once per key).
    waiting: HashMap<Vec<u8>, Vec<ConnId>>,
    /// How many keys each waiting connection still waits for.
    awaited: HashMap<ConnId, usize>,
}

/// A connection's writing half, and a wake-up it still owes its client.
#[derive(Debug)]
struct Writer {
    stream: Mutex<TcpStream>,
    /// A `STOP_WAITING` to send (a connection has at most one pending wait).
    wake: AtomicBool,
}

impl Writer {
    /// Sends the owed wake-up if nobody is writing to this connection now;
    /// whoever is writing sends it when done. Never waits for another
    /// connection's write.
    fn deliver(&self) {
        while self.wake.load(Ordering::SeqCst) {
            let Ok(mut w) = self.stream.try_lock() else {
                // The holder re-checks `wake` after it lets go.
                return;
            };
            if self.wake.swap(false, Ordering::SeqCst) {
                if let Err(e) = w.write_all(&[STOP_WAITING]) {
                    tracing::warn!(error = %e, "TCPStore server: cannot wake a waiting client");
                    let _ = w.shutdown(Shutdown::Both);
                }
            }
        }
    }

    /// Writes a reply, then what is owed.
    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        lock(&self.stream).write_all(bytes)?;
        self.deliver();
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Each open connection's writing half.
    conns: Mutex<HashMap<ConnId, Arc<Writer>>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked holding the lock left whole values behind
    // (every update is one insert or remove): go on with them.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn present(&self, key: &[u8]) -> bool {
        self.kv.contains_key(key) || self.queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Stores `value` at `key`, or says why not.
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>, max: usize) -> Result<(), String> {
        let old = self.kv.get(&key).map_or(0, |v| key.len() + v.len());
        let stored = self.stored - old + key.len() + value.len();
        if stored > max {
            return Err(format!(
                "storing {} bytes at a key would hold {stored} bytes in all, over the server's {max}",
                value.len()
            ));
        }
        self.stored = stored;
        self.kv.insert(key, value);
        Ok(())
    }

    /// Connections whose wait ends now that `key` is set.
    fn woken(&mut self, key: &[u8], out: &mut Vec<ConnId>) {
        let list = self.waiting.remove(key).unwrap_or_default();
        if !list.is_empty() {
            self.stored -= key.len();
        }
        for c in list {
            if let Some(n) = self.awaited.get_mut(&c) {
                *n -= 1;
                if *n == 0 {
                    self.awaited.remove(&c);
                    out.push(c);
                }
            }
        }
    }

    fn forget(&mut self, conn: ConnId) {
        self.awaited.remove(&conn);
        for list in self.waiting.values_mut() {
            list.retain(|c| *c != conn);
        }
        let mut freed = 0;
        self.waiting.retain(|k, l| {
            let keep = !l.is_empty();
            if !keep {
                freed += k.len();
            }
            keep
        });
        self.stored -= freed;
    }

    /// Registers `conn` as waiting on `key`; a key's first waiter counts
    /// its bytes against `max`. `false` when `conn` waits on it already.
    fn await_key(&mut self, key: Vec<u8>, conn: ConnId, max: usize) -> Result<bool, String> {
        if let Some(list) = self.waiting.get_mut(&key) {
            if list.contains(&conn) {
                return Ok(false);
            }
            list.push(conn);
            return Ok(true);
        }
        let stored = self.stored + key.len();
        if stored > max {
            return Err(format!(
                "waiting on more keys would hold {stored} bytes in all, over the server's {max}"
            ));
        }
        self.stored = stored;
        self.waiting.insert(key, vec![conn]);
        Ok(true)
    }

    fn counter(&self, key: &[u8]) -> Result<i64, String> {
        match self.kv.get(key) {
            None => Ok(0),
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|t| t.parse::<i64>().ok())
                .ok_or_else(|| "ADD on a key that holds no decimal counter".to_owned()),
        }
    }
}

/// A TCPStore server (see the module docs).
#[derive(Debug)]
pub struct TcpStoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    workers: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl TcpStoreServer {
    /// Binds `addr` (port 0: any free port, read it with
    /// [`TcpStoreServer::port`]) and starts serving.
    ///
    /// # Errors
    /// The bind's I/O error (address in use, not an address of this host).
    pub fn bind(addr: impl ToSocketAddrs, options: ServerOptions) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let workers = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let shared = Arc::clone(&shared);
            let workers = Arc::clone(&workers);
            std::thread::Builder::new()
                .name("tcpstore-accept".into())
                .spawn(move || accept_loop(&listener, &shared, &workers, &options))?
        };
        tracing::debug!(%addr, "TCPStore server listening");
        Ok(TcpStoreServer {
            addr,
            shared,
            accept: Some(accept),
            workers,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Number of keys held (queues not counted), as `GETNUMKEYS` answers.
    pub fn num_keys(&self) -> usize {
        lock(&self.shared.state).kv.len()
    }

    /// Bytes held: keys, values, queued values and the keys clients wait
    /// on ([`ServerOptions::max_stored_bytes`] bounds it).
    pub fn stored_bytes(&self) -> usize {
        lock(&self.shared.state).stored
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let mut wake_at = self.addr;
        if wake_at.ip().is_unspecified() {
            wake_at.set_ip(match wake_at {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let woke = TcpStream::connect_timeout(&wake_at, Duration::from_secs(1)).is_ok();
        if let Some(h) = self.accept.take() {
            if woke {
                let _ = h.join();
            }
        }
        for conn in lock(&self.shared.conns).values() {
            let _ = lock(&conn.stream).shutdown(Shutdown::Both);
        }
        let workers: Vec<_> = lock(&self.workers).drain(..).collect();
        for h in workers {
            let _ = h.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    workers: &Mutex<Vec<JoinHandle<()>>>,
    options: &ServerOptions,
) {
    let mut next: ConnId = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok(_) if shared.stop.load(Ordering::SeqCst) => break,
            Ok((stream, peer)) => {
                next += 1;
                let id = next;
                if let Err(e) = start_connection(stream, peer, id, shared, workers, options) {
                    tracing::warn!(%peer, error = %e, "TCPStore server: cannot serve a connection");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "TCPStore server: accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Reap finished connection threads.
        lock(workers).retain(|h| !h.is_finished());
    }
}

fn start_connection(
    stream: TcpStream,
    peer: SocketAddr,
    id: ConnId,
    shared: &Arc<Shared>,
    workers: &Mutex<Vec<JoinHandle<()>>>,
    options: &ServerOptions,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(WRITE_LIMIT))?;
    // A client has this long to say it is one (`VALIDATE`).
    stream.set_read_timeout(Some(options.validate_limit))?;
    let writer = Arc::new(Writer {
        stream: Mutex::new(stream.try_clone()?),
        wake: AtomicBool::new(false),
    });
    lock(&shared.conns).insert(id, Arc::clone(&writer));
    let shared = Arc::clone(shared);
    let options = options.clone();
    let handle = std::thread::Builder::new()
        .name(format!("tcpstore-conn-{id}"))
        .spawn(move || {
            let why = serve(stream, id, &writer, &shared, &options);
            match why {
                Ok(()) => tracing::debug!(%peer, "TCPStore client left"),
                Err(e) => tracing::warn!(%peer, error = %e, "TCPStore server: connection closed"),
            }
            lock(&shared.state).forget(id);
            if let Some(w) = lock(&shared.conns).remove(&id) {
                let _ = lock(&w.stream).shutdown(Shutdown::Both);
            }
        })?;
    lock(workers).push(handle);
    Ok(())
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("{0}")]
    Refused(String),
}

fn wake(shared: &Shared, conns: &[ConnId]) {
    if conns.is_empty() {
        return;
    }
    let writers: Vec<_> = {
        let all = lock(&shared.conns);
        conns.iter().filter_map(|c| all.get(c).cloned()).collect()
    };
    for w in writers {
        w.wake.store(true, Ordering::SeqCst);
        w.deliver();
    }
}

/// Serves one connection until it ends (`Ok`) or breaks a rule (`Err`).
fn serve(
    stream: TcpStream,
    id: ConnId,
    writer: &Writer,
    shared: &Shared,
    options: &ServerOptions,
) -> Result<(), Closed> {
    let mut reader = io::BufReader::new(stream);
    let limits = &options.limits;
    match Request::read(&mut reader, limits) {
        Ok(Request::Validate { magic }) if magic == VALIDATION_MAGIC => {}
        Ok(Request::Validate { magic }) => {
            return Err(Closed::Refused(format!(
                "VALIDATE with magic {magic:#x}, not {VALIDATION_MAGIC:#x}: not a TCPStore client \
                 (or another version)"
            )))
        }
        Ok(other) => {
            return Err(Closed::Refused(format!(
                "the first request was {} with no VALIDATE: not a TCPStore client",
                other.query().name()
            )))
        }
        Err(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
        Err(WireError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            return Err(Closed::Refused(format!(
                "no VALIDATE within {} ms: not a TCPStore client",
                options.validate_limit.as_millis()
            )))
        }
        Err(e) => return Err(Closed::Refused(format!("not a TCPStore client: {e}"))),
    }
    // A validated client may stay idle as long as it likes.
    reader
        .get_ref()
        .set_read_timeout(None)
        .map_err(WireError::Io)?;
    loop {
        let request = match Request::read(&mut reader, limits) {
            Ok(r) => r,
            Err(WireError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e.into()),
        };
        let query = request.query().name();
        let mut woken = Vec::new();
        let reply = {
            let mut st = lock(&shared.state);
            answer(&mut st, id, request, options, &mut woken)
                .map_err(|why| Closed::Refused(format!("{query}: {why}")))?
        };
        wake(shared, &woken);
        if let Some(bytes) = reply {
            writer.send(&bytes).map_err(WireError::Io)?;
        }
    }
}

/// Applies one request; its reply bytes (`None` for the queries that get
/// none). Fills `woken` with the connections whose wait ends.
fn answer(
    st: &mut State,
    conn: ConnId,
    request: Request,
    options: &ServerOptions,
    woken: &mut Vec<ConnId>,
) -> Result<Option<Vec<u8>>, String> {
    let max = options.max_stored_bytes;
    let limits = &options.limits;
    Ok(match request {
        Request::Validate { .. } => return Err("VALIDATE twice".into()),
        Request::Set { key, value } => {
            st.put(key.clone(), value, max)?;
            st.woken(&key, woken);
            None
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            let now = match st.kv.get(&key) {
                None if expected.is_empty() => {
                    st.put(key.clone(), desired.clone(), max)?;
                    desired
                }
                None => expected,
                Some(v) if *v == expected => {
                    st.put(key.clone(), desired.clone(), max)?;
                    desired
                }
                Some(v) => v.clone(),
            };
            st.woken(&key, woken);
            let mut out = Vec::new();
            put_value(&mut out, &now);
            Some(out)
        }
        Request::Get { key } => {
            let mut out = Vec::new();
            put_value(&mut out, st.kv.get(&key).map_or(&[][..], Vec::as_slice));
            Some(out)
        }
        Request::Add { key, delta } => {
            let n = st
                .counter(&key)?
                .checked_add(delta)
                .ok_or("ADD overflows the counter")?;
            st.put(key.clone(), n.to_string().into_bytes(), max)?;
            st.woken(&key, woken);
            Some(n.to_le_bytes().to_vec())
        }
        Request::Check { keys } => {
            let ready = keys.iter().all(|k| st.present(k));
            Some(vec![if ready { CHECK_READY } else { CHECK_NOT_READY }])
        }
        Request::Wait { keys } => {
            if st.awaited.contains_key(&conn) {
                return Err("WAIT while a WAIT of this connection is pending".into());
            }
            let mut missing = 0;
            for k in keys {
                if !st.present(&k) && st.await_key(k, conn, max)? {
                    missing += 1;
                }
            }
            if missing == 0 {
                Some(vec![STOP_WAITING])
            } else {
                st.awaited.insert(conn, missing);
                None
            }
        }
        Request::NumKeys => Some(
            i64::try_from(st.kv.len())
                .unwrap_or(i64::MAX)
                .to_le_bytes()
                .to_vec(),
        ),
        Request::DeleteKey { key } => {
            let n = match st.kv.remove(&key) {
                Some(v) => {
                    st.stored -= key.len() + v.len();
                    1i64
                }
                None => 0,
            };
            Some(n.to_le_bytes().to_vec())
        }
        Request::Append { key, value } => {
            let mut now = st.kv.get(&key).cloned().unwrap_or_default();
            if now.len() + value.len() > limits.max_message_bytes {
                return Err(format!(
                    "APPEND would make a value of {} bytes, over the message limit of {}",
                    now.len() + value.len(),
                    limits.max_message_bytes
                ));
            }
            now.extend_from_slice(&value);
            st.put(key.clone(), now, max)?;
            st.woken(&key, woken);
            None
        }
        Request::MultiGet { keys } => {
            let size: usize = keys
                .iter()
                .map(|k| 8 + st.kv.get(k).map_or(0, Vec::len))
                .sum();
            if size > limits.max_message_bytes {
                return Err(format!(
                    "a MULTI_GET reply of {size} bytes, over the message limit of {}",
                    limits.max_message_bytes
                ));
            }
            let mut out = Vec::with_capacity(size);
            for k in keys {
                put_value(&mut out, st.kv.get(&k).map_or(&[][..], Vec::as_slice));
            }
            Some(out)
        }
        Request::MultiSet { pairs } => {
            for (k, v) in pairs {
                st.put(k.clone(), v, max)?;
                st.woken(&k, woken);
            }
            None
        }
        Request::CancelWait => {
            st.forget(conn);
            Some(vec![WAIT_CANCELED])
        }
        Request::Ping { nonce } => Some(nonce.to_le_bytes().to_vec()),
        Request::QueuePush { key, value } => {
            let new_queue = !st.queues.contains_key(&key);
            let stored = st.stored + value.len() + if new_queue { key.len() } else { 0 };
            if stored > max {
                return Err(format!(
                    "queueing {} bytes passes the server's {max}",
                    value.len()
                ));
            }
            st.stored = stored;
            st.queues.entry(key.clone()).or_default().push_back(value);
            // One waiter takes the value.
            let mut last = false;
            if let Some(list) = st.waiting.get_mut(&key) {
                if !list.is_empty() {
                    let c = list.remove(0);
                    last = list.is_empty();
                    if let Some(n) = st.awaited.get_mut(&c) {
                        *n -= 1;
                        if *n == 0 {
                            st.awaited.remove(&c);
                            woken.push(c);
                        }
                    }
                }
            }
            if last {
                st.waiting.remove(&key);
                st.stored -= key.len();
            }
            None
        }
        Request::QueuePop { key } => {
            let (len, front, emptied) = match st.queues.get_mut(&key) {
                None => (0, None, false),
                Some(q) => {
                    let len = q.len();
                    let front = q.pop_front();
                    (len, front, q.is_empty())
                }
            };
            let mut out = i64::try_from(len)
                .unwrap_or(i64::MAX)
                .to_le_bytes()
                .to_vec();
            if let Some(v) = front {
                put_value(&mut out, &v);
                st.stored -= v.len();
            }
            if emptied {
                st.queues.remove(&key);
                st.stored -= key.len();
            }
            Some(out)
        }
        Request::QueueLen { key } => {
            let len = st.queues.get(&key).map_or(0, VecDeque::len);
            Some(
                i64::try_from(len)
                    .unwrap_or(i64::MAX)
                    .to_le_bytes()
                    .to_vec(),
            )
        }
        Request::ListKeys => {
            let size: usize = 8 + st.kv.keys().map(|k| 8 + k.len()).sum::<usize>();
            if size > limits.max_message_bytes {
                return Err(format!(
                    "a LIST_KEYS reply of {size} bytes, over the message limit of {}",
                    limits.max_message_bytes
                ));
            }
            let mut out = i64::try_from(st.kv.len())
                .unwrap_or(i64::MAX)
                .to_le_bytes()
                .to_vec();
            for k in st.kv.keys() {
                put_value(&mut out, k);
            }
            Some(out)
        }
        Request::Barrier { key, world_size } => {
            let n = st
                .counter(&key)?
                .checked_add(1)
                .ok_or("BARRIER overflows the counter")?;
            st.put(key.clone(), n.to_string().into_bytes(), max)?;
            if n >= world_size {
                st.woken(&key, woken);
                Some(vec![STOP_WAITING])
            } else {
                if st.awaited.contains_key(&conn) {
                    return Err("BARRIER while a WAIT of this connection is pending".into());
                }
                if st.await_key(key, conn, max)? {
                    st.awaited.insert(conn, 1);
                    None
                } else {
                    Some(vec![STOP_WAITING])
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Vec<u8> {
        format!("/k{i:04}").into_bytes()
    }

    /// Pops of queues that do not exist leave nothing behind; a queue's key
    /// counts while it exists; awaited keys count while awaited.
    #[test]
    fn what_the_server_holds_is_counted_and_freed() {
        let options = ServerOptions::default();
        let mut st = State::default();
        let mut woken = Vec::new();
        for i in 0..100 {
            let r = answer(
                &mut st,
                1,
                Request::QueuePop { key: key(i) },
                &options,
                &mut woken,
            );
            assert_eq!(r.unwrap().unwrap(), 0i64.to_le_bytes());
        }
        assert!(st.queues.is_empty());
        assert_eq!(st.stored, 0);
        let push = Request::QueuePush {
            key: key(1),
            value: b"abc".to_vec(),
        };
        answer(&mut st, 1, push, &options, &mut woken).unwrap();
        assert_eq!(st.stored, key(1).len() + 3);
        answer(
            &mut st,
            1,
            Request::QueuePop { key: key(1) },
            &options,
            &mut woken,
        )
        .unwrap();
        assert_eq!((st.stored, st.queues.len()), (0, 0));
        let wait = Request::Wait {
            keys: vec![key(2), key(3)],
        };
        assert_eq!(
            answer(&mut st, 7, wait, &options, &mut woken).unwrap(),
            None
        );
        assert_eq!(st.stored, 2 * key(2).len());
        st.forget(7);
        assert_eq!((st.stored, st.waiting.len()), (0, 0));
        // Awaited keys count against the bound.
        let small = ServerOptions::default().with_max_stored_bytes(3 * key(0).len());
        let wait = Request::Wait {
            keys: (0..4).map(key).collect(),
        };
        assert!(answer(&mut st, 8, wait, &small, &mut woken).is_err());
    }

    /// A reply over the message limit is refused before it is built.
    #[test]
    fn a_multi_get_reply_over_the_limit_is_refused() {
        let options = ServerOptions::default();
        let mut st = State::default();
        let mut woken = Vec::new();
        let set = Request::Set {
            key: key(0),
            value: vec![1u8; 8 << 20],
        };
        answer(&mut st, 1, set, &options, &mut woken).unwrap();
        let get = |n: usize| Request::MultiGet {
            keys: vec![key(0); n],
        };
        let ok = answer(&mut st, 1, get(7), &options, &mut woken)
            .unwrap()
            .unwrap();
        assert_eq!(ok.len(), 7 * (8 + (8 << 20)));
        let err = answer(&mut st, 1, get(8), &options, &mut woken).unwrap_err();
        assert!(err.contains("over the message limit"), "{err}");
    }

    /// A wake-up for a connection whose reply is still being written does
    /// not wait for that write: it follows the reply.
    #[test]
    fn a_wake_up_never_waits_for_another_write() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (server_end, _) = l.accept().unwrap();
        let w = Arc::new(Writer {
            stream: Mutex::new(server_end),
            wake: AtomicBool::new(false),
        });
        let held = lock(&w.stream);
        w.wake.store(true, Ordering::SeqCst);
        let start = std::time::Instant::now();
        w.deliver();
        assert!(start.elapsed() < Duration::from_millis(100));
        assert!(w.wake.load(Ordering::SeqCst), "still owed");
        drop(held);
        w.send(b"reply").unwrap();
        let mut got = [0u8; 6];
        std::io::Read::read_exact(&mut &client, &mut got).unwrap();
        assert_eq!(&got, b"reply\0");
    }
}
