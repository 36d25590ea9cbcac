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

use compiler_collectives_conformance::process::{self, env_u32, Backend, DIR, RANK, WORLD};
use compiler_collectives_conformance::skip::Missing;
use compiler_collectives_core::{Capabilities, Transport};
use compiler_collectives_nccl::{FileStore, NcclOptions, NcclTransport};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

/// NCCL as this suite runs it, at `worlds`. Its capabilities: NCCL itself
/// has none, but the transport's store gives two — the post-mortem names
/// missing ranks, `left/<rank>` keys tell waiting peers; point-to-point goes
/// through the store, so it is not cheap (the tree exchange stays off).
fn backend(worlds: Vec<u32>) -> Backend {
    Backend {
        name: "nccl",
        worlds,
        capabilities: Capabilities::none()
            .with_names_missing_ranks()
            .with_tells_peers_it_left(),
    }
}

fn main() -> ExitCode {
    process::exit_if_rank(connect, KILL_DEADLINE);
    driver()
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

fn driver() -> ExitCode {
    // Without a GPU nothing can run (a machine's lack, never a failure);
    // with GPUs but without the library, the skip rule decides.
    let gpus = match compiler_collectives_nccl::device_count() {
        Ok(n) => n,
        Err(e) => {
            return process::run(vec![process::skipped_trial(
                "nccl::conformance",
                Missing::machine(format!("no GPU: {e}")),
            )])
        }
    };
    if let Err(e) = compiler_collectives_nccl::library() {
        return process::run(vec![process::skipped_trial(
            "nccl::conformance",
            Missing::install(format!("{gpus} GPU(s) but {e}")),
        )]);
    }
    let worlds = worlds(gpus);
    println!("nccl conformance: {gpus} GPU(s), world sizes {worlds:?}");
    let b = backend(worlds);
    let mut trials = process::behaviour_trials(&b, Vec::new);
    if gpus >= 2 {
        trials.extend(process::harness_trials(&b, Vec::new));
    }
    if gpus >= 3 {
        trials.extend(process::kill_trials(
            &b,
            KILL_TRIALS,
            KILL_DEADLINE,
            Vec::new,
        ));
    } else {
        trials.push(process::skipped_trial(
            "nccl::sigkill_mid_exchange",
            Missing::machine(format!("needs 3 GPUs, this machine has {gpus}")),
        ));
    }
    process::run(trials)
}
