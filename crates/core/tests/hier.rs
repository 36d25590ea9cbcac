//! The hierarchical exchange gives the flat exchange's decisions and errors,
//! and receives O(payload · log N) bytes per rank.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::decisions::votes::AnyVote;
use compiler_collectives_core::transport::counting::{ByteCounts, CountingTransport};
use compiler_collectives_core::Join;
use compiler_collectives_core::{Channel, ChannelOptions, InProcessGroup, Transport};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

mod each_rank;
use each_rank::on_threads;

/// What one rank passes to its exchange.
#[derive(Clone, Debug)]
struct Call<J> {
    key: String,
    config: String,
    value: J,
}

/// Runs one exchange per rank over in-process threads; returns each rank's
/// outcome as text (the join's debug form, or the error's message), whether
/// the fast path applied, and the bytes each rank received. `in_place` runs
/// `Channel::exchange_in_place` (and checks that a failed one leaves the
/// rank's value as it was).
fn run<J: Join + 'static>(
    calls: Vec<Call<J>>,
    tree: bool,
    fast_path: bool,
    in_place: bool,
) -> (Vec<String>, Vec<bool>, Vec<u64>) {
    let n = u32::try_from(calls.len()).unwrap();
    let ranks = InProcessGroup::create(n).unwrap();
    let opts = ChannelOptions::default()
        .with_timeout(Duration::from_secs(60))
        .with_fast_path(fast_path)
        .with_hierarchical_from(if tree { 2 } else { u32::MAX });
    let handles: Vec<_> = ranks
        .into_iter()
        .zip(calls)
        .map(|(t, call)| {
            let opts = opts.clone();
            std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn(move || {
                    let t = CountingTransport::new(t);
                    let counts: Arc<ByteCounts> = t.counts();
                    let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                    let options = compiler_collectives_core::ExchangeOptions::default()
                        .with_config(&call.config);
                    let (text, fast) = if in_place {
                        let mut value = call.value.clone();
                        let before = format!("{value:?}");
                        match ch.exchange_in_place(&call.key, &mut value, &options) {
                            Ok(g) => (format!("{:?}", g.merged()), g.fast_path()),
                            Err(e) => {
                                assert_eq!(format!("{value:?}"), before, "changed on an error");
                                (format!("error: {e}"), false)
                            }
                        }
                    } else {
                        match ch.exchange_with(&call.key, &call.value, &options) {
                            Ok(g) => (format!("{:?}", g.merged()), g.fast_path()),
                            Err(e) => (format!("error: {e}"), false),
                        }
                    };
                    (text, fast, counts.received())
                })
                .unwrap()
        })
        .collect();
    let mut texts = Vec::new();
    let mut fast = Vec::new();
    let mut bytes = Vec::new();
    for h in handles {
        let (t, f, b) = h.join().unwrap();
        texts.push(t);
        fast.push(f);
        bytes.push(b);
    }
    (texts, fast, bytes)
}

fn same_everywhere<J: Join + 'static>(calls: Vec<Call<J>>) -> Vec<String> {
    let (flat, flat_fast, _) = run(calls.clone(), false, true, false);
    let (tree, tree_fast, _) = run(calls.clone(), true, true, false);
    let (tree_slow, _, _) = run(calls.clone(), true, false, false);
    let (tree_in_place, tree_in_place_fast, _) = run(calls.clone(), true, true, true);
    let (flat_in_place, _, _) = run(calls, false, true, true);
    assert_eq!(flat, tree, "flat vs tree");
    assert_eq!(flat, tree_slow, "flat vs tree without fast path");
    assert_eq!(flat, tree_in_place, "flat vs tree in place");
    assert_eq!(flat, flat_in_place, "flat vs flat in place");
    assert_eq!(flat_fast, tree_fast, "fast path applied differently");
    assert_eq!(
        flat_fast, tree_in_place_fast,
        "fast path applied differently in place"
    );
    assert!(
        flat.iter().all(|t| *t == flat[0]),
        "ranks disagree: {flat:?}"
    );
    flat
}

/// A state of `sources` tensors named `s0…`, a third of them with dim 0
/// depending on `rank` (the benchmarks' shape).
fn bench_state(sources: usize, rank: u64) -> FrameState {
    let mut s = FrameState::new();
    for i in 0..sources {
        let d0 = if i % 3 == 0 { 8 + rank } else { 8 };
        s.record(&format!("s{i}"), &Observation::tensor([d0, 16, 4]));
    }
    s
}

fn calls_of(states: Vec<FrameState>) -> Vec<Call<FrameState>> {
    states
        .into_iter()
        .map(|value| Call {
            key: "f".into(),
            config: String::new(),
            value,
        })
        .collect()
}

fn arb_obs() -> impl Strategy<Value = Observation> {
    prop_oneof![
        prop::collection::vec(1u64..5, 0..3).prop_map(Observation::tensor),
        (0i64..3).prop_map(Observation::Int),
        Just(Observation::None),
    ]
}

fn arb_state() -> impl Strategy<Value = FrameState> {
    prop::collection::btree_map("[a-d]", arb_obs(), 0..4).prop_map(|m| {
        let mut s = FrameState::new();
        for (k, o) in &m {
            s.record(k, o);
        }
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn tree_decides_as_flat(
        n in prop::sample::select(vec![2usize, 3, 5, 6, 8, 11]),
        states in prop::collection::vec(arb_state(), 11),
    ) {
        let out = same_everywhere(calls_of(states.into_iter().take(n).collect()));
        prop_assert!(!out[0].starts_with("error"), "{}", out[0]);
    }

    #[test]
    fn tree_reports_desync_and_config_as_flat(
        n in prop::sample::select(vec![2usize, 3, 7, 9]),
        keys in prop::collection::vec(0u8..2, 9),
        configs in prop::collection::vec(0u8..2, 9),
    ) {
        let calls: Vec<Call<FrameState>> = (0..n)
            .map(|r| Call {
                key: format!("k{}", keys[r]),
                config: format!("c{}", configs[r]),
                value: bench_state(2, r as u64),
            })
            .collect();
        let out = same_everywhere(calls);
        let keys_differ = keys[..n].iter().any(|k| *k != keys[0]);
        let configs_differ = configs[..n].iter().any(|c| *c != configs[0]);
        prop_assert_eq!(out[0].contains("desync"), keys_differ);
        prop_assert_eq!(
            out[0].contains("disagree") || out[0].contains("configuration"),
            configs_differ && !keys_differ,
        );
    }
}

#[test]
fn desync_groups_name_ranks_like_flat() {
    let calls: Vec<Call<FrameState>> = (0..6)
        .map(|r| Call {
            key: if r == 2 || r == 5 { "eval" } else { "train" }.into(),
            config: String::new(),
            value: bench_state(3, r),
        })
        .collect();
    let out = same_everywhere(calls);
    assert!(
        out[0].contains("ranks [0,1,3,4] at #0 'train'") && out[0].contains("[2,5] at #0 'eval'"),
        "{}",
        out[0]
    );
}

#[test]
fn kinds_differ_is_a_desync_like_flat() {
    // Ranks 0..3 exchange a FrameState, rank 3 a vote: one test per kind, each
    // rank's call typed by its kind, so run them by hand.
    for tree in [false, true] {
        let n = 4u32;
        let opts = ChannelOptions::default()
            .with_timeout(Duration::from_secs(60))
            .with_hierarchical_from(if tree { 2 } else { u32::MAX });
        let texts = on_threads(n, move |t| {
            let r = t.rank();
            let mut ch = Channel::with_options(Arc::new(t), opts.clone()).unwrap();
            let e = if r == 3 {
                ch.exchange("f", &AnyVote(true)).map(|_| ())
            } else {
                ch.exchange("f", &bench_state(2, 0)).map(|_| ())
            };
            e.unwrap_err().to_string()
        });
        for t in &texts {
            assert!(
                t.contains("ranks [0,1,2] at #0 'f' (shape.frame_state)")
                    && t.contains("rank [3] at #0 'f' (vote.any)"),
                "tree={tree}: {t}"
            );
        }
    }
}

#[test]
fn identical_states_take_the_fast_path_in_the_tree() {
    let states = (0..9).map(|_| bench_state(20, 0)).collect();
    let (_, fast, bytes) = run(calls_of(states), true, true, false);
    assert!(fast.iter().all(|f| *f));
    // 33 bytes from each child (at most ⌈log₂ 9⌉ = 4) and 1 from the parent.
    assert!(bytes.iter().all(|&b| b <= 4 * 33 + 1), "{bytes:?}");
}

#[test]
fn tree_bytes_grow_with_log_n_flat_with_n() {
    let n = 100u64;
    let states: Vec<FrameState> = (0..n).map(|r| bench_state(20, r)).collect();
    let payload = compiler_collectives_core::protocol::encode_payload(&states[1])
        .unwrap()
        .len() as u64;
    let (tree_out, _, tree_bytes) = run(calls_of(states.clone()), true, true, false);
    let (flat_out, _, flat_bytes) = run(calls_of(states), false, true, false);
    assert_eq!(tree_out, flat_out);
    let log2n = 7; // ⌈log₂ 100⌉
    let tree_max = *tree_bytes.iter().max().unwrap();
    let flat_max = *flat_bytes.iter().max().unwrap();
    assert!(
        tree_max <= 2 * payload * log2n,
        "tree {tree_max} bytes > 2 · {payload} · {log2n}"
    );
    assert!(
        flat_max >= (n - 1) * payload,
        "flat {flat_max} < (n-1)·payload"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// FrameState's join (which walks equal key sets in step) equals the
    /// per-source join, for equal and for differing source sets.
    #[test]
    fn frame_state_join_is_per_source(a in arb_state(), b in arb_state(), same_keys: bool) {
        let b = if same_keys {
            // b's entries on a's keys.
            let mut s = FrameState::new();
            for (k, e) in a.iter() {
                let mine = b.iter().next().map_or(e, |(_, theirs)| theirs);
                s.insert(k, &mine);
            }
            s
        } else {
            b
        };
        let mut joined = a.clone();
        joined.join(&b);
        let mut keys: Vec<&str> = a.sources().chain(b.sources()).collect();
        keys.sort();
        keys.dedup();
        prop_assert_eq!(joined.len(), keys.len());
        for k in keys {
            prop_assert_eq!(joined.get(k), a.get(k).join(&b.get(k)), "source {}", k);
        }
    }
}

proptest! {
    /// States round-trip through the payload encoding (compact atoms, entries
    /// read in bulk), and JSON keeps working.
    #[test]
    fn frame_state_round_trips(s in arb_state()) {
        use compiler_collectives_core::protocol::{decode_payload, encode_payload};
        let bytes = encode_payload(&s).unwrap();
        prop_assert_eq!(decode_payload::<FrameState>(&bytes).unwrap(), s.clone());
        let text = serde_json::to_string(&s).unwrap();
        prop_assert_eq!(serde_json::from_str::<FrameState>(&text).unwrap(), s);
    }
}

#[test]
fn a_repeated_source_keeps_its_last_entry_as_before() {
    let text = r#"{"entries": {"x": {"scalar": "Dynamic", "size": "Unset", "stride": "Unset"},
                               "x": {"scalar": {"Static": 3}, "size": "Unset", "stride": "Unset"}}}"#;
    let s: FrameState = serde_json::from_str(text).unwrap();
    assert_eq!(s.len(), 1);
    assert_eq!(s.get("x").scalar.to_string(), "3");
}

/// An in-process transport that reports point-to-point as expensive (as
/// NCCL's goes through the store); everything else delegates.
#[derive(Debug)]
struct StorePointToPoint(compiler_collectives_core::InProcessTransport);

impl Transport for StorePointToPoint {
    fn rank(&self) -> u32 {
        self.0.rank()
    }
    fn world_size(&self) -> u32 {
        self.0.world_size()
    }
    fn backend(&self) -> &'static str {
        "store-p2p"
    }
    fn capabilities(&self) -> compiler_collectives_core::Capabilities {
        let mut c = self.0.capabilities();
        c.cheap_point_to_point = false;
        c
    }
    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<Vec<u8>>> {
        self.0.all_gather(data, max_bytes, deadline)
    }
    fn all_gather_fixed(
        &self,
        data: &[u8],
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        self.0.all_gather_fixed(data, deadline)
    }
    fn barrier(
        &self,
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        self.0.barrier(deadline)
    }
    fn send(
        &self,
        peer: u32,
        tag: u32,
        data: &[u8],
        _deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        panic!(
            "the flat exchange sent {} bytes to {peer} on tag {tag}",
            data.len()
        )
    }
    fn recv(
        &self,
        peer: u32,
        tag: u32,
        _max_bytes: usize,
        _deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        panic!("the flat exchange received from {peer} on tag {tag}")
    }
    fn shutdown(&self) -> compiler_collectives_core::Result<()> {
        self.0.shutdown()
    }
}

/// Over a transport whose point-to-point is not cheap, a channel asked for
/// the tree from 2 ranks stays flat, says why, and never sends a message
/// point to point; over the in-process engine the same options give the tree.
#[test]
fn the_tree_runs_only_over_cheap_point_to_point() {
    use compiler_collectives_core::{FlatReason, Topology};
    let opts = || {
        ChannelOptions::default()
            .with_timeout(Duration::from_secs(10))
            .with_hierarchical_from(2)
    };
    let handles: Vec<_> = InProcessGroup::create(4)
        .expect("group")
        .into_iter()
        .map(|t| {
            std::thread::spawn(move || {
                let rank = t.rank();
                let mut ch =
                    Channel::with_options(Arc::new(StorePointToPoint(t)), opts()).expect("channel");
                let topology = ch.topology().clone();
                let mut s = FrameState::new();
                s.record("x", &Observation::tensor([4 + u64::from(rank), 2]));
                let merged = ch.exchange("f", &s).expect("exchange").into_merged();
                (topology, merged.get("x").size.to_string())
            })
        })
        .collect();
    for h in handles {
        let (topology, x) = h.join().expect("rank");
        assert_eq!(
            topology,
            Topology::Flat(FlatReason::NoCheapPointToPoint {
                backend: "store-p2p"
            })
        );
        assert_eq!(x, "(Dyn,2)");
    }
    let t = InProcessGroup::create(2)
        .expect("group")
        .pop()
        .expect("rank");
    let ch = Channel::with_options(Arc::new(t), opts()).expect("channel");
    assert_eq!(*ch.topology(), Topology::Tree);
    let why = FlatReason::NoCheapPointToPoint { backend: "nccl" }.to_string();
    assert!(
        why.contains("nccl transport's point-to-point is not cheap"),
        "{why}"
    );
}
