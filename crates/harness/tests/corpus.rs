//! The demo's data pipeline: corpus directory → per-rank, per-step inputs.

use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_harness::corpus::{
    self, Corpus, CorpusError, CorpusOptions, SkipReason, Tokenizer, MASK, TOKENS,
};
use compiler_collectives_harness::scenario::{run_in_process, Mode, Scenario, RUNNER_TIMEOUT};
use std::collections::BTreeSet;
use std::path::Path;

/// A corpus of `files` documents with paragraphs of varied lengths.
fn write_corpus(dir: &Path, files: usize) {
    for f in 0..files {
        let mut text = String::new();
        for p in 0..(3 + f % 4) {
            let words = 1 + (f * 7 + p * 13) % 40;
            for w in 0..words {
                text.push_str(&format!("w{f}_{p}_{w}"));
                text.push(if w % 9 == 8 { '\n' } else { ' ' });
            }
            text.push_str("\n\n");
        }
        std::fs::write(dir.join(format!("doc{f:02}.txt")), text).unwrap();
    }
}

fn opts(dir: &Path) -> CorpusOptions {
    CorpusOptions::default().with_dir(dir)
}

fn size(obs: &Observation) -> Vec<u64> {
    match obs {
        Observation::Tensor { sizes, strides } => {
            assert!(strides.is_none(), "inputs are contiguous");
            sizes.clone()
        }
        other => panic!("expected a tensor, got {other:?}"),
    }
}

#[test]
fn every_rank_gets_the_same_number_of_steps_and_valid_shapes() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 9);
    for (world, batch, max_seq_len) in [(1, 4, 64), (2, 3, 16), (3, 4, 8), (4, 5, 64), (7, 2, 1)] {
        let o = opts(dir.path())
            .with_world_size(world)
            .with_batch_size(batch)
            .with_max_seq_len(max_seq_len);
        let corpus = Corpus::load(&o).unwrap();
        let n = corpus.sequences().len();
        let sc = corpus.scenario().unwrap();
        assert_eq!(sc.world_size, world);
        assert_eq!(sc.name, format!("demo:{}", dir.path().display()));
        assert_eq!(
            sc.sources,
            BTreeSet::from([MASK.to_owned(), TOKENS.to_owned()])
        );
        let samples = n.div_ceil(world as usize) as u64;
        assert_eq!(sc.steps.len() as u64, samples.div_ceil(batch));
        let mut per_rank_samples = vec![0u64; world as usize];
        for (s, step) in sc.steps.iter().enumerate() {
            assert_eq!(step.len(), world as usize, "step {s}");
            let batches: BTreeSet<u64> = step.iter().map(|i| size(&i[TOKENS])[0]).collect();
            assert_eq!(batches.len(), 1, "step {s}: one batch size on every rank");
            for (r, inputs) in step.iter().enumerate() {
                assert_eq!(inputs.len(), 2);
                let t = size(&inputs[TOKENS]);
                assert_eq!(t, size(&inputs[MASK]), "mask is the size of tokens");
                assert_eq!(t.len(), 2);
                let (b, l) = (t[0], t[1]);
                assert!((1..=max_seq_len).contains(&l), "step {s} rank {r}: {t:?}");
                assert!((1..=batch).contains(&b));
                if s + 1 < sc.steps.len() {
                    assert_eq!(b, batch, "only the last batch may be smaller");
                }
                per_rank_samples[r] += b;
            }
        }
        assert!(per_rank_samples.iter().all(|&c| c == samples));
    }
}

#[test]
fn batches_are_padded_to_their_longest_sequence() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 5);
    let o = opts(dir.path())
        .with_world_size(3)
        .with_batch_size(3)
        .with_max_seq_len(20);
    let corpus = Corpus::load(&o).unwrap();
    let schedule = corpus.schedule().unwrap();
    let sc = corpus.scenario().unwrap();
    assert!(corpus.sequences().iter().any(|s| s.tokens > 20));
    for (s, step) in schedule.iter().enumerate() {
        for (r, batch) in step.iter().enumerate() {
            let longest = batch
                .samples
                .iter()
                .map(|&i| corpus.sequences()[i].tokens.min(20))
                .max()
                .unwrap();
            assert_eq!(batch.seq_len, longest);
            assert_eq!(size(&sc.steps[s][r][TOKENS]), batch.size().to_vec());
        }
    }
}

#[test]
fn sharding_is_distributed_sampler_and_covers_every_sequence() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 7);
    for world in [1u32, 2, 3, 4, 5, 64] {
        let o = opts(dir.path()).with_world_size(world).with_batch_size(2);
        let corpus = Corpus::load(&o).unwrap();
        let n = corpus.sequences().len();
        let order = corpus.epoch_order(0);
        let w = world as usize;
        let per_rank = n.div_ceil(w);
        // DistributedSampler: pad by repeating from the start, then stride.
        let padded: Vec<usize> = order.iter().copied().cycle().take(per_rank * w).collect();
        let mut union = BTreeSet::new();
        for r in 0..world {
            let got = corpus.rank_samples(0, r);
            let want: Vec<usize> = padded.iter().copied().skip(r as usize).step_by(w).collect();
            assert_eq!(got, want, "world {world} rank {r}");
            assert_eq!(got.len(), per_rank);
            union.extend(got);
        }
        assert_eq!(union, (0..n).collect::<BTreeSet<_>>(), "world {world}");
        assert!(corpus.rank_samples(0, world).is_empty());
        // The schedule holds exactly those samples, in order.
        let schedule = corpus.schedule().unwrap();
        for r in 0..world {
            let flat: Vec<usize> = schedule
                .iter()
                .flat_map(|step| step[r as usize].samples.iter().copied())
                .collect();
            assert_eq!(flat, corpus.rank_samples(0, r));
        }
        let summary = corpus.summary();
        assert_eq!(summary.samples_per_rank, per_rank as u64);
        assert_eq!(summary.padding_samples, (per_rank * w - n) as u64);
    }
}

#[test]
fn the_shuffle_is_deterministic_and_depends_on_the_seed_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 8);
    let a = corpus::build(&opts(dir.path())).unwrap();
    let b = corpus::build(&opts(dir.path())).unwrap();
    assert_eq!(a, b);
    let c0 = Corpus::load(&opts(dir.path())).unwrap();
    let c1 = Corpus::load(&opts(dir.path()).with_seed(1)).unwrap();
    let n = c0.sequences().len();
    assert!(n > 20);
    let identity: Vec<usize> = (0..n).collect();
    assert_ne!(c0.epoch_order(0), identity, "shuffled");
    assert_ne!(c0.epoch_order(0), c1.epoch_order(0), "another seed");
    // set_epoch: epoch e of seed s shuffles like epoch 0 of seed s + e.
    assert_eq!(c0.epoch_order(1), c1.epoch_order(0));
    assert_ne!(c0.rank_samples(0, 0), c1.rank_samples(0, 0));
    let mut sorted = c1.epoch_order(0);
    sorted.sort_unstable();
    assert_eq!(sorted, identity);
}

#[test]
fn words_and_chars_tokenisation() {
    let dir = tempfile::tempdir().unwrap();
    // Paragraph 1 (lines 1-2): "héllo   wörld" / "foo" → 3 words,
    // "héllo wörld foo" = 15 Unicode scalar values (17 bytes).
    // Paragraph 2 (line 5): "α β γ" → 3 words, 5 chars.
    std::fs::write(
        dir.path().join("t"),
        "  héllo   wörld\nfoo\n\t\n\n α β\tγ \n",
    )
    .unwrap();
    let tokens = |tokenizer| {
        let c = Corpus::load(&opts(dir.path()).with_tokenizer(tokenizer)).unwrap();
        c.sequences()
            .iter()
            .map(|s| (s.line, s.tokens))
            .collect::<Vec<_>>()
    };
    assert_eq!(tokens(Tokenizer::Words), vec![(1, 3), (5, 3)]);
    assert_eq!(tokens(Tokenizer::Chars), vec![(1, 15), (5, 5)]);
    assert_eq!("chars".parse::<Tokenizer>().unwrap(), Tokenizer::Chars);
    assert_eq!("words".parse::<Tokenizer>().unwrap(), Tokenizer::Words);
    assert_eq!(Tokenizer::default(), Tokenizer::Words);
    assert!(matches!(
        "bpe".parse::<Tokenizer>(),
        Err(CorpusError::InvalidOption {
            option: "tokenizer",
            ..
        })
    ));
    // Capping: len = min(tokens, max_seq_len).
    let c = Corpus::load(
        &opts(dir.path())
            .with_tokenizer(Tokenizer::Chars)
            .with_max_seq_len(8),
    )
    .unwrap();
    let lens: Vec<u64> = c.sequences().iter().map(|s| s.len).collect();
    assert_eq!(lens, vec![8, 5]);
    assert_eq!(c.summary().capped_sequences, 1);
    assert_eq!(c.summary().tokens, 20);
}

#[test]
fn non_utf8_bytes_are_replaced() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bin"), b"ab\xff\xfecd ef\n\ng").unwrap();
    let c = Corpus::load(&opts(dir.path()).with_tokenizer(Tokenizer::Chars)).unwrap();
    // "ab" + U+FFFD U+FFFD + "cd ef" = 9 chars.
    let t: Vec<u64> = c.sequences().iter().map(|s| s.tokens).collect();
    assert_eq!(t, vec![9, 1]);
}

fn message(e: &CorpusError) -> String {
    e.to_string()
}

#[test]
fn missing_empty_and_textless_directories_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let e = Corpus::load(&opts(&missing)).unwrap_err();
    assert!(matches!(&e, CorpusError::Unreadable { dir, .. } if dir == &missing));
    let m = message(&e);
    assert!(
        m.contains(&missing.display().to_string()) && m.contains("--corpus DIR"),
        "{m}"
    );

    let file = dir.path().join("file");
    std::fs::write(&file, "text").unwrap();
    let e = Corpus::load(&opts(&file)).unwrap_err();
    assert!(matches!(&e, CorpusError::NotADirectory { dir } if dir == &file));
    assert!(message(&e).contains("--corpus DIR"));

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = Corpus::load(&opts(&empty)).unwrap_err();
    assert!(matches!(&e, CorpusError::Empty { dir, skipped: 0 } if dir == &empty));
    let m = message(&e);
    assert!(
        m.contains(&empty.display().to_string()) && m.contains("--corpus DIR"),
        "{m}"
    );

    std::fs::create_dir(empty.join("sub")).unwrap();
    let e = corpus::build(&opts(&empty)).unwrap_err();
    assert!(matches!(e, CorpusError::Empty { skipped: 1, .. }));

    std::fs::write(empty.join("blank"), " \n\n\t\n").unwrap();
    std::fs::write(empty.join("zero"), "").unwrap();
    let e = corpus::build(&opts(&empty)).unwrap_err();
    assert!(matches!(e, CorpusError::NoText { files: 2, .. }), "{e}");
    assert!(message(&e).contains("--corpus DIR"));
}

#[test]
fn invalid_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 1);
    let base = opts(dir.path());
    for (o, field) in [
        (base.clone().with_world_size(0), "world_size"),
        (base.clone().with_world_size(65_537), "world_size"),
        (base.clone().with_batch_size(0), "batch_size"),
        (base.clone().with_max_seq_len(0), "max_seq_len"),
        (base.clone().with_epochs(0), "epochs"),
        (base.clone().with_steps(0), "steps"),
    ] {
        match Corpus::load(&o) {
            Err(CorpusError::InvalidOption { option, .. }) => assert_eq!(option, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn byte_limits_truncate_files_and_stop_reading() {
    let dir = tempfile::tempdir().unwrap();
    // 20 one-word paragraphs of 4 bytes each ("wNN\n" + "\n" = 5 bytes).
    let text: String = (10..30).map(|i| format!("w{i}\n\n")).collect();
    assert_eq!(text.len(), 100);
    for name in ["a", "b", "c"] {
        std::fs::write(dir.path().join(name), &text).unwrap();
    }
    // Per file: the first 12 bytes "w10\n\nw11\n\nw1" → 3 paragraphs.
    let c = Corpus::load(&opts(dir.path()).with_max_file_bytes(12)).unwrap();
    assert_eq!(c.documents().len(), 3);
    assert!(c.documents().iter().all(|d| d.truncated && d.bytes == 12));
    assert_eq!(c.sequences().len(), 9);
    assert_eq!(c.summary().truncated_documents, 3);
    assert_eq!(c.summary().bytes, 36);

    // In total: a whole, 50 bytes of b, c skipped.
    let c = Corpus::load(&opts(dir.path()).with_max_total_bytes(150)).unwrap();
    let docs: Vec<(&str, u64, bool)> = c
        .documents()
        .iter()
        .map(|d| (d.name.as_str(), d.bytes, d.truncated))
        .collect();
    assert_eq!(docs, vec![("a", 100, false), ("b", 50, true)]);
    assert_eq!(c.sequences().len(), 30);
    assert_eq!(c.skipped().len(), 1);
    assert_eq!(c.skipped()[0].name, "c");
    assert_eq!(c.skipped()[0].reason, SkipReason::OverTotalBytes);
    assert_eq!(c.summary().skipped, 1);

    // Exactly at the limit is not truncated.
    let c = Corpus::load(
        &opts(dir.path())
            .with_max_file_bytes(100)
            .with_max_total_bytes(300),
    )
    .unwrap();
    assert!(c.documents().iter().all(|d| !d.truncated && d.bytes == 100));
    assert!(c.skipped().is_empty());

    // The number of directory entries is bounded too.
    let e = Corpus::load(&opts(dir.path()).with_max_files(2)).unwrap_err();
    assert!(matches!(e, CorpusError::TooManyFiles { limit: 2, .. }));
}

#[test]
fn steps_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    write_corpus(dir.path(), 6);
    let base = |d: &Path| opts(d).with_batch_size(2);
    let one = Corpus::load(&base(dir.path())).unwrap();
    let per_epoch = one.steps_per_epoch();
    assert!(per_epoch >= 3);
    let cut = corpus::build(&base(dir.path()).with_steps(2)).unwrap();
    let full = one.scenario().unwrap();
    assert_eq!(cut.steps, full.steps[..2].to_vec());
    // More steps than there are: every step, no more.
    let all = corpus::build(&base(dir.path()).with_steps(1_000)).unwrap();
    assert_eq!(all, full);
    // Three epochs: the first is epoch 0, the next reshuffle.
    let three = Corpus::load(&base(dir.path()).with_epochs(3)).unwrap();
    let schedule = three.schedule().unwrap();
    assert_eq!(schedule.len() as u64, 3 * per_epoch);
    assert_eq!(three.summary().steps, 3 * per_epoch);
    let e = usize::try_from(per_epoch).unwrap();
    let flat: Vec<usize> = schedule[e..2 * e]
        .iter()
        .flat_map(|s| s[0].samples.iter().copied())
        .collect();
    assert_eq!(flat, three.rank_samples(1, 0));
    assert_eq!(
        three.scenario().unwrap().steps[..e],
        full.steps[..],
        "epoch 0 is the one-epoch schedule"
    );
    // The schedule is bounded.
    let e = Corpus::load(
        &base(dir.path())
            .with_epochs(3)
            .with_max_rank_steps(3 * per_epoch * 4 - 1),
    )
    .unwrap()
    .scenario()
    .unwrap_err();
    assert!(
        matches!(e, CorpusError::TooManySteps { world_size: 4, .. }),
        "{e}"
    );
}

#[cfg(unix)]
#[test]
fn symlinks_are_followed_and_read_once() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("GPL-3"), "gpl text\n\nmore").unwrap();
    std::os::unix::fs::symlink(dir.path().join("GPL-3"), dir.path().join("GPL")).unwrap();
    std::fs::write(outside.path().join("ext"), "outside words here").unwrap();
    std::os::unix::fs::symlink(outside.path().join("ext"), dir.path().join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("broken")).unwrap();
    let c = Corpus::load(&opts(dir.path())).unwrap();
    let names: Vec<&str> = c.documents().iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["GPL-3", "link"]);
    let skipped: Vec<(&str, &SkipReason)> = c
        .skipped()
        .iter()
        .map(|s| (s.name.as_str(), &s.reason))
        .collect();
    // Skipped entries are listed by name (byte order: upper case first).
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert_eq!(
        skipped[0],
        ("GPL", &SkipReason::Duplicate { of: "GPL-3".into() })
    );
    assert_eq!(skipped[1].0, "broken");
    assert!(matches!(skipped[1].1, SkipReason::Unreadable(_)));
    assert_eq!(c.sequences().len(), 3);
}

fn compile_steps(report: &compiler_collectives_harness::scenario::RunReport) -> Vec<Vec<u64>> {
    report
        .ranks
        .iter()
        .map(|r| r.compile_steps.clone())
        .collect()
}

#[test]
fn common_licenses_demo_agrees_with_collectives() {
    let o = CorpusOptions::default();
    if !o.dir.is_dir() {
        return compiler_collectives_conformance::skip::skip_test(
            "common_licenses_demo_agrees_with_collectives",
            compiler_collectives_conformance::skip::Missing::install(format!(
                "{} does not exist (Debian's base-files)",
                o.dir.display()
            )),
        );
    }
    let (sc, summary): (Scenario, _) = corpus::build_with_summary(&o).unwrap();
    println!("{summary}");
    assert_eq!(sc.world_size, 4);
    assert!(summary.documents > 0 && summary.sequences > 0);
    assert_eq!(summary.steps, sc.steps.len() as u64);

    let with = run_in_process(&sc, Mode::CollectivesAndGuardCollectives, RUNNER_TIMEOUT).unwrap();
    println!("with collectives and guard votes: {}", with.to_json());
    assert!(!with.failed(), "{}", with.to_json());
    let first = &with.ranks[0];
    assert!(!first.compile_steps.is_empty());
    for r in &with.ranks {
        assert_eq!(r.compile_steps, first.compile_steps, "rank {}", r.rank);
        assert_eq!(r.dynamic_dims, first.dynamic_dims, "rank {}", r.rank);
        assert_eq!(
            r.uncompiled_steps, first.uncompiled_steps,
            "rank {}",
            r.rank
        );
    }

    let without = run_in_process(&sc, Mode::NoCollectives, RUNNER_TIMEOUT).unwrap();
    assert!(!without.failed(), "{}", without.to_json());
    println!("without collectives: {}", without.to_json());
    let steps = compile_steps(&without);
    let diverge = steps.iter().any(|s| s != &steps[0])
        || without
            .ranks
            .iter()
            .any(|r| r.dynamic_dims != without.ranks[0].dynamic_dims);
    println!(
        "without collectives the ranks {}: compile steps {steps:?}",
        if diverge {
            "diverge"
        } else {
            "happen to agree"
        }
    );
}
