//! What `ccol demo` prints about a corpus: [`CorpusSummary`], the counts of
//! what was read and how it is sharded, from [`Corpus::summary`].

use super::{Corpus, Tokenizer};
use std::fmt;
use std::path::PathBuf;

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
    /// Steps each rank runs in the scenario (after [`CorpusOptions::steps`](super::CorpusOptions::steps)).
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

impl Corpus {
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
