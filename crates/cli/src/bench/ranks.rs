//! The ranks of `ccol bench`: started through `ccol run` (the hidden `ccol
//! bench-worker`, the c10d worker, PyTorch's script) or as threads
//! (`in-process`), each writing its samples to `<prefix>-rank-<R>.json`,
//! read back here.

use super::{BenchArgs, Interrupted, WorkerArgs};
use crate::cache::cache_dir;
use anyhow::{bail, Context as _};
use compiler_collectives::{InProcessGroup, Transport};
use compiler_collectives_harness::benchmark::{measure_exchange, samples_json};
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

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
        super::HEAP_STATS.then_some(&compiler_collectives_harness::heap::COUNTER);
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
pub(super) fn run_ours(
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

pub(super) fn join_list(v: &[usize]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `--c10d-worker`, else the first `examples/bench_c10d` that is built:
/// beside this ccol (same target directory and profile), in
/// `$CARGO_TARGET_DIR/release`, in the cache's `target/release` (where the
/// scripts build; an installed ccol is not beside it). None with `--no-c10d`.
pub(super) fn c10d_worker(args: &BenchArgs) -> Option<PathBuf> {
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

pub(super) fn python(args: &BenchArgs) -> Option<PathBuf> {
    if args.no_pytorch {
        return None;
    }
    args.python.clone().or_else(crate::cache::torch_python)
}

pub(super) fn run_pytorch(
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
