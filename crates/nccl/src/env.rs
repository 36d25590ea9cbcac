//! A process group from the environment torchrun (and `ccol run`) sets.
//!
//! Read: `RANK`, `WORLD_SIZE` (required), `LOCAL_RANK` (the device; default
//! 0), `LOCAL_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT`,
//! `MASTER_PORT`, `CCOL_TIMEOUT_S` (bootstrap deadline, default 300 s), and
//! [`STORE_ENV`] (`CCOL_NCCL_STORE`): a directory every rank sees, used as a
//! [`FileStore`](crate::FileStore). Unset on one node under torchrun, it is
//! `$TMPDIR/ccol-nccl-<run id>-<master port>-<restart count>`, except for
//! torchrun's default run id `none`, which is the same at every launch (an
//! error: an earlier launch's unique id would be found there). The
//! directory must not hold an earlier launch's keys.

use crate::transport::{NcclOptions, NcclTransport};
use crate::{FileStore, NcclError};
use compiler_collectives_core::protocol::timeout_from_env;
use compiler_collectives_core::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The variable naming the rendezvous directory.
pub const STORE_ENV: &str = "CCOL_NCCL_STORE";

/// What [`from_env`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfig {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub world_size: u32,
    /// `LOCAL_RANK` (the CUDA device ordinal).
    pub local_rank: usize,
    /// The rendezvous directory.
    pub store_dir: PathBuf,
    /// Key prefix of the group (run id and restart count).
    pub prefix: String,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn number(name: &str) -> Result<Option<u32>, NcclError> {
    var(name)
        .map(|v| {
            v.trim()
                .parse::<u32>()
                .map_err(|_| NcclError::Env(format!("{name}={v:?} is not a non-negative integer")))
        })
        .transpose()
}

impl EnvConfig {
    /// Reads the configuration from the environment.
    ///
    /// # Errors
    /// [`NcclError::Env`] naming the missing or malformed variable.
    pub fn read() -> Result<Self, NcclError> {
        let missing = |n: &str| {
            NcclError::Env(format!(
                "{n} is not set: start the ranks with `ccol run` or `torchrun`"
            ))
        };
        let rank = number("RANK")?.ok_or_else(|| missing("RANK"))?;
        let world_size = number("WORLD_SIZE")?.ok_or_else(|| missing("WORLD_SIZE"))?;
        if world_size == 0 || rank >= world_size {
            return Err(NcclError::Env(format!(
                "RANK={rank} is not below WORLD_SIZE={world_size}"
            )));
        }
        let local_rank = number("LOCAL_RANK")?.unwrap_or(0) as usize;
        let local_world = number("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        let run_id = var("TORCHELASTIC_RUN_ID");
        let restart = var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
        let store_dir = match var(STORE_ENV) {
            Some(d) => PathBuf::from(d),
            None => {
                let run_id = run_id.clone().ok_or_else(|| {
                    NcclError::Env(format!(
                        "{STORE_ENV} is not set and there is no TORCHELASTIC_RUN_ID to derive one from: \
                         set {STORE_ENV} to a directory every rank can see"
                    ))
                })?;
                if run_id == "none" {
                    return Err(NcclError::Env(format!(
                        "TORCHELASTIC_RUN_ID is torchrun's default 'none', the same at every launch: \
                         a directory derived from it may hold an earlier launch's unique id; \
                         set {STORE_ENV} to a fresh directory, or start torchrun with --standalone or --rdzv-id"
                    )));
                }
                if local_world != world_size {
                    return Err(NcclError::Env(format!(
                        "ranks span several nodes (LOCAL_WORLD_SIZE={local_world}, WORLD_SIZE={world_size}): \
                         set {STORE_ENV} to a directory on a shared filesystem"
                    )));
                }
                let port = var("MASTER_PORT").unwrap_or_else(|| "0".into());
                let safe: String = format!("{run_id}-{port}-{restart}")
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                std::env::temp_dir().join(format!("ccol-nccl-{safe}"))
            }
        };
        Ok(EnvConfig {
            rank,
            world_size,
            local_rank,
            store_dir,
            prefix: format!(
                "ccol/nccl/{}/{restart}",
                run_id.unwrap_or_else(|| "job".into())
            ),
        })
    }
}

/// An [`NcclTransport`] for this process, from the environment (module docs).
///
/// Cost: as [`NcclTransport::connect`].
///
/// # Errors
/// [`Error::InvalidArgument`] naming a missing or malformed variable; the
/// connect errors (no library, driver or device; timeouts).
pub fn from_env() -> Result<NcclTransport, Error> {
    let cfg = EnvConfig::read()?;
    let timeout = timeout_from_env()?.unwrap_or(Duration::from_secs(300));
    let store = Arc::new(FileStore::new(&cfg.store_dir)?);
    let options = NcclOptions::default()
        .with_device(cfg.local_rank)
        .with_connect_timeout(timeout)
        .with_prefix(cfg.prefix);
    NcclTransport::connect(store, cfg.rank, cfg.world_size, &options)
}
