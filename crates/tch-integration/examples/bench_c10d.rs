//! One rank of `ccol bench` over libtorch's c10d (`ProcessGroupGloo`, the
//! engine PyTorch's own path uses): the same interleaved measurement as
//! `ccol bench-worker` ([`compiler_collectives_harness::benchmark::measure_exchange`]).
//! `ccol bench --c10d-worker PATH` starts it on every rank through `ccol run`:
//!
//! ```text
//! cargo build --release -p compiler-collectives-tch --example bench_c10d
//! ccol bench --c10d-worker $CARGO_TARGET_DIR/release/examples/bench_c10d
//! ```
//!
//! Arguments (as `ccol bench-worker`): `--sources 20,200 --rounds N --warmup N
//! --timeout S --results DIR`; writes `DIR/bench-rank-<R>.json`.

use anyhow::Context as _;
use compiler_collectives_core::{Deadline, Transport};
use compiler_collectives_harness::benchmark::{measure_exchange, samples_json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Counts allocations for `ccol bench`'s figures per exchange.
#[global_allocator]
static HEAP: compiler_collectives_harness::heap::CountingAlloc =
    compiler_collectives_harness::heap::CountingAlloc;

fn main() -> anyhow::Result<()> {
    // RUST_LOG, CCOL_LOG_FORMAT: the library's `tracing` events on stderr.
    compiler_collectives_harness::logging::init();
    let mut sources = Vec::new();
    let (mut rounds, mut warmup, mut timeout) = (100usize, 20usize, 60u64);
    let mut results = PathBuf::from(".");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().with_context(|| format!("{a} needs a value"))?;
        match a.as_str() {
            "--sources" => {
                sources = v
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .context("--sources")?;
            }
            "--rounds" => rounds = v.parse().context("--rounds")?,
            "--warmup" => warmup = v.parse().context("--warmup")?,
            "--timeout" => timeout = v.parse().context("--timeout")?,
            "--results" => results = PathBuf::from(v),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let transport: Arc<dyn Transport> = Arc::new(compiler_collectives_tch::from_env()?);
    let rank = transport.rank();
    let timeout = Duration::from_secs(timeout);
    let samples = measure_exchange(
        Arc::clone(&transport),
        &sources,
        warmup,
        rounds,
        timeout,
        Some(&compiler_collectives_harness::heap::COUNTER),
    )?;
    let path = results.join(format!("bench-rank-{rank}.json"));
    std::fs::write(&path, samples_json(rank, &samples).to_string())
        .with_context(|| format!("{}: cannot write", path.display()))?;
    transport.barrier(Deadline::after(timeout))?;
    Ok(())
}
