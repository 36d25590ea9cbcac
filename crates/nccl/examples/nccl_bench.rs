//! Exchange latency over NCCL against the floor: a raw NCCL all_gather of
//! the same bytes between buffers already on the device.
//!
//! `nccl_bench --world N [--iters 200] [--sizes 16,4096,65536]` starts N
//! rank processes of itself (one GPU each; ranks meet in a `FileStore` in a
//! temporary directory), and rank 0 prints one line per measurement:
//!
//! `RESULT <world> <op> <bytes> <p50 µs> <p90 µs> <raw p50 µs>`
//!
//! where op is `raw_all_gather` (the floor), `all_gather_fixed` (one round
//! with host copies), `all_gather` (lengths round + padded round),
//! `exchange_fast` (all ranks agree: one round of fixed-size slots) and
//! `exchange_full` (ranks differ: the slot round, then the envelopes that
//! did not fit in a slot), and
//! "raw" is the floor for the bytes that operation gathers per rank.

use anyhow::{bail, Context, Result};
use clap::Parser;
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::transport::counting::CountingTransport;
use compiler_collectives_core::{Channel, ChannelOptions, Deadline, Transport};
use compiler_collectives_nccl::{FileStore, NcclOptions, NcclTransport};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug, Clone)]
#[command(about = "NCCL exchange latency against a raw NCCL all_gather")]
struct Args {
    /// Number of ranks (one GPU each).
    #[arg(long, default_value_t = 1)]
    world: u32,
    /// Timed iterations per measurement (after 20 warm-up ones).
    #[arg(long, default_value_t = 200)]
    iters: u32,
    /// Payload sizes in bytes per rank for the all_gather rows.
    #[arg(long, value_delimiter = ',', default_value = "16,4096,65536")]
    sizes: Vec<usize>,
}

const RANK_ENV: &str = "CCOL_BENCH_RANK";
const DIR_ENV: &str = "CCOL_BENCH_DIR";
const WARMUP: u32 = 20;

fn main() -> Result<()> {
    let args = Args::parse();
    // RUST_LOG, CCOL_LOG_FORMAT: the library's `tracing` events on stderr.
    compiler_collectives_harness::logging::init();
    match std::env::var(RANK_ENV) {
        Ok(rank) => rank_main(&args, rank.parse().context("rank")?),
        Err(_) => driver(&args),
    }
}

fn driver(args: &Args) -> Result<()> {
    let found = compiler_collectives_nccl::probe()?;
    if args.world as usize > found.devices {
        bail!(
            "--world {} needs {} GPUs (NCCL refuses two ranks on one GPU); this machine has {}",
            args.world,
            args.world,
            found.devices
        );
    }
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..args.world {
        children.push(
            Command::new(&exe)
                .args(std::env::args().skip(1))
                .env(RANK_ENV, r.to_string())
                .env(DIR_ENV, dir.path())
                .stdout(if r == 0 {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .spawn()?,
        );
    }
    if let Some(out) = children.first_mut().and_then(|c| c.stdout.take()) {
        for line in BufReader::new(out).lines() {
            println!("{}", line?);
        }
    }
    let mut failed = Vec::new();
    for (r, mut c) in children.into_iter().enumerate() {
        if !c.wait()?.success() {
            failed.push(r);
        }
    }
    if !failed.is_empty() {
        bail!("ranks {failed:?} failed");
    }
    Ok(())
}

/// The `pct`-th percentile in µs (nearest rank).
fn percentile(times: &mut [Duration], pct: usize) -> f64 {
    times.sort_unstable();
    if times.is_empty() {
        return 0.0;
    }
    let last = times.len() - 1;
    let i = (last * pct + 50) / 100;
    times[i.min(last)].as_secs_f64() * 1e6
}

/// Times `iters` calls after the warm-up ones.
fn time(iters: u32, mut f: impl FnMut() -> Result<()>) -> Result<Vec<Duration>> {
    for _ in 0..WARMUP {
        f()?;
    }
    let mut out = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t = Instant::now();
        f()?;
        out.push(t.elapsed());
    }
    Ok(out)
}

fn rank_main(args: &Args, rank: u32) -> Result<()> {
    let dir = std::env::var(DIR_ENV).context(DIR_ENV)?;
    let store = Arc::new(FileStore::new(dir)?);
    let opts = NcclOptions::default()
        .with_device(rank as usize)
        .with_connect_timeout(Duration::from_secs(120));
    let t = Arc::new(NcclTransport::connect(store, rank, args.world, &opts)?);
    let deadline = || Deadline::after(Duration::from_secs(60));
    let mut rows: Vec<(&str, usize, Vec<Duration>)> = Vec::new();
    let raw = |bytes: usize| -> Result<Vec<Duration>> {
        t.raw_all_gather_floor(bytes, WARMUP, deadline())?;
        Ok(t.raw_all_gather_floor(bytes, args.iters, deadline())?)
    };
    let mut floors: Vec<(usize, f64)> = Vec::new();
    let mut floor = |bytes: usize, raw_times: Option<Vec<Duration>>| -> Result<f64> {
        if let Some(f) = floors.iter().find(|f| f.0 == bytes) {
            return Ok(f.1);
        }
        let mut times = match raw_times {
            Some(t) => t,
            None => raw(bytes)?,
        };
        let p50 = percentile(&mut times, 50);
        floors.push((bytes, p50));
        Ok(p50)
    };
    for &bytes in &args.sizes {
        let data = vec![u8::try_from(rank % 251).unwrap_or(0); bytes];
        rows.push(("raw_all_gather", bytes, raw(bytes)?));
        rows.push((
            "all_gather_fixed",
            bytes,
            time(args.iters, || {
                Ok(t.all_gather_fixed(&data, deadline()).map(|_| ())?)
            })?,
        ));
        rows.push((
            "all_gather",
            bytes,
            time(args.iters, || {
                Ok(t.all_gather(&data, bytes, deadline()).map(|_| ())?)
            })?,
        ));
    }
    let counting = CountingTransport::shared(Arc::clone(&t));
    let counts = counting.counts();
    let mut ch = Channel::with_options(
        Arc::new(counting),
        ChannelOptions::default().with_timeout(Duration::from_secs(60)),
    )?;
    let mut same = FrameState::new();
    same.record("x", &Observation::tensor([16, 10]));
    rows.push((
        "exchange_fast",
        compiler_collectives_core::protocol::envelope::DIGEST_MSG_LEN,
        time(args.iters, || {
            Ok(ch.exchange("bench", &same).map(|_| ())?)
        })?,
    ));
    let mut differ = FrameState::new();
    differ.record("x", &Observation::tensor([16 + u64::from(rank), 10]));
    let full = time(args.iters, || {
        Ok(ch.exchange("bench", &differ).map(|_| ())?)
    })?;
    // One process of a world of 1 always takes the fast path.
    let envelope = usize::try_from(counts.last_gather_longest()).unwrap_or(usize::MAX);
    rows.push(("exchange_full", envelope.max(1), full));
    let mut table = Vec::new();
    for (op, bytes, mut times) in rows {
        let p50 = percentile(&mut times, 50);
        let p90 = percentile(&mut times, 90);
        let f = floor(bytes, (op == "raw_all_gather").then(|| times.clone()))?;
        table.push((op, bytes, p50, p90, f));
    }
    ch.shutdown()?;
    if rank == 0 {
        println!(
            "{:>5} {:>18} {:>8} {:>10} {:>10} {:>12}",
            "world", "op", "bytes", "p50 µs", "p90 µs", "raw p50 µs"
        );
    }
    let mut lines = Vec::new();
    for (op, bytes, p50, p90, f) in table {
        lines.push(format!(
            "RESULT {} {op} {bytes} {p50:.1} {p90:.1} {f:.1}",
            args.world
        ));
        if rank == 0 {
            println!(
                "{:>5} {op:>18} {bytes:>8} {p50:>10.1} {p90:>10.1} {f:>12.1}",
                args.world
            );
        }
    }
    if rank == 0 {
        for l in lines {
            println!("{l}");
        }
    }
    Ok(())
}
