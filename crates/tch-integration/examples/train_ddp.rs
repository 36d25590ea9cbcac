//! Data-parallel training of a tiny character-level language model with
//! tch-rs, gradients all-reduced over a c10d `ProcessGroupGloo`, and every
//! compile decision of the training step made by all ranks together through
//! compiler collectives on a process group of their own (`C10dJob`: one
//! store, one communicator each).
//!
//! Start it with torchrun's environment:
//!
//! ```text
//! ccol run --nproc-per-node 2 -- target/debug/examples/train_ddp --steps 200
//! torchrun --standalone --nproc-per-node 2 --no-python target/debug/examples/train_ddp --steps 50
//! ```
//!
//! Options: `--steps N` (200), `--seed S` (0), `--corpus DIR`
//! (`/usr/share/common-licenses`), `--batch-size B` (8), `--max-seq-len L`
//! (256), `--lr X` (0.01); `--help`. A bad option or value is one error
//! naming it, exit code 2. Logs: `RUST_LOG`, `CCOL_LOG_FORMAT=json` (see
//! `compiler_collectives_harness::logging`).
//!
//! Every rank prints its loss (the same on every rank) every 10 steps, a line
//! per compile, and at the end a summary and one machine-readable line:
//!
//! ```text
//! RESULT rank=R world=W steps=N first_loss=.. final_loss=.. compiles=C compile_steps=[s,..] loss_digest=HEX
//! ```
//!
//! (`loss_digest` hashes the bits of every step's loss.)
//!
//! # Data
//! The corpus of `ccol demo` ([`compiler_collectives_harness::corpus`]) with the
//! character tokenizer: a sample is one paragraph (its words joined by single
//! spaces) cut to `--max-seq-len` characters; the schedule shards and batches
//! it like `DistributedSampler` + `DataLoader`, so a batch's `seq_len` differs
//! by rank and by step, and its batch size shrinks at the end of an epoch.
//! The corpus module keeps counts, not text, so this program re-reads each
//! document (the same bytes the corpus read) and cuts out each paragraph's
//! text, checking its length against the corpus' count. A character is a
//! token: its code point when below 256, else 0 (vocabulary 256; 0 is also
//! the left context before a paragraph starts).
//!
//! # Model
//! Each position sees the embeddings of the last [`CONTEXT`] characters
//! (itself included), concatenated, through a one-hidden-layer MLP that
//! predicts the next character. Loss: cross-entropy over the positions
//! whose next character is real (the mask drops padding), averaged per rank,
//! then averaged over ranks. Adam. Parameters are initialised from the same
//! seed on every rank and then broadcast from rank 0 (belt and braces).
//!
//! # Compiles
//! The training step stands for a compiled function with a
//! [`CompileCache`]: its inputs are the batch's `tokens` and `mask` tensors
//! ([`observe`]), collectives and guard votes are on, so every rank makes the
//! same compile decisions at the same steps. A compile here does not generate
//! code: the artifact is a [`StepPlan`], the shape the compiled step runs at.
//! A dimension decided static is run at the size compiled for; a dimension
//! decided dynamic is padded up to its bucket (the next power of two, at
//! least 2), so one artifact serves every size of the bucket, as a
//! shape-polymorphic kernel would. Padding is masked, so it changes the work
//! done, not the loss. After the recompile limit the step runs uncompiled at
//! the batch's own shape (a length of at least 2, so a next character exists).

use anyhow::{bail, Context, Result};
use clap::Parser;
use compiler_collectives_core::cache::{
    CacheOptions, CompileCache, CompiledFrame, Inputs, Outcome,
};
use compiler_collectives_core::{Channel, ChannelOptions, Transport};
use compiler_collectives_harness::args::at_least_one;
use compiler_collectives_harness::corpus::{self, Batch, Corpus, CorpusOptions, Tokenizer};
use compiler_collectives_tch::{observe, C10dJob, C10dProcessGroup, ReduceOp};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

/// Characters of context each prediction sees.
const CONTEXT: i64 = 8;
/// Vocabulary: one token per code point below 256.
const VOCAB: i64 = 256;
/// Embedding width per character.
const EMBED: i64 = 16;
/// Hidden width of the MLP.
const HIDDEN: i64 = 128;
/// Deadline of every collective (gradients, loss, compile exchanges).
const TIMEOUT: Duration = Duration::from_secs(120);
/// Compile key of the training step (equal on every rank).
const STEP_KEY: &str = "train_step@examples/train_ddp.rs";

/// Data-parallel training of a tiny character-level model; every compile
/// decision is agreed by all ranks (start with `ccol run` or torchrun).
#[derive(Parser, Debug)]
#[command(name = "train_ddp")]
struct Args {
    /// Training steps.
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = at_least_one::<usize>)]
    steps: usize,
    /// Seed of the shuffle and of the parameters (the same on every rank).
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Corpus directory: every regular file in it is a document.
    #[arg(long, value_name = "DIR", default_value = corpus::DEFAULT_DIR)]
    corpus: PathBuf,
    /// Samples per batch on each rank.
    #[arg(long, value_name = "B", default_value_t = 8, value_parser = at_least_one::<u64>)]
    batch_size: u64,
    /// Longest sequence, in characters.
    #[arg(long, value_name = "L", default_value_t = 256, value_parser = at_least_one::<u64>)]
    max_seq_len: u64,
    /// Adam's learning rate.
    #[arg(long, value_name = "X", default_value_t = 0.01)]
    lr: f64,
}

/// The token ids of every sequence of the corpus, cut to its `len`.
fn sequence_tokens(corpus: &Corpus) -> Result<Vec<Vec<i64>>> {
    let docs: Vec<Vec<String>> = corpus
        .documents()
        .iter()
        .map(|d| {
            let mut bytes = std::fs::read(&d.path)
                .with_context(|| format!("re-reading {}", d.path.display()))?;
            bytes.truncate(usize::try_from(d.bytes).unwrap_or(usize::MAX));
            Ok(String::from_utf8_lossy(&bytes)
                .lines()
                .map(str::to_owned)
                .collect())
        })
        .collect::<Result<_>>()?;
    corpus
        .sequences()
        .iter()
        .map(|s| {
            let lines = &docs[s.document];
            let text = lines
                .iter()
                .skip(s.line.saturating_sub(1))
                .take_while(|l| !l.trim().is_empty())
                .flat_map(|l| l.split_whitespace())
                .collect::<Vec<_>>()
                .join(" ");
            let chars = u64::try_from(text.chars().count())?;
            if chars != s.tokens {
                bail!(
                    "{} line {}: {chars} characters, the corpus counted {}",
                    corpus.documents()[s.document].name,
                    s.line,
                    s.tokens
                );
            }
            let len = usize::try_from(s.len)?;
            Ok(text
                .chars()
                .take(len)
                .map(|c| i64::from(u8::try_from(u32::from(c)).unwrap_or(0)))
                .collect())
        })
        .collect()
}

/// One dimension of a compiled step's shape.
#[derive(Clone, Copy, Debug)]
enum PlanDim {
    /// Compiled static: runs at exactly this size.
    Static(i64),
    /// Compiled dynamic: runs at the bucket of the observed size.
    Bucket,
}

/// The artifact of a compile: the shape `[batch, seq_len]` the step runs at.
#[derive(Clone, Debug)]
struct StepPlan {
    dims: [PlanDim; 2],
}

impl StepPlan {
    /// What a compile of `frame` produces for `tokens` of size `size`.
    fn compile(frame: &CompiledFrame, size: [i64; 2]) -> StepPlan {
        let dynamic = frame
            .dynamic_dims
            .get(corpus::TOKENS)
            .cloned()
            .unwrap_or_default();
        let dim = |i: usize| {
            if dynamic.contains(&i) {
                PlanDim::Bucket
            } else {
                PlanDim::Static(size[i])
            }
        };
        StepPlan {
            dims: [dim(0), dim(1)],
        }
    }

    /// The padded shape for a batch of size `size`.
    fn shape(&self, size: [i64; 2]) -> [i64; 2] {
        let run = |d: PlanDim, n: i64| match d {
            PlanDim::Static(s) => s.max(n),
            PlanDim::Bucket => bucket(n),
        };
        [run(self.dims[0], size[0]), run(self.dims[1], size[1])]
    }
}

/// The next power of two, at least 2.
fn bucket(n: i64) -> i64 {
    let u = u64::try_from(n.max(2)).unwrap_or(2).next_power_of_two();
    i64::try_from(u).unwrap_or(n)
}

/// `tokens` and `mask` of a batch, `[batch, seq_len]`, padded with 0.
fn batch_tensors(batch: &Batch, seqs: &[Vec<i64>]) -> Result<(Tensor, Tensor)> {
    let b = batch.samples.len();
    let l = usize::try_from(batch.seq_len)?;
    let mut tok = vec![0i64; b * l];
    let mut mask = vec![0f32; b * l];
    for (row, &i) in batch.samples.iter().enumerate() {
        for (col, &t) in seqs[i].iter().enumerate() {
            tok[row * l + col] = t;
            mask[row * l + col] = 1.0;
        }
    }
    let size = [i64::try_from(b)?, i64::try_from(l)?];
    Ok((
        Tensor::from_slice(&tok).view(size),
        Tensor::from_slice(&mask).view(size),
    ))
}

/// Pads `t` (`[b, l]`) with zeros to `shape`.
fn pad_to(t: &Tensor, shape: [i64; 2]) -> Tensor {
    let s = t.size();
    if s == shape {
        return t.shallow_clone();
    }
    t.constant_pad_nd([0, shape[1] - s[1], 0, shape[0] - s[0]])
}

/// The model: context-window embeddings through an MLP.
struct Model {
    embed: nn::Embedding,
    hidden: nn::Linear,
    out: nn::Linear,
}

impl Model {
    fn new(p: &nn::Path<'_>) -> Model {
        Model {
            embed: nn::embedding(p / "embed", VOCAB, EMBED, Default::default()),
            hidden: nn::linear(p / "hidden", CONTEXT * EMBED, HIDDEN, Default::default()),
            out: nn::linear(p / "out", HIDDEN, VOCAB, Default::default()),
        }
    }

    /// Mean next-character cross-entropy over the masked positions.
    fn loss(&self, tokens: &Tensor, mask: &Tensor) -> Tensor {
        let [b, l] = [tokens.size()[0], tokens.size()[1]];
        let left = tokens.constant_pad_nd([CONTEXT - 1, 0]);
        let e = self.embed.forward(&left); // [b, l + C - 1, E]
        let windows: Vec<Tensor> = (0..CONTEXT).map(|k| e.narrow(1, k, l)).collect();
        let x = Tensor::cat(&windows, 2); // [b, l, C * E]
        let logits = self.out.forward(&self.hidden.forward(&x).relu()); // [b, l, V]
        let n = l - 1;
        let logp = logits
            .narrow(1, 0, n)
            .reshape([b * n, VOCAB])
            .log_softmax(-1, Kind::Float);
        let target = tokens.narrow(1, 1, n).reshape([b * n, 1]);
        let m = mask.narrow(1, 1, n).reshape([b * n]);
        let nll = -logp.gather(1, &target, false).reshape([b * n]);
        (nll * &m).sum(Kind::Float) / m.sum(Kind::Float).clamp_min(1.0)
    }
}

/// FNV-1a over the losses' bits: equal on every rank iff the losses are.
fn digest(losses: &[f64]) -> u64 {
    losses.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, l| {
        l.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

fn main() -> Result<()> {
    // Usage errors: one message naming the bad value, exit 2 (as `ccol`).
    let args = Args::parse();
    // RUST_LOG, CCOL_LOG_FORMAT: the library's `tracing` events on stderr.
    compiler_collectives_harness::logging::init();
    let started = Instant::now();
    tch::set_num_threads(1);
    // Two communicators, as docs/torch-compile.md describes: the gradients' all-reduces on
    // one, the compile decisions' exchanges on one of their own (so neither
    // waits behind the other's lock or operations).
    let job = C10dJob::from_env().context("joining the job's store")?;
    let grads = job.group("grads").context("the gradients' process group")?;
    let pg: &C10dProcessGroup = &grads;
    let transport = Arc::new(
        job.transport("compile")
            .context("the compile decisions' process group")?,
    );
    let (rank, world) = (pg.rank(), pg.world_size());
    let mut channel = Channel::with_options(
        transport.clone() as Arc<dyn Transport>,
        ChannelOptions::from_env()?.with_timeout(TIMEOUT),
    )?;

    // Data: the demo corpus, characters as tokens.
    let mut opts = CorpusOptions::default()
        .with_dir(args.corpus.clone())
        .with_world_size(world)
        .with_batch_size(args.batch_size)
        .with_max_seq_len(args.max_seq_len)
        .with_epochs(1)
        .with_steps(args.steps)
        .with_tokenizer(Tokenizer::Chars)
        .with_seed(args.seed);
    let mut corpus = Corpus::load(&opts)?;
    // As many epochs as the steps need (each epoch reshuffles).
    let epochs = u64::try_from(args.steps)?.div_ceil(corpus.steps_per_epoch().max(1));
    if epochs > 1 {
        opts.epochs = u32::try_from(epochs)?;
        corpus = Corpus::load(&opts)?;
    }
    let schedule = corpus.schedule()?;
    let seqs = sequence_tokens(&corpus)?;
    if schedule.len() != args.steps {
        bail!(
            "the schedule has {} steps, not {}",
            schedule.len(),
            args.steps
        );
    }
    if rank == 0 {
        println!("{}", corpus.summary());
    }

    // Model, identical on every rank.
    tch::manual_seed(i64::try_from(args.seed & 0x7fff_ffff_ffff_ffff)?);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Model::new(&vs.root());
    let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    tch::no_grad(|| -> Result<()> {
        for (_, p) in &mut params {
            pg.broadcast(p, 0, TIMEOUT)?;
        }
        Ok(())
    })?;
    let mut opt = nn::Adam::default().build(&vs, args.lr)?;
    let world_f = f64::from(world);

    // The training step's compile cache: collectives and guard votes on.
    let mut cache_opts = CacheOptions::default();
    cache_opts.collectives = true;
    cache_opts.guard_collectives = true;
    let mut cache: CompileCache<StepPlan> = CompileCache::new(STEP_KEY, cache_opts);

    let mut losses = Vec::with_capacity(args.steps);
    let mut padded_elems = 0i64;
    let mut real_elems = 0i64;
    for (step, batches) in schedule.iter().enumerate() {
        let (tokens, mask) = batch_tensors(&batches[rank as usize], &seqs)?;
        let size = [tokens.size()[0], tokens.size()[1]];
        let inputs = Inputs::from([
            (corpus::TOKENS.to_owned(), observe(&tokens)),
            (corpus::MASK.to_owned(), observe(&mask)),
        ]);
        let outcome = cache.call(&inputs, Some(&mut channel), |frame| {
            StepPlan::compile(frame, size)
        })?;
        let shape = match outcome {
            Outcome::Hit(i) | Outcome::Compiled(i) => cache
                .artifact(i)
                .context("a compiled frame without an artifact")?
                .shape(size),
            Outcome::Uncompiled => [size[0], size[1].max(2)],
        };
        if let Outcome::Compiled(i) = outcome {
            println!(
                "rank {rank}: step {step}: compile {i}: inputs {size:?} -> plan {:?} (dynamic dims {:?})",
                cache.artifact(i).map(|p| p.dims).unwrap_or([PlanDim::Bucket; 2]),
                cache.frames()[i].dynamic_dims.get(corpus::TOKENS).cloned().unwrap_or_default()
            );
        }
        let (tokens, mask) = (pad_to(&tokens, shape), pad_to(&mask, shape));
        padded_elems += shape[0] * shape[1];
        real_elems += size[0] * size[1];

        opt.zero_grad();
        let loss = model.loss(&tokens, &mask);
        loss.backward();
        let mean = tch::no_grad(|| -> Result<f64> {
            // One all-reduce: every gradient, flattened, then the loss.
            let mut parts: Vec<Tensor> = params
                .iter()
                .map(|(_, p)| {
                    let g = p.grad();
                    if g.defined() {
                        g.reshape([-1])
                    } else {
                        p.zeros_like().reshape([-1])
                    }
                })
                .collect();
            parts.push(loss.detach().reshape([1]));
            let mut flat = Tensor::cat(&parts, 0);
            pg.all_reduce(&mut flat, ReduceOp::Sum, TIMEOUT)?;
            let flat = flat / world_f;
            let mut at = 0i64;
            for (_, p) in &params {
                let n = p.numel();
                let n = i64::try_from(n)?;
                let mut g = p.grad();
                if g.defined() {
                    g.copy_(&flat.narrow(0, at, n).view_as(p));
                }
                at += n;
            }
            Ok(flat.double_value(&[at]))
        })?;
        opt.step();
        losses.push(mean);
        if step % 10 == 0 || step + 1 == args.steps {
            println!("rank {rank}: step {step:4} loss {mean:.6}");
        }
    }

    let first = losses.first().copied().unwrap_or(f64::NAN);
    let last = losses.last().copied().unwrap_or(f64::NAN);
    let steps_at: Vec<u64> = cache.compile_calls().to_vec();
    println!(
        "rank {rank}: compiles {} at steps {steps_at:?}; padded {padded_elems} elements for {real_elems} \
         ({:.2}x); final loss {last:.6} (first {first:.6}); {:.1} s",
        cache.compiles(),
        padded_elems as f64 / real_elems.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    let list: Vec<String> = steps_at.iter().map(u64::to_string).collect();
    println!(
        "RESULT rank={rank} world={world} steps={} first_loss={first:.6} final_loss={last:.6} \
         compiles={} compile_steps=[{}] loss_digest={:016x}",
        losses.len(),
        cache.compiles(),
        list.join(","),
        digest(&losses)
    );
    channel.shutdown()?;
    Ok(())
}
