//! A process group from the environment torchrun (and `ccol run`) sets.
//!
//! Read: torchrun's variables through core's [`RunEnv`] (`RANK`,
//! `WORLD_SIZE` required; `LOCAL_WORLD_SIZE`, `TORCHELASTIC_RUN_ID`,
//! `TORCHELASTIC_RESTART_COUNT`, `MASTER_PORT` used here), plus:
//! - where ranks rendezvous ([`StoreSpec`]), first that applies:
//!   1. [`STORE_ENV`] (`CCOL_GLOO_STORE`): a directory (Gloo's FileStore;
//!      ranks on one host or a shared filesystem) or `redis://host:port`
//!      (Gloo's RedisStore);
//!   2. `MASTER_ADDR` and `MASTER_PORT`: the job's TCPStore — torchrun's
//!      agent store when `TORCHELASTIC_USE_AGENT_STORE=True` (torchrun,
//!      `ccol run`), else one rank 0 serves there
//!      ([`JobStore`](compiler_collectives_tcpstore::JobStore)); one node or
//!      many, nothing else to run;
//!   3. a FileStore in `$TMPDIR/ccol-gloo-<launch id>`
//!      ([`RunEnv::launch_id`]: `<run id>-<master port>-<restart count>`,
//!      made a safe name): one node only; torchrun's default run id `none`
//!      (the same at every launch) derives none.
//! - `CCOL_GLOO_HOSTNAME`: the address peers connect to for this rank.
//!   Default: over the job's TCPStore, the local address of the connection
//!   to it (the address the store's network reaches this host at; not the
//!   host name, which every network namespace shares); otherwise
//!   [`advertised_hostname`]: `127.0.0.1` when every rank is on this node,
//!   else the local address of the route to `MASTER_ADDR`, else the host
//!   name.
//! - `CCOL_TIMEOUT_S`: the rendezvous deadline (default 300 s).
//!
//! After connecting, ranks pass a barrier and rank 0 deletes a default
//! FileStore directory, so a later job with the same run id never meets stale
//! addresses. A rank whose rendezvous fails (a peer never came, a deadline
//! passed) deletes it too, so a failed job leaves no directory behind either
//! (the last rank to fail removes what the others wrote after the first).

use crate::store::GlooStore;
use crate::transport::{GlooOptions, GlooTransport};
use crate::GlooError;
use compiler_collectives_core::launch::runenv::StoreChoice;
use compiler_collectives_core::protocol::{timeout_from_env, DEFAULT_TIMEOUT};
use compiler_collectives_core::{launch::runenv, Deadline, Error, RunEnv, Transport};
use compiler_collectives_tcpstore::JobStore;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The variable that chooses the rendezvous store: a directory or `redis://host:port`.
pub const STORE_ENV: &str = "CCOL_GLOO_STORE";

/// Where the ranks of [`from_env`] rendezvous (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSpec {
    /// [`STORE_ENV`]: a directory or `redis://host:port`.
    Named(String),
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
    /// The FileStore directory derived from the launch id (deleted after
    /// connecting).
    DefaultDir(PathBuf),
}

/// What [`from_env`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfig {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub world_size: u32,
    /// Where ranks rendezvous.
    pub store: StoreSpec,
    /// The address peers connect to for this rank; `None`: the local
    /// address of the connection to the job's TCPStore.
    pub hostname: Option<String>,
    /// The key prefix of the group: `ccol/<run id>/<restart count>`.
    pub prefix: String,
}

/// A variable of this crate's own, unset when empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl EnvConfig {
    /// Reads the configuration from the environment: torchrun's variables
    /// through [`RunEnv::from_env`], then `CCOL_GLOO_STORE` and
    /// `CCOL_GLOO_HOSTNAME` (module docs).
    ///
    /// # Errors
    /// [`GlooError::Env`] naming the missing or malformed variable
    /// ([`RunEnv::from_vars`]); with no [`STORE_ENV`], no default store
    /// ([`RunEnv::local_store_dir`]: no run id, torchrun's default `none`, or
    /// ranks on several nodes).
    pub fn read() -> Result<Self, GlooError> {
        let env = RunEnv::from_env().map_err(env_error)?;
        let forms = "redis://host:port or to a fresh directory every rank can see";
        let store = match env
            .store_choice(var(STORE_ENV), STORE_ENV, "gloo", forms)
            .map_err(env_error)?
        {
            StoreChoice::Named(s) => StoreSpec::Named(s),
            StoreChoice::Job(at) => StoreSpec::Tcp {
                host: at.host,
                port: at.port,
                serve: at.serve,
            },
            StoreChoice::LocalDir(dir) => StoreSpec::DefaultDir(dir),
        };
        let hostname = match (var("CCOL_GLOO_HOSTNAME"), &store) {
            (Some(h), _) => Some(h),
            (None, StoreSpec::Tcp { .. }) => None,
            (None, _) => Some(advertised_hostname(&env)),
        };
        Ok(EnvConfig {
            rank: env.rank,
            world_size: env.world_size,
            store,
            hostname,
            prefix: format!("ccol/{}", env.key_prefix()),
        })
    }
}

fn env_error(e: Error) -> GlooError {
    GlooError::Env(runenv::error_text(e))
}

/// The address peers connect to for this rank, where no connection to the
/// job's TCPStore says it: `CCOL_GLOO_HOSTNAME`; else `127.0.0.1` when every
/// rank is on this node ([`RunEnv::single_node`]) or `MASTER_ADDR` is a
/// loopback name; else the local address of the route to `MASTER_ADDR`
/// (a UDP socket's connect picks the route; no packet is sent); else the
/// host name; else `127.0.0.1`. The Python package's channel takes this.
pub fn advertised_hostname(env: &RunEnv) -> String {
    if let Some(h) = var("CCOL_GLOO_HOSTNAME") {
        return h;
    }
    let loopback = ["", "localhost", "127.0.0.1", "::1"].contains(&env.master_addr.as_str());
    if env.single_node() || loopback {
        return "127.0.0.1".into();
    }
    route_to(&env.master_addr, env.master_port.unwrap_or(29500))
        .or_else(hostname)
        .unwrap_or_else(|| "127.0.0.1".into())
}

/// The local address of the route to `host:port`, if there is one.
fn route_to(host: &str, port: u16) -> Option<String> {
    let socket = std::net::UdpSocket::bind(("0.0.0.0", 0)).ok()?;
    socket.connect((host, port)).ok()?;
    Some(socket.local_addr().ok()?.ip().to_string())
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Opens the store a spec names: `redis://host[:port]` or a directory.
///
/// # Errors
/// [`GlooError`] for a malformed spec or an unreachable store.
pub fn store_from_env(spec: &str) -> Result<GlooStore, GlooError> {
    if let Some(rest) = spec.strip_prefix("redis://") {
        let rest = rest.trim_end_matches('/');
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .map_err(|_| GlooError::Env(format!("{STORE_ENV}={spec:?}: bad port {p:?}")))?,
            ),
            None => (rest, 6379),
        };
        if host.is_empty() {
            return Err(GlooError::Env(format!("{STORE_ENV}={spec:?}: no host")));
        }
        GlooStore::redis(host, port)
    } else {
        GlooStore::file(PathBuf::from(spec))
    }
}

/// A [`GlooTransport`] for this process, from the environment (module docs):
/// [`EnvConfig::read`], `CCOL_TIMEOUT_S` (default 300 s), then
/// [`EnvConfig::connect`].
///
/// Cost: the rendezvous (one store round per peer), one TCP connection per
/// peer, and one barrier.
///
/// # Errors
/// [`Error::InvalidArgument`] naming a missing or malformed variable;
/// the rendezvous' [`Error::Timeout`] or [`Error::Backend`].
pub fn from_env() -> Result<GlooTransport, Error> {
    let cfg = EnvConfig::read().map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let timeout = timeout_from_env()?.unwrap_or(DEFAULT_TIMEOUT);
    cfg.connect(timeout)
}

impl EnvConfig {
    /// Connects this rank as configured: opens the store, rendezvouses with
    /// every peer within `timeout`, and passes a barrier within `timeout`.
    /// With the default store ([`StoreSpec::DefaultDir`]), the store directory is removed by
    /// rank 0 after the barrier, and by any rank whose rendezvous or barrier
    /// fails (module docs); a store the user named is never removed.
    ///
    /// Cost: the rendezvous (one store round per peer), one TCP connection
    /// per peer, and one barrier.
    ///
    /// # Errors
    /// The store's or the rendezvous' [`Error::Timeout`] or [`Error::Backend`].
    pub fn connect(&self, timeout: Duration) -> Result<GlooTransport, Error> {
        let result = self.connect_and_meet(timeout);
        if let StoreSpec::DefaultDir(dir) = &self.store {
            if result.is_err() || self.rank == 0 {
                match std::fs::remove_dir_all(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "gloo: cannot remove the rendezvous directory");
                    }
                }
            }
        }
        result
    }

    fn connect_and_meet(&self, timeout: Duration) -> Result<GlooTransport, Error> {
        let (store, hostname) = match &self.store {
            StoreSpec::Named(spec) => (store_from_env(spec)?, self.hostname.clone()),
            StoreSpec::DefaultDir(dir) => (GlooStore::file(dir)?, self.hostname.clone()),
            StoreSpec::Tcp { host, port, serve } => {
                let job = JobStore::open(
                    host,
                    *port,
                    *serve,
                    format!("{}/", self.prefix),
                    Deadline::after(timeout),
                )?;
                let here = job.local_ip().map(|ip| ip.to_string());
                // The Gloo store holds the job's store (and its server, on
                // the rank that serves) as long as the transport lives.
                let store = GlooStore::from_store(Arc::new(job), timeout)?
                    .with_description(format!("the TCPStore at {host}:{port}"));
                (store, self.hostname.clone().or(here))
            }
        };
        let hostname = hostname.unwrap_or_else(|| "127.0.0.1".into());
        let options = GlooOptions::default()
            .with_hostname(hostname)
            .with_connect_timeout(timeout)
            .with_prefix(self.prefix.clone());
        let transport = GlooTransport::connect(&store, self.rank, self.world_size, &options)?;
        transport.barrier(Deadline::after(timeout))?;
        Ok(transport)
    }
}

#[cfg(test)]
mod tests {
    use super::{advertised_hostname, hostname};
    use compiler_collectives_core::RunEnv;

    fn job(vars: &[(&str, &str)]) -> RunEnv {
        RunEnv::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
        .unwrap()
    }

    #[test]
    fn the_advertised_address_follows_where_the_ranks_are() {
        // The variable, when set, wins every case below; CI leaves it unset.
        let set = std::env::var("CCOL_GLOO_HOSTNAME")
            .ok()
            .filter(|v| !v.is_empty());
        let expect = |want: &str| set.clone().unwrap_or_else(|| want.to_owned());
        let one_node = job(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.1.2.3"),
        ]);
        assert_eq!(advertised_hostname(&one_node), expect("127.0.0.1"));
        let two_nodes = [
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
        ];
        let loopback = job(&[two_nodes.as_slice(), &[("MASTER_ADDR", "localhost")]].concat());
        assert_eq!(advertised_hostname(&loopback), expect("127.0.0.1"));
        // The route to a master on the loopback network leaves from 127.0.0.1.
        let routed = job(&[two_nodes.as_slice(), &[("MASTER_ADDR", "127.0.0.2")]].concat());
        assert_eq!(advertised_hostname(&routed), expect("127.0.0.1"));
        // No route to a name that does not resolve: the host name.
        let unknown = job(&[
            two_nodes.as_slice(),
            &[("MASTER_ADDR", "no-such-host.invalid")],
        ]
        .concat());
        let name = hostname().unwrap_or_else(|| "127.0.0.1".into());
        assert_eq!(advertised_hostname(&unknown), expect(&name));
    }
}
