//! `ccol trace FILES...`: lines up several ranks' trace files (JSON lines,
//! see `compiler_collectives::protocol::trace`) by sequence number, prints a table of
//! the exchanges around the first divergence and names it.
//!
//! Exit codes: 0 the traces agree; 1 they diverge; 2 a file cannot be read
//! or is not a trace.

use clap::Args;
use compiler_collectives::protocol::trace::{by_seq, first_divergence, read_trace, TraceRecord};
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The longest first line [`not_a_trace`] reads (a trace record is a few
/// hundred bytes).
const FIRST_LINE_MAX_BYTES: u64 = 1 << 20;

#[derive(Args, Debug)]
pub(crate) struct TraceArgs {
    /// Trace files (`rank-<r>.jsonl`), or directories of them.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Rows shown before the first divergence (before the last exchange
    /// when the traces agree).
    #[arg(long, default_value_t = 10)]
    context: u64,
}

/// The trace files among `paths`: files as given, and the `rank-*.jsonl`
/// files of directories, sorted by rank number.
fn trace_files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut in_dir: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| anyhow::anyhow!("{}: cannot list: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.file_name().is_some_and(|n| {
                        let n = n.to_string_lossy();
                        n.starts_with("rank-") && n.ends_with(".jsonl")
                    })
                })
                .collect();
            // By rank number, not by name: rank-10 after rank-9, not after rank-1.
            in_dir.sort_by_key(|f| {
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
                let rank = name.as_deref().and_then(|n| {
                    n.strip_prefix("rank-")?
                        .strip_suffix(".jsonl")?
                        .parse::<u64>()
                        .ok()
                });
                (rank.is_none(), rank, name)
            });
            files.extend(in_dir);
        } else {
            files.push(p.clone());
        }
    }
    if files.is_empty() {
        anyhow::bail!("no trace files found");
    }
    Ok(files)
}

pub(crate) fn run(args: &TraceArgs) -> ExitCode {
    match compare(args) {
        Ok(true) => ExitCode::FAILURE,
        Ok(false) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccol: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Why a file in which [`read_trace`] found no record is not a trace, or
/// `None` when it is one without exchanges (empty or blank: a channel that
/// never exchanged). `read_trace` takes an unparsable last line without its
/// newline for a write cut short; when that line is the file's only content,
/// the file was never a trace.
fn not_a_trace(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).ok()?;
    let mut reader = BufReader::new(file.take(FIRST_LINE_MAX_BYTES));
    let mut line = Vec::new();
    for number in 1u64.. {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line.iter().all(u8::is_ascii_whitespace) => continue,
            Ok(_) => {}
        }
        return serde_json::from_slice::<TraceRecord>(&line)
            .err()
            .map(|e| format!("line {number}: not a trace record: {e}"));
    }
    None
}

/// `1 trace`, `2 traces`.
fn traces_count(n: usize) -> String {
    crate::count(n, "trace", "traces")
}

/// One table cell: `outcome [fast] 'key' (kind)`, at most 44 characters.
fn cell(r: Option<&TraceRecord>) -> String {
    let Some(r) = r else {
        return "-".into();
    };
    let fast = match r.fast_path {
        Some(true) => " fast",
        _ => "",
    };
    let mut s = format!("{}{fast} '{}' ({})", r.outcome, r.key, r.kind);
    if s.chars().count() > 44 {
        s = s.chars().take(43).collect::<String>() + "…";
    }
    s
}

/// Prints the table and the verdict; `Ok(true)` when the traces diverge.
fn compare(args: &TraceArgs) -> anyhow::Result<bool> {
    let files = trace_files(&args.files)?;
    let mut traces = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let records = read_trace(f)?;
        if records.is_empty() {
            if let Some(why) = not_a_trace(f) {
                anyhow::bail!(
                    "trace {}: {why} (a trace is the rank-<r>.jsonl that `--trace DIR` or \
                     CCOL_TRACE_DIR writes, one JSON record per line)",
                    f.display()
                );
            }
        }
        let rank = records
            .first()
            .map_or(u32::try_from(i).unwrap_or(u32::MAX), |r| r.rank);
        traces.push((rank, records));
    }
    // A directory reused by a run with fewer ranks keeps the old run's files
    // of the ranks above: rank 0's trace says the world size.
    if let Some(world) = traces
        .iter()
        .find(|(r, t)| *r == 0 && !t.is_empty())
        .and_then(|(_, t)| t.first().map(|rec| rec.world_size))
    {
        traces.retain(|(rank, _)| {
            let keep = *rank < world;
            if !keep {
                println!(
                    "ignoring the trace of rank {rank}: rank 0's trace is of a world of {world} \
                     (a file left by an earlier run?)"
                );
            }
            keep
        });
    }
    let divergence = first_divergence(&traces);
    let by_seq = by_seq(traces.as_slice());
    let last = by_seq
        .iter()
        .filter_map(|m| m.keys().next_back().copied())
        .max();
    let Some(last) = last else {
        println!("{}, no exchanges", traces_count(traces.len()));
        return Ok(false);
    };
    let (from, to) = match &divergence {
        Some(d) => (
            d.seq.saturating_sub(args.context),
            d.seq.saturating_add(2).min(last),
        ),
        None => (last.saturating_sub(args.context), last),
    };
    print!("{:>6}", "seq");
    for (rank, _) in &traces {
        print!("  {:<44}", format!("rank {rank}"));
    }
    println!();
    if from > 0 {
        println!("{:>6}", "…");
    }
    for seq in from..=to {
        print!("{:>6}", format!("#{seq}"));
        for m in &by_seq {
            print!("  {:<44}", cell(m.get(&seq).copied()));
        }
        if divergence.as_ref().is_some_and(|d| d.seq == seq) {
            print!("  <== first divergence");
        }
        println!();
    }
    match divergence {
        Some(d) => {
            println!("{d}");
            Ok(true)
        }
        None => {
            if traces.len() == 1 {
                println!("1 trace (#0..#{last}): no other rank's trace to compare it with");
            } else {
                println!(
                    "{} traces agree on every exchange (#0..#{last})",
                    traces.len()
                );
            }
            Ok(false)
        }
    }
}
