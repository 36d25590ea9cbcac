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
//! let opts = CorpusOptions { dir: dir.path().into(), world_size: 2, batch_size: 2, ..Default::default() };
//! let (scenario, summary) = corpus::build_with_summary(&opts)?;
//! assert_eq!((summary.documents, summary.sequences, summary.tokens), (1, 3, 7));
//! // 3 sequences padded to 4 → 2 samples per rank → 1 step of [2, seq_len].
//! assert_eq!(scenario.steps.len(), 1);
//! let report = run_in_process(&scenario, Mode::CollectivesAndGuardCollectives, RUNNER_TIMEOUT)?;
//! assert!(!report.failed());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::scenario::{Scenario, ScenarioLimits};
use compiler_collectives_core::cache::{CacheOptions, Inputs};
use compiler_collectives_core::decisions::shapes::Observation;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The source holding a batch of token ids, size `[batch, seq_len]`.
pub const TOKENS: &str = "tokens";

/// The source holding a batch's attention mask, the same size as [`TOKENS`].
pub const MASK: &str = "mask";

/// The corpus every Debian system has: the common licence texts.
pub const DEFAULT_DIR: &str = "/usr/share/common-licenses";

/// How a sequence's text is cut into tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Tokenizer {
    /// Whitespace-separated words (`char::is_whitespace`). The default.
    #[default]
    Words,
    /// Unicode scalar values of the words joined by single spaces.
    Chars,
}

impl Tokenizer {
    /// Its name on the command line: `words` or `chars`.
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::Words => "words",
            Tokenizer::Chars => "chars",
        }
    }

    /// Number of tokens in a paragraph given as its lines. The text is the
    /// whitespace-separated words joined by single spaces.
    fn count<'a>(self, lines: impl IntoIterator<Item = &'a str>) -> u64 {
        let mut words = 0u64;
        let mut chars = 0u64;
        for word in lines.into_iter().flat_map(str::split_whitespace) {
            words += 1;
            chars += word.chars().count() as u64;
        }
        match self {
            Tokenizer::Words => words,
            Tokenizer::Chars => chars + words.saturating_sub(1),
        }
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tokenizer {
    type Err = CorpusError;

    /// Parses `words` or `chars`.
    ///
    /// # Errors
    /// [`CorpusError::InvalidOption`] for anything else.
    fn from_str(s: &str) -> Result<Self, CorpusError> {
        match s {
            "words" => Ok(Tokenizer::Words),
            "chars" => Ok(Tokenizer::Chars),
            other => Err(CorpusError::InvalidOption {
                option: "tokenizer",
                message: format!("`{other}` is not a tokenizer (words, chars)"),
            }),
        }
    }
}

/// What to read and how to batch it. Build with `..Default::default()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusOptions {
    /// The corpus directory (default [`DEFAULT_DIR`]).
    pub dir: PathBuf,
    /// Number of ranks, 1..=65 536 (default 4).
    pub world_size: u32,
    /// Samples per batch and rank, ≥ 1 (default 4).
    pub batch_size: u64,
    /// Tokens a sequence is truncated to, ≥ 1 (default 64).
    pub max_seq_len: u64,
    /// Epochs, ≥ 1 (default 1); epoch `e` shuffles with `seed + e`.
    pub epochs: u32,
    /// Cut the schedule to this many steps, ≥ 1 (default: every step of every epoch).
    pub steps: Option<usize>,
    /// How sequences are tokenised (default [`Tokenizer::Words`]).
    pub tokenizer: Tokenizer,
    /// Shuffle seed (default 0).
    pub seed: u64,
    /// Bytes read from one file at most; the rest is ignored (default 1 MiB).
    pub max_file_bytes: u64,
    /// Bytes read from the whole directory at most; reading stops there (default 16 MiB).
    pub max_total_bytes: u64,
    /// Directory entries at most; more is an error (default 10 000).
    pub max_files: usize,
    /// `steps × world_size` at most in the schedule; more is an error (default 4 Mi).
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

/// One file of the corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// Its file name (lossy UTF-8).
    pub name: String,
    /// Its path as listed in the directory.
    pub path: PathBuf,
    /// Bytes read from it.
    pub bytes: u64,
    /// Whether it was cut by [`CorpusOptions::max_file_bytes`] or
    /// [`CorpusOptions::max_total_bytes`].
    pub truncated: bool,
    /// Its sequences (paragraphs).
    pub sequences: usize,
    /// Its tokens, before capping.
    pub tokens: u64,
}

/// One sequence (paragraph) of the corpus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequence {
    /// Index of its document in [`Corpus::documents`].
    pub document: usize,
    /// 1-based line of the document it starts at.
    pub line: usize,
    /// Its token count, ≥ 1.
    pub tokens: u64,
    /// Its length in a batch: `tokens` capped at [`CorpusOptions::max_seq_len`].
    pub len: u64,
}

/// Why a directory entry is not a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Not a regular file (after following symlinks).
    NotAFile,
    /// It could not be read (the I/O error's text).
    Unreadable(String),
    /// Another name of a file already read.
    Duplicate {
        /// The name it was read under.
        of: String,
    },
    /// [`CorpusOptions::max_total_bytes`] was reached before it.
    OverTotalBytes,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NotAFile => f.write_str("not a regular file"),
            SkipReason::Unreadable(e) => write!(f, "cannot read: {e}"),
            SkipReason::Duplicate { of } => write!(f, "same file as {of}"),
            SkipReason::OverTotalBytes => f.write_str("over the total byte limit"),
        }
    }
}

/// A directory entry that is not a document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Its file name (lossy UTF-8).
    pub name: String,
    /// Why.
    pub reason: SkipReason,
}

/// One rank's batch at one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Indices into [`Corpus::sequences`] of its samples, in order.
    pub samples: Vec<usize>,
    /// Its padded length: the longest sample's [`Sequence::len`], ≥ 1.
    pub seq_len: u64,
}

impl Batch {
    /// `[batch, seq_len]`.
    pub fn size(&self) -> [u64; 2] {
        [self.samples.len() as u64, self.seq_len]
    }

    /// This batch as compiler inputs: [`TOKENS`] and [`MASK`], both
    /// contiguous of size [`Batch::size`].
    pub fn inputs(&self) -> Inputs {
        let obs = Observation::tensor(self.size());
        Inputs::from([(TOKENS.to_owned(), obs.clone()), (MASK.to_owned(), obs)])
    }
}

/// Counts for printing. Token counts are over the corpus, not the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusSummary {
    /// The directory.
    pub dir: PathBuf,
    /// Documents (files) read.
    pub documents: usize,
    /// Documents cut by a byte limit.
    pub truncated_documents: usize,
    /// Directory entries skipped.
    pub skipped: usize,
    /// Bytes read.
    pub bytes: u64,
    /// Sequences (paragraphs).
    pub sequences: usize,
    /// Tokens, before capping.
    pub tokens: u64,
    /// Sequences longer than `max_seq_len` (truncated in batches).
    pub capped_sequences: usize,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
    /// Ranks.
    pub world_size: u32,
    /// Samples per batch.
    pub batch_size: u64,
    /// Cap on a sequence's length, in tokens.
    pub max_seq_len: u64,
    /// Samples each rank gets per epoch.
    pub samples_per_rank: u64,
    /// Samples repeated per epoch to give every rank as many.
    pub padding_samples: u64,
    /// Steps per epoch (the same on every rank).
    pub steps_per_epoch: u64,
    /// Epochs asked for.
    pub epochs: u32,
    /// Steps each rank runs in the scenario (after [`CorpusOptions::steps`]).
    pub steps: u64,
}

impl fmt::Display for CorpusSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use compiler_collectives_core::counted;
        writeln!(
            f,
            "corpus {}: {} ({}, {} truncated, {} skipped)",
            self.dir.display(),
            counted(self.documents, "document", "documents"),
            counted(self.bytes, "byte", "bytes"),
            self.truncated_documents,
            counted(self.skipped, "entry", "entries")
        )?;
        writeln!(
            f,
            "  {} (paragraphs), {} ({}), {} longer than {} (capped)",
            counted(self.sequences, "sequence", "sequences"),
            counted(self.tokens, "token", "tokens"),
            self.tokenizer,
            self.capped_sequences,
            self.max_seq_len
        )?;
        write!(
            f,
            "  {} × {} per epoch ({} repeated), batch {} → {} per epoch; {} epoch(s), running {} per rank",
            counted(self.world_size, "rank", "ranks"),
            counted(self.samples_per_rank, "sample", "samples"),
            self.padding_samples,
            self.batch_size,
            counted(self.steps_per_epoch, "step", "steps"),
            self.epochs,
            counted(self.steps, "step", "steps")
        )
    }
}

/// A corpus read, split and tokenised, ready to be sharded and batched.
#[derive(Clone, Debug)]
pub struct Corpus {
    options: CorpusOptions,
    documents: Vec<Document>,
    sequences: Vec<Sequence>,
    skipped: Vec<Skipped>,
}

fn validate(opts: &CorpusOptions) -> Result<(), CorpusError> {
    let max_world = ScenarioLimits::default().max_world_size;
    let bad = |option, message: String| Err(CorpusError::InvalidOption { option, message });
    if opts.world_size == 0 || opts.world_size > max_world {
        return bad(
            "world_size",
            format!("{} is outside 1..={max_world}", opts.world_size),
        );
    }
    if opts.batch_size == 0 {
        return bad("batch_size", "must be at least 1".into());
    }
    if opts.max_seq_len == 0 {
        return bad("max_seq_len", "must be at least 1".into());
    }
    if opts.epochs == 0 {
        return bad("epochs", "must be at least 1".into());
    }
    if opts.steps == Some(0) {
        return bad("steps", "must be at least 1".into());
    }
    Ok(())
}

/// Reads at most `limit` bytes of `path`; `true` when the file had more.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<(Vec<u8>, bool)> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    let truncated = bytes.len() > keep;
    bytes.truncate(keep);
    Ok((bytes, truncated))
}

/// Paragraphs of `text`: `(1-based first line, token count)`.
fn paragraphs(text: &str, tokenizer: Tokenizer) -> Vec<(usize, u64)> {
    let mut out = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut start = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                out.push((start, tokenizer.count(current.drain(..))));
            }
        } else {
            if current.is_empty() {
                start = i + 1;
            }
            current.push(line);
        }
    }
    if !current.is_empty() {
        out.push((start, tokenizer.count(current)));
    }
    out
}

/// The seeded shuffle of `0..n` the module documentation defines.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1);
        // `j <= i < n`, so it fits.
        order.swap(i, usize::try_from(j).unwrap_or(i));
    }
    order
}

/// The splitmix64 generator (Steele, Lea, Flood 2014), as in the module
/// documentation.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound ≥ 1`), by rejection.
    fn below(&mut self, bound: u64) -> u64 {
        let threshold = bound.wrapping_neg() % bound; // 2^64 mod bound
        loop {
            let x = self.next_u64();
            if x >= threshold {
                return x % bound;
            }
        }
    }
}

impl Corpus {
    /// Reads, splits and tokenises `opts.dir` (see the module documentation).
    ///
    /// # Errors
    /// [`CorpusError::InvalidOption`] for an option out of range;
    /// [`CorpusError::Unreadable`] / [`CorpusError::NotADirectory`] when the
    /// directory cannot be listed; [`CorpusError::TooManyFiles`] over
    /// `max_files` entries; [`CorpusError::Empty`] with no readable regular
    /// file; [`CorpusError::NoText`] when no file holds a non-blank line.
    pub fn load(opts: &CorpusOptions) -> Result<Corpus, CorpusError> {
        validate(opts)?;
        let dir = &opts.dir;
        let meta = std::fs::metadata(dir).map_err(|error| CorpusError::Unreadable {
            dir: dir.clone(),
            error,
        })?;
        if !meta.is_dir() {
            return Err(CorpusError::NotADirectory { dir: dir.clone() });
        }
        let listing = std::fs::read_dir(dir).map_err(|error| CorpusError::Unreadable {
            dir: dir.clone(),
            error,
        })?;
        let mut skipped = Vec::new();
        let mut entries = Vec::new();
        for entry in listing {
            if entries.len() + skipped.len() >= opts.max_files {
                return Err(CorpusError::TooManyFiles {
                    dir: dir.clone(),
                    limit: opts.max_files,
                });
            }
            match entry {
                Ok(e) => entries.push((e.file_name(), e.path())),
                Err(e) => skipped.push(Skipped {
                    name: String::from("?"),
                    reason: SkipReason::Unreadable(e.to_string()),
                }),
            }
        }
        entries.sort();

        // Regular files with their canonical paths. A file listed under
        // several names is read once, under its first name (in name order)
        // that is not a symlink, or its first name when all are.
        struct Candidate {
            name: String,
            path: PathBuf,
            symlink: bool,
        }
        let mut by_target: BTreeMap<PathBuf, Vec<Candidate>> = BTreeMap::new();
        for (name, path) in entries {
            let name = name.to_string_lossy().into_owned();
            let target = match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => std::fs::canonicalize(&path),
                Ok(_) => {
                    skipped.push(Skipped {
                        name,
                        reason: SkipReason::NotAFile,
                    });
                    continue;
                }
                Err(e) => Err(e),
            };
            match target {
                Ok(target) => {
                    let symlink = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_symlink());
                    by_target.entry(target).or_default().push(Candidate {
                        name,
                        path,
                        symlink,
                    });
                }
                Err(e) => skipped.push(Skipped {
                    name,
                    reason: SkipReason::Unreadable(e.to_string()),
                }),
            }
        }
        let mut candidates = Vec::with_capacity(by_target.len());
        for (_, mut names) in by_target {
            // `names` is in name order; every group has at least one.
            let keep = names.iter().position(|c| !c.symlink).unwrap_or(0);
            let kept = names.swap_remove(keep);
            for other in names {
                skipped.push(Skipped {
                    name: other.name,
                    reason: SkipReason::Duplicate {
                        of: kept.name.clone(),
                    },
                });
            }
            candidates.push(kept);
        }
        candidates.sort_by(|a, b| a.name.cmp(&b.name));

        let mut documents = Vec::new();
        let mut sequences = Vec::new();
        let mut used = 0u64;
        for c in candidates {
            let budget = opts.max_total_bytes.saturating_sub(used);
            if budget == 0 {
                skipped.push(Skipped {
                    name: c.name,
                    reason: SkipReason::OverTotalBytes,
                });
                continue;
            }
            let limit = opts.max_file_bytes.min(budget);
            let (bytes, truncated) = match read_bounded(&c.path, limit) {
                Ok(r) => r,
                Err(e) => {
                    skipped.push(Skipped {
                        name: c.name,
                        reason: SkipReason::Unreadable(e.to_string()),
                    });
                    continue;
                }
            };
            used += bytes.len() as u64;
            let text = String::from_utf8_lossy(&bytes);
            let doc = documents.len();
            let mut tokens = 0u64;
            let paras = paragraphs(&text, opts.tokenizer);
            for &(line, n) in &paras {
                tokens += n;
                sequences.push(Sequence {
                    document: doc,
                    line,
                    tokens: n,
                    len: n.min(opts.max_seq_len),
                });
            }
            documents.push(Document {
                name: c.name,
                path: c.path,
                bytes: bytes.len() as u64,
                truncated,
                sequences: paras.len(),
                tokens,
            });
        }
        if documents.is_empty() {
            return Err(CorpusError::Empty {
                dir: dir.clone(),
                skipped: skipped.len(),
            });
        }
        if sequences.is_empty() {
            return Err(CorpusError::NoText {
                dir: dir.clone(),
                files: documents.len(),
            });
        }
        skipped.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Corpus {
            options: opts.clone(),
            documents,
            sequences,
            skipped,
        })
    }

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

    fn world(&self) -> usize {
        self.options.world_size as usize
    }

    /// Samples each rank gets per epoch: `ceil(sequences / world_size)`.
    pub fn samples_per_rank(&self) -> usize {
        self.sequences.len().div_ceil(self.world())
    }

    /// Steps per epoch, the same on every rank.
    pub fn steps_per_epoch(&self) -> u64 {
        (self.samples_per_rank() as u64).div_ceil(self.options.batch_size)
    }

    /// Steps each rank runs: every step of every epoch, cut to
    /// [`CorpusOptions::steps`].
    pub fn steps(&self) -> u64 {
        let all = self
            .steps_per_epoch()
            .saturating_mul(u64::from(self.options.epochs));
        self.options.steps.map_or(all, |s| all.min(s as u64))
    }

    /// The shuffled order of sequence indices in `epoch` (before padding).
    pub fn epoch_order(&self, epoch: u32) -> Vec<usize> {
        shuffled(
            self.sequences.len(),
            self.options.seed.wrapping_add(u64::from(epoch)),
        )
    }

    /// Rank `rank`'s samples in `epoch`: the shuffled order padded by
    /// repetition to a multiple of `world_size`, every `world_size`-th entry
    /// from `rank`. Empty for a rank outside the world.
    pub fn rank_samples(&self, epoch: u32, rank: u32) -> Vec<usize> {
        let world = self.world();
        if rank as usize >= world {
            return Vec::new();
        }
        let total = self.samples_per_rank() * world;
        self.epoch_order(epoch)
            .into_iter()
            .cycle()
            .take(total)
            .skip(rank as usize)
            .step_by(world)
            .collect()
    }

    fn batches_of(&self, samples: &[usize]) -> Vec<Batch> {
        let b = usize::try_from(self.options.batch_size).unwrap_or(usize::MAX);
        samples
            .chunks(b)
            .map(|chunk| Batch {
                samples: chunk.to_vec(),
                seq_len: chunk
                    .iter()
                    .map(|&i| self.sequences[i].len)
                    .max()
                    .unwrap_or(1),
            })
            .collect()
    }

    fn check_size(&self) -> Result<(), CorpusError> {
        let steps = self.steps();
        let limits = ScenarioLimits::default();
        let world = u64::from(self.options.world_size);
        let message = if steps > limits.max_steps as u64 {
            format!("at most {} steps", limits.max_steps)
        } else if steps.saturating_mul(world) > self.options.max_rank_steps {
            format!(
                "at most {} steps × ranks (max_rank_steps)",
                self.options.max_rank_steps
            )
        } else {
            return Ok(());
        };
        Err(CorpusError::TooManySteps {
            dir: self.options.dir.clone(),
            steps,
            world_size: self.options.world_size,
            message,
        })
    }

    /// The whole schedule: `schedule[s][r]` is rank `r`'s batch at step `s`.
    ///
    /// # Errors
    /// [`CorpusError::TooManySteps`] over the scenario step limit (1 000 000)
    /// or [`CorpusOptions::max_rank_steps`].
    pub fn schedule(&self) -> Result<Vec<Vec<Batch>>, CorpusError> {
        self.check_size()?;
        let steps = usize::try_from(self.steps()).unwrap_or(usize::MAX);
        let mut out: Vec<Vec<Batch>> = Vec::with_capacity(steps);
        for epoch in 0..self.options.epochs {
            if out.len() >= steps {
                break;
            }
            let per_rank: Vec<Vec<Batch>> = (0..self.options.world_size)
                .map(|r| self.batches_of(&self.rank_samples(epoch, r)))
                .collect();
            let per_epoch = per_rank.first().map_or(0, Vec::len);
            for s in 0..per_epoch.min(steps - out.len()) {
                out.push(per_rank.iter().map(|batches| batches[s].clone()).collect());
            }
        }
        Ok(out)
    }

    /// The scenario: named `demo:<dir>`, `world_size` ranks, default
    /// [`CacheOptions`] (collectives on, guard votes off), sources
    /// [`TOKENS`] and [`MASK`], one step per [`Corpus::schedule`] step.
    ///
    /// # Errors
    /// As [`Corpus::schedule`].
    pub fn scenario(&self) -> Result<Scenario, CorpusError> {
        let steps = self
            .schedule()?
            .iter()
            .map(|step| step.iter().map(Batch::inputs).collect())
            .collect();
        let o = &self.options;
        Ok(Scenario {
            name: format!("demo:{}", o.dir.display()),
            description: Some(format!(
                "{} documents, {} sequences (paragraphs, {} tokens, capped at {}), \
                 sharded over {} ranks in batches of {}, seed {}, {} epoch(s)",
                self.documents.len(),
                self.sequences.len(),
                o.tokenizer,
                o.max_seq_len,
                o.world_size,
                o.batch_size,
                o.seed,
                o.epochs
            )),
            world_size: o.world_size,
            options: CacheOptions::default(),
            sources: BTreeSet::from([MASK.to_owned(), TOKENS.to_owned()]),
            steps,
            expect: BTreeMap::new(),
            setup: Default::default(),
        })
    }

    /// Counts for printing.
    pub fn summary(&self) -> CorpusSummary {
        let o = &self.options;
        let samples_per_rank = self.samples_per_rank() as u64;
        CorpusSummary {
            dir: o.dir.clone(),
            documents: self.documents.len(),
            truncated_documents: self.documents.iter().filter(|d| d.truncated).count(),
            skipped: self.skipped.len(),
            bytes: self.documents.iter().map(|d| d.bytes).sum(),
            sequences: self.sequences.len(),
            tokens: self.sequences.iter().map(|s| s.tokens).sum(),
            capped_sequences: self.sequences.iter().filter(|s| s.tokens > s.len).count(),
            tokenizer: o.tokenizer,
            world_size: o.world_size,
            batch_size: o.batch_size,
            max_seq_len: o.max_seq_len,
            samples_per_rank,
            padding_samples: samples_per_rank * u64::from(o.world_size)
                - self.sequences.len() as u64,
            steps_per_epoch: self.steps_per_epoch(),
            epochs: o.epochs,
            steps: self.steps(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of splitmix64 seeded with 0 (reference implementation).
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(rng.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn below_stays_in_range_and_shuffle_is_a_permutation() {
        let mut rng = SplitMix64(7);
        for bound in 1..100 {
            assert!(rng.below(bound) < bound);
        }
        let mut p = shuffled(1000, 42);
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
        assert!(shuffled(0, 1).is_empty());
        assert_eq!(shuffled(1, 1), vec![0]);
    }

    #[test]
    fn paragraphs_split_on_blank_lines() {
        let text = "a b\nc\n \n\n\u{c}\nd e f\r\n\r\ng";
        assert_eq!(
            paragraphs(text, Tokenizer::Words),
            vec![(1, 3), (6, 3), (8, 1)]
        );
        // "a b c" = 5 chars.
        assert_eq!(paragraphs("a  b\n c", Tokenizer::Chars), vec![(1, 5)]);
    }
}
