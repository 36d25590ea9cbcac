//! [`from_env`]: a [`C10dTransport`] from torchrun's environment.

use crate::error::timed;
use crate::group::C10dProcessGroup;
use crate::store::{C10dStore, TcpStoreOptions};
use crate::transport::C10dTransport;
use compiler_collectives_core::{Error, RunEnv};
use std::time::Duration;

/// A job's ranks as torchrun started them: this rank, the world, the
/// TCPStore every group rendezvouses through, the address peers reach this
/// rank at, and the deadline. One job holds any number of process groups,
/// each under a name of its own in the store, so compile exchanges get a
/// communicator of their own (docs/torch-compile.md: a dedicated communicator) beside
/// the training's gradient all-reduces:
///
/// ```no_run
/// # fn main() -> compiler_collectives_core::Result<()> {
/// let job = compiler_collectives_tch::C10dJob::from_env()?;
/// let grads = job.group("grads")?;        // the training's all-reduces
/// let compile = job.transport("ccol")?;   // compiler collectives only
/// # let _ = (grads, compile); Ok(()) }
/// ```
#[derive(Debug)]
pub struct C10dJob {
    rank: u32,
    world: u32,
    host: String,
    timeout: Duration,
    /// The store under this launch's prefix (`ccol/<run id>/<restart>`).
    store: C10dStore,
}

impl C10dJob {
    /// Reads torchrun's variables through [`RunEnv::from_env`]: `RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR` (default `127.0.0.1`), `MASTER_PORT`
    /// (required here), `TORCHELASTIC_USE_AGENT_STORE` (when `True`,
    /// torchrun's agent already serves the TCPStore and rank 0 is only a
    /// client), `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT` (the
    /// store prefix [`RunEnv::key_prefix`], so a restarted job never reads an
    /// earlier attempt's keys; the TCPStore is served afresh at every launch,
    /// so torchrun's default run id `none` is fine here), and
    /// `CCOL_TIMEOUT_S` (default 300 s), and joins the TCPStore.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming a missing or malformed variable
    /// ([`RunEnv::from_vars`], or `MASTER_PORT` unset); the store's errors.
    pub fn from_env() -> compiler_collectives_core::Result<Self> {
        let env = RunEnv::from_env()?;
        let (rank, world) = (env.rank, env.world_size);
        let port = env.master_port.ok_or_else(|| {
            Error::InvalidArgument(
                "MASTER_PORT is not set: start the ranks with `ccol run` or `torchrun`".into(),
            )
        })?;
        let agent = env.use_agent_store;
        let addr = env.master_addr.clone();
        let timeout = compiler_collectives_core::protocol::timeout_from_env()?
            .unwrap_or(compiler_collectives_core::protocol::DEFAULT_TIMEOUT);
        // Rank 0 serves unless torchrun's agent does; every store counts itself
        // in (as Python's init_process_group) unless the agent's store is used.
        let opts = if rank == 0 && !agent {
            TcpStoreOptions::server(addr.as_str(), port, world)
        } else {
            TcpStoreOptions::client(addr.as_str(), port, world)
        };
        let opts = opts.with_wait_workers(!agent).with_timeout(timeout);
        let store = timed(|| C10dStore::tcp(&opts))?;
        let scoped = timed(|| store.prefixed(&format!("ccol/{}", env.key_prefix())))?;
        let host = if addr == "localhost" || addr.starts_with("127.") {
            "127.0.0.1".to_string()
        } else {
            addr
        };
        Ok(C10dJob {
            rank,
            world,
            host,
            timeout,
            store: scoped,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world
    }

    /// A `ProcessGroupGloo` of every rank of the job, rendezvousing under
    /// `name` in the store (every rank must ask for the same names in the
    /// same order of use).
    ///
    /// # Errors
    /// The store's or group's errors.
    pub fn group(&self, name: &str) -> compiler_collectives_core::Result<C10dProcessGroup> {
        self.group_in(&timed(|| self.store.prefixed(name))?)
    }

    /// A [`C10dTransport`] on a process group of its own under `name`, for
    /// compiler collectives.
    ///
    /// # Errors
    /// As [`C10dJob::group`].
    pub fn transport(&self, name: &str) -> compiler_collectives_core::Result<C10dTransport> {
        let store = timed(|| self.store.prefixed(name))?;
        let pg = self.group_in(&store)?;
        Ok(C10dTransport::new(pg, store))
    }

    fn group_in(&self, store: &C10dStore) -> compiler_collectives_core::Result<C10dProcessGroup> {
        timed(|| C10dProcessGroup::gloo(store, self.rank, self.world, &self.host, self.timeout))
    }
}

/// A [`C10dTransport`] from torchrun's environment: [`C10dJob::from_env`],
/// then a group in the launch's store itself (where this function always
/// made it). A program that also runs collectives of its own takes
/// [`C10dJob::group`] and [`C10dJob::transport`] instead, one communicator
/// each.
///
/// # Errors
/// As [`C10dJob::from_env`] and [`C10dJob::transport`].
pub fn from_env() -> compiler_collectives_core::Result<C10dTransport> {
    let job = C10dJob::from_env()?;
    let pg = job.group_in(&job.store)?;
    Ok(C10dTransport::new(pg, job.store))
}
