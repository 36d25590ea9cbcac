//! Structured logs of exchanges: one `tracing` span per exchange, and an
//! optional JSON-lines trace file per rank that `ccol trace` lines up across
//! ranks to find where they diverged.
//!
//! Every [`crate::Channel::exchange`] runs inside a `debug` span named
//! `exchange` (fields `seq`, `key`, `kind`) and ends with one event (target
//! `ccol::exchange`; `debug` on success, `warn` on error) carrying
//! `bytes_sent`, `bytes_received`, `duration_us`, `fast_path` and `outcome`.
//! Install any `tracing` subscriber to see them.
//!
//! # Trace files
//! With [`crate::ChannelOptions::trace_dir`] set (by hand, or from the
//! [`TRACE_DIR_ENV`] variable `CCOL_TRACE_DIR` through
//! [`crate::ChannelOptions::from_env`]), each channel writes `<dir>/rank-<r>.jsonl`:
//! one [`TraceRecord`] per exchange, one JSON object per line, written with
//! one `write` call per line (a killed rank leaves whole lines; a line cut
//! short by a full disk is skipped by [`read_trace`]). Opening a
//! channel truncates its rank's file: one file holds one channel's
//! exchanges. Growth is bounded: after [`TRACE_MAX_BYTES`] (64 MiB) a last
//! record with outcome `"trace_truncated"` is written and nothing more;
//! [`first_divergence`] compares only the exchanges before the first
//! truncation. A trace file that cannot be written never fails an exchange:
//! it is reported once as a `tracing` warning and then disabled.

use crate::error::{group_ranks, Error, RankGroup, Result};
use crate::protocol::envelope::EnvelopeRef;
use crate::protocol::join::Join;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Environment variable naming the directory of per-rank trace files.
pub const TRACE_DIR_ENV: &str = "CCOL_TRACE_DIR";

/// `CCOL_TRACE_DIR`, when set and not empty (read by
/// [`ChannelOptions::from_env`](crate::ChannelOptions::from_env)).
pub fn trace_dir_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os(TRACE_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
}
/// Largest trace file written, in bytes (64 MiB).
pub const TRACE_MAX_BYTES: u64 = 64 << 20;
/// Outcome of the last record of a trace that reached [`TRACE_MAX_BYTES`].
pub const TRUNCATED: &str = "trace_truncated";

/// One exchange as one rank saw it: a line of a trace file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// Sequence number of the exchange (0-based per channel).
    pub seq: u64,
    /// Compile key this rank exchanged under.
    pub key: String,
    /// Decision kind, e.g. `"shape.frame_state"`.
    pub kind: String,
    /// XXH3-64 of the configuration text, 16 hex digits.
    pub config_digest: String,
    /// XXH3-64 of this rank's payload, 16 hex digits (differs between ranks
    /// that saw different inputs; not a divergence).
    pub payload_digest: String,
    /// XXH3-64 of the merged value, 16 hex digits; the same on every rank
    /// after a successful exchange. `None` on error.
    pub merged_digest: Option<String>,
    /// Bytes this rank handed to the transport in the collective rounds
    /// that completed (a round that failed is not counted).
    pub bytes_sent: u64,
    /// Bytes this rank received from the transport (its own included) in
    /// the rounds that completed.
    pub bytes_received: u64,
    /// Wall time of the exchange, in microseconds.
    pub duration_us: u64,
    /// Whether the digest fast path applied; `None` on error.
    pub fast_path: Option<bool>,
    /// `"ok"`, an [`Error::kind`] (`"timeout"`, `"desync"`, …) or [`TRUNCATED`].
    pub outcome: String,
    /// The error's message, on error.
    pub error: Option<String>,
}

/// Bytes moved by one exchange, counted by the protocol.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Traffic {
    pub(crate) sent: u64,
    pub(crate) received: u64,
}

impl Traffic {
    /// Counts one all_gather: `sent` bytes out, `received` in.
    pub(crate) fn add(&mut self, sent: usize, received: usize) {
        self.sent += sent as u64;
        self.received += received as u64;
    }
}

/// One rank's open trace file (see the module docs).
#[derive(Debug)]
pub struct TraceFile {
    file: Option<File>,
    path: PathBuf,
    written: u64,
    max_bytes: u64,
}

impl TraceFile {
    /// Creates (truncates) `<dir>/rank-<rank>.jsonl`, creating `dir`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the path when it cannot be created.
    pub fn create(dir: &Path, rank: u32) -> Result<Self> {
        let path = dir.join(format!("rank-{rank}.jsonl"));
        let file = fs::create_dir_all(dir)
            .and_then(|()| File::create(&path))
            .map_err(|e| {
                Error::InvalidArgument(format!("trace file {}: cannot create: {e}", path.display()))
            })?;
        Ok(TraceFile {
            file: Some(file),
            path,
            written: 0,
            max_bytes: TRACE_MAX_BYTES,
        })
    }

    /// The trace file of a new channel in `dir`, none without one.
    pub(crate) fn for_channel(dir: Option<&Path>, rank: u32) -> Result<Option<Self>> {
        dir.map(|d| Self::create(d, rank)).transpose()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line (one `write` call).
    pub fn write(&mut self, record: &TraceRecord) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let mut line = match serde_json::to_vec(record) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "trace: cannot encode a record");
                return;
            }
        };
        line.push(b'\n');
        let full = self.written + line.len() as u64 > self.max_bytes;
        if full {
            let mut last = record.clone();
            last.outcome = TRUNCATED.into();
            last.error = Some(format!("trace file reached {} bytes", self.max_bytes));
            line = serde_json::to_vec(&last).unwrap_or_default();
            line.push(b'\n');
        }
        if let Err(e) = file.write_all(&line) {
            tracing::warn!(path = %self.path.display(), error = %e, "trace: cannot write; tracing to this file stops");
            self.file = None;
            return;
        }
        self.written += line.len() as u64;
        if full {
            self.file = None;
        }
    }
}

fn digest_hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// Reports one finished exchange: the `tracing` event (with `rank`, the
/// exchange's number `seq` and its `key`), and a record in the trace file
/// when there is one. `result` is the join and whether the fast path
/// applied, or the error. `env` is this rank's own envelope, decoded only
/// when there is a trace file (the exchange encoded it before anything
/// else).
#[allow(clippy::too_many_arguments)]
pub(crate) fn finish<J: Join>(
    trace: Option<&mut TraceFile>,
    env: Option<EnvelopeRef<'_>>,
    seq: u64,
    key: &str,
    rank: u32,
    world_size: u32,
    traffic: Traffic,
    elapsed: Duration,
    result: std::result::Result<(&J, bool), &Error>,
) {
    let duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let (outcome, fast_path) = match result {
        Ok((_, fast)) => ("ok", Some(fast)),
        Err(e) => (e.kind().as_str(), None),
    };
    // Which exchange: this rank, the exchange's number on its channel and
    // its compile key, so that a line read alone says where it failed.
    let exchange = seq;
    if result.is_ok() {
        tracing::debug!(target: "ccol::exchange", rank, exchange, key, bytes_sent = traffic.sent, bytes_received = traffic.received, duration_us, fast_path, outcome, "exchange done");
    } else {
        tracing::warn!(target: "ccol::exchange", rank, exchange, key, bytes_sent = traffic.sent, bytes_received = traffic.received, duration_us, outcome, "exchange failed");
    }
    let (Some(trace), Some(env)) = (trace, env) else {
        return;
    };
    let merged_digest = match result {
        Ok((merged, _)) => postcard::to_allocvec(merged).ok().map(|b| digest_hex(&b)),
        Err(_) => None,
    };
    trace.write(&TraceRecord {
        rank,
        world_size,
        seq: env.seq,
        key: env.key.to_owned(),
        kind: env.kind.to_owned(),
        config_digest: digest_hex(env.config.as_bytes()),
        payload_digest: digest_hex(env.payload),
        merged_digest,
        bytes_sent: traffic.sent,
        bytes_received: traffic.received,
        duration_us,
        fast_path,
        outcome: outcome.to_owned(),
        error: result.err().map(ToString::to_string),
    });
}

/// Largest trace file [`read_trace`] reads, in bytes (twice [`TRACE_MAX_BYTES`]).
pub const READ_MAX_BYTES: u64 = 2 * TRACE_MAX_BYTES;

/// Reads a JSON-lines trace file (blank lines ignored, and a last line cut
/// short before its newline).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the file (and line) when it cannot be
/// read, is over [`READ_MAX_BYTES`], or a line is not a [`TraceRecord`].
pub fn read_trace(path: &Path) -> Result<Vec<TraceRecord>> {
    let bad = |what: String| Error::InvalidArgument(format!("trace {}: {what}", path.display()));
    let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let len = file
        .metadata()
        .map_err(|e| bad(format!("cannot stat: {e}")))?
        .len();
    if len > READ_MAX_BYTES {
        return Err(bad(format!(
            "{len} bytes, over the limit of {READ_MAX_BYTES}"
        )));
    }
    let mut bytes = Vec::new();
    file.take(READ_MAX_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| bad(format!("cannot read: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(record) => out.push(record),
            // A last line without its newline is a write cut short (a full
            // disk): the records before it still count.
            Err(_) if line.last() != Some(&b'\n') => break,
            Err(e) => return Err(bad(format!("line {}: not a trace record: {e}", i + 1))),
        }
    }
    Ok(out)
}

/// The first exchange at which ranks' traces differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The sequence number of that exchange.
    pub seq: u64,
    /// Each group of ranks with what it did there, e.g.
    /// `#1 'step' (shape.frame_state) → ok` or `no exchange #1 (trace ends at #0)`.
    pub groups: Vec<RankGroup>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "first divergence at exchange #{}: ", self.seq)?;
        for (i, g) in self.groups.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let word = if g.ranks.len() == 1 { "rank" } else { "ranks" };
            write!(f, "{word} {}: {}", crate::RankList(&g.ranks), g.what)?;
        }
        Ok(())
    }
}

/// What a rank did at `seq`, as compared between ranks: key, kind,
/// configuration digest, outcome and merged digest (not the local payload,
/// which legitimately differs).
pub fn position(record: Option<&TraceRecord>, seq: u64, last: Option<u64>) -> String {
    match record {
        Some(r) => {
            let mut s = format!(
                "#{} '{}' ({}) config {} → {}",
                r.seq, r.key, r.kind, r.config_digest, r.outcome
            );
            if let Some(m) = &r.merged_digest {
                s.push_str(&format!(" merged {m}"));
            }
            s
        }
        None => match last {
            Some(l) => format!("no exchange #{seq} (trace ends at #{l})"),
            None => format!("no exchange #{seq} (empty trace)"),
        },
    }
}

/// Each trace's records by sequence number (`traces[i]` = (rank, its records)).
pub fn by_seq(traces: &[(u32, Vec<TraceRecord>)]) -> Vec<BTreeMap<u64, &TraceRecord>> {
    traces
        .iter()
        .map(|(_, recs)| recs.iter().map(|r| (r.seq, r)).collect())
        .collect()
}

/// Lines up traces by sequence number (`traces[i]` = (rank, its records))
/// and returns the first exchange where they differ: one rank has it and
/// another not, or key, kind, configuration, outcome or merged value
/// differ. Exchanges at or after a [`TRUNCATED`] record are not compared.
pub fn first_divergence(traces: &[(u32, Vec<TraceRecord>)]) -> Option<Divergence> {
    let by_seq = by_seq(traces);
    // `None`: no trace was truncated, every exchange counts (u64::MAX too).
    let stop = traces
        .iter()
        .flat_map(|(_, recs)| recs.iter())
        .filter(|r| r.outcome == TRUNCATED)
        .map(|r| r.seq)
        .min();
    let all_seqs: std::collections::BTreeSet<u64> = by_seq
        .iter()
        .flat_map(|m| m.keys().copied())
        .filter(|&s| stop.is_none_or(|stop| s < stop))
        .collect();
    for seq in all_seqs {
        let groups = group_ranks(traces.iter().zip(&by_seq).map(|((rank, _), m)| {
            let last = m.range(..seq).next_back().map(|(s, _)| *s);
            (*rank, position(m.get(&seq).copied(), seq, last))
        }));
        if groups.len() > 1 {
            return Some(Divergence { seq, groups });
        }
    }
    None
}
