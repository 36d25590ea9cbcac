//! The shared conformance suite over libtorch's c10d (TCPStore +
//! ProcessGroupGloo) with real processes, at 2 and 3 ranks, plus SIGKILL
//! trials and the harness's hung-rank check (see
//! `compiler_collectives_conformance::process`). Behaviours that need a
//! capability c10d lacks are listed as ignored with the reason. Arguments
//! are libtest's (filters, `--list`, `--exact`).

use compiler_collectives_conformance::process::{self, env_u32, Backend, RANK, WORLD};
use compiler_collectives_core::{Capabilities, Transport};
use compiler_collectives_tch::{C10dProcessGroup, C10dStore, C10dTransport, TcpStoreOptions};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

/// c10d as this suite runs it. Its capabilities: missing ranks are named
/// (the store post-mortem) and point-to-point is ProcessGroupGloo's own; a
/// rank that leaves cannot interrupt peers blocked inside a c10d
/// collective, so it lacks `tells_peers_it_left`.
fn backend() -> Backend {
    Backend {
        name: "c10d",
        worlds: vec![2, 3],
        capabilities: Capabilities::none()
            .with_names_missing_ranks()
            .with_cheap_point_to_point(),
    }
}

fn main() -> ExitCode {
    process::exit_if_rank(connect, KILL_DEADLINE);
    let b = backend();
    let mut trials = process::behaviour_trials(&b, Vec::new);
    trials.extend(process::harness_trials(&b, Vec::new));
    trials.extend(process::kill_trials(
        &b,
        KILL_TRIALS,
        KILL_DEADLINE,
        Vec::new,
    ));
    process::run(trials)
}

/// Rank 0 serves a TCPStore on a port the system picks (no race for a
/// "free" port) and publishes it in the case's directory; the others
/// connect to it.
fn connect() -> Arc<dyn Transport> {
    let rank = env_u32(RANK);
    let world = env_u32(WORLD);
    let t = Duration::from_secs(30);
    let store = if rank == 0 {
        let store = C10dStore::tcp(&TcpStoreOptions::server("127.0.0.1", 0, world).with_timeout(t))
            .expect("TCPStore server");
        let port = store.port().expect("bound port");
        process::publish("port", &port.to_string()).expect("publish the port");
        store
    } else {
        let port: u16 = process::fetch("port", t)
            .expect("rank 0's port")
            .parse()
            .expect("a port number");
        C10dStore::tcp(&TcpStoreOptions::client("127.0.0.1", port, world).with_timeout(t))
            .expect("TCPStore client")
    };
    let scoped = store.prefixed("conformance").expect("prefix");
    let pg =
        C10dProcessGroup::gloo(&scoped, rank, world, "127.0.0.1", t).expect("ProcessGroupGloo");
    Arc::new(C10dTransport::new(pg, scoped))
}
