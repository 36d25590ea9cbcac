//! A process group from the environment torchrun (and `ccol run`) sets.
//!
//! Read: torchrun's variables through core's [`RunEnv`] (`RANK`,
//! `WORLD_SIZE` required; `LOCAL_RANK` the device, default 0;
//! `LOCAL_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`, `TORCHELASTIC_RESTART_COUNT`,
//! `MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE`),
//! `CCOL_TIMEOUT_S` (bootstrap deadline, default 300 s), and where ranks
//! exchange the unique id and keep their post-mortem keys ([`NcclStore`]),
//! first that applies:
//! 1. [`STORE_ENV`] (`CCOL_NCCL_STORE`): a directory every rank sees, used
//!    as a [`FileStore`](crate::FileStore);
//! 2. `MASTER_ADDR` and `MASTER_PORT`: the job's TCPStore — torchrun's agent
//!    store when `TORCHELASTIC_USE_AGENT_STORE=True`, else one rank 0
//!    serves ([`JobStore`]), which then stays up at shutdown until every
//!    other rank wrote its departure key (or
//!    [`DRAIN_LIMIT`](compiler_collectives_core::transport::toolkit::DRAIN_LIMIT)
//!    passed); one node or many;
//! 3. `$TMPDIR/ccol-nccl-<launch id>` ([`RunEnv::launch_id`]:
//!    `<run id>-<master port>-<restart count>`, made a safe name) on one
//!    node, except for torchrun's default run id `none`, which is the same
//!    at every launch (an error: an earlier launch's unique id would be
//!    found there). The directory must not hold an earlier launch's keys.
//!
//! Keys live under `ccol/<run id>/<restart count>/nccl`.

use crate::transport::{NcclOptions, NcclTransport};
use crate::{FileStore, NcclError};
use compiler_collectives_core::launch::runenv::StoreChoice;
use compiler_collectives_core::protocol::{timeout_from_env, DEFAULT_TIMEOUT};
use compiler_collectives_core::transport::toolkit::{departure_key, DRAIN_LIMIT};
use compiler_collectives_core::{launch::runenv, Deadline, Error, RunEnv, Store};
use compiler_collectives_tcpstore::JobStore;
use std::path::PathBuf;
use std::sync::Arc;

/// The variable naming the rendezvous directory.
pub const STORE_ENV: &str = "CCOL_NCCL_STORE";

/// Where the ranks of [`from_env`] meet (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NcclStore {
    /// A directory every rank sees ([`STORE_ENV`], or derived from the
    /// launch id on one node).
    Dir(PathBuf),
    /// The job's TCPStore at `MASTER_ADDR:MASTER_PORT`; `serve`: this rank
    /// (0) serves it, no agent does.
    Tcp {
        /// `MASTER_ADDR`.
        host: String,
        /// `MASTER_PORT`.
        port: u16,
        /// Whether this rank serves it.
        serve: bool,
    },
}

/// What [`from_env`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfig {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub world_size: u32,
    /// `LOCAL_RANK` (the CUDA device ordinal).
    pub local_rank: usize,
    /// Where the ranks meet.
    pub store: NcclStore,
    /// Key prefix of the group: `ccol/<run id>/<restart count>/nccl`.
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
        let named = std::env::var(STORE_ENV).ok();
        let forms = "a fresh directory every rank can see";
        let store = match env
            .store_choice(named, STORE_ENV, "nccl", forms)
            .map_err(env_error)?
        {
            StoreChoice::Named(d) => NcclStore::Dir(PathBuf::from(d)),
            StoreChoice::Job(at) => NcclStore::Tcp {
                host: at.host,
                port: at.port,
                serve: at.serve,
            },
            StoreChoice::LocalDir(dir) => NcclStore::Dir(dir),
        };
        Ok(EnvConfig {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank as usize,
            store,
            prefix: format!("ccol/{}/nccl", env.key_prefix()),
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
    let timeout = timeout_from_env()?.unwrap_or(DEFAULT_TIMEOUT);
    let store: Arc<dyn Store> = match &cfg.store {
        NcclStore::Dir(dir) => Arc::new(FileStore::new(dir)?),
        NcclStore::Tcp { host, port, serve } => {
            let mut job = JobStore::open(
                host,
                *port,
                *serve,
                format!("{}/", cfg.prefix),
                Deadline::after(timeout),
            )?;
            // The post-mortem's departure keys (`toolkit::PostMortem`).
            let left = (0..cfg.world_size)
                .filter(|&r| r != cfg.rank)
                .map(|r| format!("{}/{}", cfg.prefix, departure_key(r)))
                .collect();
            job.linger_on_drop(left, DRAIN_LIMIT);
            Arc::new(job)
        }
    };
    let options = NcclOptions::default()
        .with_device(cfg.local_rank)
        .with_connect_timeout(timeout)
        .with_prefix(cfg.prefix);
    NcclTransport::connect(store, cfg.rank, cfg.world_size, &options)
}
