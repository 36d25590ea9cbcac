//! Gloo rendezvous stores: FileStore, RedisStore, HashStore, PrefixStore,
//! and any core [`Store`] written in Rust (through a table of C function
//! pointers).

use crate::sys::{self, StoreHandle};
use crate::GlooError;
use compiler_collectives_core::{Deadline, Result, Store};
use std::sync::Arc;
use std::time::Duration;

/// Which kind of store a [`GlooStore`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// Gloo's FileStore in a directory (ranks on one host, or a shared filesystem).
    File(std::path::PathBuf),
    /// Gloo's RedisStore (ranks on several hosts).
    Redis {
        /// Host name or address.
        host: String,
        /// TCP port.
        port: u16,
    },
    /// Gloo's in-memory HashStore (ranks as threads of one process).
    Hash,
    /// A core [`Store`] written in Rust.
    Rust,
    /// A prefix over another store.
    Prefix(String),
}

/// A Gloo rendezvous store handle. Cloning shares the store.
#[derive(Clone, Debug)]
pub struct GlooStore {
    handle: Arc<StoreHandle>,
    kind: StoreKind,
    /// What errors call it (`the TCPStore at host:port`), when not its kind's.
    description: Option<String>,
    /// For a Rust store (under any prefixes): the store itself and the
    /// prefix Gloo's PrefixStores put before a key (`a/b/`), so that
    /// [`GlooStore::set_within`] and [`GlooStore::try_get_within`] call it
    /// on the caller's thread with a deadline, not through Gloo.
    direct: Option<(Arc<dyn Store>, String)>,
}

impl GlooStore {
    fn new(handle: StoreHandle, kind: StoreKind) -> Self {
        GlooStore {
            handle: Arc::new(handle),
            kind,
            description: None,
            direct: None,
        }
    }

    /// Gloo's FileStore in `dir` (created if missing).
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load or the directory cannot be used.
    pub fn file(dir: impl AsRef<std::path::Path>) -> Result<Self, GlooError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| GlooError::Invalid(format!("store directory {}: {e}", dir.display())))?;
        let path = sys::cstring(&dir.to_string_lossy(), "store directory")?;
        let handle = StoreHandle::file(&path)?;
        Ok(Self::new(handle, StoreKind::File(dir.to_path_buf())))
    }

    /// Gloo's RedisStore at `host:port`.
    ///
    /// # Errors
    /// [`GlooError`] if the server cannot be reached.
    pub fn redis(host: &str, port: u16) -> Result<Self, GlooError> {
        let h = sys::cstring(host, "redis host")?;
        let handle = StoreHandle::redis(&h, port)?;
        Ok(Self::new(
            handle,
            StoreKind::Redis {
                host: host.to_owned(),
                port,
            },
        ))
    }

    /// Gloo's in-memory HashStore (for ranks that are threads of one process).
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load.
    pub fn hash() -> Result<Self, GlooError> {
        Ok(Self::new(StoreHandle::hash()?, StoreKind::Hash))
    }

    /// A Rust [`Store`] seen by Gloo as its rendezvous store. Gloo's waits use
    /// `timeout` when Gloo gives none.
    ///
    /// # Errors
    /// [`GlooError`] if the adapter cannot load.
    pub fn from_store(store: Arc<dyn Store>, timeout: Duration) -> Result<Self, GlooError> {
        // Gloo's `set` carries no timeout: bound it (and every other call)
        // by `timeout` too.
        let bounded: Arc<dyn Store> = Arc::new(Bounded {
            inner: Arc::clone(&store),
            timeout,
        });
        let mut made = Self::new(StoreHandle::rust(bounded, timeout)?, StoreKind::Rust);
        made.direct = Some((store, String::new()));
        Ok(made)
    }

    /// A view of this store in which every key `k` is stored as `prefix/k`
    /// (Gloo's PrefixStore).
    ///
    /// # Errors
    /// [`GlooError`] if `prefix` contains NUL.
    pub fn prefixed(&self, prefix: &str) -> Result<Self, GlooError> {
        let p = sys::cstring(prefix, "prefix")?;
        let handle = self.handle.prefixed(&p)?;
        let mut made = Self::new(handle, StoreKind::Prefix(prefix.to_owned()));
        // Gloo's PrefixStore stores `k` as `prefix/k`.
        made.direct = self
            .direct
            .as_ref()
            .map(|(store, outer)| (Arc::clone(store), format!("{outer}{prefix}/")));
        Ok(made)
    }

    /// What kind of store this is.
    pub fn kind(&self) -> &StoreKind {
        &self.kind
    }

    /// The same store, called `description` in errors (e.g. `the TCPStore
    /// at 10.0.0.1:29500` for a Rust store).
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// What errors call this store: `the FileStore in DIR`, `Redis at
    /// HOST:PORT`, or the description given.
    pub fn describe(&self) -> String {
        if let Some(d) = &self.description {
            return d.clone();
        }
        match &self.kind {
            StoreKind::File(dir) => format!("the FileStore in {}", dir.display()),
            StoreKind::Redis { host, port } => format!("Redis at {host}:{port}"),
            StoreKind::Hash => "the in-memory HashStore".into(),
            StoreKind::Rust => "the rendezvous store".into(),
            StoreKind::Prefix(p) => format!("the rendezvous store (under '{p}')"),
        }
    }

    pub(crate) fn handle(&self) -> &StoreHandle {
        &self.handle
    }

    /// Sets `key` (Gloo's `Store::set`). Gloo's FileStore cannot hold an
    /// empty value (its read enforces a non-empty file).
    ///
    /// # Errors
    /// The store's error.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), GlooError> {
        let k = sys::cstring(key, "key")?;
        self.handle.set(&k, value)
    }

    /// Waits until `key` is set (at most `timeout`) and returns it.
    ///
    /// # Errors
    /// A timeout or the store's error.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, GlooError> {
        let k = sys::cstring(key, "key")?;
        self.handle.get(&k, timeout)
    }

    /// Whether [`GlooStore::set_within`] and [`GlooStore::try_get_within`]
    /// honour their deadline on the caller's thread: a Rust store (under
    /// any prefixes). Gloo's own stores take no deadline on `set`, and
    /// their FileStore takes a second to say a key is missing.
    pub fn takes_deadlines(&self) -> bool {
        self.direct.is_some()
    }

    /// Sets `key` by `deadline`: on a Rust store, its own `set` with that
    /// deadline; on Gloo's stores, Gloo's `set` (no deadline).
    ///
    /// # Errors
    /// The store's error, or a timeout.
    pub fn set_within(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()> {
        match &self.direct {
            Some((store, prefix)) => store.set(&format!("{prefix}{key}"), value, deadline),
            None => self.set(key, value).map_err(Into::into),
        }
    }

    /// `key`'s value if it is set, asking at most until `deadline`: on a
    /// Rust store, its `try_get`; on Gloo's stores, Gloo's `wait` for a
    /// millisecond, then `get` (Gloo's FileStore takes a second to say a
    /// key is missing).
    ///
    /// # Errors
    /// The store's error.
    pub fn try_get_within(&self, key: &str, deadline: Deadline) -> Result<Option<Vec<u8>>> {
        match &self.direct {
            Some((store, prefix)) => store.try_get(&format!("{prefix}{key}"), deadline),
            None => {
                if self.wait(&[key], Duration::from_millis(1)).is_err() {
                    return Ok(None);
                }
                self.get(key, deadline.remaining())
                    .map(Some)
                    .map_err(Into::into)
            }
        }
    }

    /// Waits until every key is set (at most `timeout`).
    ///
    /// # Errors
    /// A timeout or the store's error.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), GlooError> {
        let owned = keys
            .iter()
            .map(|k| sys::cstring(k, "key"))
            .collect::<Result<Vec<_>, _>>()?;
        self.handle.wait(&owned, timeout)
    }
}

/// A Rust store whose calls end by `timeout` from their start at the latest
/// (what Gloo gives a Rust store no deadline for, `set`, otherwise waits
/// its own).
#[derive(Debug)]
struct Bounded {
    inner: Arc<dyn Store>,
    timeout: Duration,
}

impl Bounded {
    fn bound(&self, deadline: Deadline) -> Deadline {
        Deadline::after(self.timeout).min(deadline)
    }
}

impl Store for Bounded {
    fn set(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()> {
        self.inner.set(key, value, self.bound(deadline))
    }
    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>> {
        self.inner.get(key, self.bound(deadline))
    }
    fn add(&self, key: &str, delta: i64, deadline: Deadline) -> Result<i64> {
        self.inner.add(key, delta, self.bound(deadline))
    }
    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        self.inner.wait(keys, self.bound(deadline))
    }
    fn delete(&self, key: &str, deadline: Deadline) -> Result<bool> {
        self.inner.delete(key, self.bound(deadline))
    }
    fn try_get(&self, key: &str, deadline: Deadline) -> Result<Option<Vec<u8>>> {
        self.inner.try_get(key, self.bound(deadline))
    }
}
