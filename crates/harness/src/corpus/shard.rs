//! Steps 5–6 of the pipeline (see the [module documentation](super)): the
//! seeded shuffle, sharding like `DistributedSampler`, batching like a
//! padding `DataLoader`, and the resulting schedule and [`Scenario`].

use super::{Corpus, CorpusError, MASK, TOKENS};
use crate::scenario::{Scenario, ScenarioLimits};
use compiler_collectives_core::cache::{CacheOptions, Inputs};
use compiler_collectives_core::decisions::shapes::Observation;
use std::collections::{BTreeMap, BTreeSet};

/// One rank's batch at one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Indices into [`Corpus::sequences`] of its samples, in order.
    pub samples: Vec<usize>,
    /// Its padded length: the longest sample's [`Sequence::len`](super::Sequence::len), ≥ 1.
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
    /// [`CorpusOptions::steps`](super::CorpusOptions::steps).
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
    /// or [`CorpusOptions::max_rank_steps`](super::CorpusOptions::max_rank_steps).
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
}
