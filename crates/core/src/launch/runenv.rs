//! [`RunEnv`]: the environment `torchrun` (and `ccol run`) give each rank,
//! parsed once for every backend.
//!
//! The variables, as torch 2.13's `torchrun` sets them for each worker
//! (`torch/distributed/elastic/agent/server/local_elastic_agent.py`,
//! `_start_workers`):
//!
//! | variable | field | unset or empty |
//! |---|---|---|
//! | `RANK` | [`rank`](RunEnv::rank) | an error: required |
//! | `WORLD_SIZE` | [`world_size`](RunEnv::world_size) | an error: required |
//! | `LOCAL_RANK` | [`local_rank`](RunEnv::local_rank) | 0 |
//! | `LOCAL_WORLD_SIZE` | [`local_world_size`](RunEnv::local_world_size) | `WORLD_SIZE` (one node) |
//! | `GROUP_RANK` | [`group_rank`](RunEnv::group_rank) | 0 |
//! | `MASTER_ADDR` | [`master_addr`](RunEnv::master_addr) | `127.0.0.1` |
//! | `MASTER_PORT` | [`master_port`](RunEnv::master_port) | `None` |
//! | `TORCHELASTIC_RUN_ID` | [`run_id`](RunEnv::run_id) | `None` |
//! | `TORCHELASTIC_RESTART_COUNT` | [`restart_count`](RunEnv::restart_count) | 0 |
//! | `TORCHELASTIC_USE_AGENT_STORE` | [`use_agent_store`](RunEnv::use_agent_store) | `false` |
//! | `TORCHELASTIC_ERROR_FILE` | [`error_file`](RunEnv::error_file) | `None` |
//!
//! An empty variable counts as unset. Numbers are decimal, surrounding
//! whitespace allowed. What a backend reads besides these (`CCOL_GLOO_STORE`,
//! `CCOL_NCCL_STORE`, …) stays in the backend's own `env.rs`.
//!
//! A store that must be fresh at every launch (a FileStore directory,
//! [`RunEnv::local_store_dir`]) is derived from [`RunEnv::launch_id`], which
//! refuses torchrun's default run id `none`: `torchrun` without `--standalone` or `--rdzv-id` passes `none`
//! at every launch, so a directory named after it would hold an earlier
//! launch's keys. Key prefixes in a store that is fresh anyway (a TCPStore a
//! rank serves) or that the user named take [`RunEnv::key_prefix`].
//!
//! ```
//! use compiler_collectives_core::launch::runenv::RunEnv;
//!
//! let vars = [("RANK", "1"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "4f2a"), ("MASTER_PORT", "29500")];
//! let lookup = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
//! let env = RunEnv::from_vars(lookup)?;
//! assert_eq!((env.rank, env.world_size, env.local_world_size), (1, 2, 2));
//! assert_eq!(env.launch_id("set CCOL_NCCL_STORE")?, "4f2a-29500-0");
//! assert_eq!(env.key_prefix(), "4f2a/0");
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The longest name [`dir_safe`] returns, in bytes (a file name may have 255).
pub const MAX_DIR_NAME: usize = 128;

/// This rank's place in the job, from torchrun's variables (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunEnv {
    /// `RANK`: this rank, below [`world_size`](Self::world_size).
    pub rank: u32,
    /// `WORLD_SIZE`: the number of ranks in the job, at least 1.
    pub world_size: u32,
    /// `LOCAL_RANK`: this rank's index on its node (the device ordinal a GPU
    /// backend uses), below [`local_world_size`](Self::local_world_size); 0
    /// when unset.
    pub local_rank: u32,
    /// `LOCAL_WORLD_SIZE`: the ranks on this node, 1 to
    /// [`world_size`](Self::world_size); `WORLD_SIZE` (every rank on one node)
    /// when unset.
    pub local_world_size: u32,
    /// `GROUP_RANK`: the index of this rank's node (torchrun's agent); 0
    /// when unset.
    pub group_rank: u32,
    /// `MASTER_ADDR`: the host of the job's TCPStore; `127.0.0.1` when unset.
    pub master_addr: String,
    /// `MASTER_PORT`: the TCPStore's port; `None` when unset.
    pub master_port: Option<u16>,
    /// `TORCHELASTIC_RUN_ID` as set, unsanitised (torchrun's `--rdzv-id`,
    /// default `none`; a fresh UUID under `--standalone`); `None` when unset.
    pub run_id: Option<String>,
    /// `TORCHELASTIC_RESTART_COUNT`: how often the agent restarted the
    /// workers; 0 when unset.
    pub restart_count: u32,
    /// `TORCHELASTIC_USE_AGENT_STORE` is `True` (any case): torchrun's agent
    /// serves the TCPStore at `MASTER_ADDR:MASTER_PORT`, so rank 0 must not.
    pub use_agent_store: bool,
    /// `TORCHELASTIC_ERROR_FILE`: where a failing rank writes its error
    /// ([`crate::launch::torchelastic`], which reads the variable by itself).
    pub error_file: Option<PathBuf>,
}

fn bad(name: &str, value: &str, why: &str) -> Error {
    Error::InvalidArgument(format!("{name}={value:?} {why}"))
}

/// Where the job's TCPStore is ([`RunEnv::job_store`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStoreAt {
    /// `MASTER_ADDR`.
    pub host: String,
    /// `MASTER_PORT`.
    pub port: u16,
    /// Whether this rank serves it (rank 0, no agent).
    pub serve: bool,
}

/// Where a backend's ranks rendezvous ([`RunEnv::store_choice`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreChoice {
    /// The backend's own variable, as set (a directory, or a URL the
    /// backend understands).
    Named(String),
    /// The job's TCPStore.
    Job(JobStoreAt),
    /// A directory on this node, derived from the launch id.
    LocalDir(PathBuf),
}

impl RunEnv {
    /// Reads torchrun's variables from this process's environment (a value
    /// that is not UTF-8 counts as unset): [`RunEnv::from_vars`] over
    /// [`std::env::var`].
    ///
    /// # Errors
    /// As [`RunEnv::from_vars`].
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads torchrun's variables through `var` (the value of a variable, or
    /// `None`), so tests need not change the process's environment. An
    /// empty value counts as unset.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable (and its value, when
    /// set): `RANK` or `WORLD_SIZE` unset (start the ranks with `ccol run` or
    /// `torchrun`); a number that is not a non-negative 32-bit integer
    /// (`MASTER_PORT`: not a port number); `RANK` not below `WORLD_SIZE`;
    /// `LOCAL_WORLD_SIZE` 0 or above `WORLD_SIZE`; `LOCAL_RANK` not below
    /// `LOCAL_WORLD_SIZE`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let number = |name: &str| -> Result<Option<u32>> {
            get(name)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| bad(name, &v, "is not a non-negative integer"))
                })
                .transpose()
        };
        let required = |name: &str| -> Result<u32> {
            number(name)?.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{name} is not set: start the ranks with `ccol run` or `torchrun`"
                ))
            })
        };
        let rank = required("RANK")?;
        let world_size = required("WORLD_SIZE")?;
        if rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "RANK={rank} is not below WORLD_SIZE={world_size}"
            )));
        }
        let local_world_size = number("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        if local_world_size == 0 || local_world_size > world_size {
            return Err(Error::InvalidArgument(format!(
                "LOCAL_WORLD_SIZE={local_world_size} is not between 1 and WORLD_SIZE={world_size}"
            )));
        }
        let local_rank = number("LOCAL_RANK")?.unwrap_or(0);
        if local_rank >= local_world_size {
            return Err(Error::InvalidArgument(format!(
                "LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}"
            )));
        }
        let master_port = get("MASTER_PORT")
            .map(|v| {
                v.trim()
                    .parse::<u16>()
                    .map_err(|_| bad("MASTER_PORT", &v, "is not a port number (0-65535)"))
            })
            .transpose()?;
        Ok(RunEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            group_rank: number("GROUP_RANK")?.unwrap_or(0),
            master_addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            run_id: get("TORCHELASTIC_RUN_ID"),
            restart_count: number("TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0),
            use_agent_store: get("TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            error_file: get("TORCHELASTIC_ERROR_FILE").map(PathBuf::from),
        })
    }

    /// The job's TCPStore as torchrun's environment names it, `None` when
    /// `MASTER_PORT` is unset: `MASTER_ADDR:MASTER_PORT`, served by this
    /// rank when no agent serves it (`TORCHELASTIC_USE_AGENT_STORE` not
    /// `True`) and this is rank 0 — the rule of `init_process_group`'s
    /// `env://` (`torch/distributed/rendezvous.py`, `_create_c10d_store`),
    /// one for every backend.
    pub fn job_store(&self) -> Option<JobStoreAt> {
        self.master_port.map(|port| JobStoreAt {
            host: self.master_addr.clone(),
            port,
            serve: !self.use_agent_store && self.rank == 0,
        })
    }

    /// Where a backend's ranks rendezvous, the first that applies: `named`
    /// (the value of the backend's own variable `store_env`, e.g.
    /// `CCOL_GLOO_STORE`; `None` or empty: unset), else the job's TCPStore
    /// ([`RunEnv::job_store`]), else a directory on this node derived from
    /// the launch id ([`RunEnv::local_store_dir`] under the system's
    /// temporary directory, for `backend`). One rule for every backend
    /// (docs/environment.md).
    ///
    /// # Errors
    /// As [`RunEnv::local_store_dir`] when neither of the first two applies;
    /// the message tells the user to set `MASTER_ADDR` and `MASTER_PORT`, or
    /// `store_env` to one of `forms` (e.g. `a fresh directory every rank can
    /// see`).
    pub fn store_choice(
        &self,
        named: Option<String>,
        store_env: &str,
        backend: &str,
        forms: &str,
    ) -> Result<StoreChoice> {
        if let Some(v) = named.filter(|v| !v.is_empty()) {
            return Ok(StoreChoice::Named(v));
        }
        if let Some(at) = self.job_store() {
            return Ok(StoreChoice::Job(at));
        }
        let remedy = format!(
            "set MASTER_ADDR and MASTER_PORT (the job's TCPStore), or {store_env} to {forms}"
        );
        self.local_store_dir(&std::env::temp_dir(), backend, &remedy)
            .map(StoreChoice::LocalDir)
    }

    /// Whether every rank of the job runs on this node
    /// (`LOCAL_WORLD_SIZE == WORLD_SIZE`), so a store on the local
    /// filesystem reaches them all.
    pub fn single_node(&self) -> bool {
        self.local_world_size == self.world_size
    }

    /// An id unique to this launch and attempt, safe as a directory name
    /// ([`dir_safe`]): `<run id>-<master port>-<restart count>` (port 0 when
    /// unset), e.g. `4f2a-29500-0`. Backends name a store that must be fresh
    /// at every launch after it (a FileStore directory); `remedy` is what
    /// else the user can do, appended to the error (e.g. `set
    /// CCOL_NCCL_STORE to a fresh directory every rank can see`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `TORCHELASTIC_RUN_ID` is unset, or is
    /// torchrun's default `none` (the same at every launch), naming
    /// torchrun's `--standalone` and `--rdzv-id`, then `remedy`.
    pub fn launch_id(&self, remedy: &str) -> Result<String> {
        let fix = format!(
            "start torchrun with --standalone or --rdzv-id=<an id unique to this launch> \
             (`ccol run` sets a fresh one), or {remedy}"
        );
        match self.run_id.as_deref() {
            None => Err(Error::InvalidArgument(format!(
                "TORCHELASTIC_RUN_ID is not set, so no store can be derived for this launch: {fix}"
            ))),
            Some("none") => Err(Error::InvalidArgument(format!(
                "TORCHELASTIC_RUN_ID is torchrun's default 'none', the same at every launch: \
                 a store derived from it may hold an earlier launch's keys; {fix}"
            ))),
            Some(run) => Ok(dir_safe(&format!(
                "{run}-{}-{}",
                self.master_port.unwrap_or(0),
                self.restart_count
            ))),
        }
    }

    /// The directory `<base>/ccol-<backend>-<launch id>` (`base` usually
    /// [`std::env::temp_dir`]), where a backend keeps the FileStore of a
    /// launch whose user named none, e.g. `/tmp/ccol-nccl-4f2a-29500-0`.
    /// Only for a job on one node ([`RunEnv::single_node`]): ranks on other
    /// nodes would not see it. `remedy` is as for [`RunEnv::launch_id`].
    /// Creates nothing.
    ///
    /// # Errors
    /// [`RunEnv::launch_id`]'s; [`Error::InvalidArgument`] when the ranks
    /// span several nodes (`LOCAL_WORLD_SIZE` below `WORLD_SIZE`), ending
    /// with `remedy`.
    pub fn local_store_dir(&self, base: &Path, backend: &str, remedy: &str) -> Result<PathBuf> {
        let id = self.launch_id(remedy)?;
        if !self.single_node() {
            return Err(Error::InvalidArgument(format!(
                "ranks span several nodes (LOCAL_WORLD_SIZE={}, WORLD_SIZE={}), \
                 so a directory on this node reaches only some of them: {remedy}",
                self.local_world_size, self.world_size
            )));
        }
        Ok(base.join(format!("ccol-{}-{id}", dir_safe(backend))))
    }

    /// `<run id>/<restart count>` (run id `job` when unset), e.g. `4f2a/0`:
    /// the key prefix of a group in a store that is fresh at every launch or
    /// that the user named, so a restarted attempt never reads an earlier
    /// attempt's keys. Not unique across launches under torchrun's default
    /// run id `none` (use [`RunEnv::launch_id`] for that).
    pub fn key_prefix(&self) -> String {
        format!(
            "{}/{}",
            self.run_id.as_deref().unwrap_or("job"),
            self.restart_count
        )
    }
}

/// The text of an error of this module without [`Error`]'s `invalid
/// argument: ` prefix, for a backend whose own error type carries
/// environment errors as text (its `Env` variant, converted back into
/// [`Error::InvalidArgument`]).
pub fn error_text(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        other => other.to_string(),
    }
}

/// `raw` made safe as one directory name, by one rule: every character
/// other than ASCII letters, digits and `-` becomes `_` (so no `/`, `.`,
/// space or non-ASCII character survives, and the name is never `.` or
/// `..`); a result longer than [`MAX_DIR_NAME`] bytes keeps its first 111
/// bytes, then `-` and the 16 hex digits of XXH3-64 over `raw`, so long ids
/// stay distinct. Different ids may meet (`a/b` and `a_b`), which a
/// per-launch run id does not.
///
/// ```
/// use compiler_collectives_core::launch::runenv::dir_safe;
/// assert_eq!(dir_safe("job 7/../x_y"), "job_7____x_y");
/// ```
pub fn dir_safe(raw: &str) -> String {
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.len() <= MAX_DIR_NAME {
        return safe;
    }
    let hash = xxhash_rust::xxh3::xxh3_64(raw.as_bytes());
    // Every character of `safe` is ASCII, so any byte index is a boundary.
    format!("{}-{hash:016x}", &safe[..MAX_DIR_NAME - 17])
}
