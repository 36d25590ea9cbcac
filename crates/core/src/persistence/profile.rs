//! Profiles: decisions persisted across runs of a job (profile-guided
//! optimisation, PGO).
//!
//! A [`Profile`] maps a compile key and a decision kind to the joined state
//! of that decision — today the [`FrameState`] of automatic-dynamic shapes.
//! A restarted job loads it before its first compile, so a dimension that
//! became dynamic in an earlier run is dynamic from step 0 instead of costing
//! a static compile and a recompile. This is the role of PyTorch's
//! `torch._dynamo.pgo` (per code object, the source → `FrameStateSizeEntry`
//! map of automatic dynamic, stored per job id); the file format, locking and
//! cross-rank rule here are this project's own.
//!
//! # How ranks keep identical profiles (docs/protocol.md)
//! In a frame compile every rank contributes (persisted state ⊔ its
//! observation) to the one exchange ([`crate::cache::CompileCache`] does it),
//! so every rank ends the compile holding the same join and saves the same
//! entry. **Every rank saves** (no rank is special): saving joins what is on
//! disk with what is saved, under a file lock, so N ranks saving identical
//! content leave exactly that content, and ranks on other hosts with their
//! own directories each get it. [`exchange_profile`] joins whole profiles
//! over a channel, for keys only some ranks compiled.
//!
//! # Files
//! A [`ProfileStore`] is one directory per job id holding:
//! - `profile.ccol` — the profile ([`Profile::encode`]): a 32-byte header
//!   then a postcard body, written only by rename;
//! - `profile.ccol.lock` — the lock file (never deleted: deleting a lock
//!   file lets two writers lock different files);
//! - `.profile.ccol.tmp-<pid>-<n>` — a save in progress. A writer killed
//!   mid-save leaves its temp file behind; the next save removes every such
//!   file while it holds the lock (a live writer only has one while holding
//!   the lock, so whatever is there belongs to a dead one). Readers never
//!   look at temp files.
//!
//! Saving is: take the lock (waiting at most [`ProfileStore::lock_timeout`],
//! else [`ProfileError::LockTimeout`]) → read the current file → join →
//! write a temp file in the same directory → fsync it → rename it over
//! `profile.ccol` → fsync the directory → unlock. So concurrent writers
//! never lose an entry, and a writer killed at any instant leaves either the
//! old or the new file, never a partial one.
//!
//! ```text
//! profile.ccol, little-endian:
//!   0  magic     8 bytes  "CCOLPGO\0"
//!   8  version   u16      PROFILE_VERSION
//!  10  flags     u16      0
//!  12  body len  u32      bytes after the header
//!  16  checksum  16 bytes XXH3-128 of the body
//!  32  body      postcard of the entries, canonical (re-encoding gives the same bytes)
//! ```

use crate::decisions::shapes::FrameState;
use crate::error::{DecodeError, Error};
use crate::protocol::join::Join;
use crate::protocol::Channel;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The eight bytes that start every profile file.
pub const PROFILE_MAGIC: [u8; 8] = *b"CCOLPGO\0";
/// The profile file version this build reads and writes.
pub const PROFILE_VERSION: u16 = 1;
/// Length of the fixed file header, in bytes.
pub const PROFILE_HEADER_LEN: usize = 32;
/// Name of the profile file inside a store's directory.
pub const PROFILE_FILE: &str = "profile.ccol";
/// Name of the lock file inside a store's directory.
pub const LOCK_FILE: &str = "profile.ccol.lock";
const TEMP_PREFIX: &str = ".profile.ccol.tmp-";

/// Environment variable naming the root directory of profiles; a job's
/// store is `<root>/<job id>`.
pub const PROFILE_DIR_ENV: &str = "CCOL_PROFILE_DIR";
/// Environment variable naming the job id (else `TORCHELASTIC_RUN_ID`).
pub const JOB_ID_ENV: &str = "CCOL_JOB_ID";
/// The job id torchrun exports (docs/environment.md), used when [`JOB_ID_ENV`] is unset.
pub const TORCHELASTIC_RUN_ID_ENV: &str = "TORCHELASTIC_RUN_ID";

/// Default wait for the lock: 10 s (PyTorch's PGO uses the same lock timeout).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds on what a profile file may make a reader accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileLimits {
    /// Largest body in bytes (default 64 MiB).
    pub max_body_bytes: usize,
    /// Most entries (default 1 048 576).
    pub max_entries: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        ProfileLimits {
            max_body_bytes: 64 << 20,
            max_entries: 1 << 20,
        }
    }
}

/// Where an entry of a profile belongs: a compile key and a decision kind.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProfileKey {
    /// The compile key (canonical, equal on every rank), e.g. `"train_step@model.rs:88"`.
    pub key: String,
    /// The decision kind ([`Join::KIND`]), e.g. `"shape.frame_state"`.
    pub kind: String,
}

/// A persisted decision. One variant per decision kind; new kinds are new
/// variants (the postcard tag of existing ones does not change).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ProfileValue {
    /// Automatic-dynamic shapes of one frame ([`FrameState::KIND`]).
    Shapes(FrameState),
}

impl ProfileValue {
    /// The decision kind of this value.
    pub fn kind(&self) -> &'static str {
        match self {
            ProfileValue::Shapes(_) => FrameState::KIND,
        }
    }

    fn join(&mut self, other: &Self) {
        match (self, other) {
            (ProfileValue::Shapes(a), ProfileValue::Shapes(b)) => a.join(b),
        }
    }
}

/// Persisted decisions: (compile key, kind) → joined state.
///
/// Its serde form is the postcard body of the file (keys are structs, so
/// not JSON: use [`Profile::to_json`]).
///
/// Join: per entry, missing = ⊥ (a [`Join`], kind `"profile"`), so profiles
/// from several ranks or runs merge order-independently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Profile {
    entries: BTreeMap<ProfileKey, ProfileValue>,
}

impl Join for Profile {
    const KIND: &'static str = "profile";
    fn join(&mut self, other: &Self) {
        for (k, v) in &other.entries {
            match self.entries.get_mut(k) {
                Some(mine) => mine.join(v),
                None => {
                    self.entries.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

impl Profile {
    /// An empty profile.
    pub fn new() -> Self {
        Self::default()
    }

    /// Joins `state` into the shapes entry of compile key `key`.
    pub fn record_shapes(&mut self, key: &str, state: &FrameState) {
        let k = ProfileKey {
            key: key.to_owned(),
            kind: FrameState::KIND.to_owned(),
        };
        match self.entries.get_mut(&k) {
            Some(ProfileValue::Shapes(s)) => s.join(state),
            None => {
                self.entries.insert(k, ProfileValue::Shapes(state.clone()));
            }
        }
    }

    /// The shapes state persisted for compile key `key`, if any.
    pub fn shapes(&self, key: &str) -> Option<&FrameState> {
        let k = ProfileKey {
            key: key.to_owned(),
            kind: FrameState::KIND.to_owned(),
        };
        match self.entries.get(&k) {
            Some(ProfileValue::Shapes(s)) => Some(s),
            None => None,
        }
    }

    /// Every entry, in (key, kind) order.
    pub fn entries(&self) -> impl Iterator<Item = (&ProfileKey, &ProfileValue)> {
        self.entries.iter()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The file bytes: header then canonical postcard body (see the module docs).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the body is over 4 GiB.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let body = postcard::to_allocvec(&self.entries)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode the profile: {e}")))?;
        let len = u32::try_from(body.len()).map_err(|_| {
            Error::InvalidArgument(format!(
                "profile body of {} bytes is over 4 GiB",
                body.len()
            ))
        })?;
        let mut out = Vec::with_capacity(PROFILE_HEADER_LEN + body.len());
        out.extend_from_slice(&PROFILE_MAGIC);
        out.extend_from_slice(&PROFILE_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(&body).to_le_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Decodes profile file bytes strictly: magic, version, flags, exact
    /// length, checksum, a body that decodes completely, at most
    /// `limits.max_entries` entries, each kind matching its value, and a
    /// canonical body. Allocation is bounded by the input length; a body
    /// declaring more than `limits.max_entries` entries is refused before they
    /// are decoded.
    ///
    /// # Errors
    /// [`DecodeError`] saying which check failed.
    pub fn decode(bytes: &[u8], limits: &ProfileLimits) -> Result<Profile, DecodeError> {
        if bytes.len() < PROFILE_HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: PROFILE_HEADER_LEN,
                got: bytes.len(),
            });
        }
        if bytes[..8] != PROFILE_MAGIC {
            return Err(DecodeError::Invalid {
                field: "magic",
                detail: format!("{:02x?} is not a compiler-collectives profile", &bytes[..8]),
            });
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != PROFILE_VERSION {
            return Err(DecodeError::Invalid {
                field: "version",
                detail: format!(
                    "profile version {version}; this build reads version {PROFILE_VERSION}"
                ),
            });
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        if flags != 0 {
            return Err(DecodeError::Invalid {
                field: "flags",
                detail: format!("{flags:#06x}, expected 0"),
            });
        }
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        if len > limits.max_body_bytes {
            return Err(DecodeError::TooLarge {
                field: "profile body",
                len: len as u64,
                limit: limits.max_body_bytes as u64,
            });
        }
        let body = &bytes[PROFILE_HEADER_LEN..];
        if body.len() < len {
            return Err(DecodeError::Truncated {
                needed: PROFILE_HEADER_LEN + len,
                got: bytes.len(),
            });
        }
        if body.len() > len {
            return Err(DecodeError::Trailing {
                extra: body.len() - len,
            });
        }
        if xxhash_rust::xxh3::xxh3_128(body).to_le_bytes()[..] != bytes[16..32] {
            return Err(DecodeError::Invalid {
                field: "checksum",
                detail: "the body does not match its checksum (corrupt file)".into(),
            });
        }
        // The body starts with the entry count (a postcard varint): refuse
        // too many before decoding them, which takes ~16 times the body's size.
        let (count, _) =
            postcard::take_from_bytes::<u64>(body).map_err(|e| DecodeError::Payload {
                kind: Profile::KIND.to_owned(),
                detail: e.to_string(),
            })?;
        if count > limits.max_entries as u64 {
            return Err(DecodeError::Invalid {
                field: "profile entries",
                detail: format!("{count} entries, over the limit of {}", limits.max_entries),
            });
        }
        let entries: BTreeMap<ProfileKey, ProfileValue> =
            crate::protocol::envelope::decode_postcard(Profile::KIND, body)?;
        if let Some((k, v)) = entries.iter().find(|(k, v)| k.kind != v.kind()) {
            return Err(DecodeError::Invalid {
                field: "entry kind",
                detail: format!(
                    "entry '{}' says kind '{}' but holds '{}'",
                    k.key,
                    k.kind,
                    v.kind()
                ),
            });
        }
        let canonical = postcard::to_allocvec(&entries).map_err(|e| DecodeError::Invalid {
            field: "body",
            detail: e.to_string(),
        })?;
        if canonical != body {
            return Err(DecodeError::Invalid {
                field: "body",
                detail: "not in canonical form (entries unsorted or repeated)".into(),
            });
        }
        Ok(Profile { entries })
    }

    /// A JSON view for people and tools:
    /// `{"entries": [{"key", "kind", "sources": [{"source", "scalar", "size",
    /// "stride", "dynamic"}]}]}` where `dynamic` is the decision the entry
    /// gives: sorted dynamic size dims, `"scalar"`, or `[]` when static.
    pub fn to_json(&self) -> Value {
        let entries: Vec<Value> = self
            .entries
            .iter()
            .map(|(k, v)| {
                let ProfileValue::Shapes(state) = v;
                let sources: Vec<Value> = state
                    .iter()
                    .map(|(source, e)| {
                        json!({
                            "source": source,
                            "scalar": e.scalar.to_string(),
                            "size": e.size.to_string(),
                            "stride": e.stride.to_string(),
                            "dynamic": persisted_decision(&e),
                        })
                    })
                    .collect();
                json!({"key": k.key, "kind": k.kind, "sources": sources})
            })
            .collect();
        json!({ "entries": entries })
    }

    /// What differs between `self` (A) and `other` (B), one line each, in
    /// (key, kind, source) order; empty when equal.
    pub fn diff(&self, other: &Profile) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&ProfileKey> =
            self.entries.keys().chain(other.entries.keys()).collect();
        for k in keys {
            let name = format!("'{}' ({})", k.key, k.kind);
            match (self.entries.get(k), other.entries.get(k)) {
                (Some(_), None) => out.push(format!("- {name}: only in A")),
                (None, Some(_)) => out.push(format!("+ {name}: only in B")),
                (Some(ProfileValue::Shapes(a)), Some(ProfileValue::Shapes(b))) => {
                    let sources: std::collections::BTreeSet<&str> =
                        a.sources().chain(b.sources()).collect();
                    for s in sources {
                        match (a.entry(s), b.entry(s)) {
                            (Some(_), None) => {
                                out.push(format!("- {name} source '{s}': only in A"));
                            }
                            (None, Some(_)) => {
                                out.push(format!("+ {name} source '{s}': only in B"));
                            }
                            (Some(x), Some(y)) if x != y => {
                                out.push(format!("~ {name} source '{s}': A {x}, B {y}"));
                            }
                            _ => {}
                        }
                    }
                }
                (None, None) => {}
            }
        }
        out
    }
}

/// The decision a persisted entry gives, as `ccol profile show` prints it:
/// the sorted dynamic size dims of a tensor (`[0]`, `[]` when static),
/// `"all"` when the size tuple itself is dynamic and the scalar too (an int
/// that varied, tensors of different ndim, or a tensor on one rank and an
/// int on another), `[]` for a static int.
pub fn persisted_decision(e: &crate::decisions::lattice::SizeEntry) -> Value {
    match &e.size {
        crate::decisions::lattice::Dims::Known(atoms) => {
            json!((0..atoms.len())
                .filter(|&i| e.is_size_dynamic(i))
                .collect::<Vec<_>>())
        }
        crate::decisions::lattice::Dims::Dynamic if e.is_scalar_dynamic() => json!("all"),
        _ => json!([]),
    }
}

/// Joins `local` with every rank's profile over `channel` (one exchange
/// under compile key `"ccol.profile"`), so every rank can save the same
/// profile even for keys only some ranks compiled.
///
/// Cost: one exchange (the digest fast path when every rank already holds
/// the same profile).
///
/// # Errors
/// The channel's errors ([`Error::Timeout`], [`Error::Desync`], …).
pub fn exchange_profile(channel: &mut Channel, local: &Profile) -> Result<Profile, Error> {
    Ok(channel.exchange("ccol.profile", local)?.into_merged())
}

/// Why a profile could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// A file-system operation failed.
    #[error("profile {}: cannot {op}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done, e.g. `"rename the temp file over"`.
        op: &'static str,
        /// The system's error (its text is part of this error's message,
        /// so it is not also this error's `source()`).
        error: std::io::Error,
    },
    /// The profile file exists but does not decode. Saving refuses to
    /// overwrite it: move it aside (`ccol profile show` says what is wrong).
    #[error("profile {}: corrupt: {reason}; move it aside to start a new profile", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong (part of this error's message).
        reason: DecodeError,
    },
    /// Another process held the lock for longer than the timeout.
    #[error("profile {}: lock still held by another process after {} ms", path.display(), waited.as_millis())]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long this process waited.
        waited: Duration,
    },
    /// A job id or directory that cannot name a store.
    #[error("profile: {0}")]
    InvalidArgument(String),
}

fn io_err<'a>(
    path: &'a Path,
    op: &'static str,
) -> impl FnOnce(std::io::Error) -> ProfileError + 'a {
    move |error| ProfileError::Io {
        path: path.to_owned(),
        op,
        error,
    }
}

/// Reads and decodes a profile file; a missing file is an empty profile.
///
/// # Errors
/// [`ProfileError::Io`] when the file cannot be read or is not a regular
/// file (a FIFO would block), [`ProfileError::Corrupt`]
/// when it does not decode (files over the limit are refused before reading).
pub fn read_profile(path: &Path, limits: &ProfileLimits) -> Result<Profile, ProfileError> {
    // Opening a FIFO would block until some process writes it: refuse
    // anything but a regular file (or a link to one) before opening.
    match fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            return Err(io_err(path, "read")(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )))
        }
        _ => {}
    }
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Profile::new()),
        Err(e) => return Err(io_err(path, "open")(e)),
    };
    let len = file.metadata().map_err(io_err(path, "stat"))?.len();
    let max = (limits.max_body_bytes + PROFILE_HEADER_LEN) as u64;
    if len > max {
        return Err(ProfileError::Corrupt {
            path: path.to_owned(),
            reason: DecodeError::TooLarge {
                field: "profile file",
                len,
                limit: max,
            },
        });
    }
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, max + 1), &mut bytes)
        .map_err(io_err(path, "read"))?;
    Profile::decode(&bytes, limits).map_err(|reason| ProfileError::Corrupt {
        path: path.to_owned(),
        reason,
    })
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `profile` to `path` atomically: a temp file in the same directory,
/// fsync, rename over `path`, fsync the directory. Takes no lock (see
/// [`ProfileStore::save`] for concurrent writers).
///
/// # Errors
/// [`ProfileError::Io`] naming the step that failed; the temp file is removed.
pub fn write_profile_atomic(path: &Path, profile: &Profile) -> Result<(), ProfileError> {
    let bytes = profile
        .encode()
        .map_err(|e| ProfileError::InvalidArgument(e.to_string()))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        "{TEMP_PREFIX}{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_err(&tmp, "create the temp file"))?;
        f.write_all(&bytes)
            .map_err(io_err(&tmp, "write the temp file"))?;
        f.sync_all().map_err(io_err(&tmp, "fsync the temp file"))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io_err(path, "rename the temp file over"))?;
        sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn sync_dir(dir: &Path) -> Result<(), ProfileError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(dir, "fsync the directory"))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The profile of one job: a directory holding `profile.ccol` and its lock
/// (see the module docs for the files and the save protocol).
#[derive(Clone, Debug)]
pub struct ProfileStore {
    dir: PathBuf,
    lock_timeout: Duration,
    limits: ProfileLimits,
}

impl ProfileStore {
    /// The store in directory `dir` (created if missing, with its parents).
    ///
    /// # Errors
    /// [`ProfileError::Io`] if the directory cannot be created.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, ProfileError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(io_err(&dir, "create the directory"))?;
        Ok(ProfileStore {
            dir,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            limits: ProfileLimits::default(),
        })
    }

    /// The store of job `job_id` under `root`: `<root>/<job_id>`.
    ///
    /// # Errors
    /// [`ProfileError::InvalidArgument`] unless `job_id` is 1–200 characters
    /// of `[A-Za-z0-9._-]` and not `.` or `..`; [`ProfileError::Io`] as [`ProfileStore::open`].
    pub fn for_job(root: &Path, job_id: &str) -> Result<Self, ProfileError> {
        let ok = !job_id.is_empty()
            && job_id.len() <= 200
            && job_id != "."
            && job_id != ".."
            && job_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !ok {
            return Err(ProfileError::InvalidArgument(format!(
                "job id '{job_id}' must be 1-200 characters of A-Z a-z 0-9 . _ - (and not . or ..)"
            )));
        }
        Self::open(root.join(job_id))
    }

    /// The store named by the environment: `CCOL_PROFILE_DIR/<job id>`, the
    /// job id from `CCOL_JOB_ID`, else torchrun's `TORCHELASTIC_RUN_ID`.
    /// `Ok(None)` when `CCOL_PROFILE_DIR` is unset or empty (profiles off).
    /// An empty variable counts as unset, as for `CCOL_TRACE_DIR`.
    ///
    /// # Errors
    /// [`ProfileError::InvalidArgument`] when the directory is set but no job
    /// id is, or the job id is unusable; [`ProfileError::Io`] as [`ProfileStore::open`].
    pub fn from_env() -> Result<Option<Self>, ProfileError> {
        let Some(root) = std::env::var_os(PROFILE_DIR_ENV).filter(|r| !r.is_empty()) else {
            return Ok(None);
        };
        let set = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let job = set(JOB_ID_ENV)
            .or_else(|| set(TORCHELASTIC_RUN_ID_ENV))
            .ok_or_else(|| {
                ProfileError::InvalidArgument(format!(
                    "{PROFILE_DIR_ENV} is set but neither {JOB_ID_ENV} nor {TORCHELASTIC_RUN_ID_ENV} names the job"
                ))
            })?;
        Self::for_job(Path::new(&root), &job).map(Some)
    }

    /// With another lock wait (default [`DEFAULT_LOCK_TIMEOUT`]).
    #[must_use]
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// With other decode limits.
    #[must_use]
    pub fn with_limits(mut self, limits: ProfileLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The profile file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(PROFILE_FILE)
    }

    /// How long a save waits for the lock.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// Reads the profile (empty when no file exists yet). Takes no lock: the
    /// file is only ever replaced by rename, so a reader sees a whole file.
    ///
    /// # Errors
    /// As [`read_profile`].
    pub fn load(&self) -> Result<Profile, ProfileError> {
        read_profile(&self.path(), &self.limits)
    }

    /// Joins `profile` into the stored one under the lock and writes the
    /// result atomically; returns what was written.
    ///
    /// Cost: one lock, one read, one write of the whole file, two fsyncs.
    ///
    /// # Errors
    /// [`ProfileError::LockTimeout`] after [`ProfileStore::lock_timeout`];
    /// [`ProfileError::Corrupt`] when the stored file does not decode (it is
    /// left as it is); [`ProfileError::InvalidArgument`] when the join is
    /// over the store's [`ProfileLimits`] (nothing is written);
    /// [`ProfileError::Io`] naming the failed step.
    pub fn save(&self, profile: &Profile) -> Result<Profile, ProfileError> {
        let _lock = self.lock()?;
        self.remove_stale_temp_files();
        let mut merged = self.load()?;
        let before = merged.clone();
        merged.join(profile);
        if merged != before || !self.path().exists() {
            self.check_limits(&merged)?;
            write_profile_atomic(&self.path(), &merged)?;
        }
        Ok(merged)
    }

    /// The shapes state persisted for compile key `key` (to start a
    /// [`crate::cache::CompileCache`] from, with `with_state`).
    ///
    /// # Errors
    /// As [`ProfileStore::load`].
    pub fn load_shapes(&self, key: &str) -> Result<Option<FrameState>, ProfileError> {
        Ok(self.load()?.shapes(key).cloned())
    }

    /// Saves `state` as the shapes entry of compile key `key` (joined with
    /// what is stored, as [`ProfileStore::save`]).
    ///
    /// # Errors
    /// As [`ProfileStore::save`].
    pub fn save_shapes(&self, key: &str, state: &FrameState) -> Result<(), ProfileError> {
        let mut p = Profile::new();
        p.record_shapes(key, state);
        self.save(&p).map(|_| ())
    }

    /// Replaces the stored profile with exactly `profile` (no join), under
    /// the lock and atomically, as [`ProfileStore::save`] writes.
    ///
    /// # Errors
    /// [`ProfileError::InvalidArgument`] when `profile` is over the store's
    /// limits; [`ProfileError::LockTimeout`]; [`ProfileError::Io`] naming the failed step.
    pub fn replace(&self, profile: &Profile) -> Result<(), ProfileError> {
        self.check_limits(profile)?;
        let _lock = self.lock()?;
        self.remove_stale_temp_files();
        write_profile_atomic(&self.path(), profile)
    }

    /// Refuses a profile that [`ProfileStore::load`] would refuse: writing
    /// it would leave a file no later load or save can read.
    fn check_limits(&self, profile: &Profile) -> Result<(), ProfileError> {
        let body = profile
            .encode()
            .map_err(|e| ProfileError::InvalidArgument(e.to_string()))?
            .len()
            - PROFILE_HEADER_LEN;
        if profile.len() > self.limits.max_entries || body > self.limits.max_body_bytes {
            return Err(ProfileError::InvalidArgument(format!(
                "{}: {} entries in {body} bytes, over the limits of {} entries and {} bytes; \
                 not written (the file would not load)",
                self.path().display(),
                profile.len(),
                self.limits.max_entries,
                self.limits.max_body_bytes
            )));
        }
        Ok(())
    }

    fn lock(&self) -> Result<LockGuard, ProfileError> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path, "open the lock file"))?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match fs4::FileExt::try_lock(&file) {
                Ok(()) => return Ok(LockGuard(file)),
                Err(fs4::TryLockError::WouldBlock) => {}
                Err(fs4::TryLockError::Error(e)) => return Err(io_err(&path, "lock")(e)),
            }
            let waited = start.elapsed();
            if waited >= self.lock_timeout {
                return Err(ProfileError::LockTimeout { path, waited });
            }
            std::thread::sleep(pause.min(self.lock_timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Removes temp files of writers that died mid-save. Called with the
    /// lock held, when no live writer has one.
    fn remove_stale_temp_files(&self) {
        let Ok(listing) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in listing.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                if let Err(e) = fs::remove_file(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "profile: cannot remove a stale temp file");
                }
            }
        }
    }
}

/// Holds the lock; closing the file releases it (also when the process dies).
#[derive(Debug)]
struct LockGuard(File);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = fs4::FileExt::unlock(&self.0);
    }
}
