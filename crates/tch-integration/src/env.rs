//! [`from_env`]: a [`C10dTransport`] from torchrun's environment.

use crate::group::C10dProcessGroup;
use crate::store::{C10dStore, TcpStoreOptions};
use crate::transport::C10dTransport;
use compiler_collectives_core::Error;
use std::time::Duration;

/// What [`from_env`] reads: torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
/// `MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE` (when `True`, torchrun's
/// agent already serves the TCPStore and rank 0 is only a client), and
/// `CCOL_TIMEOUT_S` (default 300 s).
///
/// # Errors
/// [`Error::InvalidArgument`] naming a missing or malformed variable; the
/// store's or group's errors.
pub fn from_env() -> compiler_collectives_core::Result<C10dTransport> {
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
    let num = |n: &str| -> compiler_collectives_core::Result<u32> {
        var(n)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{n} is not set: start the ranks with `ccol run` or `torchrun`"
                ))
            })?
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("{n} is not a non-negative integer")))
    };
    let rank = num("RANK")?;
    let world = num("WORLD_SIZE")?;
    if world == 0 || rank >= world {
        return Err(Error::InvalidArgument(format!(
            "RANK={rank} is not below WORLD_SIZE={world}"
        )));
    }
    let addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
    let port: u16 = var("MASTER_PORT")
        .ok_or_else(|| Error::InvalidArgument("MASTER_PORT is not set".into()))?
        .parse()
        .map_err(|_| Error::InvalidArgument("MASTER_PORT is not a port number".into()))?;
    let agent = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let timeout = compiler_collectives_core::protocol::timeout_from_env()?
        .unwrap_or(Duration::from_secs(300));
    // Rank 0 serves unless torchrun's agent does; every store counts itself
    // in (as Python's init_process_group) unless the agent's store is used.
    let opts = if rank == 0 && !agent {
        TcpStoreOptions::server(addr.as_str(), port, world)
    } else {
        TcpStoreOptions::client(addr.as_str(), port, world)
    };
    let store = C10dStore::tcp(&opts.with_wait_workers(!agent).with_timeout(timeout))?;
    let run = var("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "job".into());
    let restart = var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|| "0".into());
    let scoped = store.prefixed(&format!("ccol/{run}/{restart}"))?;
    let host = if addr == "localhost" || addr.starts_with("127.") {
        "127.0.0.1".to_string()
    } else {
        addr
    };
    let pg = C10dProcessGroup::gloo(&scoped, rank, world, &host, timeout)?;
    drop(store);
    Ok(C10dTransport::new(pg, scoped))
}
