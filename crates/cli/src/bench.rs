//! `ccol bench`: exchange latency side by side with the raw engine floor and
//! with PyTorch's path, join throughput, wire size, the fast path, and the
//! scale simulation — one run, one table, one JSON file, one SVG chart.
//!
//! - Exchange (per world size in `--ranks`, per state size in `--sources`):
//!   the ranks run
//!   [`measure_exchange`](compiler_collectives_harness::benchmark::measure_exchange)
//!   — floor, ours, fast path and a 16-byte all_gather interleaved per round
//!   after a barrier. Over Gloo
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
//! Output: the tables on stdout (`report`, each drawn by `table`'s one
//! renderer; as Markdown with `--markdown`), `bench.json` (`json`) and
//! `latency.svg` (`chart`) in `--out` (default: `bench/` in the project's
//! cache directory, [`default_out`]), and a last line saying where they
//! are. The ranks are started and read back by `ranks`; what they measured
//! is `measured`'s plain values.
//!
//! `--from FILE` measures nothing: it reads a `bench.json` back and draws
//! its tables again, after a line saying which command measured them, when
//! and on what machine (`json::Run`). `ccol bench --from bench.json
//! --markdown` is how docs/performance.md's generated section is made.
//!
//! Exit codes: 0 done; 1 a measurement failed; 2 bad arguments, a Python
//! without torch or a `--from` file that is not a readable bench.json; 130
//! interrupted (the ranks are stopped, temporary files
//! removed).

use anyhow::{bail, Context as _};
use clap::Args;
use compiler_collectives::Join;
use compiler_collectives_harness::benchmark::{bench_state, envelope_bytes, simulate, SimResult};
use json::Run;
use measured::{percentile, Joins, Results, Row, Wire, JOIN_RANKS, JOIN_SOURCES};
use ranks::{c10d_worker, join_list, python, run_ours, run_pytorch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};
use table::Format;

mod chart;
mod json;
mod measured;
mod ranks;
mod report;
mod table;

pub(crate) use ranks::worker;

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
    /// Measure nothing: draw the tables of this bench.json (written by an
    /// earlier run), after a line saying which run measured them.
    #[arg(
        long,
        value_name = "BENCH_JSON",
        conflicts_with_all = [
            "ranks", "sources", "rounds", "warmup", "engine", "out", "no_pytorch", "python",
            "no_scale", "flat_max", "scale_max", "c10d_worker", "no_c10d", "timeout",
        ]
    )]
    from: Option<PathBuf>,
    /// Draw the tables as Markdown (GitHub's tables) instead of aligned text.
    #[arg(long)]
    markdown: bool,
}

impl BenchArgs {
    fn format(&self) -> Format {
        if self.markdown {
            Format::Markdown
        } else {
            Format::Text
        }
    }
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
const HEAP_STATS: bool = cfg!(feature = "heap-stats");

/// The heap section's line for the Gloo rows of a ccol without `heap-stats`.
const NO_HEAP_STATS: &str =
    "gloo rows: not counted: this ccol was built without the `heap-stats` feature \
     (`cargo build --release -p compiler-collectives-cli --features gloo,heap-stats`)";

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

/// Where `ccol bench` writes without `--out`: `bench` in the project's cache
/// directory.
fn default_out() -> Option<PathBuf> {
    crate::cache::cache_dir().map(|cache| cache.join("bench"))
}

/// Ends the run between two measurements when a signal arrived: once the
/// first launcher ran, Ctrl-C no longer ends this process by itself.
fn stop_if_interrupted() -> anyhow::Result<()> {
    if crate::launch::interrupted() {
        return Err(Interrupted.into());
    }
    Ok(())
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

fn bench_inner(args: &BenchArgs) -> anyhow::Result<()> {
    if let Some(file) = &args.from {
        return redraw(file, args.format());
    }
    let (started, run) = (Instant::now(), Run::start());
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
            for size in args.sources.0.iter().copied().enumerate() {
                rows.push(Row::read(engine, world, size, &ours, theirs.as_deref()));
            }
        }
    }

    stop_if_interrupted()?;
    let (joins, their_join) = measure_joins(args, py.as_deref(), &script, tmp.path())?;
    let mut wire = Vec::new();
    for &sources in &args.sources.0 {
        wire.push(Wire {
            sources,
            ours_bytes: envelope_bytes(&bench_state(sources, 1))?,
            pickle_bytes: their_join
                .as_ref()
                .and_then(|j| j["pickle_bytes"][sources.to_string()].as_u64()),
        });
    }
    let scale = measure_scale(args)?;

    stop_if_interrupted()?;
    let results = Results {
        rows,
        joins,
        wire,
        scale,
        // Rows whose ranks ran this ccol, which counted nothing without the feature.
        heap_note: (!HEAP_STATS && engine == "gloo").then(|| NO_HEAP_STATS.to_owned()),
    };
    let targets = report::targets(&results);
    print!("{}", report::render(&results, &targets, args.format()));
    let run = run.finish(started);
    let json = json::to_json(args, engine, &run, &results, &targets);
    let json_path = out.join("bench.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&json)?)
        .with_context(|| format!("{}: cannot write", json_path.display()))?;
    let svg_path = out.join("latency.svg");
    chart::draw(&results.rows, &svg_path)?;
    println!("\nwrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

/// `ccol bench --from FILE`: the tables of a bench.json, drawn again in
/// `format` (the targets judged again from its measurements, by the same
/// rules), after the line saying which run measured them.
fn redraw(file: &Path, format: Format) -> anyhow::Result<()> {
    let read = || -> anyhow::Result<(Results, Option<Run>)> {
        let text = std::fs::read_to_string(file).context("cannot read")?;
        let value: Value = serde_json::from_str(&text).context("not JSON")?;
        json::from_json(&value)
    };
    let (results, run) = read().map_err(|e| Usage(format!("--from {}: {e:#}", file.display())))?;
    if let Some(run) = run {
        println!("{}", run.describe());
    }
    print!(
        "{}",
        report::render(&results, &report::targets(&results), format)
    );
    Ok(())
}

/// Our joins, and PyTorch's under `py` (its `join` mode, which also gives
/// the pickle sizes of `--sources`: the JSON it wrote).
fn measure_joins(
    args: &BenchArgs,
    py: Option<&Path>,
    script: &Path,
    tmp: &Path,
) -> anyhow::Result<(Joins, Option<Value>)> {
    eprintln!("ccol bench: joins ({JOIN_RANKS} ranks × {JOIN_SOURCES} sources)…");
    let (ours_ms, folded_ms) = our_join(JOIN_RANKS, JOIN_SOURCES);
    let theirs = match py {
        Some(p) => {
            let out = tmp.join("join.json");
            let status = Command::new(p)
                .arg(script)
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
    let joins = Joins {
        ours_ms,
        folded_ms,
        pytorch_ms: theirs.as_ref().and_then(|j| j["join_ms"].as_f64()),
    };
    Ok((joins, theirs))
}

/// The scale simulation (none with `--no-scale`): 16, 64, … ranks up to
/// `--scale-max`, flat up to `--flat-max`, and hierarchical.
fn measure_scale(args: &BenchArgs) -> anyhow::Result<Vec<SimResult>> {
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
    Ok(scale)
}
