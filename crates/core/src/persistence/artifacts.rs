//! A persistent artifact cache and cache-hit agreement (docs/semantics.md,
//! Other decision kinds).
//!
//! Compilers keep compiled artifacts on disk between runs (PyTorch's FX graph
//! and AOTAutograd caches): a later run that finds the artifact skips the
//! backend compile. In a multi-rank job that is a trap. Compiling may itself
//! run collectives — distributed autotuning ([`crate::decisions::autotune`]), partitioner
//! agreement — so a rank whose cache is warm skips them while a rank whose
//! cache is cold (another node, a fresh container) enters them and waits for
//! peers that never come: it fails at the deadline ([`Error::Timeout`] naming
//! the warm rank, or [`Error::PeerLost`] once that rank shuts down), or, if
//! the warm rank has reached its next exchange meanwhile, both get
//! [`Error::Desync`]. Without deadlines (PyTorch) the job hangs.
//!
//! **Cache-hit agreement** fixes it with one [`AllVote`]: after the decisions
//! are made and the artifact key is known, every rank looks in its own store
//! and votes whether it hit; a hit is kept only if every rank hit, otherwise
//! every rank compiles (and so every rank takes part in the compile's
//! exchanges). [`CompileCache::call_persistent`] does this when
//! [`CacheOptions::cache_hit_agreement`](crate::cache::CacheOptions::cache_hit_agreement)
//! is on (the default) and a channel is given.
//!
//! [`DiskArtifacts`] is the on-disk store: one file per artifact key in a
//! directory, written atomically (a temporary file in the same directory,
//! renamed into place), so a reader never sees a half-written artifact.
//! Unreadable, corrupt or foreign files count as misses; a failed write is a
//! warning (the artifact is in memory already). Any other store (a remote
//! cache) implements [`ArtifactStore`].
//!
//! ```
//! use compiler_collectives_core::persistence::artifacts::{ArtifactOrigin, DiskArtifacts};
//! use compiler_collectives_core::cache::{CacheOptions, CompileCache};
//! use compiler_collectives_core::decisions::shapes::Observation;
//! use compiler_collectives_core::{Channel, InProcessGroup, Transport};
//!
//! // Rank 0's disk cache is warm from an earlier run, rank 1's is cold.
//! let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
//! let inputs = [("x".to_string(), Observation::tensor([8, 16]))].into_iter().collect();
//! {
//!     let mut alone = CacheOptions::default();
//!     alone.collectives = false;                               // a run of one rank
//!     let mut earlier: CompileCache<String> = CompileCache::new("step", alone);
//!     let store = DiskArtifacts::open(dirs[0].path()).unwrap();
//!     earlier.call_persistent(&inputs, None, &store, |_, _| Ok("kernel".to_string()))?;
//! }
//! let ranks = InProcessGroup::create(2)?;
//! let handles: Vec<_> = ranks.into_iter().map(|t| {
//!     let (dir, inputs) = (dirs[t.rank() as usize].path().to_owned(), inputs.clone());
//!     std::thread::spawn(move || {
//!         let store = DiskArtifacts::open(dir).unwrap();
//!         let mut channel = Channel::new(std::sync::Arc::new(t))?;
//!         let mut cache: CompileCache<String> = CompileCache::new("step", CacheOptions::default());
//!         let call = cache.call_persistent(&inputs, Some(&mut channel), &store, |_, _| {
//!             Ok("kernel".to_string())   // a real compile would autotune on the channel here
//!         })?;
//!         Ok::<_, compiler_collectives_core::Error>(call.origin)
//!     })
//! }).collect();
//! let origins: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<_, _>>()?;
//! // Rank 0 hit but rank 1 did not: both compile.
//! assert_eq!(origins, [Some(ArtifactOrigin::Compiled { local_hit: true }),
//!                      Some(ArtifactOrigin::Compiled { local_hit: false })]);
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

use crate::cache::{CompileCache, CompiledFrame, Inputs, Outcome};
use crate::decisions::votes::AllVote;
use crate::error::{Error, Result};
use crate::protocol::Channel;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

/// Where compiled artifacts persist between runs: bytes by artifact key.
pub trait ArtifactStore: Debug {
    /// The artifact stored under `key`, `None` when there is none.
    ///
    /// # Errors
    /// An I/O error; callers treat it as a miss.
    fn load(&self, key: &str) -> std::io::Result<Option<Vec<u8>>>;

    /// Stores `bytes` under `key`, replacing any artifact there.
    ///
    /// # Errors
    /// An I/O error; callers warn and go on.
    fn store(&self, key: &str, bytes: &[u8]) -> std::io::Result<()>;
}

/// First bytes of every artifact file.
const MAGIC: &[u8; 8] = b"CCOLART1";

/// Name prefix of the temporary file a store writes before renaming it.
const TEMP_PREFIX: &str = ".ccol-artifact-tmp-";

/// A temporary file untouched for this long belongs to a killed writer.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files of writers killed mid-write (older than
/// [`STALE_TEMP_AGE`], so a live writer's file is left alone). Best effort.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX)
            && entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_TEMP_AGE);
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// An artifact store in a directory: one file per key, named by the key's
/// 128-bit xxh3 hash (`<32 hex digits>.ccol`), holding a magic, the key (so a
/// hash collision or a foreign file reads as a miss) and the bytes.
#[derive(Debug, Clone)]
pub struct DiskArtifacts {
    dir: PathBuf,
    max_bytes: u64,
}

impl DiskArtifacts {
    /// The default largest artifact read back: 1 GiB.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

    /// Opens (creating it if needed) the store in `dir`, and removes the
    /// temporary files of writers killed mid-write (those untouched for
    /// [`STALE_TEMP_AGE`]).
    ///
    /// # Errors
    /// The I/O error of creating the directory.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        remove_stale_temp_files(&dir);
        Ok(DiskArtifacts {
            dir,
            max_bytes: Self::DEFAULT_MAX_BYTES,
        })
    }

    /// Sets the largest artifact file read back, in bytes; larger files are
    /// misses.
    #[must_use]
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that holds `key`'s artifact.
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.dir.join(format!(
            "{:032x}.ccol",
            xxhash_rust::xxh3::xxh3_128(key.as_bytes())
        ))
    }
}

impl ArtifactStore for DiskArtifacts {
    fn load(&self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        let path = self.path_of(key);
        // Opening a FIFO would block until some process writes it.
        match std::fs::metadata(&path) {
            Ok(m) if !m.is_file() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} is not a regular file", path.display()),
                ))
            }
            _ => {}
        }
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut data = Vec::new();
        file.take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut data)?;
        if data.len() as u64 > self.max_bytes {
            tracing::warn!(path = %path.display(), limit = self.max_bytes,
                "artifact file over the size limit: a miss");
            return Ok(None);
        }
        let header = MAGIC.len() + 4;
        let ok = data.len() >= header && data[..MAGIC.len()] == MAGIC[..];
        let key_len = ok
            .then(|| data[MAGIC.len()..header].try_into().ok())
            .flatten()
            .map(|b: [u8; 4]| u32::from_le_bytes(b) as usize);
        match key_len {
            Some(n) if data.len() >= header + n && &data[header..header + n] == key.as_bytes() => {
                Ok(Some(data.split_off(header + n)))
            }
            _ => {
                tracing::warn!(path = %path.display(), "artifact file is corrupt or holds another key: a miss");
                Ok(None)
            }
        }
    }

    fn store(&self, key: &str, bytes: &[u8]) -> std::io::Result<()> {
        let key_len = u32::try_from(key.len()).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "artifact key over 4 GiB")
        })?;
        let total = (MAGIC.len() + 4 + key.len()) as u64 + bytes.len() as u64;
        if total > self.max_bytes {
            // It would never be read back: a miss, then a rewrite, every run.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "artifact file of {total} bytes is over this store's limit of {} bytes \
                     (DiskArtifacts::with_max_bytes)",
                    self.max_bytes
                ),
            ));
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&self.dir)?;
        tmp.write_all(MAGIC)?;
        tmp.write_all(&key_len.to_le_bytes())?;
        tmp.write_all(key.as_bytes())?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(self.path_of(key)).map_err(|e| e.error)?;
        Ok(())
    }
}

/// The key of the artifact a compile produces: a 128-bit hash (32 hex
/// digits) of this library's version, the compile key and the entry's guards
/// and decisions — what the compiled code depends on.
pub fn artifact_key(compile_key: &str, frame: &CompiledFrame) -> String {
    let text = format!(
        "{}\0{compile_key}\0{:?}\0{:?}",
        env!("CARGO_PKG_VERSION"),
        frame.guards,
        frame.decisions
    );
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(text.as_bytes()))
}

/// Where the artifact of a compile came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArtifactOrigin {
    /// Loaded from the store (every rank hit, or no agreement was taken).
    Loaded,
    /// Compiled by the callback; `local_hit` says whether this rank's store
    /// held it (a hit dropped because another rank missed).
    Compiled {
        /// Whether this rank's store held the artifact.
        local_hit: bool,
    },
}

/// What one [`CompileCache::call_persistent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistentCall {
    /// The call's outcome, as [`CompileCache::call`]'s.
    pub outcome: Outcome,
    /// For [`Outcome::Compiled`]: where the artifact came from.
    pub origin: Option<ArtifactOrigin>,
}

impl<A: Serialize + DeserializeOwned> CompileCache<A> {
    /// [`CompileCache::call`] through a persistent artifact store: on a guard
    /// miss the decisions are made as usual (one exchange with collectives
    /// on), then the artifact is looked up in `store` under
    /// [`artifact_key`]. With
    /// [`cache_hit_agreement`](crate::cache::CacheOptions::cache_hit_agreement)
    /// on and a channel given, the ranks vote ([`AllVote`]) and keep their
    /// hits only if every rank hit; otherwise (or on a local miss) `compile`
    /// runs — receiving the channel, so it may run collectives of its own —
    /// and its artifact is stored.
    ///
    /// The agreement setting is part of the configuration every rank must
    /// share (a rank that votes and one that does not would fall out of step).
    ///
    /// Cost: [`CompileCache::call`]'s, plus per compile one exchange of an
    /// [`AllVote`] when agreeing, one store lookup and, when compiling, one
    /// store write.
    ///
    /// # Errors
    /// As [`CompileCache::call`], and `compile`'s errors. Store failures are
    /// misses (load) or warnings (store), never errors.
    pub fn call_persistent<F>(
        &mut self,
        inputs: &Inputs,
        channel: Option<&mut Channel>,
        store: &dyn ArtifactStore,
        compile: F,
    ) -> Result<PersistentCall>
    where
        F: FnOnce(&CompiledFrame, Option<&mut Channel>) -> Result<A>,
    {
        let agree = self.options().cache_hit_agreement;
        let extra = if agree {
            " artifacts=agree"
        } else {
            " artifacts=local"
        };
        let config = self.options().config_text() + extra;
        let key = self.key().to_owned();
        let mut origin = None;
        let outcome = self.call_inner(inputs, channel, extra, |frame, mut channel| {
            let akey = artifact_key(&key, frame);
            let local: Option<A> = match store.load(&akey) {
                Ok(Some(bytes)) => match postcard::from_bytes(&bytes) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        tracing::warn!(key = %key, artifact = %akey, error = %e,
                            "stored artifact does not decode: a miss");
                        None
                    }
                },
                Ok(None) => None,
                Err(e) => {
                    tracing::warn!(key = %key, artifact = %akey, error = %e,
                        "artifact store unreadable: a miss");
                    None
                }
            };
            let local_hit = local.is_some();
            let keep = match (agree, channel.as_deref_mut()) {
                (true, Some(ch)) => ch
                    .exchange_with(
                        &key,
                        &AllVote(local_hit),
                        &crate::ExchangeOptions::default().with_config(&config),
                    )?
                    .all(),
                _ => local_hit,
            };
            if let (true, Some(artifact)) = (keep, local) {
                origin = Some(ArtifactOrigin::Loaded);
                return Ok(artifact);
            }
            let artifact = compile(frame, channel)?;
            match postcard::to_allocvec(&artifact) {
                Ok(bytes) => {
                    if let Err(e) = store.store(&akey, &bytes) {
                        tracing::warn!(key = %key, artifact = %akey, error = %e,
                            "cannot store the artifact");
                    }
                }
                Err(e) => {
                    return Err(Error::InvalidArgument(format!(
                        "cannot encode the artifact of '{key}': {e}"
                    )))
                }
            }
            origin = Some(ArtifactOrigin::Compiled { local_hit });
            Ok(artifact)
        })?;
        Ok(PersistentCall { outcome, origin })
    }
}
