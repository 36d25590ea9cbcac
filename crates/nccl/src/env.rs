//! A process group from the environment torchrun (and `ccol run`) sets.
//!
//! Read: torchrun's variables through core's [`RunEnv`] (`RANK`,
//! `WORLD_SIZE` required; `LOCAL_RANK` the device, default 0;
//! `LOCAL_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT`,
//! `MASTER_PORT`), `CCOL_TIMEOUT_S` (bootstrap deadline, default 300 s), and
//! [`STORE_ENV`] (`CCOL_NCCL_STORE`): a directory every rank sees, used as a
//! [`FileStore`](crate::FileStore). Unset on one node under torchrun, it is
//! `$TMPDIR/ccol-nccl-<launch id>` ([`RunEnv::launch_id`]:
//! `<run id>-<master port>-<restart count>`, made a safe name), except for
//! torchrun's default run id `none`, which is the same at every launch (an
//! error: an earlier launch's unique id would be found there). The
//! directory must not hold an earlier launch's keys.

use crate::transport::{NcclOptions, NcclTransport};
use crate::{FileStore, NcclError};
use compiler_collectives_core::protocol::timeout_from_env;
use compiler_collectives_core::{launch::runenv, Error, RunEnv};
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

impl EnvConfig {
    /// Reads the configuration from the environment: torchrun's variables
    /// through [`RunEnv::from_env`], then [`STORE_ENV`] (module docs).
    ///
    /// # Errors
    /// [`NcclError::Env`] naming the missing or malformed variable
    /// ([`RunEnv::from_vars`]); with no [`STORE_ENV`], no default directory
    /// ([`RunEnv::local_store_dir`]: no run id, torchrun's default `none`, or
    /// ranks on several nodes).
    pub fn read() -> Result<Self, NcclError> {
        let env = RunEnv::from_env().map_err(env_error)?;
        let store_dir = match std::env::var(STORE_ENV).ok().filter(|v| !v.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => env
                .local_store_dir(
                    &std::env::temp_dir(),
                    "nccl",
                    &format!("set {STORE_ENV} to a fresh directory every rank can see"),
                )
                .map_err(env_error)?,
        };
        Ok(EnvConfig {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank as usize,
            store_dir,
            prefix: format!("ccol/nccl/{}", env.key_prefix()),
        })
    }
}

fn env_error(e: Error) -> NcclError {
    NcclError::Env(runenv::error_text(e))
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
