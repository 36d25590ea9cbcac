//! `ccol bench`: exchange latency side by side with the raw engine floor and
//! with PyTorch's path, join throughput, wire size, the fast path, and the
//! scale simulation — one run, one table, one JSON file, one SVG chart.
//!
//! - Exchange (per world size in `--ranks`, per state size in `--sources`):
//!   the ranks run [`measure_exchange`] — floor, ours, fast path and a
//!   16-byte all_gather interleaved per round after a barrier. Over Gloo
//!   (`--engine gloo`, the default when built with the `gloo` feature) the
//!   ranks are processes started through `ccol run`, each running the hidden
//!   `ccol bench-worker`; over `--engine in-process` they are threads. A
//!   round's time is the slowest rank's; p50/p90 over the rounds.
//! - c10d: with `--c10d-worker PATH` (default: `examples/bench_c10d` beside
//!   ccol, else in the release build of `$CARGO_TARGET_DIR` or of the cache's
//!   `target/` — built by `cargo build --release -p compiler-collectives-tch
//!   --example bench_c10d`), the same measurement over libtorch's
//!   `ProcessGroupGloo` — the engine PyTorch's own path runs on.
//! - PyTorch (unless `--no-pytorch`): the embedded `bench/pytorch_bench.py`
//!   under `--python` (default `$CCOL_TORCH_PYTHON`, from
//!   `scripts/setup-torch.sh`), started through `ccol run` with the same
//!   world sizes, states and rounds: `all_gather_object` of Dynamo's
//!   `LocalState` over gloo plus the `FrameStateSizeEntry` joins. Its
//!   `join` mode gives PyTorch's join time and pickle sizes.
//! - Join: 64 ranks × 1000 sources, ours in this process (median of 20).
//! - Scale (unless `--no-scale`): [`simulate`] with 20-source states, flat
//!   up to `--flat-max` ranks, hierarchical up to `--scale-max`.
//! - Heap per exchange: each rank process's allocations, counted by the
//!   allocator of `compiler_collectives_harness::heap` where the process
//!   installs it: `examples/bench_c10d` always, `ccol bench-worker` only in a
//!   ccol built with the `heap-stats` feature ([`HEAP_STATS`]); without it
//!   the table says that the Gloo rows need the feature. In-process ranks
//!   share one heap: no figures.
//!
//! Output: the table on stdout, `bench.json` and `latency.svg` in `--out`
//! (default: `bench/` in the project's cache directory, [`default_out`]),
//! and a last line saying where they are.
//!
//! Exit codes: 0 done; 1 a measurement failed; 2 bad arguments or a Python
//! without torch; 130 interrupted (the ranks are stopped, temporary files
//! removed).

use anyhow::{bail, Context as _};
use clap::Args;
use compiler_collectives::{InProcessGroup, Join, Transport};
use compiler_collectives_harness::benchmark::{
    bench_state, envelope_bytes, measure_exchange, samples_json, simulate, SimResult,
};
use serde_json::{json, Value};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The PyTorch side, embedded so `ccol bench` runs from anywhere.
const PYTORCH_SCRIPT: &str = include_str!("../../../bench/pytorch_bench.py");

/// A comma-separated list of positive integers (`2,4`).
#[derive(Clone, Debug)]
pub(crate) struct List(Vec<usize>);

fn parse_list(text: &str) -> Result<List, String> {
    let v: Result<Vec<usize>, _> = text.split(',').map(|x| x.trim().parse()).collect();
    match v {
        Ok(v) if !v.is_empty() && v.iter().all(|&x| x > 0) => Ok(List(v)),
        _ => Err(format!(
            "'{text}' is not a comma-separated list of positive integers"
        )),
    }
}

/// Arguments of `ccol bench`.
#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// World sizes of the exchange benchmark.
    #[arg(long, default_value = "2,4", value_parser = parse_list)]
    ranks: List,
    /// State sizes (sources per state) of the exchange benchmark.
    #[arg(long, default_value = "20,200,2000", value_parser = parse_list)]
    sources: List,
    /// Recorded rounds per state size.
    #[arg(long, default_value_t = 200, value_parser = crate::at_least_one::<u64>)]
    rounds: u64,
    /// Warm-up rounds per state size (not recorded).
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// `gloo` (rank processes; needs the `gloo` feature) or `in-process` (threads).
    #[arg(long)]
    engine: Option<String>,
    /// Where to write bench.json and latency.svg [default: $CCOL_CACHE/bench,
    /// else $XDG_CACHE_HOME/compiler-collectives/bench, else
    /// ~/.cache/compiler-collectives/bench].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Skip PyTorch's side.
    #[arg(long)]
    no_pytorch: bool,
    /// Python with torch 2.13 (default: $CCOL_TORCH_PYTHON, else the cache's
    /// torch-2.13.0 from the scripts).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Skip the scale simulation.
    #[arg(long)]
    no_scale: bool,
    /// Largest simulated world of the flat exchange.
    #[arg(long, default_value_t = 1024)]
    flat_max: u32,
    /// Largest simulated world of the hierarchical exchange.
    #[arg(long, default_value_t = 4096)]
    scale_max: u32,
    /// Also measure our side over libtorch's c10d with this worker binary
    /// (`cargo build --release -p compiler-collectives-tch --example bench_c10d`;
    /// default: `examples/bench_c10d` beside ccol, else
    /// $CARGO_TARGET_DIR/release/examples/bench_c10d, else
    /// target/release/examples/bench_c10d in the cache directory, when built).
    #[arg(long, value_name = "PATH")]
    c10d_worker: Option<PathBuf>,
    /// Do not look for the c10d worker beside ccol.
    #[arg(long)]
    no_c10d: bool,
    /// Deadline of each round, in seconds.
    #[arg(long, default_value_t = 60, value_parser = crate::at_least_one::<u64>)]
    timeout: u64,
}

/// Arguments of the hidden `ccol bench-worker` (one rank, started by `ccol bench`).
#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(long, value_parser = parse_list)]
    sources: List,
    #[arg(long)]
    rounds: u64,
    #[arg(long)]
    warmup: u64,
    #[arg(long)]
    timeout: u64,
    /// Where to write `bench-rank-<R>.json`.
    #[arg(long)]
    results: PathBuf,
}

/// Whether this ccol counts its allocations (feature `heap-stats`: `main.rs`
/// installs the counting allocator), so that `ccol bench-worker` reports heap
/// figures per exchange. The production binary does not.
pub(crate) const HEAP_STATS: bool = cfg!(feature = "heap-stats");

fn usize_of(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// Runs one rank of `ccol bench` over Gloo.
pub(crate) fn worker(args: &WorkerArgs) -> ExitCode {
    match worker_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccol bench-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(feature = "gloo")]
fn worker_inner(args: &WorkerArgs) -> anyhow::Result<()> {
    let transport: Arc<dyn Transport> = Arc::new(compiler_collectives::gloo::from_env()?);
    let rank = transport.rank();
    // The counter of the allocator `main.rs` installs with `heap-stats`.
    let heap: Option<&dyn compiler_collectives_harness::benchmark::HeapCounter> =
        HEAP_STATS.then_some(&compiler_collectives_harness::heap::COUNTER);
    let samples = measure_exchange(
        Arc::clone(&transport),
        &args.sources.0,
        usize_of(args.warmup),
        usize_of(args.rounds),
        Duration::from_secs(args.timeout),
        heap,
    )?;
    let path = args.results.join(format!("bench-rank-{rank}.json"));
    std::fs::write(&path, samples_json(rank, &samples).to_string())
        .with_context(|| format!("{}: cannot write", path.display()))?;
    transport.barrier(compiler_collectives::Deadline::after(Duration::from_secs(
        args.timeout,
    )))?;
    Ok(())
}

#[cfg(not(feature = "gloo"))]
fn worker_inner(_args: &WorkerArgs) -> anyhow::Result<()> {
    bail!("this ccol was built without Gloo")
}

/// `p`-th percentile (0–100) of sorted `v`, nearest rank (rounded).
fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let max_index = sorted.len() - 1;
    sorted[((p.min(100) * max_index + 50) / 100).min(max_index)]
}

#[derive(Clone, Copy, Debug)]
struct Stat {
    p50: f64,
    p90: f64,
}

impl Stat {
    fn json(self) -> Value {
        json!({"p50": self.p50, "p90": self.p90})
    }
}

/// Per round, the slowest rank's time; then p50 and p90.
fn stat(per_rank: &[&Vec<f64>]) -> Stat {
    let rounds = per_rank.iter().map(|v| v.len()).min().unwrap_or(0);
    let mut slowest: Vec<f64> = (0..rounds)
        .map(|i| per_rank.iter().map(|v| v[i]).fold(f64::MIN, f64::max))
        .collect();
    slowest.sort_by(f64::total_cmp);
    Stat {
        p50: percentile(&slowest, 50),
        p90: percentile(&slowest, 90),
    }
}

fn f64_list(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// One (world size, state size) row.
#[derive(Debug)]
struct Row {
    /// The engine our side ran on: `gloo`, `c10d` or `in-process`.
    engine: String,
    world_size: usize,
    sources: usize,
    envelope_bytes: usize,
    /// `Channel::exchange_in_place`: the rank's state becomes the join.
    ours: Stat,
    /// `Channel::exchange`: the join as a new value.
    owned: Stat,
    floor: Stat,
    fast: Stat,
    floor16: Stat,
    pytorch: Option<Stat>,
    /// One 16-byte all_gather on torch's own gloo (the engine PyTorch uses).
    torch_gloo16: Option<Stat>,
    pickle_bytes: Option<u64>,
    /// Per exchange of differing states, the median over rounds, the most
    /// of any rank: bytes allocated, allocations, peak live bytes.
    heap: Option<(u64, u64, u64)>,
}

/// Reads every rank's file `<prefix>-rank-<r>.json` from `dir`.
fn read_ranks(dir: &Path, prefix: &str, world: usize) -> anyhow::Result<Vec<Value>> {
    (0..world)
        .map(|r| {
            let p = dir.join(format!("{prefix}-rank-{r}.json"));
            let text = std::fs::read_to_string(&p)
                .with_context(|| format!("rank {r} wrote no results ({})", p.display()))?;
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", p.display()))
        })
        .collect()
}

/// The series `field` of state size index `i` on every rank.
fn series(ranks: &[Value], i: usize, field: &str) -> Vec<Vec<f64>> {
    ranks
        .iter()
        .map(|r| f64_list(&r["sizes"][i][field]))
        .collect()
}

/// The heap figures of state size `i`: per rank the median over rounds of
/// each field, then the most of any rank; `None` when no rank counted.
fn heap_of(ranks: &[Value], i: usize) -> Option<(u64, u64, u64)> {
    let median = |field: &str| -> Option<u64> {
        ranks
            .iter()
            .filter_map(|r| {
                let mut v: Vec<u64> = r["sizes"][i][field]
                    .as_array()?
                    .iter()
                    .filter_map(Value::as_u64)
                    .collect();
                v.sort_unstable();
                v.get(v.len() / 2).copied()
            })
            .max()
    };
    Some((
        median("alloc_bytes")?,
        median("allocations")?,
        median("peak_live_bytes")?,
    ))
}

fn stat_of(ranks: &[Value], i: usize, field: &str) -> Stat {
    let s = series(ranks, i, field);
    let refs: Vec<&Vec<f64>> = s.iter().collect();
    stat(&refs)
}

/// `--sources S --rounds R --warmup W`: what every rank program is told.
fn shape_args(args: &BenchArgs) -> Vec<OsString> {
    [
        "--sources".into(),
        join_list(&args.sources.0),
        "--rounds".into(),
        args.rounds.to_string(),
        "--warmup".into(),
        args.warmup.to_string(),
    ]
    .into_iter()
    .map(OsString::from)
    .collect()
}

/// `ccol bench` stopped by Ctrl-C, SIGTERM or SIGHUP (exit 130).
#[derive(Debug)]
struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted; the ranks were stopped")
    }
}

impl std::error::Error for Interrupted {}

/// Bad arguments or set-up (exit 2): a Python without torch, no output
/// directory.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

use crate::cache::cache_dir;

/// Where `ccol bench` writes without `--out`: `bench` in [`cache_dir`].
fn default_out() -> Option<PathBuf> {
    cache_dir().map(|cache| cache.join("bench"))
}

/// Ends the run between two measurements when a signal arrived: once the
/// first launcher ran, Ctrl-C no longer ends this process by itself.
fn stop_if_interrupted() -> anyhow::Result<()> {
    if crate::launch::interrupted() {
        return Err(Interrupted.into());
    }
    Ok(())
}

fn ccol_run(world: usize, program: &[OsString]) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let mut launcher = Command::new(&exe);
    launcher
        .arg("run")
        .arg("--nproc-per-node")
        .arg(world.to_string())
        .arg("--")
        .args(program);
    let (status, interrupted) =
        crate::launch::run_launcher(&mut launcher).context("cannot start the ranks")?;
    if interrupted {
        return Err(Interrupted.into());
    }
    if !status.success() {
        bail!("the ranks failed ({status})");
    }
    Ok(())
}

/// Runs our side on `world` ranks: threads (`in-process`), `ccol
/// bench-worker` processes (`gloo`), or `program` processes (`c10d`).
fn run_ours(
    args: &BenchArgs,
    engine: &str,
    program: Option<&Path>,
    world: usize,
    dir: &Path,
) -> anyhow::Result<Vec<Value>> {
    let timeout = Duration::from_secs(args.timeout);
    if engine == "in-process" {
        let n = u32::try_from(world).context("world size")?;
        let handles: Vec<_> = InProcessGroup::create(n)?
            .into_iter()
            .map(|t| {
                let sizes = args.sources.0.clone();
                let (warmup, rounds) = (usize_of(args.warmup), usize_of(args.rounds));
                std::thread::spawn(move || {
                    let rank = t.rank();
                    let t: Arc<dyn Transport> = Arc::new(t);
                    // Threads share one heap: no allocation figures.
                    measure_exchange(t, &sizes, warmup, rounds, timeout, None)
                        .map(|s| samples_json(rank, &s))
                })
            })
            .collect();
        return handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a rank thread panicked"))?
                    .map_err(anyhow::Error::from)
            })
            .collect();
    }
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let mut command: Vec<OsString> = match program {
        Some(p) => vec![p.into()],
        None => vec![exe.into(), "bench-worker".into()],
    };
    command.extend(shape_args(args));
    command.extend([
        "--timeout".into(),
        args.timeout.to_string().into(),
        "--results".into(),
        dir.into(),
    ]);
    ccol_run(world, &command)?;
    read_ranks(dir, "bench", world)
}

fn join_list(v: &[usize]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `--c10d-worker`, else the first `examples/bench_c10d` that is built:
/// beside this ccol (same target directory and profile), in
/// `$CARGO_TARGET_DIR/release`, in the cache's `target/release` (where the
/// scripts build; an installed ccol is not beside it). None with `--no-c10d`.
fn c10d_worker(args: &BenchArgs) -> Option<PathBuf> {
    if args.no_c10d || args.engine.as_deref() == Some("in-process") {
        return None;
    }
    if let Some(p) = &args.c10d_worker {
        return Some(p.clone());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map(|t| PathBuf::from(t).join("release"));
    let cache = cache_dir().map(|c| c.join("target").join("release"));
    [beside, target, cache]
        .into_iter()
        .flatten()
        .map(|dir| dir.join("examples").join("bench_c10d"))
        .find(|p| p.is_file())
}

fn python(args: &BenchArgs) -> Option<PathBuf> {
    if args.no_pytorch {
        return None;
    }
    args.python.clone().or_else(crate::cache::torch_python)
}

fn run_pytorch(
    args: &BenchArgs,
    py: &Path,
    script: &Path,
    world: usize,
    dir: &Path,
) -> anyhow::Result<Vec<Value>> {
    let mut command: Vec<OsString> = vec![py.into(), script.into(), "exchange".into()];
    command.extend(shape_args(args));
    command.extend(["--out".into(), dir.into()]);
    ccol_run(world, &command)?;
    read_ranks(dir, "pytorch", world)
}

/// Our join of 64 ranks × 1000 sources, median ms of 20:
/// `FrameState::join_all` (the target's: two-way merges into two buffers)
/// and `Join::join` folded over the ranks in rank order, alternating.
fn our_join(ranks: u64, sources: usize) -> (f64, f64) {
    use compiler_collectives::decisions::shapes::FrameState;
    let states: Vec<_> = (0..ranks).map(|r| bench_state(sources, r)).collect();
    let (mut join_all_ms, mut folded) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        let start = Instant::now();
        std::hint::black_box(FrameState::join_all(&states));
        join_all_ms.push(start.elapsed().as_secs_f64() * 1e3);
        let start = Instant::now();
        let mut acc = FrameState::new();
        for s in &states {
            acc.join(s);
        }
        std::hint::black_box(&acc);
        folded.push(start.elapsed().as_secs_f64() * 1e3);
    }
    join_all_ms.sort_by(f64::total_cmp);
    folded.sort_by(f64::total_cmp);
    (percentile(&join_all_ms, 50), percentile(&folded, 50))
}

const JOIN_RANKS: u64 = 64;
const JOIN_SOURCES: usize = 1000;

/// Runs `ccol bench`.
pub(crate) fn bench(args: &BenchArgs) -> ExitCode {
    match bench_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccol bench: {e:#}");
            if e.downcast_ref::<Interrupted>().is_some() {
                ExitCode::from(130)
            } else if e.downcast_ref::<Usage>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

fn bench_inner(args: &BenchArgs) -> anyhow::Result<()> {
    let engine = match args.engine.as_deref() {
        Some(e @ ("gloo" | "in-process")) => e,
        Some(other) => {
            return Err(Usage(format!("--engine {other}: expected gloo or in-process")).into())
        }
        None if cfg!(feature = "gloo") => "gloo",
        None => "in-process",
    };
    if engine == "gloo" && !cfg!(feature = "gloo") {
        return Err(Usage(
            "this ccol was built without Gloo (build with `--features gloo`, or pass --engine in-process)"
                .into(),
        )
        .into());
    }
    let out = match args.out.clone().or_else(default_out) {
        Some(o) => o,
        None => {
            return Err(Usage(
                "no cache directory to write to (CCOL_CACHE, XDG_CACHE_HOME and HOME are unset): pass --out DIR"
                    .into(),
            )
            .into())
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create", out.display()))?;
    let tmp = tempfile::Builder::new().prefix("ccol-bench-").tempdir()?;
    let script = tmp.path().join("pytorch_bench.py");
    std::fs::write(&script, PYTORCH_SCRIPT)?;
    let py = python(args);
    match &py {
        Some(p) => crate::oracle::require_torch(p).map_err(|e| Usage(format!("{e:#}")))?,
        None if !args.no_pytorch => eprintln!(
            "ccol bench: no PyTorch rows: no torch 2.13 found (CCOL_TORCH_PYTHON is unset and the cache has none: \
             ./scripts/test.sh or `. scripts/env.sh; eval \"$(scripts/setup-torch.sh)\"` installs it; or pass --python; \
             --no-pytorch hides this note)"
        ),
        None => {}
    }

    let mut engines: Vec<(&str, Option<&Path>)> = vec![(engine, None)];
    let c10d = c10d_worker(args);
    match &c10d {
        Some(p) => engines.push(("c10d", Some(p.as_path()))),
        None if !args.no_c10d && args.engine.as_deref() != Some("in-process") => eprintln!(
            "ccol bench: no c10d rows: examples/bench_c10d is not built (`cargo build --release -p \
             compiler-collectives-tch --example bench_c10d` with LIBTORCH set; --no-c10d hides this note)"
        ),
        None => {}
    }
    let mut rows = Vec::new();
    for &world in &args.ranks.0 {
        let theirs = match &py {
            Some(p) => {
                eprintln!(
                    "ccol bench: {} of PyTorch over gloo…",
                    crate::count(world, "rank", "ranks")
                );
                let dir = tmp.path().join(format!("pytorch-{world}"));
                std::fs::create_dir_all(&dir)?;
                Some(run_pytorch(args, p, &script, world, &dir)?)
            }
            None => None,
        };
        for &(engine, program) in &engines {
            eprintln!(
                "ccol bench: {} over {engine}…",
                crate::count(world, "rank", "ranks")
            );
            let dir = tmp.path().join(format!("{engine}-{world}"));
            std::fs::create_dir_all(&dir)?;
            let ours = run_ours(args, engine, program, world, &dir)?;
            for (i, &sources) in args.sources.0.iter().enumerate() {
                rows.push(Row {
                    engine: engine.to_owned(),
                    world_size: world,
                    sources,
                    envelope_bytes: ours[0]["sizes"][i]["envelope_bytes"]
                        .as_u64()
                        .and_then(|b| usize::try_from(b).ok())
                        .unwrap_or(0),
                    ours: stat_of(&ours, i, "ours_ms"),
                    owned: stat_of(&ours, i, "owned_ms"),
                    floor: stat_of(&ours, i, "floor_ms"),
                    fast: stat_of(&ours, i, "fast_ms"),
                    floor16: stat_of(&ours, i, "floor16_ms"),
                    pytorch: theirs.as_ref().map(|t| stat_of(t, i, "pytorch_ms")),
                    torch_gloo16: theirs.as_ref().map(|t| stat_of(t, i, "torch_gloo16_ms")),
                    pickle_bytes: theirs
                        .as_ref()
                        .and_then(|t| t[0]["sizes"][i]["pickle_bytes"].as_u64()),
                    heap: heap_of(&ours, i),
                });
            }
        }
    }

    stop_if_interrupted()?;
    eprintln!("ccol bench: joins ({JOIN_RANKS} ranks × {JOIN_SOURCES} sources)…");
    let (our_join_ms, folded_join_ms) = our_join(JOIN_RANKS, JOIN_SOURCES);
    let their_join = match &py {
        Some(p) => {
            let out = tmp.path().join("join.json");
            let status = Command::new(p)
                .arg(&script)
                .arg("join")
                .arg("--sources")
                .arg(JOIN_SOURCES.to_string())
                .arg("--ranks")
                .arg(JOIN_RANKS.to_string())
                .arg("--pickle-sizes")
                .arg(join_list(&args.sources.0))
                .arg("--out")
                .arg(&out)
                .status()?;
            stop_if_interrupted()?;
            if !status.success() {
                bail!("PyTorch's join measurement failed ({status})");
            }
            Some(serde_json::from_str::<Value>(&std::fs::read_to_string(
                &out,
            )?)?)
        }
        None => None,
    };
    let their_join_ms = their_join.as_ref().and_then(|j| j["join_ms"].as_f64());

    let mut wire = Vec::new();
    for &s in &args.sources.0 {
        let ours = envelope_bytes(&bench_state(s, 1))?;
        let pickle = their_join
            .as_ref()
            .and_then(|j| j["pickle_bytes"][s.to_string()].as_u64());
        wire.push((s, ours, pickle));
    }

    let mut scale = Vec::new();
    if !args.no_scale {
        let timeout = Duration::from_secs(args.timeout.max(120));
        let mut n = 16u32;
        while n <= args.scale_max {
            for tree in [false, true] {
                if !tree && n > args.flat_max {
                    continue;
                }
                stop_if_interrupted()?;
                eprintln!(
                    "ccol bench: simulating {n} ranks ({})…",
                    if tree { "hierarchical" } else { "flat" }
                );
                scale.push(simulate(n, 20, tree, timeout)?);
            }
            n = n.saturating_mul(4);
        }
    }

    stop_if_interrupted()?;
    // Rows whose ranks ran this ccol, which counted nothing without the feature.
    let heap_note = (!HEAP_STATS && engine == "gloo").then_some(NO_HEAP_STATS);
    print_table(
        &rows,
        (our_join_ms, folded_join_ms),
        their_join_ms,
        &wire,
        &scale,
        heap_note,
    );
    let verdicts = targets(&rows, our_join_ms, their_join_ms, &wire, &scale);
    println!("\ntargets, measured in this run:");
    for t in &verdicts {
        println!(
            "  {:<4} {:<58} {}",
            match t.met {
                Some(true) => "met",
                Some(false) => "NOT",
                None => "-",
            },
            t.what,
            t.measured
        );
    }
    let mut report = to_json(
        args,
        engine,
        &rows,
        (our_join_ms, folded_join_ms),
        their_join_ms,
        &wire,
        &scale,
    );
    report["targets"] = verdicts
        .iter()
        .map(|t| json!({"target": t.what, "measured": t.measured, "met": t.met}))
        .collect();
    let json_path = out.join("bench.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("{}: cannot write", json_path.display()))?;
    let svg_path = out.join("latency.svg");
    chart(&rows, &svg_path)?;
    println!("\nwrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

/// One benchmark target and what this run measured for it.
struct Target {
    what: String,
    measured: String,
    /// `None` when this run could not measure it (e.g. no PyTorch side).
    met: Option<bool>,
}

fn target(what: impl Into<String>, values: &[f64], ok: impl Fn(f64) -> bool) -> Target {
    let shown: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
    Target {
        what: what.into(),
        measured: if shown.is_empty() {
            "-".into()
        } else {
            shown.join(", ")
        },
        met: (!values.is_empty()).then(|| values.iter().all(|&v| ok(v))),
    }
}

fn targets(
    rows: &[Row],
    our_join: f64,
    their_join: Option<f64>,
    wire: &[(usize, usize, Option<u64>)],
    scale: &[SimResult],
) -> Vec<Target> {
    let mut out = Vec::new();
    let mut engines: Vec<&str> = Vec::new();
    for r in rows {
        if !engines.contains(&r.engine.as_str()) {
            engines.push(r.engine.as_str());
        }
    }
    for e in engines {
        let of = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.engine == e)
                .filter_map(f)
                .collect()
        };
        out.push(target(
            format!("{e}: ours / raw floor <= 1.2 (every row)"),
            &of(&|r| Some(ratio(r.ours.p50, r.floor.p50))),
            |v| v <= 1.2,
        ));
        for (world, want) in [(2, 10.0), (4, 3.0)] {
            out.push(target(
                format!("{e}: PyTorch / ours >= {want} ({world} ranks, 200 sources)"),
                &of(&|r| {
                    (r.world_size == world && r.sources == 200)
                        .then_some(r.pytorch.map(|p| ratio(p.p50, r.ours.p50)))
                        .flatten()
                }),
                |v| v >= want,
            ));
        }
        out.push(target(
            format!("{e}: fast path / 16-byte all_gather <= 1.1 (every row)"),
            &of(&|r| Some(ratio(r.fast.p50, r.floor16.p50))),
            |v| v <= 1.1,
        ));
    }
    out.push(target(
        "join: PyTorch / ours >= 100 (64 ranks x 1000 sources)",
        &their_join
            .map(|t| ratio(t, our_join))
            .into_iter()
            .collect::<Vec<_>>(),
        |v| v >= 100.0,
    ));
    out.push(target(
        "wire: ours / pickle <= 0.25 (every state size)",
        &wire
            .iter()
            .filter_map(|(_, o, p)| p.map(|p| ratio(*o as f64, p as f64)))
            .collect::<Vec<_>>(),
        |v| v <= 0.25,
    ));
    let tree: Vec<&SimResult> = scale.iter().filter(|s| s.hierarchical).collect();
    out.push(target(
        "scale: hierarchical max bytes / (2 payload log2 N) <= 1",
        &tree
            .iter()
            .map(|s| {
                let bound = 2 * s.payload_bytes as u64 * u64::from(log2_ceil(s.world_size));
                ratio(s.max_received_bytes as f64, bound as f64)
            })
            .collect::<Vec<_>>(),
        |v| v <= 1.0,
    ));
    out.push(Target {
        what: "scale: 4096 simulated ranks complete".into(),
        measured: tree
            .iter()
            .find(|s| s.world_size >= 4096)
            .map_or("-".into(), |s| format!("{:.0} ms", s.exchange_ms)),
        // A world that fails to complete fails the whole run; not run = not measured.
        met: tree.iter().any(|s| s.world_size >= 4096).then_some(true),
    });
    out
}

fn log2_ceil(n: u32) -> u32 {
    32 - n.saturating_sub(1).leading_zeros()
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{x:.2}"))
}

/// The heap section's line for the Gloo rows of a ccol without `heap-stats`.
const NO_HEAP_STATS: &str =
    "gloo rows: not counted: this ccol was built without the `heap-stats` feature \
     (`cargo build --release -p compiler-collectives-cli --features gloo,heap-stats`)";

fn print_table(
    rows: &[Row],
    (our_join, folded_join): (f64, f64),
    their_join: Option<f64>,
    wire: &[(usize, usize, Option<u64>)],
    scale: &[SimResult],
    heap_note: Option<&str>,
) {
    println!("exchange + merge latency, ms (p50 / p90 over rounds; a round = the slowest rank)");
    println!(
        "{:>6} {:>5} {:>7} {:>8} | {:>15} {:>15} {:>15} | {:>10} {:>10} | {:>15} {:>15} {:>9} | {:>15}",
        "engine",
        "ranks",
        "sources",
        "bytes",
        "ours",
        "floor",
        "pytorch",
        "ours/flr",
        "torch/ours",
        "fast path",
        "16B gather",
        "fast/16B",
        "torch 16B"
    );
    for r in rows {
        let pair = |s: Stat| format!("{:.3} / {:.3}", s.p50, s.p90);
        println!(
            "{:>6} {:>5} {:>7} {:>8} | {:>15} {:>15} {:>15} | {:>10} {:>10} | {:>15} {:>15} {:>9} | {:>15}",
            r.engine,
            r.world_size,
            r.sources,
            r.envelope_bytes,
            pair(r.ours),
            pair(r.floor),
            r.pytorch.map_or("-".into(), pair),
            fmt_ratio(Some(ratio(r.ours.p50, r.floor.p50))),
            fmt_ratio(r.pytorch.map(|p| ratio(p.p50, r.ours.p50))),
            pair(r.fast),
            pair(r.floor16),
            fmt_ratio(Some(ratio(r.fast.p50, r.floor16.p50))),
            r.torch_gloo16.map_or("-".into(), pair),
        );
    }
    println!(
        "\nthe join as a new value (Channel::exchange; \"ours\" above joins into the rank's state, Channel::exchange_in_place)"
    );
    println!(
        "  {:>6} {:>5} {:>7} | {:>15} {:>10} {:>10}",
        "engine", "ranks", "sources", "new value", "new/flr", "new/ours"
    );
    for r in rows {
        println!(
            "  {:>6} {:>5} {:>7} | {:>15} {:>10} {:>10}",
            r.engine,
            r.world_size,
            r.sources,
            format!("{:.3} / {:.3}", r.owned.p50, r.owned.p90),
            fmt_ratio(Some(ratio(r.owned.p50, r.floor.p50))),
            fmt_ratio(Some(ratio(r.owned.p50, r.ours.p50))),
        );
    }
    let counted = rows.iter().any(|r| r.heap.is_some());
    if counted || heap_note.is_some() {
        println!(
            "\nheap per exchange of differing states, in place (median over rounds, the most of any rank)"
        );
    }
    if counted {
        println!(
            "  {:>6} {:>5} {:>7} {:>14} {:>12} {:>16}",
            "engine", "ranks", "sources", "bytes alloc'd", "allocations", "peak live bytes"
        );
        for r in rows {
            if let Some((bytes, count, peak)) = r.heap {
                println!(
                    "  {:>6} {:>5} {:>7} {bytes:>14} {count:>12} {peak:>16}",
                    r.engine, r.world_size, r.sources
                );
            }
        }
    }
    if let Some(note) = heap_note {
        println!("  {note}");
    }
    println!(
        "\njoin, {JOIN_RANKS} ranks × {JOIN_SOURCES} sources: ours {our_join:.3} ms (join_all; Join::join folded {folded_join:.3} ms), PyTorch {} ms, PyTorch/ours {}",
        their_join.map_or("-".into(), |t| format!("{t:.1}")),
        fmt_ratio(their_join.map(|t| ratio(t, our_join)))
    );
    println!(
        "\nwire bytes per state: sources, ours (envelope), pickle (all_gather_object), ours/pickle"
    );
    for (s, ours, pickle) in wire {
        println!(
            "  {s:>6} {ours:>9} {:>9} {:>7}",
            pickle.map_or("-".into(), |p| p.to_string()),
            fmt_ratio(pickle.map(|p| ratio(*ours as f64, p as f64)))
        );
    }
    if !scale.is_empty() {
        println!("\nscale (in-process ranks, 20-source states): one exchange");
        println!(
            "  {:>6} {:>12} {:>12} {:>18} {:>22}",
            "ranks", "exchange", "ms", "max bytes/rank", "2·payload·log2 N"
        );
        for s in scale {
            println!(
                "  {:>6} {:>12} {:>12.2} {:>18} {:>22}",
                s.world_size,
                if s.hierarchical {
                    "hierarchical"
                } else {
                    "flat"
                },
                s.exchange_ms,
                s.max_received_bytes,
                2 * s.payload_bytes as u64 * u64::from(log2_ceil(s.world_size))
            );
        }
    }
}

fn to_json(
    args: &BenchArgs,
    engine: &str,
    rows: &[Row],
    (our_join, folded_join): (f64, f64),
    their_join: Option<f64>,
    wire: &[(usize, usize, Option<u64>)],
    scale: &[SimResult],
) -> Value {
    json!({
        "engine": engine,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "exchange": rows.iter().map(|r| json!({
            "engine": r.engine,
            "world_size": r.world_size,
            "sources": r.sources,
            "envelope_bytes": r.envelope_bytes,
            "pickle_bytes": r.pickle_bytes,
            "ours_ms": r.ours.json(),
            "owned_ms": r.owned.json(),
            "floor_ms": r.floor.json(),
            "fast_ms": r.fast.json(),
            "floor16_ms": r.floor16.json(),
            "pytorch_ms": r.pytorch.map(Stat::json),
            "torch_gloo16_ms": r.torch_gloo16.map(Stat::json),
            "ours_over_floor": ratio(r.ours.p50, r.floor.p50),
            "pytorch_over_ours": r.pytorch.map(|p| ratio(p.p50, r.ours.p50)),
            "fast_over_floor16": ratio(r.fast.p50, r.floor16.p50),
            "heap_per_exchange": r.heap.map(|(bytes, count, peak)| json!({
                "allocated_bytes": bytes,
                "allocations": count,
                "peak_live_bytes": peak,
            })),
        })).collect::<Vec<_>>(),
        "join": {
            "ranks": JOIN_RANKS,
            "sources": JOIN_SOURCES,
            "ours_ms": our_join,
            "ours_folded_ms": folded_join,
            "pytorch_ms": their_join,
            "pytorch_over_ours": their_join.map(|t| ratio(t, our_join)),
        },
        "wire": wire.iter().map(|(s, o, p)| json!({
            "sources": s,
            "ours_bytes": o,
            "pickle_bytes": p,
            "ours_over_pickle": p.map(|p| ratio(*o as f64, p as f64)),
        })).collect::<Vec<_>>(),
        "scale": scale.iter().map(|s| json!({
            "world_size": s.world_size,
            "hierarchical": s.hierarchical,
            "exchange_ms": s.exchange_ms,
            "max_received_bytes": s.max_received_bytes,
            "payload_bytes": s.payload_bytes,
            "bound_bytes": 2 * s.payload_bytes as u64 * u64::from(log2_ceil(s.world_size)),
        })).collect::<Vec<_>>(),
    })
}

/// p50 latency against state size, log–log, one line per (series, world size).
fn chart(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs: Vec<f64> = rows.iter().map(|r| r.sources as f64).collect();
    let ys: Vec<f64> = rows
        .iter()
        .flat_map(|r| {
            [r.ours.p50, r.floor.p50, r.fast.p50]
                .into_iter()
                .chain(r.pytorch.map(|p| p.p50))
        })
        .filter(|y| *y > 0.0 && y.is_finite())
        .collect();
    let (x0, x1) = (
        xs.iter().copied().fold(f64::MAX, f64::min).max(1.0),
        xs.iter().copied().fold(1.0, f64::max),
    );
    let (y0, y1) = (
        ys.iter().copied().fold(f64::MAX, f64::min).min(1.0) * 0.5,
        ys.iter().copied().fold(0.001, f64::max) * 2.0,
    );
    let mut chart = ChartBuilder::on(&root)
        .caption("exchange + merge latency (p50)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("sources per state")
        .y_desc("ms")
        .draw()?;
    // One line per (engine, world size) and measurement; PyTorch's once per world size.
    let mut groups: Vec<(&str, usize)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.engine.as_str(), r.world_size)) {
            groups.push((r.engine.as_str(), r.world_size));
        }
    }
    let first_engine = groups.first().map(|g| g.0).unwrap_or_default();
    type Get = fn(&Row) -> Option<f64>;
    let kinds: [(&str, Get, RGBColor); 4] = [
        ("ours", |r| Some(r.ours.p50), RGBColor(0x1f, 0x77, 0xb4)),
        (
            "raw floor",
            |r| Some(r.floor.p50),
            RGBColor(0x2c, 0xa0, 0x2c),
        ),
        (
            "PyTorch",
            |r| r.pytorch.map(|p| p.p50),
            RGBColor(0xd6, 0x27, 0x28),
        ),
        (
            "fast path",
            |r| Some(r.fast.p50),
            RGBColor(0x94, 0x67, 0xbd),
        ),
    ];
    let palette = [0u8, 0x55, 0x99];
    for (gi, &(engine, w)) in groups.iter().enumerate() {
        for (name, get, color) in &kinds {
            if *name == "PyTorch" && engine != first_engine {
                continue;
            }
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.world_size == w && r.engine == engine)
                .filter_map(|r| get(r).map(|y| (r.sources as f64, y)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            // Later groups: the same hue, lighter.
            let shade = palette[gi.min(palette.len() - 1)];
            let c = RGBColor(
                color.0.saturating_add(shade),
                color.1.saturating_add(shade),
                color.2.saturating_add(shade),
            );
            let ranks = crate::count(w, "rank", "ranks");
            let label = if *name == "PyTorch" {
                format!("PyTorch (torch gloo), {ranks}")
            } else {
                format!("{name} ({engine}), {ranks}")
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
