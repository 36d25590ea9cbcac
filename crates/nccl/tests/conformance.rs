//! The shared conformance suite over NCCL with real processes, one GPU per
//! rank, at every world size from 1 to the number of GPUs (at most 8;
//! `CCOL_NCCL_WORLDS=1,2` picks others), plus SIGKILL trials with 3 or more
//! GPUs. Ranks rendezvous through a `FileStore` in the case's directory.
//! Arguments filter cases.
//!
//! Without a GPU or without the NCCL library the suite prints why and
//! passes: NCCL refuses two ranks on one GPU, so nothing multi-rank can run.
//! It fails instead when the machine has a GPU and `CCOL_STRICT_SKIPS=1`
//! but the library is missing.

use compiler_collectives_conformance::process::{self, env_u32, DIR, RANK, WORLD};
use compiler_collectives_conformance::Capability;
use compiler_collectives_core::Transport;
use compiler_collectives_nccl::{FileStore, NcclOptions, NcclTransport};
use std::sync::Arc;
use std::time::Duration;

const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

/// NCCL itself can do neither, but the transport's store does both: the
/// post-mortem names missing ranks, `left/<rank>` keys tell waiting peers.
const HAS: &[Capability] = Capability::ALL;

fn main() {
    let code = match process::role().as_deref() {
        Some("behaviour") => process::rank_behaviour(connect()),
        Some("kill_loop") => process::rank_kill_loop(connect(), KILL_DEADLINE),
        _ => driver(),
    };
    std::process::exit(code);
}

/// One GPU per rank (device = rank), rendezvous in the case's directory.
fn connect() -> Arc<dyn Transport> {
    let rank = env_u32(RANK);
    let world = env_u32(WORLD);
    let store = Arc::new(FileStore::new(std::env::var(DIR).expect("dir")).expect("file store"));
    let opts = NcclOptions::default()
        .with_device(rank as usize)
        .with_connect_timeout(Duration::from_secs(60));
    match NcclTransport::connect(store, rank, world, &opts) {
        Ok(t) => Arc::new(t),
        Err(e) => {
            println!("VERDICT fail connect: {e}");
            std::process::exit(1);
        }
    }
}

fn strict() -> bool {
    std::env::var("CCOL_STRICT_SKIPS").is_ok_and(|v| v == "1")
}

/// World sizes to run: `CCOL_NCCL_WORLDS` or 1..=min(GPUs, 8).
fn worlds(gpus: usize) -> Vec<u32> {
    if let Ok(v) = std::env::var("CCOL_NCCL_WORLDS") {
        return v
            .split(',')
            .filter_map(|w| w.trim().parse().ok())
            .filter(|w| (1..=gpus).contains(&(*w as usize)))
            .collect();
    }
    (1..=u32::try_from(gpus.min(8)).unwrap_or(1)).collect()
}

fn driver() -> i32 {
    let gpus = match compiler_collectives_nccl::device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("\nrunning 0 tests\nnccl conformance skipped: {e}\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n");
            return 0;
        }
    };
    if let Err(e) = compiler_collectives_nccl::library() {
        println!("\nnccl conformance skipped: {gpus} GPU(s) but {e}");
        return i32::from(strict());
    }
    let worlds = worlds(gpus);
    println!("nccl conformance: {gpus} GPU(s), world sizes {worlds:?}");
    let (mut cases, skipped) = process::behaviour_cases("nccl", &worlds, HAS, Vec::new);
    if gpus >= 3 {
        cases.extend(process::kill_cases(
            "nccl",
            KILL_TRIALS,
            KILL_DEADLINE,
            Vec::new,
        ));
    } else {
        println!("nccl::sigkill_mid_exchange skipped: needs 3 GPUs, this machine has {gpus}");
    }
    process::run_cases(cases, skipped)
}
