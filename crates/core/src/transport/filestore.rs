//! [`FileStore`]: a [`Store`] on a directory every rank can see (one node,
//! or a shared filesystem), next to [`InProcessStore`](crate::InProcessStore).
//! Pure Rust, so a job needs no other rendezvous service: the NCCL backend
//! uses it by default; any other `Store` (c10d's TCPStore through the tch
//! crate, Gloo's stores) works as well.

use crate::{Deadline, Error, Store};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A key–value store in a directory: one file per key, written to a
/// temporary name and renamed (readers never see half a value); `add`
/// holds a lock file. Waits poll every 1–10 ms. Values read back are
/// bounded ([`FileStore::with_max_value_bytes`]): any process that can write
/// the directory controls them.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
    max_value_bytes: u64,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Backend {
        backend: "file-store",
        message: format!("file store: {what} {}: {e}", path.display()),
        engine: Some(Box::new(e)),
    }
}

fn timeout(start: Instant, what: String) -> Error {
    tracing::debug!(%what, "file store wait timed out");
    Error::timeout(Vec::new(), Vec::new(), start.elapsed())
}

/// Longest key stored under its hex name: `k-` + 200 hex digits + `.lock`
/// stays within the 255 bytes of a file name.
const MAX_HEX_KEY_BYTES: usize = 100;

/// Sleeps a little longer each time, up to 10 ms, without passing `deadline`.
fn pause(round: &mut u32, deadline: Deadline) {
    *round = round.saturating_add(1);
    let ms = u64::from((*round).min(10));
    std::thread::sleep(Duration::from_millis(ms).min(deadline.remaining()));
}

impl FileStore {
    /// A store in `dir` (created if missing).
    ///
    /// # Errors
    /// [`Error::Backend`] if the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io("cannot create", &dir, e))?;
        Ok(FileStore {
            dir,
            max_value_bytes: Self::DEFAULT_MAX_VALUE_BYTES,
        })
    }

    /// The default largest value read back: 1 GiB.
    pub const DEFAULT_MAX_VALUE_BYTES: u64 = 1 << 30;

    /// Sets the largest value `get` (and `add`) reads back, in bytes; a
    /// larger file is an [`Error::Backend`] instead of an allocation of its size.
    #[must_use]
    pub fn with_max_value_bytes(mut self, max_value_bytes: u64) -> Self {
        self.max_value_bytes = max_value_bytes;
        self
    }

    /// Reads a value file, at most `max_value_bytes` of it.
    fn read(&self, path: &Path) -> std::io::Result<Result<Vec<u8>, Error>> {
        use std::io::Read as _;
        let file = std::fs::File::open(path)?;
        let mut value = Vec::new();
        file.take(self.max_value_bytes.saturating_add(1))
            .read_to_end(&mut value)?;
        if value.len() as u64 > self.max_value_bytes {
            return Ok(Err(Error::Backend {
                backend: "file-store",
                message: format!(
                    "file store: {} holds more than {} bytes, the limit of a value",
                    path.display(),
                    self.max_value_bytes
                ),
                engine: None,
            }));
        }
        Ok(Ok(value))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of a key: `k-` and its bytes in hex (keys may hold `/`);
    /// for keys over [`MAX_HEX_KEY_BYTES`] bytes, whose hex name would pass
    /// the 255-byte limit of a file name, `h-` and its 128-bit xxh3 hash.
    fn path(&self, key: &str) -> PathBuf {
        if key.len() > MAX_HEX_KEY_BYTES {
            return self.dir.join(format!(
                "h-{:032x}",
                xxhash_rust::xxh3::xxh3_128(key.as_bytes())
            ));
        }
        let mut name = String::with_capacity(key.len() * 2 + 2);
        name.push_str("k-");
        for b in key.bytes() {
            name.push_str(&format!("{b:02x}"));
        }
        self.dir.join(name)
    }

    fn write(&self, path: &Path, value: &[u8]) -> Result<(), Error> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let tmp = self
            .dir
            .join(format!(".tmp-{}-{nanos}", std::process::id()));
        std::fs::write(&tmp, value).map_err(|e| io("cannot write", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("cannot rename to", path, e))
    }
}

impl Store for FileStore {
    fn set(&self, key: &str, value: &[u8], _deadline: Deadline) -> Result<(), Error> {
        self.write(&self.path(key), value)
    }

    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>, Error> {
        let path = self.path(key);
        let start = Instant::now();
        let mut round = 0;
        loop {
            match self.read(&path) {
                Ok(v) => return v,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot read", &path, e)),
            }
            if deadline.expired() {
                return Err(timeout(start, format!("get {key}")));
            }
            pause(&mut round, deadline);
        }
    }

    fn add(&self, key: &str, delta: i64, deadline: Deadline) -> Result<i64, Error> {
        let path = self.path(key);
        let lock = path.with_extension("lock");
        let start = Instant::now();
        let mut round = 0;
        while let Err(e) = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(io("cannot create", &lock, e));
            }
            if deadline.expired() {
                return Err(timeout(start, format!("lock for add {key}")));
            }
            pause(&mut round, deadline);
        }
        let result = (|| {
            let current = match self.read(&path) {
                Ok(v) => std::str::from_utf8(&v?)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("store key {key:?} holds no counter"))
                    })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
                Err(e) => return Err(io("cannot read", &path, e)),
            };
            let new = current.checked_add(delta).ok_or_else(|| {
                Error::InvalidArgument(format!("store counter {key:?} overflows"))
            })?;
            self.write(&path, new.to_string().as_bytes())?;
            Ok(new)
        })();
        let _ = std::fs::remove_file(&lock);
        result
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<(), Error> {
        let start = Instant::now();
        let mut round = 0;
        loop {
            let missing: Vec<&str> = keys
                .iter()
                .copied()
                .filter(|k| !self.path(k).exists())
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            if deadline.expired() {
                return Err(timeout(start, format!("wait {missing:?}")));
            }
            pause(&mut round, deadline);
        }
    }

    fn delete(&self, key: &str, _deadline: Deadline) -> Result<bool, Error> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("cannot delete", &path, e)),
        }
    }
}
