//! The shared conformance suite over libtorch's c10d (TCPStore +
//! ProcessGroupGloo) with real processes, at 2 and 3 ranks, plus SIGKILL
//! trials (see `compiler_collectives_conformance::process`). Behaviours that
//! need a capability c10d lacks are listed as skipped with the reason.
//! Arguments filter cases.

use compiler_collectives_conformance::process::{self, env_u32, RANK, WORLD};
use compiler_collectives_conformance::Capability;
use compiler_collectives_core::Transport;
use compiler_collectives_tch::{C10dProcessGroup, C10dStore, C10dTransport};
use std::sync::Arc;
use std::time::Duration;

const PORT: &str = "CCOL_TEST_PORT";

/// What c10d gives: missing ranks are named (the store post-mortem); a rank
/// that leaves cannot interrupt peers blocked in c10d.
const HAS: &[Capability] = &[Capability::NamesMissingRanks];
const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

fn main() {
    let code = match process::role().as_deref() {
        Some("behaviour") => process::rank_behaviour(connect()),
        Some("kill_loop") => process::rank_kill_loop(connect(), KILL_DEADLINE),
        _ => driver(),
    };
    std::process::exit(code);
}

fn connect() -> Arc<dyn Transport> {
    let rank = env_u32(RANK);
    let world = env_u32(WORLD);
    let port = u16::try_from(env_u32(PORT)).expect("port");
    let t = Duration::from_secs(30);
    let store = C10dStore::tcp("127.0.0.1", port, world, rank == 0, true, t).expect("TCPStore");
    let scoped = store.prefixed("conformance").expect("prefix");
    let pg =
        C10dProcessGroup::gloo(&scoped, rank, world, "127.0.0.1", t).expect("ProcessGroupGloo");
    Arc::new(C10dTransport::new(pg, scoped))
}

/// A fresh TCPStore port per case.
fn port_env() -> Vec<(&'static str, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    vec![(PORT, port.to_string())]
}

fn driver() -> i32 {
    let (mut cases, skipped) = process::behaviour_cases("c10d", &[2, 3], HAS, port_env);
    cases.extend(process::kill_cases(
        "c10d",
        KILL_TRIALS,
        KILL_DEADLINE,
        port_env,
    ));
    process::run_cases(cases, skipped)
}
