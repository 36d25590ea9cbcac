//! Steps 1–4 of the pipeline (see the [module documentation](super)): reading
//! a directory's files within the byte limits, splitting them into paragraphs
//! and counting tokens ([`Tokenizer`]), in [`Corpus::load`].

use super::{Corpus, CorpusError, CorpusOptions};
use crate::scenario::ScenarioLimits;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
