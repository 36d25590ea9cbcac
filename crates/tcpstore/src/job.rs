//! [`JobStore`]: the TCPStore torchrun's environment names, as the backends'
//! `from_env` use it.
//!
//! With `MASTER_PORT` set ([`RunEnv::master_port`]):
//! - `TORCHELASTIC_USE_AGENT_STORE=True` (torchrun, `ccol run`): the
//!   launcher's agent serves the store; every rank is a client;
//! - otherwise (a job started by hand, as `init_process_group`'s `env://`
//!   does it): rank 0 serves on `MASTER_ADDR:MASTER_PORT` and every rank,
//!   rank 0 too, is a client. A rank 0 that finds the port taken (by
//!   torch's own rank-0 store in the same job, say) is a client of
//!   whatever serves there, as torch's client is when its agent store's bind
//!   fails.
//!
//! Keys live under [`JobStore::prefix`], `ccol/<run id>/<restart count>/`
//! (run id `job` when unset): a restarted attempt never reads the keys of
//! the one before, although the agent's store outlives attempts. The
//! restart count is per agent; under elastic membership changes every agent
//! restarts its workers, so agents of one attempt agree on it.

use crate::{ServerOptions, TcpStoreClient, TcpStoreServer};
use compiler_collectives_core::{Deadline, Error, Result, RunEnv, Store};
use std::sync::Arc;
use std::time::Duration;

/// The job's TCPStore: a client, and the server when this rank serves it.
/// It is a [`Store`] (its client's): whoever holds it keeps the server
/// running.
#[derive(Debug)]
pub struct JobStore {
    client: Arc<TcpStoreClient>,
    server: Option<TcpStoreServer>,
    prefix: String,
    /// Keys a serving rank waits for before its server stops, and how long.
    departures: Option<(Vec<String>, Duration)>,
}

impl JobStore {
    /// The job's store as `env` names it (module docs); `None` when
    /// `MASTER_PORT` is unset.
    ///
    /// # Errors
    /// Rank 0's bind error other than the port being in use (as
    /// [`Error::Backend`]); the client's connect errors
    /// ([`TcpStoreClient::connect`]: unreachable, not a TCPStore).
    pub fn from_run_env(env: &RunEnv, deadline: Deadline) -> Result<Option<JobStore>> {
        let Some(at) = env.job_store() else {
            return Ok(None);
        };
        let prefix = format!("ccol/{}/", env.key_prefix());
        Self::open(&at.host, at.port, at.serve, prefix, deadline).map(Some)
    }

    /// The store at `host:port`, served by this process first when `serve`
    /// (a taken port makes this a client of what serves there), with key
    /// prefix `prefix` for [`JobStore::prefix`].
    ///
    /// # Errors
    /// As [`JobStore::from_run_env`].
    pub fn open(
        host: &str,
        port: u16,
        serve: bool,
        prefix: String,
        deadline: Deadline,
    ) -> Result<JobStore> {
        let server = if serve {
            match TcpStoreServer::bind((host, port), ServerOptions::default()) {
                Ok(s) => Some(s),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    tracing::info!(host, port, "MASTER_PORT is taken: using the store there");
                    None
                }
                Err(e) => {
                    return Err(Error::Backend {
                        backend: "tcpstore",
                        message: format!(
                            "rank 0 cannot serve the job's TCPStore on MASTER_ADDR:MASTER_PORT \
                             {host}:{port}: {e}"
                        ),
                        engine: Some(Box::new(e)),
                    })
                }
            }
        } else {
            None
        };
        let client = TcpStoreClient::connect(host, port, deadline)?;
        Ok(JobStore {
            client: Arc::new(client),
            server,
            prefix,
            departures: None,
        })
    }

    /// The client.
    pub fn client(&self) -> &Arc<TcpStoreClient> {
        &self.client
    }

    /// Whether this rank serves the store.
    pub fn serves(&self) -> bool {
        self.server.is_some()
    }

    /// `ccol/<run id>/<restart count>/`: the prefix of every key the job's
    /// backends write.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The address this host has on the network of the store (the local
    /// end of the client's connection): what peers can reach this rank at
    /// when the store is reachable from them.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.client.local_addr().map(|a| a.ip())
    }

    /// When this rank serves, dropping the store first waits (at most
    /// `limit`) until every key in `keys` is set: the other ranks'
    /// departure keys, which they write after this rank may be done.
    pub fn linger_on_drop(&mut self, keys: Vec<String>, limit: Duration) {
        self.departures = Some((keys, limit));
    }

    /// When this rank serves: waits until every key in `keys` is set (each
    /// other rank's departure or post-mortem key) or `limit` passes, so the
    /// server outlives what the others still write. Returns at once when a
    /// launcher serves.
    pub fn linger(&self, keys: &[&str], limit: Duration) {
        if self.server.is_none() {
            return;
        }
        if let Err(e) = self.client.wait(keys, Deadline::after(limit)) {
            tracing::debug!(error = %e, "the job's store stops before every rank left");
        }
    }
}

impl Drop for JobStore {
    fn drop(&mut self) {
        if let Some((keys, limit)) = self.departures.take() {
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            self.linger(&keys, limit);
        }
    }
}

impl Store for JobStore {
    fn set(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()> {
        self.client.set(key, value, deadline)
    }

    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>> {
        self.client.get(key, deadline)
    }

    fn add(&self, key: &str, delta: i64, deadline: Deadline) -> Result<i64> {
        self.client.add(key, delta, deadline)
    }

    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()> {
        self.client.wait(keys, deadline)
    }

    fn delete(&self, key: &str, deadline: Deadline) -> Result<bool> {
        self.client.delete(key, deadline)
    }

    fn try_get(&self, key: &str, deadline: Deadline) -> Result<Option<Vec<u8>>> {
        self.client.try_get(key, deadline)
    }
}
