//! The data side of `ccol demo`: a directory of text files becomes, for
//! every rank and every step, the shapes a training step's compiled function
//! sees — a [`Scenario`] that runs in-process
//! ([`scenario::run_in_process`](crate::scenario::run_in_process)) or over
//! real processes ([`scenario::run_rank`](crate::scenario::run_rank) over any
//! transport).
//!
//! # The pipeline
//!
//! 1. **Read** ([`Corpus::load`]): every regular file directly in
//!    [`CorpusOptions::dir`] is one *document*. Entries are taken in file-name
//!    order (byte order of the name), symlinks are followed, entries that are
//!    not regular files or cannot be read are skipped and listed
//!    ([`Corpus::skipped`]), and two names for the same file (a symlink and its
//!    target, as `GPL -> GPL-3` in `/usr/share/common-licenses`) are read once,
//!    under the target's own name. Bytes that are not UTF-8 are replaced
//!    (U+FFFD), as `String::from_utf8_lossy` does.
//! 2. **Bound**: reading *truncates*, it never refuses: a file longer than
//!    [`CorpusOptions::max_file_bytes`] contributes its first
//!    `max_file_bytes` bytes, and once [`CorpusOptions::max_total_bytes`] bytes
//!    have been read, the file being read is cut there and the files after it
//!    (in name order) are skipped. Both show in [`Document::truncated`],
//!    [`Corpus::skipped`] and the [`CorpusSummary`]. Only a directory with more
//!    than [`CorpusOptions::max_files`] entries is refused
//!    ([`CorpusError::TooManyFiles`]), since its listing alone is unbounded.
//! 3. **Split**: a *sequence* is a paragraph — a maximal run of lines that
//!    hold a non-whitespace character; blank (whitespace-only) lines separate
//!    paragraphs. On the licence texts this gives a realistic spread: from
//!    one-word headings to paragraphs of a few hundred words (median about
//!    40 words).
//! 4. **Tokenise** ([`Tokenizer`]): a paragraph's text is its
//!    whitespace-separated words joined by single spaces; [`Tokenizer::Words`]
//!    counts the words, [`Tokenizer::Chars`] the Unicode scalar values of that
//!    text (spaces included). A sequence's *length* is its token count capped at
//!    [`CorpusOptions::max_seq_len`] (the loader truncates); no sequence is
//!    empty.
//! 5. **Shard** like PyTorch's `DistributedSampler(shuffle=True,
//!    drop_last=False)` with `sampler.set_epoch(e)` before epoch `e`: the
//!    sequence indices `0..n` are shuffled with seed `seed + e` (wrapping);
//!    the list is padded by repeating it from its start to
//!    `world_size * ceil(n / world_size)` entries; rank `r` takes entries
//!    `r, r + world_size, r + 2 * world_size, …`. Every rank gets the same
//!    number of samples.
//! 6. **Batch** like a `DataLoader(batch_size, drop_last=False)` with a
//!    padding collate: consecutive samples of a rank form batches of
//!    `batch_size`, the last one possibly smaller (and the same size on every
//!    rank); a batch is padded to its longest sequence. Rank `r`'s input at
//!    step `s` is then the tensor [`TOKENS`] of size `[batch, seq_len]`
//!    (contiguous) and the attention mask [`MASK`] of the same size: `seq_len`
//!    differs by rank and by step, `batch` changes at the last step of an
//!    epoch.
//!
//! Epochs follow each other ([`CorpusOptions::epochs`]); the whole schedule is
//! cut to [`CorpusOptions::steps`] steps when given.
//!
//! # The shuffle
//!
//! The permutation is defined here, so that any implementation (another
//! process, the Python oracle) reproduces it bit for bit, whatever version of a
//! random-number crate it links: a splitmix64 generator seeded with
//! `seed + epoch` —
//! `state += 0x9E3779B97F4A7C15; z = state; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//! z = (z ^ (z >> 27)) * 0x94D049BB133111EB; output z ^ (z >> 31)` (all wrapping
//! `u64`) — drives a Fisher–Yates shuffle of `[0, 1, …, n-1]`: for `i` from
//! `n-1` down to 1, swap entries `i` and `j`, with `j` uniform in `0..=i`
//! drawn by rejection (draw `x` until `x >= 2^64 mod (i+1)`, then
//! `j = x mod (i+1)`).
//!
//! # Example
//!
//! ```
//! use compiler_collectives_harness::corpus::{self, CorpusOptions};
//! use compiler_collectives_harness::scenario::{run_in_process, Mode, RUNNER_TIMEOUT};
//!
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("a.txt"), "one two three\n\nfour\nfive\n\nsix seven")?;
//! let opts = CorpusOptions::default()
//!     .with_dir(dir.path())
//!     .with_world_size(2)
//!     .with_batch_size(2);
//! let (scenario, summary) = corpus::build_with_summary(&opts)?;
//! assert_eq!((summary.documents, summary.sequences, summary.tokens), (1, 3, 7));
//! // 3 sequences padded to 4 → 2 samples per rank → 1 step of [2, seq_len].
//! assert_eq!(scenario.steps.len(), 1);
//! let report = run_in_process(&scenario, Mode::CollectivesAndGuardCollectives, RUNNER_TIMEOUT)?;
//! assert!(!report.failed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Where the steps live
//!
//! Reading, splitting and tokenising (steps 1–4, [`Corpus::load`]) are in
//! `corpus/read.rs`; the shuffle, sharding and batching (steps 5–6,
//! [`Corpus::schedule`], [`Corpus::scenario`]) in `corpus/shard.rs`; the
//! counts printed for a corpus ([`CorpusSummary`]) in `corpus/summary.rs`.
//! This file holds the options, the errors and the [`Corpus`] itself.

use crate::scenario::Scenario;
use std::path::PathBuf;

mod read;
mod shard;
mod summary;

pub use read::{Document, Sequence, SkipReason, Skipped, Tokenizer};
pub use shard::Batch;
pub use summary::CorpusSummary;

/// The source holding a batch of token ids, size `[batch, seq_len]`.
pub const TOKENS: &str = "tokens";

/// The source holding a batch's attention mask, the same size as [`TOKENS`].
pub const MASK: &str = "mask";

/// The corpus every Debian system has: the common licence texts.
pub const DEFAULT_DIR: &str = "/usr/share/common-licenses";

/// What to read and how to batch it, built with
/// `CorpusOptions::default().with_…` (one `with_<field>` setter per field;
/// the ranges below are checked when the corpus is built, not by the setters).
#[derive(Clone, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct CorpusOptions {
    /// The corpus directory (default [`DEFAULT_DIR`]).
    /// `with_dir(impl Into<PathBuf>)`.
    #[setters(into)]
    pub dir: PathBuf,
    /// Number of ranks, 1..=65 536 (default 4).
    pub world_size: u32,
    /// Samples per batch and rank, ≥ 1 (default 4).
    pub batch_size: u64,
    /// Tokens a sequence is truncated to, ≥ 1 (default 64).
    pub max_seq_len: u64,
    /// Epochs, ≥ 1 (default 1); epoch `e` shuffles with `seed + e`.
    pub epochs: u32,
    /// Cut the schedule to this many steps, ≥ 1 (default `None`: every step
    /// of every epoch). `with_steps(usize)` sets `Some`.
    #[setters(strip_option)]
    pub steps: Option<usize>,
    /// How sequences are tokenised (default [`Tokenizer::Words`]).
    pub tokenizer: Tokenizer,
    /// Shuffle seed (default 0).
    pub seed: u64,
    /// Bytes read from one file at most; the rest is ignored (default 1 MiB).
    pub max_file_bytes: u64,
    /// Bytes read from the whole directory at most; reading stops there (default 16 MiB).
    pub max_total_bytes: u64,
    /// Directory entries at most, a count; more is an error (default 10 000).
    pub max_files: usize,
    /// `steps × world_size` at most in the schedule, a count of rank-steps;
    /// more is an error (default 4 Mi).
    pub max_rank_steps: u64,
}

impl Default for CorpusOptions {
    fn default() -> Self {
        CorpusOptions {
            dir: PathBuf::from(DEFAULT_DIR),
            world_size: 4,
            batch_size: 4,
            max_seq_len: 64,
            epochs: 1,
            steps: None,
            tokenizer: Tokenizer::Words,
            seed: 0,
            max_file_bytes: 1 << 20,
            max_total_bytes: 16 << 20,
            max_files: 10_000,
            max_rank_steps: 4 << 20,
        }
    }
}

/// Why a corpus cannot be built. Every message names the directory or the
/// option at fault and says what to pass instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorpusError {
    /// The directory does not exist or cannot be listed.
    #[error("corpus directory {}: cannot read it: {error}; pass a directory of text files with --corpus DIR", dir.display())]
    Unreadable {
        /// The directory.
        dir: PathBuf,
        /// Why (part of this error's message).
        error: std::io::Error,
    },
    /// The path exists but is not a directory.
    #[error("corpus directory {}: not a directory; pass a directory of text files with --corpus DIR", dir.display())]
    NotADirectory {
        /// The path.
        dir: PathBuf,
    },
    /// The directory holds no readable regular file.
    #[error("corpus directory {}: no readable regular files ({} skipped); pass a directory of text files with --corpus DIR", dir.display(), compiler_collectives_core::counted(*skipped, "entry", "entries"))]
    Empty {
        /// The directory.
        dir: PathBuf,
        /// Entries skipped (not files, unreadable).
        skipped: usize,
    },
    /// Files were read but none holds a non-blank line.
    #[error("corpus directory {}: {} read but none holds any text; pass a directory of text files with --corpus DIR", dir.display(), compiler_collectives_core::counted(*files, "file", "files"))]
    NoText {
        /// The directory.
        dir: PathBuf,
        /// Files read.
        files: usize,
    },
    /// The directory has more entries than [`CorpusOptions::max_files`].
    #[error("corpus directory {}: more than {limit} entries; pass a smaller directory with --corpus DIR", dir.display())]
    TooManyFiles {
        /// The directory.
        dir: PathBuf,
        /// The limit.
        limit: usize,
    },
    /// The schedule is larger than the scenario limits allow.
    #[error("corpus {}: {steps} steps × {world_size} ranks is over the limit ({message}); pass --steps N, fewer epochs or a smaller corpus", dir.display())]
    TooManySteps {
        /// The directory.
        dir: PathBuf,
        /// Steps the schedule would have.
        steps: u64,
        /// Ranks.
        world_size: u32,
        /// Which limit.
        message: String,
    },
    /// An option is out of range.
    #[error("corpus option `{option}`: {message}")]
    InvalidOption {
        /// The option's field name.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// A corpus read, split and tokenised, ready to be sharded and batched.
#[derive(Clone, Debug)]
pub struct Corpus {
    options: CorpusOptions,
    documents: Vec<Document>,
    sequences: Vec<Sequence>,
    skipped: Vec<Skipped>,
}
impl Corpus {
    /// The options it was loaded with.
    pub fn options(&self) -> &CorpusOptions {
        &self.options
    }

    /// The documents, in file-name order.
    pub fn documents(&self) -> &[Document] {
        &self.documents
    }

    /// The sequences, document by document, in order; never empty.
    pub fn sequences(&self) -> &[Sequence] {
        &self.sequences
    }

    /// Directory entries that are not documents, by name.
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }
}

/// Builds the demo scenario of `opts`: [`Corpus::load`] then
/// [`Corpus::scenario`].
///
/// # Errors
/// Those of [`Corpus::load`] and [`Corpus::scenario`].
pub fn build(opts: &CorpusOptions) -> Result<Scenario, CorpusError> {
    Corpus::load(opts)?.scenario()
}

/// [`build`], with the [`CorpusSummary`] to print.
///
/// # Errors
/// As [`build`].
pub fn build_with_summary(opts: &CorpusOptions) -> Result<(Scenario, CorpusSummary), CorpusError> {
    let corpus = Corpus::load(opts)?;
    Ok((corpus.scenario()?, corpus.summary()))
}
