//! Where profiles live and how they are saved: [`ProfileStore`] (one
//! directory per job, the lock, the save protocol of the [module
//! documentation](super)), [`read_profile`], [`write_profile_atomic`] and
//! [`ProfileError`].

use super::{Profile, ProfileLimits, PROFILE_HEADER_LEN};
use crate::decisions::shapes::FrameState;
use crate::error::DecodeError;
use crate::protocol::join::Join;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
/// (see the [module docs](super) for the files and the save protocol).
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
