//! The TCPStore wire format (torch 2.13, `torch/csrc/distributed/c10d/`
//! `TCPStore.cpp` and `TCPStoreLibUvBackend.cpp`), encoded and decoded with
//! bounds.
//!
//! A request is one command byte ([`Query`]) followed by its fields, with no
//! frame length and no request id; replies come back in request order, and
//! `SET`, `APPEND`, `MULTI_SET`, `QUEUE_PUSH` and `VALIDATE` get none. Every
//! integer is little-endian; a key or value is a `u64` length and the bytes;
//! a key list is a `u64` count and the keys. The only message a server sends
//! unasked is the one byte that ends a pending `WAIT` or `BARRIER`.
//!
//! Decoding reads from any [`Read`] and checks every length against
//! [`Limits`] before it allocates: a peer cannot make either side allocate
//! more than the limits, and a malformed message is a [`WireError`], never
//! a panic.

use std::fmt;
use std::io::{self, Read};

/// The number a client sends in its first message (`VALIDATE`), so that a
/// server can tell a TCPStore client from anything else that connects.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Longest key the libuv server (torch's default) accepts: 8 KiB.
pub const MAX_KEY_BYTES: usize = 8 * 1024;
/// Largest value the libuv server accepts: 8 MiB. Over it the server
/// closes the connection without a word, so the client refuses first.
pub const MAX_VALUE_BYTES: usize = 8 * 1024 * 1024;
/// Most keys in one `CHECK`, `WAIT`, `MULTI_GET` or `MULTI_SET` the libuv
/// server accepts: 131 072.
pub const MAX_KEYS: usize = 128 * 1024;

/// Reply byte of `CHECK`: every key is set.
pub const CHECK_READY: u8 = 0;
/// Reply byte of `CHECK`: some key is not set.
pub const CHECK_NOT_READY: u8 = 1;
/// The byte that ends a `WAIT` (or `BARRIER`): every key is set.
pub const STOP_WAITING: u8 = 0;
/// The reply to `CANCEL_WAIT`.
pub const WAIT_CANCELED: u8 = 1;

/// The command byte of each request (c10d's `QueryType`, values in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Query {
    /// `u32` magic; no reply.
    Validate = 0,
    /// key, value; no reply.
    Set = 1,
    /// key, expected, desired; replies the value now stored.
    CompareSet = 2,
    /// key; replies its value (empty when unset on the libuv server).
    Get = 3,
    /// key, `i64` delta; replies the new `i64`.
    Add = 4,
    /// key list; replies [`CHECK_READY`] or [`CHECK_NOT_READY`].
    Check = 5,
    /// key list; replies [`STOP_WAITING`] once every key is set.
    Wait = 6,
    /// nothing; replies the number of keys, `i64`.
    NumKeys = 7,
    /// key; replies the number deleted, `i64`.
    DeleteKey = 8,
    /// key, value; no reply.
    Append = 9,
    /// key list; replies one value per key.
    MultiGet = 10,
    /// pair count, then key and value per pair; no reply.
    MultiSet = 11,
    /// nothing; replies [`WAIT_CANCELED`] (after a [`STOP_WAITING`] that
    /// was already on its way, if any).
    CancelWait = 12,
    /// `u32` nonce; replies the same 4 bytes.
    Ping = 13,
    /// key, value; no reply.
    QueuePush = 14,
    /// key; replies the queue's length before the pop (`i64`), then the
    /// front value if it was not empty.
    QueuePop = 15,
    /// key; replies the queue's length, `i64`.
    QueueLen = 16,
    /// nothing; replies a key count (`i64`) and the keys.
    ListKeys = 17,
    /// key, `i64` world size; replies [`STOP_WAITING`] once that many
    /// clients arrived.
    Barrier = 18,
}

impl Query {
    /// The query of a command byte, `None` for a byte no query has.
    pub fn from_byte(b: u8) -> Option<Query> {
        use Query::*;
        Some(match b {
            0 => Validate,
            1 => Set,
            2 => CompareSet,
            3 => Get,
            4 => Add,
            5 => Check,
            6 => Wait,
            7 => NumKeys,
            8 => DeleteKey,
            9 => Append,
            10 => MultiGet,
            11 => MultiSet,
            12 => CancelWait,
            13 => Ping,
            14 => QueuePush,
            15 => QueuePop,
            16 => QueueLen,
            17 => ListKeys,
            18 => Barrier,
            _ => return None,
        })
    }

    /// The name c10d gives the query (`"SET"`, `"COMPARE_SET"`, …).
    pub fn name(self) -> &'static str {
        use Query::*;
        match self {
            Validate => "VALIDATE",
            Set => "SET",
            CompareSet => "COMPARE_SET",
            Get => "GET",
            Add => "ADD",
            Check => "CHECK",
            Wait => "WAIT",
            NumKeys => "GETNUMKEYS",
            DeleteKey => "DELETE_KEY",
            Append => "APPEND",
            MultiGet => "MULTI_GET",
            MultiSet => "MULTI_SET",
            CancelWait => "CANCEL_WAIT",
            Ping => "PING",
            QueuePush => "QUEUE_PUSH",
            QueuePop => "QUEUE_POP",
            QueueLen => "QUEUE_LEN",
            ListKeys => "LIST_KEYS",
            Barrier => "BARRIER",
        }
    }
}

/// Bounds on what one message may hold; the defaults are the libuv
/// server's, plus a bound on a whole request (a `MULTI_SET` of many large
/// values) that the libuv server does not have. Built with
/// `Limits::default().with_…`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct Limits {
    /// Longest key, in bytes (default [`MAX_KEY_BYTES`]).
    pub max_key_bytes: usize,
    /// Largest value, in bytes (default [`MAX_VALUE_BYTES`]).
    pub max_value_bytes: usize,
    /// Most keys in one list, a count (default [`MAX_KEYS`]).
    pub max_keys: usize,
    /// Most bytes of keys and values in one message (default 64 MiB).
    pub max_message_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: MAX_KEY_BYTES,
            max_value_bytes: MAX_VALUE_BYTES,
            max_keys: MAX_KEYS,
            max_message_bytes: 64 << 20,
        }
    }
}

/// A message that breaks the format or its limits.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The connection failed or ended in the middle of (or before) a
    /// message.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A command byte no query has.
    #[error("unknown command byte {0}")]
    UnknownQuery(u8),
    /// A length or count over its limit.
    #[error("{what} of {len} is over the limit of {max}")]
    TooLarge {
        /// What the length is of (`"key"`, `"value"`, `"key count"`, `"message"`).
        what: &'static str,
        /// The length (or count) the peer announced.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A reply byte that is not one the query may give.
    #[error("{query} replied byte {got}, expected {expected}")]
    UnexpectedReply {
        /// The query.
        query: &'static str,
        /// The byte received.
        got: u8,
        /// What it may be.
        expected: &'static str,
    },
}

/// One request, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // the fields are the wire fields named in `Query`
pub enum Request {
    Validate {
        magic: u32,
    },
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    NumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
    ListKeys,
    Barrier {
        key: Vec<u8>,
        world_size: i64,
    },
}

/// Reads fields of one message, counting its bytes against the limits.
pub struct Reader<'a, R> {
    inner: &'a mut R,
    limits: &'a Limits,
    total: usize,
}

impl<R> fmt::Debug for Reader<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader")
            .field("total", &self.total)
            .finish()
    }
}

impl<'a, R: Read> Reader<'a, R> {
    /// A reader of one message from `inner`.
    pub fn new(inner: &'a mut R, limits: &'a Limits) -> Self {
        Reader {
            inner,
            limits,
            total: 0,
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut b = [0u8; N];
        self.inner.read_exact(&mut b)?;
        Ok(b)
    }

    /// One byte.
    ///
    /// # Errors
    /// [`WireError::Io`].
    pub fn byte(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    /// A little-endian `u32`.
    ///
    /// # Errors
    /// [`WireError::Io`].
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// A little-endian `u64`.
    ///
    /// # Errors
    /// [`WireError::Io`].
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A little-endian `i64`.
    ///
    /// # Errors
    /// [`WireError::Io`].
    pub fn i64(&mut self) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, WireError> {
        let len = self.u64()?;
        let too_large = |max| WireError::TooLarge { what, len, max };
        let n = usize::try_from(len).map_err(|_| too_large(max))?;
        if n > max {
            return Err(too_large(max));
        }
        let total = self.total.saturating_add(n);
        if total > self.limits.max_message_bytes {
            return Err(WireError::TooLarge {
                what: "message",
                len: u64::try_from(total).unwrap_or(u64::MAX),
                max: self.limits.max_message_bytes,
            });
        }
        self.total = total;
        // Grow with what arrives, not with what the peer announced: a length
        // it never sends reserves nothing.
        let mut out = Vec::with_capacity(n.min(64 * 1024));
        let got = (&mut *self.inner).take(len).read_to_end(&mut out)?;
        if got < n {
            return Err(WireError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{what} of {n} bytes ended after {got}"),
            )));
        }
        Ok(out)
    }

    /// A key (`u64` length, bytes), bounded by [`Limits::max_key_bytes`].
    ///
    /// # Errors
    /// [`WireError::TooLarge`], [`WireError::Io`].
    pub fn key(&mut self) -> Result<Vec<u8>, WireError> {
        let max = self.limits.max_key_bytes;
        self.bytes("key", max)
    }

    /// A value (`u64` length, bytes), bounded by [`Limits::max_value_bytes`].
    ///
    /// # Errors
    /// [`WireError::TooLarge`], [`WireError::Io`].
    pub fn value(&mut self) -> Result<Vec<u8>, WireError> {
        let max = self.limits.max_value_bytes;
        self.bytes("value", max)
    }

    /// A count of keys (`u64`), bounded by [`Limits::max_keys`].
    ///
    /// # Errors
    /// [`WireError::TooLarge`], [`WireError::Io`].
    pub fn count(&mut self) -> Result<usize, WireError> {
        let len = self.u64()?;
        let max = self.limits.max_keys;
        match usize::try_from(len) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(WireError::TooLarge {
                what: "key count",
                len,
                max,
            }),
        }
    }

    fn keys(&mut self) -> Result<Vec<Vec<u8>>, WireError> {
        let n = self.count()?;
        // Each key costs at least its 8-byte length: grow as they come.
        let mut keys = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}

impl Request {
    /// Reads one request (the server's side).
    ///
    /// # Errors
    /// [`WireError::Io`] (including a clean end of the connection before a
    /// command byte: `UnexpectedEof`), [`WireError::UnknownQuery`],
    /// [`WireError::TooLarge`].
    pub fn read(r: &mut impl Read, limits: &Limits) -> Result<Request, WireError> {
        let mut r = Reader::new(r, limits);
        let cmd = r.byte()?;
        let query = Query::from_byte(cmd).ok_or(WireError::UnknownQuery(cmd))?;
        Ok(match query {
            Query::Validate => Request::Validate { magic: r.u32()? },
            Query::Set => Request::Set {
                key: r.key()?,
                value: r.value()?,
            },
            Query::CompareSet => Request::CompareSet {
                key: r.key()?,
                expected: r.value()?,
                desired: r.value()?,
            },
            Query::Get => Request::Get { key: r.key()? },
            Query::Add => Request::Add {
                key: r.key()?,
                delta: r.i64()?,
            },
            Query::Check => Request::Check { keys: r.keys()? },
            Query::Wait => Request::Wait { keys: r.keys()? },
            Query::NumKeys => Request::NumKeys,
            Query::DeleteKey => Request::DeleteKey { key: r.key()? },
            Query::Append => Request::Append {
                key: r.key()?,
                value: r.value()?,
            },
            Query::MultiGet => Request::MultiGet { keys: r.keys()? },
            Query::MultiSet => {
                let n = r.count()?;
                let mut pairs = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    pairs.push((r.key()?, r.value()?));
                }
                Request::MultiSet { pairs }
            }
            Query::CancelWait => Request::CancelWait,
            Query::Ping => Request::Ping { nonce: r.u32()? },
            Query::QueuePush => Request::QueuePush {
                key: r.key()?,
                value: r.value()?,
            },
            Query::QueuePop => Request::QueuePop { key: r.key()? },
            Query::QueueLen => Request::QueueLen { key: r.key()? },
            Query::ListKeys => Request::ListKeys,
            Query::Barrier => Request::Barrier {
                key: r.key()?,
                world_size: r.i64()?,
            },
        })
    }

    /// The request's query.
    pub fn query(&self) -> Query {
        match self {
            Request::Validate { .. } => Query::Validate,
            Request::Set { .. } => Query::Set,
            Request::CompareSet { .. } => Query::CompareSet,
            Request::Get { .. } => Query::Get,
            Request::Add { .. } => Query::Add,
            Request::Check { .. } => Query::Check,
            Request::Wait { .. } => Query::Wait,
            Request::NumKeys => Query::NumKeys,
            Request::DeleteKey { .. } => Query::DeleteKey,
            Request::Append { .. } => Query::Append,
            Request::MultiGet { .. } => Query::MultiGet,
            Request::MultiSet { .. } => Query::MultiSet,
            Request::CancelWait => Query::CancelWait,
            Request::Ping { .. } => Query::Ping,
            Request::QueuePush { .. } => Query::QueuePush,
            Request::QueuePop { .. } => Query::QueuePop,
            Request::QueueLen { .. } => Query::QueueLen,
            Request::ListKeys => Query::ListKeys,
            Request::Barrier { .. } => Query::Barrier,
        }
    }

    /// The request's bytes (the client's side).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.query() as u8];
        let put = |out: &mut Vec<u8>, b: &[u8]| {
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        };
        let put_keys = |out: &mut Vec<u8>, keys: &[Vec<u8>]| {
            out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
            for k in keys {
                put(out, k);
            }
        };
        match self {
            Request::Validate { magic } => out.extend_from_slice(&magic.to_le_bytes()),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put(&mut out, key);
                put(&mut out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put(&mut out, key);
                put(&mut out, expected);
                put(&mut out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put(&mut out, key),
            Request::Add { key, delta } => {
                put(&mut out, key);
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Request::Barrier { key, world_size } => {
                put(&mut out, key);
                out.extend_from_slice(&world_size.to_le_bytes());
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_keys(&mut out, keys);
            }
            Request::MultiSet { pairs } => {
                out.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
                for (k, v) in pairs {
                    put(&mut out, k);
                    put(&mut out, v);
                }
            }
            Request::Ping { nonce } => out.extend_from_slice(&nonce.to_le_bytes()),
            Request::NumKeys | Request::CancelWait | Request::ListKeys => {}
        }
        out
    }
}

/// Appends a value's wire form (`u64` length, bytes) to `out`.
pub fn put_value(out: &mut Vec<u8>, value: &[u8]) {
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(value);
}

/// One reply, decoded (the client's side).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The query gets no reply (`SET`, `APPEND`, `MULTI_SET`, `QUEUE_PUSH`,
    /// `VALIDATE`).
    Nothing,
    /// A value (`GET`, `COMPARE_SET`).
    Value(Vec<u8>),
    /// An integer (`ADD`, `GETNUMKEYS`, `DELETE_KEY`, `QUEUE_LEN`).
    Int(i64),
    /// Whether every key is set (`CHECK`).
    Ready(bool),
    /// The wait ended: every key is set (`WAIT`, `BARRIER`).
    StopWaiting,
    /// The wait was cancelled (`CANCEL_WAIT`; a late [`STOP_WAITING`]
    /// before it is read too).
    Canceled,
    /// The ping's nonce (`PING`).
    Nonce(u32),
    /// One value per key asked for (`MULTI_GET`).
    Values(Vec<Vec<u8>>),
    /// The front value of a queue, `None` when it was empty (`QUEUE_POP`).
    Popped(Option<Vec<u8>>),
    /// Every key the server holds (`LIST_KEYS`).
    Keys(Vec<Vec<u8>>),
}

impl Reply {
    /// Reads the reply to `query` (`keys`: how many keys a `MULTI_GET`
    /// asked for), checking every length against `limits`.
    ///
    /// # Errors
    /// [`WireError::Io`] (the connection ended, or its read timed out),
    /// [`WireError::TooLarge`], [`WireError::UnexpectedReply`] for a reply
    /// byte the query cannot give.
    pub fn read(
        query: Query,
        keys: usize,
        r: &mut impl Read,
        limits: &Limits,
    ) -> Result<Reply, WireError> {
        let mut r = Reader::new(r, limits);
        let name = query.name();
        let unexpected = |got: u8, expected: &'static str| WireError::UnexpectedReply {
            query: name,
            got,
            expected,
        };
        Ok(match query {
            Query::Validate | Query::Set | Query::Append | Query::MultiSet | Query::QueuePush => {
                Reply::Nothing
            }
            Query::Get | Query::CompareSet => Reply::Value(r.value()?),
            Query::Add | Query::NumKeys | Query::DeleteKey | Query::QueueLen => {
                Reply::Int(r.i64()?)
            }
            Query::Check => match r.byte()? {
                CHECK_READY => Reply::Ready(true),
                CHECK_NOT_READY => Reply::Ready(false),
                got => return Err(unexpected(got, "0 (ready) or 1 (not ready)")),
            },
            Query::Wait | Query::Barrier => match r.byte()? {
                STOP_WAITING => Reply::StopWaiting,
                got => return Err(unexpected(got, "0 (stop waiting)")),
            },
            Query::CancelWait => {
                let mut got = r.byte()?;
                if got == STOP_WAITING {
                    got = r.byte()?;
                }
                if got != WAIT_CANCELED {
                    return Err(unexpected(got, "1 (wait canceled)"));
                }
                Reply::Canceled
            }
            Query::Ping => Reply::Nonce(r.u32()?),
            Query::MultiGet => {
                if keys > limits.max_keys {
                    return Err(WireError::TooLarge {
                        what: "key count",
                        len: keys as u64,
                        max: limits.max_keys,
                    });
                }
                let mut values = Vec::with_capacity(keys.min(1024));
                for _ in 0..keys {
                    values.push(r.value()?);
                }
                Reply::Values(values)
            }
            Query::QueuePop => {
                let len = r.i64()?;
                Reply::Popped(if len > 0 { Some(r.value()?) } else { None })
            }
            Query::ListKeys => {
                let n = r.i64()?;
                let max = limits.max_keys;
                let n =
                    usize::try_from(n)
                        .ok()
                        .filter(|n| *n <= max)
                        .ok_or(WireError::TooLarge {
                            what: "key count",
                            len: n.unsigned_abs(),
                            max,
                        })?;
                let mut keys = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    keys.push(r.key()?);
                }
                Reply::Keys(keys)
            }
        })
    }
}
