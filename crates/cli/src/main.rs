//! `ccol`: the command-line tool of compiler-collectives.
//!
//! - `ccol scenario run FILE` runs one scenario file over in-process ranks
//!   (one thread per rank) and prints what each rank compiled.
//! - `ccol scenario check [FILE|DIR]...` runs every mode each file has an
//!   expectation for and compares (the embedded corpus when no path is given).
//! - `ccol scenario schema` prints the JSON Schema of scenario files.
//! - `ccol scenario compare FILE|DIR...` runs files on ours and on real
//!   PyTorch 2.13 (`tests/pytorch-oracle`) and shows the differences.
//! - `ccol run --nproc-per-node N CMD ARGS...` starts N local ranks of a
//!   command with torchrun's environment (see the `launch` module).
//! - `ccol bench`: exchange latency against the raw engine floor and
//!   PyTorch, joins, wire size, fast path, scale (see the `bench` module).
//! - `ccol demo` (feature `gloo`): the main job, N rank processes over Gloo
//!   agreeing on a real text corpus (see the `demo` module).
//! - `ccol profile show|merge|diff` reads profiles (persisted decisions, see
//!   the `profile_cmd` module); `ccol trace FILES...` lines up ranks' trace
//!   files and names the first exchange where they diverge (`trace_cmd`).
//!
//! Exit codes of `ccol scenario`: 0 success; 1 an expectation did not hold;
//! 2 a malformed file or bad arguments; 3 a rank failed (timeout, desync,
//! lost peer). `ccol run` exits 0 when every rank succeeds, with the first
//! failed rank's exit code (1 when it has none in 1..=255), 2 on bad arguments
//! or a command that cannot be started, and 130 when interrupted.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use compiler_collectives::persistence::profile::ProfileStore;
use compiler_collectives::protocol::{parse_timeout_secs, timeout_from_env};
use compiler_collectives_harness::scenario::{
    check_expectation, run_in_process, run_in_process_with, Mode, RunOptions, RunReport, Scenario,
    ScenarioLimits, RUNNER_TIMEOUT,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod bench;
mod cache;

/// With the `heap-stats` feature only: counts allocations for `ccol bench`'s
/// figures per exchange (see `compiler_collectives_harness::heap` and
/// `bench::HEAP_STATS`). Without it ccol uses the system allocator as is.
#[cfg(feature = "heap-stats")]
#[global_allocator]
static HEAP: compiler_collectives_harness::heap::CountingAlloc =
    compiler_collectives_harness::heap::CountingAlloc;
mod demo;
mod launch;
mod oracle;
mod profile_cmd;
mod trace_cmd;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

#[derive(Parser, Debug)]
#[command(
    name = "ccol",
    version,
    about = "compiler-collectives: make every rank's JIT compiler take the same decisions"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Scenario files: one multi-rank job each (docs/scenarios.md).
    #[command(subcommand)]
    Scenario(ScenarioCmd),
    /// Start N local ranks of a command, like `torchrun --standalone
    /// --nproc-per-node N --no-python CMD ARGS...`.
    Run(launch::LaunchArgs),
    /// The main job: N rank processes over Gloo agree on a real corpus.
    Demo(demo::DemoArgs),
    /// One rank of `ccol demo` (started by it).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Benchmarks: exchange latency against the raw engine floor and PyTorch,
    /// joins, wire size, fast path, scale (writes bench.json and latency.svg;
    /// `--from bench.json [--markdown]` draws a run's tables again).
    Bench(bench::BenchArgs),
    /// One rank of `ccol bench` (started by it).
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
    /// Lattice cases on stdin, our joins and decisions on stdout (the randomized differential).
    #[command(hide = true)]
    LatticeEval(oracle::LatticeEvalArgs),
    /// Profiles: decisions persisted across runs (PGO).
    #[command(subcommand)]
    Profile(profile_cmd::ProfileCmd),
    /// Line up ranks' trace files by exchange and name the first divergence.
    Trace(trace_cmd::TraceArgs),
    /// Saves entries one by one into a profile store (crash-safety tests).
    #[command(hide = true)]
    ProfileWriter(profile_cmd::WriterArgs),
}

#[derive(Subcommand, Debug)]
enum ScenarioCmd {
    /// Run one scenario over in-process ranks and print each rank's compiles.
    Run(RunArgs),
    /// Run every mode a file has an expectation for, and compare.
    Check(CheckArgs),
    /// Print the JSON Schema of scenario files.
    Schema,
    /// Run files through ccol and real PyTorch Dynamo, and print the differences.
    Compare(oracle::CompareArgs),
}

#[derive(Args, Debug)]
struct ModeFlags {
    /// Compiler collectives on (overrides the file).
    #[arg(long, overrides_with = "no_collectives")]
    collectives: bool,
    /// Compiler collectives off (overrides the file).
    #[arg(long, overrides_with = "collectives")]
    no_collectives: bool,
    /// Guard votes on: any rank's miss makes every rank recompile.
    #[arg(long, overrides_with = "no_guard_collectives")]
    guard_collectives: bool,
    /// Guard votes off.
    #[arg(long, overrides_with = "guard_collectives")]
    no_guard_collectives: bool,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The scenario file (JSON).
    file: PathBuf,
    #[command(flatten)]
    mode: ModeFlags,
    /// Deadline of each exchange, in seconds (default: CCOL_TIMEOUT_S, else 10).
    #[arg(long, value_name = "S")]
    timeout: Option<String>,
    /// Print one line of JSON (keys sorted) instead of a table.
    #[arg(long)]
    json: bool,
    /// Load and save decisions in this profile directory (a restarted run
    /// starts from what earlier runs decided). Default: CCOL_PROFILE_DIR/<job
    /// id> when CCOL_PROFILE_DIR is set (job id: CCOL_JOB_ID, else
    /// TORCHELASTIC_RUN_ID); else no profile.
    #[arg(long, value_name = "DIR")]
    profile: Option<PathBuf>,
    /// Write each rank's exchange trace to DIR/rank-<r>.jsonl (see `ccol
    /// trace`). Default: CCOL_TRACE_DIR when set; else no trace files.
    #[arg(long, value_name = "DIR")]
    trace: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// Scenario files or directories of them; none = the corpus built into ccol.
    paths: Vec<PathBuf>,
    /// Deadline of each exchange, in seconds (default: CCOL_TIMEOUT_S, else 10).
    #[arg(long, value_name = "S")]
    timeout: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // RUST_LOG, CCOL_LOG_FORMAT: the library's `tracing` events on stderr.
    compiler_collectives_harness::logging::init();
    // Rank processes (and the launcher, which must outlive a closed pipe to
    // stop its ranks) keep Rust's default of ignoring SIGPIPE: Gloo writes to
    // sockets whose peer may have died, and must see EPIPE, not die of it.
    if !matches!(
        cli.command,
        Command::DemoWorker(_) | Command::BenchWorker(_) | Command::Run(_)
    ) {
        restore_sigpipe();
    }
    match cli.command {
        Command::Scenario(ScenarioCmd::Run(args)) => run(&args),
        Command::Scenario(ScenarioCmd::Check(args)) => check(&args),
        Command::Run(args) => launch::run(&args),
        Command::Demo(args) => demo::demo(&args),
        Command::DemoWorker(args) => demo::worker(&args),
        Command::Bench(args) => bench::bench(&args),
        Command::BenchWorker(args) => bench::worker(&args),
        Command::LatticeEval(args) => oracle::lattice_eval(&args),
        Command::Profile(cmd) => profile_cmd::run(&cmd),
        Command::Trace(args) => trace_cmd::run(&args),
        Command::ProfileWriter(args) => profile_cmd::writer(&args),
        Command::Scenario(ScenarioCmd::Compare(args)) => oracle::compare(&args),
        Command::Scenario(ScenarioCmd::Schema) => {
            println!("{}", embedded::SCHEMA.trim_end());
            ExitCode::SUCCESS
        }
    }
}

/// Lets a closed output pipe (`ccol ... | head`) end the process quietly, as
/// it does other Unix tools, instead of a panic in `println!`. Only for
/// commands that do no network I/O of their own.
fn restore_sigpipe() {
    #[cfg(unix)]
    {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: called first thing in `main`, before any thread exists;
        // SIG_DFL installs no Rust code as a handler.
        if let Err(e) = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) } {
            eprintln!("ccol: warning: cannot restore SIGPIPE: {e}");
        }
    }
}

/// `n` and the noun in the number `n` takes: `count(1, "step", "steps")` is
/// `1 step`, `count(3, "step", "steps")` is `3 steps`.
pub(crate) fn count(n: impl TryInto<u64>, one: &str, many: &str) -> String {
    let n: u64 = n.try_into().unwrap_or(u64::MAX);
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `--rounds`, `--steps`, …: a whole number of at least 1.
pub(crate) use compiler_collectives_harness::args::at_least_one;

/// The word for a list of ranks: `rank` before one, `ranks` before several.
pub(crate) fn ranks_word<T>(ranks: &[T]) -> &'static str {
    if ranks.len() == 1 {
        "rank"
    } else {
        "ranks"
    }
}

/// Exit code of a malformed file or bad arguments.
const EXIT_MALFORMED: u8 = 2;
/// Exit code of a run in which a rank failed.
const EXIT_RANK_FAILED: u8 = 3;

fn runner_timeout(flag: Option<&str>) -> anyhow::Result<Duration> {
    if let Some(t) = flag {
        return parse_timeout_secs(t).context("--timeout");
    }
    Ok(timeout_from_env()?.unwrap_or(RUNNER_TIMEOUT))
}

fn run(args: &RunArgs) -> ExitCode {
    let timeout = match runner_timeout(args.timeout.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ccol: {e:#}");
            return ExitCode::from(EXIT_MALFORMED);
        }
    };
    let scenario = match Scenario::from_file(&args.file, &ScenarioLimits::default()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ccol: {e}");
            return ExitCode::from(EXIT_MALFORMED);
        }
    };
    let (mut collectives, mut votes) = scenario.default_mode().flags();
    if args.mode.collectives {
        collectives = true;
    }
    if args.mode.no_collectives {
        collectives = false;
    }
    if args.mode.guard_collectives {
        votes = true;
    }
    if args.mode.no_guard_collectives {
        votes = false;
    }
    let mode = Mode::from_flags(collectives, votes);
    let mut options = RunOptions::default();
    let store = match &args.profile {
        Some(dir) => ProfileStore::open(dir).map(Some),
        None => ProfileStore::from_env(),
    };
    match store {
        Ok(store) => options.profile = store,
        Err(e) => {
            eprintln!("ccol: {e}");
            return ExitCode::from(EXIT_MALFORMED);
        }
    }
    options.trace_dir = args
        .trace
        .clone()
        .or_else(compiler_collectives::protocol::trace::trace_dir_from_env);
    let report = match run_in_process_with(&scenario, mode, timeout, &options) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ccol: {}: {e}", args.file.display());
            let code = if matches!(e, compiler_collectives::Error::InvalidArgument(_)) {
                EXIT_MALFORMED
            } else {
                EXIT_RANK_FAILED
            };
            return ExitCode::from(code);
        }
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print_table(&scenario, &report);
    }
    if report.failed() {
        ExitCode::from(EXIT_RANK_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_table(scenario: &Scenario, report: &RunReport) {
    println!(
        "scenario '{}': {}, {}, mode {}",
        scenario.name,
        count(scenario.world_size, "rank", "ranks"),
        count(scenario.steps.len(), "step", "steps"),
        report.mode
    );
    println!(
        "{:>5}  {:>8}  {:<16}  {:<24}  {:<16}  error",
        "rank", "compiles", "compile steps", "dynamic", "dynamic strides"
    );
    for r in &report.ranks {
        let mut dynamic: Vec<String> = r
            .dynamic_dims
            .iter()
            .map(|(s, d)| format!("{s}{d:?}"))
            .collect();
        dynamic.extend(r.dynamic_scalars.iter().map(|s| format!("{s}:scalar")));
        let strides: Vec<String> = r
            .dynamic_strides
            .iter()
            .map(|(s, d)| format!("{s}{d:?}"))
            .collect();
        let or_dash = |v: Vec<String>| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(" ")
            }
        };
        println!(
            "{:>5}  {:>8}  {:<16}  {:<24}  {:<16}  {}",
            r.rank,
            r.compile_steps.len(),
            format!("{:?}", r.compile_steps),
            or_dash(dynamic),
            or_dash(strides),
            r.error
                .as_ref()
                .map_or("-".to_string(), |e| e.message.clone())
        );
        if let Some(a) = &r.artifacts {
            println!(
                "{:>5}  backend compiles {} at {:?}, loaded {} at {:?}, disk hits at {:?}",
                "",
                a.compiled_steps.len(),
                a.compiled_steps,
                a.loaded_steps.len(),
                a.loaded_steps,
                a.disk_hit_steps
            );
        }
    }
}

/// One scenario to check: where it came from, and its text.
struct Source {
    label: String,
    text: Vec<u8>,
}

fn collect_sources(paths: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    if paths.is_empty() {
        return Ok(embedded::SCENARIOS
            .iter()
            .map(|(name, text)| Source {
                label: format!("<built-in>/{name}"),
                text: text.as_bytes().to_vec(),
            })
            .collect());
    }
    let files = scenario_files(paths)?;
    files
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read(&f).with_context(|| format!("{}: cannot read", f.display()))?;
            Ok(Source {
                label: f.display().to_string(),
                text,
            })
        })
        .collect()
}

/// The scenario files among `paths`: files as given, and the `*.json` files
/// (not `*.schema.json`) of directories, sorted by name.
pub(crate) fn scenario_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("{}: cannot list", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| is_scenario_file(f))
                .collect();
            in_dir.sort();
            files.extend(in_dir);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

fn is_scenario_file(p: &Path) -> bool {
    p.extension().is_some_and(|x| x == "json")
        && !p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(".schema.json"))
}

fn check(args: &CheckArgs) -> ExitCode {
    let timeout = match runner_timeout(args.timeout.as_deref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ccol: {e:#}");
            return ExitCode::from(EXIT_MALFORMED);
        }
    };
    let sources = match collect_sources(&args.paths) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ccol: {e:#}");
            return ExitCode::from(EXIT_MALFORMED);
        }
    };
    let limits = ScenarioLimits::default();
    let (mut passed, mut failed, mut malformed) = (0u32, 0u32, 0u32);
    for src in &sources {
        let scenario = match Scenario::from_slice(&src.text, &src.label, &limits) {
            Ok(s) => s,
            Err(e) => {
                println!("MALFORMED {e}");
                malformed += 1;
                continue;
            }
        };
        if scenario.expect.is_empty() {
            println!("SKIP {} ('{}'): no expectations", src.label, scenario.name);
            continue;
        }
        for &mode in scenario.expect.keys() {
            let outcome = run_in_process(&scenario, mode, timeout)
                .map(|report| check_expectation(&scenario, &report).unwrap_or_default());
            match outcome {
                Ok(diffs) if diffs.is_empty() => {
                    println!("ok   {:<40} {mode}", scenario.name);
                    passed += 1;
                }
                Ok(diffs) => {
                    println!("FAIL {:<40} {mode} ({})", scenario.name, src.label);
                    for d in diffs {
                        println!("       {d}");
                    }
                    failed += 1;
                }
                Err(e) => {
                    println!("FAIL {:<40} {mode}: {e}", scenario.name);
                    failed += 1;
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if passed + failed + malformed == 0 {
        eprintln!("ccol: no scenario with expectations found");
        return ExitCode::from(EXIT_MALFORMED);
    }
    if malformed > 0 {
        ExitCode::from(EXIT_MALFORMED)
    } else if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
