//! `ccol demo`: the main job. N rank processes over Gloo on this host read
//! their shard of a real text corpus, batch it like a DistributedSampler
//! loader, and drive the reference compile cache step by step; with compiler
//! collectives every rank takes the same decisions.
//!
//! The parent starts the ranks through `ccol run` (so they get torchrun's
//! environment and the launcher's failure handling); each rank runs the
//! hidden `ccol demo-worker`, which writes its report to a results directory
//! that the parent reads and prints. The ranks rendezvous through the
//! launcher's TCPStore, as they would under torchrun's agent.

use crate::{count, print_table, ranks_word};
use clap::Args;
use compiler_collectives_harness::corpus::{CorpusOptions, Tokenizer};
use compiler_collectives_harness::scenario::{Mode, RankError, RankReport, RunReport};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Exit code of a run in which a rank failed.
const EXIT_RANK_FAILED: u8 = 3;
/// Exit code of bad arguments or a missing backend.
const EXIT_USAGE: u8 = 2;
/// Exit code after Ctrl-C / SIGTERM / SIGHUP (128 + SIGINT, as `ccol run`).
const EXIT_INTERRUPTED: u8 = 130;

/// The corpus and batching options shared by `demo` and `demo-worker`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DataArgs {
    /// Corpus directory: every regular file in it is a document
    /// (default: /usr/share/common-licenses, on every Debian system).
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Tokeniser: `words` (whitespace-separated words) or `chars` (Unicode scalar values).
    #[arg(long, default_value = "words")]
    tokenizer: Tokenizer,
    /// Samples per batch on each rank.
    #[arg(long, default_value_t = 4, value_parser = crate::at_least_one::<u64>)]
    batch_size: u64,
    /// Longest sequence, in tokens (longer paragraphs are truncated).
    #[arg(long, default_value_t = 64, value_parser = crate::at_least_one::<u64>)]
    max_seq_len: u64,
    /// Run only this many steps (default: one epoch).
    #[arg(long, value_parser = crate::at_least_one::<u64>)]
    steps: Option<u64>,
    /// Shuffle seed (the same on every rank, as with DistributedSampler).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Compiler collectives off (then guard votes are off too unless asked for).
    #[arg(long)]
    no_collectives: bool,
    /// Guard votes off (on by default with collectives).
    #[arg(long, overrides_with = "guard_collectives")]
    no_guard_collectives: bool,
    /// Guard votes on.
    #[arg(long, overrides_with = "no_guard_collectives")]
    guard_collectives: bool,
    /// Deadline of each exchange, in seconds.
    #[arg(long, value_name = "S")]
    timeout: Option<String>,
}

impl DataArgs {
    fn mode(&self) -> Mode {
        let collectives = !self.no_collectives;
        let votes = if self.guard_collectives {
            true
        } else if self.no_guard_collectives {
            false
        } else {
            collectives
        };
        Mode::from_flags(collectives, votes)
    }

    fn corpus_options(&self, world_size: u32) -> CorpusOptions {
        let mut o = CorpusOptions::default()
            .with_world_size(world_size)
            .with_batch_size(self.batch_size)
            .with_max_seq_len(self.max_seq_len)
            .with_tokenizer(self.tokenizer)
            .with_seed(self.seed);
        o.steps = self.steps.and_then(|s| usize::try_from(s).ok());
        if let Some(d) = &self.corpus {
            o.dir.clone_from(d);
        }
        o
    }

    /// The arguments that reproduce these options for a worker.
    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--tokenizer".to_string(),
            self.tokenizer.name().to_string(),
            "--batch-size".into(),
            self.batch_size.to_string(),
            "--max-seq-len".into(),
            self.max_seq_len.to_string(),
            "--seed".into(),
            self.seed.to_string(),
        ];
        if let Some(c) = &self.corpus {
            a.push("--corpus".into());
            a.push(c.to_string_lossy().into_owned());
        }
        if let Some(s) = self.steps {
            a.push("--steps".into());
            a.push(s.to_string());
        }
        if self.no_collectives {
            a.push("--no-collectives".into());
        }
        if self.no_guard_collectives {
            a.push("--no-guard-collectives".into());
        }
        if self.guard_collectives {
            a.push("--guard-collectives".into());
        }
        if let Some(t) = &self.timeout {
            a.push("--timeout".into());
            a.push(t.clone());
        }
        a
    }
}

/// Arguments of `ccol demo`.
#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// Number of rank processes.
    #[arg(long = "nproc", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    nproc: u32,
    #[command(flatten)]
    data: DataArgs,
    /// Print one line of JSON (the scenario runner's output shape).
    #[arg(long)]
    json: bool,
}

/// Arguments of the hidden `ccol demo-worker`.
#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    /// Where to write `rank-<R>.json`.
    #[arg(long, value_name = "DIR")]
    results: PathBuf,
    #[command(flatten)]
    data: DataArgs,
}

/// Runs `ccol demo`.
pub(crate) fn demo(args: &DemoArgs) -> ExitCode {
    if !cfg!(feature = "gloo") {
        eprintln!(
            "ccol demo: this ccol was built without Gloo; run ./scripts/demo.sh \
             (or build with `cargo build -p compiler-collectives-cli --features gloo`)"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let opts = args.data.corpus_options(args.nproc);
    let (scenario, summary) = match compiler_collectives_harness::corpus::build_with_summary(&opts)
    {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ccol demo: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // Check the deadline here, once, rather than in every rank process.
    let timeout = match args.data.timeout.as_deref() {
        Some(t) => compiler_collectives::protocol::parse_timeout_secs(t).map(Some),
        None => compiler_collectives::protocol::timeout_from_env(),
    };
    let timeout = match timeout {
        Ok(t) => t.unwrap_or(compiler_collectives_harness::scenario::RUNNER_TIMEOUT),
        Err(e) => {
            eprintln!("ccol demo: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mode = args.data.mode();
    if !args.json {
        println!("{summary}");
        println!(
            "mode: {mode} — {} over Gloo (TCP on 127.0.0.1)\n",
            count(args.nproc, "rank process", "rank processes")
        );
    }
    let results = match tempfile::Builder::new().prefix("ccol-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ccol demo: cannot create a temporary directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ccol demo: cannot find this program's path: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = Command::new(&exe);
    // After a failure, give the other ranks their exchange deadline (plus a
    // second) to notice and report it before the launcher stops them.
    let stop_delay = timeout + std::time::Duration::from_secs(1);
    cmd.arg("run")
        .arg("--stop-delay")
        .arg(format!("{:.3}", stop_delay.as_secs_f64()))
        .arg("--nproc-per-node")
        .arg(args.nproc.to_string())
        .arg("--")
        .arg(&exe)
        .arg("demo-worker")
        .arg("--results")
        .arg(results.path())
        .args(args.data.to_args());
    // The ranks rendezvous through the launcher's TCPStore (MASTER_ADDR,
    // MASTER_PORT), unless CCOL_GLOO_STORE names another store: nothing is
    // left on disk, even when a rank is killed.
    // Ctrl-C / SIGTERM / SIGHUP: the launcher stops the ranks, then
    // `results` is removed on return.
    let status = match crate::launch::run_launcher(&mut cmd) {
        Ok((_, true)) => {
            eprintln!("ccol demo: interrupted; the ranks were stopped");
            return ExitCode::from(EXIT_INTERRUPTED);
        }
        Ok((s, false)) => s,
        Err(e) => {
            eprintln!("ccol demo: cannot start the ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ranks: Vec<RankReport> = (0..args.nproc)
        .map(|r| read_report(results.path(), r))
        .collect();
    let report = RunReport {
        name: scenario.name.clone(),
        mode,
        ranks,
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!();
        print_table(&scenario, &report);
        println!();
        print_agreement(&report);
    }
    if report.failed() || !status.success() {
        ExitCode::from(EXIT_RANK_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Reads a worker's report back (the JSON of [`RankReport::to_json`]).
fn read_report(dir: &Path, rank: u32) -> RankReport {
    let path = dir.join(format!("rank-{rank}.json"));
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            return RankReport::failed(
                rank,
                "no_report",
                format!("rank {rank} wrote no report ({e})"),
            )
        }
    };
    let v: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return RankReport::failed(
                rank,
                "no_report",
                format!("rank {rank}'s report is not JSON: {e}"),
            )
        }
    };
    let mut r = RankReport::new(rank);
    if let Some(m) = v["decided"].as_object() {
        for (k, d) in m {
            if let Some(text) = d.as_str() {
                r.decided.insert(k.clone(), text.to_owned());
            }
        }
    }
    r.compile_steps = v["compile_steps"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    if let Some(m) = v["dynamic"].as_object() {
        for (k, d) in m {
            match d {
                Value::String(_) => {
                    r.dynamic_scalars.insert(k.clone());
                }
                Value::Array(a) => {
                    let dims = a
                        .iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| usize::try_from(x).ok())
                        .collect();
                    r.dynamic_dims.insert(k.clone(), dims);
                }
                _ => {}
            }
        }
    }
    if let Some(m) = v["dynamic_strides"].as_object() {
        for (k, d) in m {
            let dims = d
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| usize::try_from(x).ok())
                        .collect()
                })
                .unwrap_or_default();
            r.dynamic_strides.insert(k.clone(), dims);
        }
    }
    if let Some(e) = v.get("error").filter(|e| e.is_object()) {
        r.error = Some(RankError {
            kind: e["kind"].as_str().unwrap_or("unknown").to_owned(),
            missing_ranks: e["missing_ranks"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_u64)
                        .filter_map(|x| u32::try_from(x).ok())
                        .collect()
                })
                .unwrap_or_default(),
            exchange: e["exchange"].as_u64(),
            message: e["message"].as_str().unwrap_or_default().to_owned(),
        });
    }
    r
}

/// Compile steps, and the decided dynamic dims per source.
type Agreed = (Vec<u64>, BTreeMap<String, String>);

/// What ranks must agree on: when they compile, and what the group decided
/// (before 0/1 specialisation, which may keep a size-1 dim static on the one
/// rank that sees 1 — PyTorch does the same).
fn agreed(r: &RankReport) -> Agreed {
    (r.compile_steps.clone(), r.decided.clone())
}

fn print_agreement(report: &RunReport) {
    let failed: Vec<u32> = report
        .ranks
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.rank)
        .collect();
    if !failed.is_empty() {
        println!(
            "{} {failed:?} failed (see the errors above); no decisions to compare",
            ranks_word(&failed)
        );
        return;
    }
    let first = report.ranks.first().map(agreed);
    if report.ranks.iter().all(|r| Some(agreed(r)) == first) {
        if report.ranks.len() == 1 {
            println!("1 rank: it took its decisions alone (run with --nproc 2 or more to see ranks agree)");
        } else {
            println!(
                "all {} ranks took the same decisions: they compile the same graphs at the same steps",
                report.ranks.len()
            );
        }
        for r in &report.ranks {
            for (source, dims) in &r.decided {
                let realised = r.dynamic_dims.get(source).map(|d| format!("{d:?}"));
                let scalar = r.dynamic_scalars.contains(source);
                if realised.as_deref() != Some(dims.as_str()) && !(scalar && dims == "scalar") {
                    println!(
                        "  (rank {}: {source} decided dynamic {dims}, compiled {} — a size of 0 or 1 \
                         stays specialised on the rank that sees it, as in PyTorch)",
                        r.rank,
                        realised.unwrap_or_else(|| "static".into())
                    );
                }
            }
        }
    } else {
        println!("the ranks DIVERGE: they compile different graphs at different steps:");
        let mut groups: Vec<(Agreed, Vec<u32>)> = Vec::new();
        for r in &report.ranks {
            let d = agreed(r);
            match groups.iter_mut().find(|(g, _)| *g == d) {
                Some((_, ranks)) => ranks.push(r.rank),
                None => groups.push((d, vec![r.rank])),
            }
        }
        for ((steps, decided), ranks) in groups {
            println!(
                "  {} {ranks:?}: compile steps {steps:?}, dynamic {decided:?}",
                ranks_word(&ranks)
            );
        }
        if report.mode == Mode::NoCollectives {
            println!(
                "(in a real job, different graphs issue different collectives: the job would hang; \
                 run without --no-collectives)"
            );
        }
    }
}

/// Runs one rank of the demo (`ccol demo-worker`, started by `ccol demo`).
pub(crate) fn worker(args: &WorkerArgs) -> ExitCode {
    match worker_inner(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ccol demo-worker: {e}");
            if let Some(core) = e.downcast_ref::<compiler_collectives::Error>() {
                let _ = compiler_collectives::launch::torchelastic::write_core_error_file(core);
            }
            // A rank that could not even join (bad environment, bad corpus)
            // is a usage error; one that failed while exchanging is not.
            let usage = e
                .downcast_ref::<compiler_collectives::Error>()
                .is_some_and(|c| matches!(c, compiler_collectives::Error::InvalidArgument(_)))
                || e.downcast_ref::<compiler_collectives_harness::corpus::CorpusError>()
                    .is_some();
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_RANK_FAILED })
        }
    }
}

#[cfg(feature = "gloo")]
fn worker_inner(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    use compiler_collectives::protocol::{parse_timeout_secs, timeout_from_env};
    use compiler_collectives::{Channel, ChannelOptions, Transport};
    use compiler_collectives_harness::scenario::RUNNER_TIMEOUT;
    use serde_json::json;
    let transport = compiler_collectives::gloo::from_env()?;
    let rank = transport.rank();
    let world = transport.world_size();
    let opts = args.data.corpus_options(world);
    let scenario = compiler_collectives_harness::corpus::build(&opts)?;
    let timeout = match &args.data.timeout {
        Some(t) => parse_timeout_secs(t)?,
        None => timeout_from_env()?.unwrap_or(RUNNER_TIMEOUT),
    };
    let mode = args.data.mode();
    let (collectives, votes) = mode.flags();
    let channel = if collectives || votes {
        Some(Channel::with_options(
            std::sync::Arc::new(transport),
            // CCOL_TRACE_DIR as the other `ccol` commands; the timeout above.
            ChannelOptions::from_env()?.with_timeout(timeout),
        )?)
    } else {
        None
    };
    // CCOL_PROFILE_DIR (with the run id `ccol run` and torchrun export): a
    // restarted job starts from the decisions its earlier runs saved.
    let profile = compiler_collectives::persistence::profile::ProfileStore::from_env()?;
    let report = compiler_collectives_harness::scenario::run_rank_with(
        &scenario,
        mode,
        rank,
        channel,
        profile.as_ref(),
    );
    let path = args.results.join(format!("rank-{rank}.json"));
    let mut out = report.to_json();
    if let Some(o) = out.as_object_mut() {
        o.insert("decided".into(), json!(report.decided));
    }
    std::fs::write(&path, out.to_string())
        .map_err(|e| anyhow::anyhow!("cannot write the report {}: {e}", path.display()))?;
    if let Some(e) = &report.error {
        eprintln!("rank {rank} failed: {}", e.message);
        let reported = compiler_collectives::launch::torchelastic::ErrorReport::new(
            format!("CompilerCollectivesError({})", e.kind),
            e.message.clone(),
        );
        if let Err(w) = reported.write_to_env() {
            eprintln!("rank {rank}: cannot write TORCHELASTIC_ERROR_FILE: {w}");
        }
        return Ok(ExitCode::from(EXIT_RANK_FAILED));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "gloo"))]
fn worker_inner(_args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("this ccol was built without Gloo")
}
