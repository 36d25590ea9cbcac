//! Decision kinds beyond shapes (issue 9, docs/semantics.md): votes, must-agree
//! values, best-choice and sharded autotuning, and the persistent artifact
//! store behind cache-hit agreement — over in-process ranks (threads), with
//! the join laws of the new kinds property-tested.

use compiler_collectives_core::cache::{CacheOptions, CompileCache, Inputs};
use compiler_collectives_core::decisions::agree::{must_agree, AgreedValues, MustAgree};
use compiler_collectives_core::decisions::autotune::{
    autotune, autotune_ops, median_nanos, Choice, Measure, Op, Strategy as Tuning, Timings,
};
use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_core::decisions::votes::{AllVote, AnyVote, Max, MaxEach, Min, TextLists};
use compiler_collectives_core::persistence::artifacts::{
    ArtifactOrigin, ArtifactStore, DiskArtifacts,
};
use compiler_collectives_core::Join;
use compiler_collectives_core::{
    Channel, ChannelOptions, Error, ExchangeOptions, InProcessGroup, PerRank, RankGroup, Topology,
    Transport,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Runs `body(rank, channel)` on `world` in-process ranks; results by rank.
fn ranks<T, F>(world: u32, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(u32, Channel) -> T + Send + Sync + 'static,
{
    ranks_with_timeout(world, Duration::from_secs(20), body)
}

fn ranks_with_timeout<T, F>(world: u32, timeout: Duration, body: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(u32, Channel) -> T + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let handles: Vec<_> = InProcessGroup::create(world)
        .expect("group")
        .into_iter()
        .map(|t| {
            let body = Arc::clone(&body);
            std::thread::spawn(move || {
                let rank = t.rank();
                let ch = Channel::with_options(
                    Arc::new(t),
                    ChannelOptions::default().with_timeout(timeout),
                )
                .expect("channel");
                body(rank, ch)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank panicked"))
        .collect()
}

fn groups(err: &Error) -> Vec<(Vec<u32>, String)> {
    match err {
        Error::Disagreement { groups, .. } => groups
            .iter()
            .map(|RankGroup { ranks, what }| (ranks.clone(), what.clone()))
            .collect(),
        other => panic!("expected a disagreement, got {other}"),
    }
}

// ---------------------------------------------------------------------------
// Votes
// ---------------------------------------------------------------------------

#[test]
fn votes_join_every_ranks_value() {
    let out = ranks(4, |rank, mut ch| {
        let (yes, no) = (AnyVote(rank == 2), AllVote(rank != 3));
        let (hi, lo) = (Max(i64::from(rank) * 10 - 7), Min(i64::from(rank) * 10 - 7));
        let any = ch.exchange("v", &yes).unwrap();
        let all = ch.exchange("v", &no).unwrap();
        let max = ch.exchange("v", &hi).unwrap();
        let min = ch.exchange("v", &lo).unwrap();
        let all_yes = ch.exchange("v", &AllVote(true)).unwrap();
        (
            any.any(),
            all.all(),
            max.merged().0,
            min.merged().0,
            all_yes.all(),
            all_yes.fast_path(),
        )
    });
    for o in out {
        assert_eq!(o, (true, false, 23, -7, true, true));
    }
}

/// The reference cache's guard votes are plain `AnyVote` exchanges of the
/// framework: a rank that votes by hand with `AnyVote` pairs with a cache's
/// vote (a different kind would be a desync), and its miss makes the cache
/// recompile.
#[test]
fn the_reference_caches_guard_vote_is_an_any_vote() {
    let mut options = CacheOptions::default();
    options.collectives = false;
    options.guard_collectives = true;
    let config = options.config_text();
    let x: Inputs = [("x".to_string(), Observation::tensor([10]))].into();
    let out = ranks(2, move |rank, mut ch| {
        if rank == 0 {
            let mut cache: CompileCache<()> = CompileCache::new("f", options.clone());
            let first = cache
                .call(&x, Some(&mut ch), |_| ())
                .map_err(|e| e.to_string())?;
            let second = cache
                .call(&x, Some(&mut ch), |_| ())
                .map_err(|e| e.to_string())?;
            Ok(format!("{first:?} {second:?}"))
        } else {
            // The first call takes no vote (nothing to check); the second does.
            let v = ch
                .exchange_with(
                    "f",
                    &AnyVote(true),
                    &compiler_collectives_core::ExchangeOptions::default().with_config(&config),
                )
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(format!("vote {}", v.any()))
        }
    });
    assert_eq!(out[0].as_deref(), Ok("Compiled(0) Compiled(1)"));
    assert_eq!(out[1].as_deref(), Ok("vote true"));
}

// ---------------------------------------------------------------------------
// Must-agree values
// ---------------------------------------------------------------------------

#[test]
fn agreeing_values_take_the_fast_path() {
    let out = ranks(3, |_, mut ch| {
        let r = MustAgree::new()
            .value("compiler", "ccol 0.1.0")
            .value("config", "a1b2")
            .check(&mut ch, "startup");
        // The channel stays usable and in step.
        let next = ch.exchange("next", &Max(1)).map(|g| g.seq());
        (
            r.map_err(|e| e.to_string()),
            next.map_err(|e| e.to_string()),
        )
    });
    for o in out {
        assert_eq!(o, (Ok(()), Ok(1)));
    }
}

#[test]
fn disagreement_names_each_value_with_its_ranks_on_every_rank() {
    let out = ranks(4, |rank, mut ch| {
        let version = match rank {
            0 | 2 => "2.13.0",
            1 => "2.12.1",
            _ => "2.14.0",
        };
        let err = must_agree(&mut ch, "startup", "compiler", version).unwrap_err();
        let after = ch.exchange("next", &Max(1)).unwrap_err();
        (err.to_string(), groups(&err), after.kind())
    });
    let want = vec![
        (vec![0, 2], "compiler='2.13.0'".to_string()),
        (vec![1], "compiler='2.12.1'".to_string()),
        (vec![3], "compiler='2.14.0'".to_string()),
    ];
    for (text, g, after) in &out {
        assert_eq!(g, &want);
        assert!(text.contains("must-agree value 'compiler'"), "{text}");
        assert_eq!(*after, "channel_unusable");
    }
    assert!(
        out.windows(2).all(|w| w[0].0 == w[1].0),
        "same error text on every rank"
    );
}

/// The same disagreement where the channel runs the hierarchical exchange
/// (the tree from 2 ranks here; from 64 by default): the tree moves joins,
/// not every rank's value, and the check used to return Ok on every rank.
/// A must-agree check runs flat whatever the topology, and names the ranks.
#[test]
fn disagreement_is_found_and_named_where_the_channel_runs_the_tree() {
    let handles: Vec<_> = InProcessGroup::create(4)
        .expect("group")
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let rank = t.rank();
                let options = ChannelOptions::default()
                    .with_timeout(Duration::from_secs(20))
                    .with_hierarchical_from(2);
                let mut ch = Channel::with_options(Arc::new(t), options).expect("channel");
                assert_eq!(ch.topology(), &Topology::Tree);
                let version = if rank == 3 { "2.14.0" } else { "2.13.0" };
                let same = must_agree(&mut ch, "startup", "python", "3.11");
                let err = must_agree(&mut ch, "startup", "compiler", version).unwrap_err();
                (same, groups(&err))
            })
        })
        .collect();
    for h in handles {
        let (same, g) = h.join().expect("rank");
        assert!(same.is_ok(), "{same:?}");
        assert_eq!(
            g,
            vec![
                (vec![0, 1, 2], "compiler='2.13.0'".to_string()),
                (vec![3], "compiler='2.14.0'".to_string()),
            ]
        );
    }
}

#[test]
fn a_value_missing_on_a_rank_is_shown_absent_and_only_differing_names_are_listed() {
    let out = ranks(2, |rank, mut ch| {
        let mut m = MustAgree::new().value("compiler", "same");
        if rank == 0 {
            m = m.value("code", "4be0");
        }
        groups(&m.check(&mut ch, "k").unwrap_err())
    });
    for g in out {
        assert_eq!(
            g,
            vec![
                (vec![0], "code='4be0'".to_string()),
                (vec![1], "code=<absent>".to_string())
            ]
        );
    }
}

// ---------------------------------------------------------------------------
// Autotuning
// ---------------------------------------------------------------------------

/// A deterministic "benchmark": candidate `c{i}` takes `BASE[i]` µs plus
/// per-rank noise (rank·3 µs), as samples around that value (median: +1 µs).
fn bench(rank: u32, cand: &str) -> std::result::Result<Vec<Duration>, String> {
    const BASE: [u64; 12] = [250, 260, 270, 280, 290, 300, 310, 205, 320, 330, 340, 350];
    let i: usize = cand[1..]
        .parse()
        .map_err(|_| format!("bad candidate {cand}"))?;
    let us = BASE[i] + u64::from(rank) * 3;
    Ok(vec![
        Duration::from_micros(us + 50),
        Duration::from_micros(us),
        Duration::from_micros(us + 1),
    ])
}

#[test]
fn sharded_autotuning_4_ranks_12_candidates_same_winner_3_benchmarks_each() {
    let candidates: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    let out = ranks(4, move |rank, mut ch| {
        let mut ran = Vec::new();
        let choice = autotune(&mut ch, "mm", &candidates, Tuning::Sharded, |c| {
            ran.push(c.to_owned());
            bench(rank, c)
        })
        .unwrap();
        (choice, ran)
    });
    let winners: BTreeSet<Option<String>> = out.iter().map(|(c, _)| c.winner.clone()).collect();
    assert_eq!(winners, BTreeSet::from([Some("c7".to_string())]));
    for (rank, (choice, ran)) in (0u32..).zip(&out) {
        let want: Vec<String> = (0..12)
            .filter(|i| i % 4 == rank)
            .map(|i| format!("c{i}"))
            .collect();
        assert_eq!(
            ran, &want,
            "rank {rank} benchmarks candidates i with i mod 4 = rank"
        );
        assert_eq!(choice.benchmarked, want);
        // The aggregate of c7 is rank 3's median (7 mod 4 = 3): 205 + 9 + 1 µs.
        assert_eq!(choice.aggregate["c7"], Measure::Nanos(215_000));
        assert_eq!(choice.winner_time(), Some(Duration::from_micros(215)));
        assert!(choice.failed.is_empty());
        assert_eq!(
            choice.aggregate, out[0].0.aggregate,
            "same aggregate everywhere"
        );
    }
}

#[test]
fn best_choice_takes_the_slowest_ranks_median_not_rank_0s() {
    // a is fastest on rank 0 but slow on rank 2; b is steady.
    let out = ranks(3, |rank, mut ch| {
        autotune(&mut ch, "op", &["a", "b"], Tuning::EveryRank, |c| {
            let us = match (c, rank) {
                ("a", 2) => 90,
                ("a", _) => 10,
                _ => 40,
            };
            Ok(vec![Duration::from_micros(us)])
        })
        .unwrap()
    });
    for c in &out {
        assert_eq!(c.winner.as_deref(), Some("b"));
        assert_eq!(c.aggregate["a"], Measure::Nanos(90_000));
        assert_eq!(c.benchmarked, ["a", "b"]);
    }
}

#[test]
fn ties_are_broken_by_candidate_key_not_by_list_order() {
    let out = ranks(2, |_, mut ch| {
        autotune(
            &mut ch,
            "op",
            &["zeta", "alpha", "mid"],
            Tuning::Sharded,
            |c| Ok(vec![Duration::from_micros(if c == "mid" { 9 } else { 5 })]),
        )
        .unwrap()
        .winner
    });
    assert_eq!(out, vec![Some("alpha".to_string()); 2]);
}

#[test]
fn a_failed_benchmark_excludes_the_candidate_everywhere_and_names_its_rank() {
    let out = ranks(3, |rank, mut ch| {
        autotune(
            &mut ch,
            "op",
            &["fast", "slow"],
            Tuning::EveryRank,
            |c| match (c, rank) {
                ("fast", 2) => Err("out of shared memory".to_string()),
                ("fast", _) => Ok(vec![Duration::from_micros(1)]),
                _ => Ok(vec![Duration::from_micros(100)]),
            },
        )
        .unwrap()
    });
    for c in &out {
        assert_eq!(c.winner.as_deref(), Some("slow"));
        let f = &c.failed["fast"];
        assert_eq!(f.ranks, [2]);
        assert_eq!(f.reason, "out of shared memory");
    }
}

#[test]
fn all_candidates_failing_or_empty_samples_leave_no_winner() {
    let out = ranks(2, |_, mut ch| {
        autotune(&mut ch, "op", &["a", "b"], Tuning::Sharded, |c| {
            if c == "a" {
                Err("compile error".into())
            } else {
                Ok(vec![])
            }
        })
        .unwrap()
    });
    for c in &out {
        assert_eq!(c.winner, None);
        assert_eq!(c.failed["a"].ranks, [0]);
        assert_eq!(c.failed["b"].ranks, [1]);
        assert_eq!(c.failed["b"].reason, "the benchmark returned no samples");
    }
}

#[test]
fn several_ops_share_one_exchange_and_one_shard_count() {
    let ops = vec![
        Op::new("mm", ["t16", "t32", "t64"]),
        Op::new("conv", ["direct", "winograd", "fft"]),
    ];
    let out = ranks(2, move |rank, mut ch| {
        let mut count = 0;
        let choices = autotune_ops(&mut ch, "step", &ops, Tuning::Sharded, |op, c| {
            count += 1;
            let us = match (op, c) {
                ("mm", "t32") | ("conv", "fft") => 3,
                _ => 7,
            };
            Ok(vec![Duration::from_micros(us + u64::from(rank))])
        })
        .unwrap();
        (choices, count, ch.next_seq())
    });
    for (choices, count, seq) in &out {
        assert_eq!(*count, 3, "6 candidates over 2 ranks");
        assert_eq!(*seq, 1, "one exchange");
        let w: BTreeMap<&str, Option<&str>> = choices
            .iter()
            .map(|(k, c): (&String, &Choice)| (k.as_str(), c.winner.as_deref()))
            .collect();
        assert_eq!(
            w,
            BTreeMap::from([("conv", Some("fft")), ("mm", Some("t32"))])
        );
    }
}

#[test]
fn differing_candidate_lists_are_a_typed_error_on_every_rank_not_a_hang() {
    let start = std::time::Instant::now();
    let out = ranks_with_timeout(3, Duration::from_secs(5), |rank, mut ch| {
        let cands: &[&str] = if rank == 1 {
            &["a", "b", "c"]
        } else {
            &["a", "b"]
        };
        autotune(&mut ch, "mm", cands, Tuning::Sharded, |_| {
            Ok(vec![Duration::from_micros(1)])
        })
        .unwrap_err()
    });
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "no waiting for a deadline"
    );
    for err in &out {
        let text = err.to_string();
        assert!(
            text.contains("the candidate lists of autotuning 'mm'"),
            "{text}"
        );
        let g = groups(err);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].0, [0, 2]);
        assert_eq!(g[1].0, [1]);
        assert!(g[1].1.contains(r#"["a","b","c"]"#), "{}", g[1].1);
    }
}

#[test]
fn repeated_candidates_are_invalid_on_every_rank_after_the_exchange() {
    let out = ranks(2, |_, mut ch| {
        let err = autotune(&mut ch, "mm", &["a", "a"], Tuning::Sharded, |_| {
            Ok(vec![Duration::from_micros(1)])
        })
        .unwrap_err();
        (err.kind().as_str(), ch.next_seq())
    });
    assert_eq!(out, vec![("invalid_argument", 1); 2]);
}

#[test]
fn medians() {
    let d = |v: &[u64]| {
        v.iter()
            .map(|&n| Duration::from_nanos(n))
            .collect::<Vec<_>>()
    };
    assert_eq!(median_nanos(&d(&[])), None);
    assert_eq!(median_nanos(&d(&[7])), Some(7));
    assert_eq!(median_nanos(&d(&[9, 1, 5])), Some(5));
    assert_eq!(median_nanos(&d(&[4, 1, 3, 100])), Some(3)); // (3 + 4) / 2 rounded down
    assert_eq!(median_nanos(&d(&[u64::MAX, u64::MAX])), Some(u64::MAX));
}

// ---------------------------------------------------------------------------
// Persistent artifact store
// ---------------------------------------------------------------------------

#[test]
fn disk_artifacts_round_trip_and_refuse_what_is_not_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskArtifacts::open(dir.path().join("nested/cache")).unwrap();
    assert_eq!(store.load("k").unwrap(), None);
    store.store("k", b"artifact bytes").unwrap();
    assert_eq!(
        store.load("k").unwrap().as_deref(),
        Some(&b"artifact bytes"[..])
    );
    store.store("k", b"v2").unwrap();
    assert_eq!(store.load("k").unwrap().as_deref(), Some(&b"v2"[..]));
    // Only the artifact file is left: the temporary file was renamed.
    let files: Vec<_> = std::fs::read_dir(store.dir()).unwrap().collect();
    assert_eq!(files.len(), 1);
    // A file holding another key (a collision, a copied file) is a miss.
    std::fs::copy(store.path_of("k"), store.path_of("other")).unwrap();
    assert_eq!(store.load("other").unwrap(), None);
    // Garbage and truncation are misses, not errors.
    for bad in [
        &b""[..],
        b"CCOLART1",
        b"CCOLART1\xff\xff\xff\xffk",
        b"not an artifact",
    ] {
        std::fs::write(store.path_of("k"), bad).unwrap();
        assert_eq!(store.load("k").unwrap(), None, "{bad:?}");
    }
    // Over the size limit is a miss.
    store.store("big", &[7u8; 100]).unwrap();
    let small = DiskArtifacts::open(store.dir()).unwrap().with_max_bytes(64);
    assert_eq!(small.load("big").unwrap(), None);
}

/// One rank warm, one cold, agreement on: both run the backend compile (and
/// its exchange); a second process-level run where both are warm loads on both.
#[test]
fn cache_hit_agreement_keeps_a_hit_only_if_every_rank_hit() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let paths: Vec<_> = dirs.iter().map(|d| d.path().to_owned()).collect();
    let x: Inputs = [("x".to_string(), Observation::tensor([8, 16]))].into();
    // Warm rank 0 only: a single-rank earlier run.
    {
        let mut alone = CacheOptions::default();
        alone.collectives = false;
        let mut c: CompileCache<String> = CompileCache::new("step", alone);
        let store = DiskArtifacts::open(&paths[0]).unwrap();
        let call = c
            .call_persistent(&x, None, &store, |_, _| Ok("k".into()))
            .unwrap();
        assert_eq!(
            call.origin,
            Some(ArtifactOrigin::Compiled { local_hit: false })
        );
    }
    let run = |paths: Vec<std::path::PathBuf>, x: Inputs| {
        ranks(2, move |rank, mut ch| {
            let store = DiskArtifacts::open(&paths[rank as usize]).unwrap();
            let mut c: CompileCache<String> = CompileCache::new("step", CacheOptions::default());
            let call = c
                .call_persistent(&x, Some(&mut ch), &store, |_, ch| {
                    // The compile's own collective: every rank must be here.
                    let ch = ch.expect("a channel");
                    ch.exchange("step/compile", &AllVote(true))?;
                    Ok::<_, Error>("k".to_string())
                })
                .unwrap();
            (call.origin, c.artifact(0).cloned(), ch.next_seq())
        })
    };
    let first = run(paths.clone(), x.clone());
    assert_eq!(
        first,
        vec![
            (
                Some(ArtifactOrigin::Compiled { local_hit: true }),
                Some("k".into()),
                3
            ),
            (
                Some(ArtifactOrigin::Compiled { local_hit: false }),
                Some("k".into()),
                3
            ),
        ]
    );
    // Both disks now hold it: both load, no compile exchange.
    let second = run(paths, x);
    for o in second {
        assert_eq!(o, (Some(ArtifactOrigin::Loaded), Some("k".into()), 2));
    }
}

proptest! {
    #[test]
    fn timings_join_laws(a in timings(), b in timings(), c in timings()) {
        check_laws(&a, &b, &c);
    }

    #[test]
    fn agreed_values_join_laws(a in agreed(), b in agreed(), c in agreed()) {
        check_laws(&a, &b, &c);
    }

    #[test]
    fn vote_join_laws(a: (bool, i64), b: (bool, i64), c: (bool, i64)) {
        check_laws(&AnyVote(a.0), &AnyVote(b.0), &AnyVote(c.0));
        check_laws(&AllVote(a.0), &AllVote(b.0), &AllVote(c.0));
        check_laws(&Max(a.1), &Max(b.1), &Max(c.1));
        check_laws(&Min(a.1), &Min(b.1), &Min(c.1));
    }

    #[test]
    fn max_each_and_text_lists_join_laws(
        a in proptest::collection::vec(any::<i64>(), 0..6),
        b in proptest::collection::vec(any::<i64>(), 0..6),
        c in proptest::collection::vec(any::<i64>(), 0..6),
        s in proptest::collection::vec(proptest::collection::vec("[a-c]{0,2}", 0..3), 3),
    ) {
        check_laws(&MaxEach(a), &MaxEach(b), &MaxEach(c));
        check_laws(
            &TextLists::of(s[0].clone()),
            &TextLists::of(s[1].clone()),
            &TextLists::of(s[2].clone()),
        );
    }
}

#[test]
fn max_each_is_the_maximum_at_each_position_and_text_lists_every_rank_s_list() {
    let ranks = InProcessGroup::create(3).unwrap();
    let handles: Vec<_> = ranks
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let r = i64::from(t.rank());
                let mut ch = Channel::new(std::sync::Arc::new(t)).unwrap();
                // Rank 2 sends one size more: the others' lists end earlier.
                let mut sizes = vec![10 - r, r * 4, 7];
                if r == 2 {
                    sizes.push(-3);
                }
                let maxed = ch
                    .exchange("sizes", &MaxEach(sizes))
                    .unwrap()
                    .merged()
                    .0
                    .clone();
                let names = TextLists::of(vec![format!("n{r}"), "shared".into()]);
                let every = ExchangeOptions::default().with_every_value(true);
                let g = ch.exchange_with("names", &names, &every).unwrap();
                let lists: Vec<Vec<String>> = match g.per_rank() {
                    PerRank::Values(v) => v.iter().map(|l| l.one().unwrap().to_vec()).collect(),
                    other => panic!("every value expected, got {other:?}"),
                };
                (maxed, lists, g.merged().0.len())
            })
        })
        .collect();
    for h in handles {
        let (maxed, lists, distinct) = h.join().unwrap();
        assert_eq!(maxed, vec![10, 8, 7, -3]);
        assert_eq!(
            lists,
            (0..3)
                .map(|r| vec![format!("n{r}"), "shared".to_string()])
                .collect::<Vec<_>>()
        );
        assert_eq!(distinct, 3);
    }
}

fn j<J: Join>(a: &J, b: &J) -> J {
    let mut x = a.clone();
    x.join(b);
    x
}

fn check_laws<J: Join + PartialEq>(a: &J, b: &J, c: &J) {
    assert_eq!(j(a, b), j(b, a), "commutative");
    assert_eq!(j(&j(a, b), c), j(a, &j(b, c)), "associative");
    assert_eq!(j(a, a), *a, "idempotent");
}

fn measure() -> impl Strategy<Value = Measure> {
    prop_oneof![
        (0u64..50).prop_map(Measure::Nanos),
        "[ab]{0,2}".prop_map(Measure::Failed),
    ]
}

fn timings() -> impl Strategy<Value = Timings> {
    prop::collection::btree_map(
        "op[12]",
        prop::collection::btree_map("c[0-3]", measure(), 0..4),
        0..3,
    )
    .prop_map(Timings)
}

fn agreed() -> impl Strategy<Value = AgreedValues> {
    prop::collection::btree_map("[xy]", prop::collection::btree_set("[uvw]", 0..3), 0..3)
        .prop_map(AgreedValues)
}

#[test]
fn a_disagreement_on_many_long_names_gives_a_bounded_message() {
    // 2 000 names of 1 000 bytes differ: listing them all, once in the
    // summary and once per rank group, made an 8 MB message on each rank.
    let errs = ranks(3, |r, mut ch| {
        let mut m = MustAgree::new();
        for i in 0..2000 {
            m = m.value(format!("{}{i:04}", "n".repeat(1000)), r.to_string());
        }
        m.check(&mut ch, "k").expect_err("ranks differ").to_string()
    });
    for e in &errs {
        assert!(e.len() < 16 << 10, "{} bytes", e.len());
        assert!(e.contains("(and 1984 more)"), "{e}");
        assert!(e.contains(&format!("'{}…'", "n".repeat(200))), "{e}");
        assert!(
            e.contains("ranks disagree") && e.contains("rank [2] has"),
            "{e}"
        );
    }
    assert_eq!(errs[0], errs[2]);
}
