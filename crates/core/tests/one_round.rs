//! The exchange's cost work, checked against what it replaced:
//! - a frame state joined straight from another rank's payload
//!   (`Join::join_encoded`) equals decoding it, then joining, on every
//!   payload — well-formed, cut short, corrupted or out of order;
//! - the flat exchange in one round (every envelope in its slot), in two
//!   (slots too small), and with the fast path off (one variable-length
//!   round) gives the same join, the same per-rank values and the same
//!   errors, over random states and world sizes.

use compiler_collectives_core::decisions::lattice::{SizeEntry, Stride};
use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::protocol::{
    decode_payload, encode_payload, envelope, Channel, ChannelOptions, ExchangeOptions,
};
use compiler_collectives_core::transport::inprocess::InProcessGroup;
use compiler_collectives_core::{Error, Join, Transport};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Duration;

mod strategies;
use strategies::{atom, dims};

/// Tuples of up to nine dimensions: past the six a joined tuple reads onto
/// the stack.
const MAX_DIMS: usize = 10;

fn entry() -> impl Strategy<Value = SizeEntry> {
    let stride = prop_oneof![
        (0u64..4).prop_map(Stride::Int),
        (0u32..4).prop_map(Stride::Infer)
    ];
    (
        atom(strategies::scalar()),
        dims(atom(0u64..4), MAX_DIMS),
        dims(atom(stride), MAX_DIMS),
    )
        .prop_map(|(scalar, size, stride)| SizeEntry {
            scalar,
            size,
            stride,
        })
}

/// A state over a pool of names, so that ranks share some sources and
/// miss others.
fn state() -> impl Strategy<Value = FrameState> {
    proptest::collection::btree_map(
        (0u32..14).prop_map(|i| format!("L['x{i}']")),
        entry(),
        0..10,
    )
    .prop_map(|entries| entries.into_iter().collect::<FrameState>())
}

/// A large state: `n` sources of a fixed shape, every third differing with
/// `salt` (what does not fit a small slot).
fn big(n: usize, salt: u64) -> FrameState {
    let mut s = FrameState::new();
    for i in 0..n {
        let d0 = if i % 3 == 0 { 8 + salt } else { 8 };
        s.record(
            &format!("s{i}"),
            &compiler_collectives_core::decisions::shapes::Observation::tensor([d0, 16, 4]),
        );
    }
    s
}

fn joined(a: &FrameState, b: &FrameState) -> FrameState {
    let mut out = a.clone();
    out.join(b);
    out
}

/// postcard's decoding (serde), the reference of the hand-written reader.
fn postcard_decode(payload: &[u8]) -> Result<FrameState, ()> {
    envelope::decode_postcard::<FrameState>(FrameState::KIND, payload).map_err(drop)
}

/// Decoding then joining, the reference of `join_encoded`.
fn reference(acc: &FrameState, payload: &[u8]) -> Result<FrameState, ()> {
    postcard_decode(payload)
        .map(|other| joined(acc, &other))
        .map_err(drop)
}

fn direct(acc: &FrameState, payload: &[u8]) -> Result<FrameState, ()> {
    let mut out = acc.clone();
    out.join_encoded(payload).map(|()| out).map_err(drop)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Well-formed payloads: postcard's bytes, read back as postcard reads
    /// them, and the same join.
    #[test]
    fn join_encoded_is_decode_then_join(a in state(), b in state()) {
        let bytes = encode_payload(&b).unwrap();
        prop_assert_eq!(&bytes, &postcard::to_allocvec(&b).unwrap());
        prop_assert_eq!(decode_payload::<FrameState>(&bytes).ok(), Some(b.clone()));
        prop_assert_eq!(direct(&a, &bytes), Ok(joined(&a, &b)));
    }

    /// Any payload at all: accepted by both or by neither, with the same join.
    #[test]
    fn join_encoded_accepts_what_decode_accepts(
        a in state(),
        b in state(),
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        extra in proptest::collection::vec(any::<u8>(), 0..2),
    ) {
        let mut bytes = encode_payload(&b).unwrap();
        for (at, x) in flips {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
        }
        let keep = cut.index(bytes.len() + 1);
        bytes.truncate(keep.max(bytes.len().saturating_sub(3)));
        bytes.extend(extra);
        prop_assert_eq!(direct(&a, &bytes), reference(&a, &bytes));
        let ours = decode_payload::<FrameState>(&bytes).map_err(drop);
        prop_assert_eq!(ours, postcard_decode(&bytes));
    }
}

/// The reference of `join_payloads`: read every payload with postcard in
/// rank order (the first that does not read names its index), then join
/// every one but `own` into `acc`.
fn reference_all(acc: &FrameState, own: usize, payloads: &[Vec<u8>]) -> Result<FrameState, usize> {
    let mut values = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        values.push(postcard_decode(p).map_err(|()| i)?);
    }
    Ok(values
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != own)
        .fold(acc.clone(), |a, (_, v)| joined(&a, v)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Joining every peer's payload in place (the frame state's override,
    /// which compares bytes against this rank's own payload) gives the
    /// reference's result, and refuses exactly the payloads postcard
    /// refuses, naming the first, with the state unchanged.
    #[test]
    fn join_payloads_is_read_every_payload_then_join(
        states in (1usize..5).prop_flat_map(|n| proptest::collection::vec(state(), n)),
        own in any::<prop::sample::Index>(),
        shared in any::<bool>(),
        damage in proptest::option::of((
            any::<prop::sample::Index>(),
            proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..3),
            any::<prop::sample::Index>(),
        )),
    ) {
        let mut states = states;
        if shared {
            // Mostly the same entries: what the byte comparison skips.
            let first = states[0].clone();
            for s in &mut states[1..] {
                let mut copy = first.clone();
                if let Some((name, e)) = s.iter().next() {
                    copy.insert(name, &e);
                }
                *s = copy;
            }
        }
        let own = own.index(states.len());
        let mut payloads: Vec<Vec<u8>> = states.iter().map(|s| encode_payload(s).unwrap()).collect();
        if let Some((who, flips, cut)) = damage {
            // Damage a peer's payload (this rank's own is its writer's).
            let peers: Vec<usize> = (0..states.len()).filter(|&i| i != own).collect();
            if !peers.is_empty() {
                let bytes = &mut payloads[peers[who.index(peers.len())]];
                for (at, x) in flips {
                    if !bytes.is_empty() {
                        let i = at.index(bytes.len());
                        bytes[i] ^= x;
                    }
                }
                let keep = cut.index(bytes.len() + 1);
                bytes.truncate(keep.max(bytes.len().saturating_sub(2)));
            }
        }
        let views: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let mut ours = states[own].clone();
        let got = ours.join_payloads(own, &views).map_err(|(i, _)| i);
        match reference_all(&states[own], own, &payloads) {
            Ok(want) => {
                prop_assert_eq!(got, Ok(()));
                prop_assert_eq!(ours, want);
            }
            Err(index) => {
                prop_assert_eq!(got, Err(index));
                prop_assert_eq!(&ours, &states[own], "the state changed on an error");
            }
        }
    }
}

/// A payload whose names are not strictly increasing is refused by both
/// readers (the canonical form is sorted), with the same message (postcard
/// reports every custom error as a deserialization error).
#[test]
fn out_of_order_and_repeated_names_are_refused() {
    let mut one = FrameState::new();
    one.record(
        "b",
        &compiler_collectives_core::decisions::shapes::Observation::tensor([2]),
    );
    let entry = encode_payload(&one).unwrap();
    // `FrameState` = (map: len, then name, entry…): splice two copies with
    // the names given.
    let body = &entry[1..];
    for (first, second) in [("b", "a"), ("b", "b")] {
        let mut bytes = vec![2u8];
        for name in [first, second] {
            let mut e = body.to_vec();
            let at = e.iter().position(|&c| c == b'b').unwrap();
            e[at] = name.as_bytes()[0];
            bytes.extend(e);
        }
        let mut acc = FrameState::new();
        acc.record(
            "a",
            &compiler_collectives_core::decisions::shapes::Observation::tensor([3]),
        );
        let decoded = decode_payload::<FrameState>(&bytes)
            .unwrap_err()
            .to_string();
        let direct = acc.join_encoded(&bytes).unwrap_err().to_string();
        // In place, after an entry equal to this rank's own (the byte
        // comparison's path): refused too, naming the peer, nothing joined.
        let mut mine = one.clone();
        let (index, reason) = mine.join_payloads(0, &[&entry, &bytes]).unwrap_err();
        assert_eq!(index, 1, "{first}, {second}");
        assert!(
            reason.to_string().contains("strictly increasing"),
            "{first}, {second}: {reason}"
        );
        assert_eq!(mine, one);
        assert!(
            decoded.contains("shape.frame_state"),
            "{first}, {second}: {decoded}"
        );
        assert!(
            direct.contains("shape.frame_state"),
            "{first}, {second}: {direct}"
        );
        // The same names in order decode.
        let mut fine = bytes.clone();
        let at = fine
            .iter()
            .rposition(|&c| c == second.as_bytes()[0])
            .unwrap();
        fine[at] = b'c';
        assert!(decode_payload::<FrameState>(&fine).is_ok(), "{first}, c");
        assert!(acc.join_encoded(&fine).is_ok(), "{first}, c");
    }
}

#[derive(Clone, Copy, Debug)]
enum Way {
    /// Default slot: small states in one round.
    OneRound,
    /// A 64-byte slot: almost every envelope goes in the second round.
    TwoRounds,
    /// Fast path off: one variable-length round of the envelopes.
    NoFastPath,
    /// `Channel::exchange_in_place`, default slot.
    InPlace,
    /// `Channel::exchange_in_place`, 64-byte slot.
    InPlaceTwoRounds,
}

type Outcome = Result<(FrameState, Option<Vec<FrameState>>, bool), String>;

/// One exchange of `states[r]` on each rank `r`, under `keys[r]`.
fn exchange(states: &[FrameState], keys: &[&'static str], way: Way) -> Vec<Outcome> {
    let world = u32::try_from(states.len()).unwrap();
    let ranks = InProcessGroup::create(world).unwrap();
    let handles: Vec<_> = ranks
        .into_iter()
        .zip(states.iter().cloned().zip(keys.iter().copied()))
        .map(|(t, (state, key))| {
            std::thread::spawn(move || -> Outcome {
                let mut opts = ChannelOptions::default().with_timeout(Duration::from_secs(20));
                opts = match way {
                    Way::OneRound | Way::InPlace => opts,
                    Way::TwoRounds | Way::InPlaceTwoRounds => opts.with_slot_bytes(64),
                    Way::NoFastPath => opts.with_fast_path(false),
                };
                let mut ch = Channel::with_options(Arc::new(t), opts).map_err(|e| e.to_string())?;
                let mut state = state;
                let before = state.clone();
                if matches!(way, Way::InPlace | Way::InPlaceTwoRounds) {
                    let got = ch.exchange_in_place(key, &mut state, &ExchangeOptions::default());
                    let g = match got {
                        Ok(g) => g,
                        Err(e) => {
                            assert_eq!(state, before, "the state changed on an error");
                            return Err(e.to_string());
                        }
                    };
                    let per_rank = g.per_rank().values().map(<[FrameState]>::to_vec);
                    return Ok((g.merged().clone(), per_rank, g.fast_path()));
                }
                let g = ch.exchange(key, &state).map_err(|e: Error| e.to_string())?;
                let per_rank = g.per_rank().values().map(<[FrameState]>::to_vec);
                Ok((g.merged().clone(), per_rank, g.fast_path()))
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Same decisions, same per-rank values, same errors, whichever way the
    /// envelopes travel; the fast path exactly when every state is equal.
    #[test]
    fn every_way_gives_the_same_exchange(
        states in (1usize..6).prop_flat_map(|n| proptest::collection::vec(state(), n)),
        identical in any::<bool>(),
        big_rank in proptest::option::of(any::<prop::sample::Index>()),
        odd_key in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut states = states;
        if identical {
            let first = states[0].clone();
            states.iter_mut().for_each(|s| *s = first.clone());
        }
        if let Some(i) = big_rank {
            // One rank's state too large for the default slot: two rounds.
            let r = i.index(states.len());
            states[r] = big(300, r as u64);
        }
        let mut keys = vec!["f"; states.len()];
        if let Some(i) = odd_key {
            if states.len() > 1 {
                keys[i.index(states.len())] = "g";
            }
        }
        let all_same = states.iter().all(|s| *s == states[0]);
        let reference = states[1..].iter().fold(states[0].clone(), |acc, s| joined(&acc, s));
        let desync = keys.iter().any(|k| *k != "f");
        let outcomes: Vec<(Way, Vec<Outcome>)> = [
            Way::OneRound,
            Way::TwoRounds,
            Way::NoFastPath,
            Way::InPlace,
            Way::InPlaceTwoRounds,
        ]
            .into_iter()
            .map(|w| (w, exchange(&states, &keys, w)))
            .collect();
        for (way, per_rank) in &outcomes {
            for (rank, o) in per_rank.iter().enumerate() {
                if desync {
                    let e = o.as_ref().expect_err("a desync must fail");
                    prop_assert!(e.contains("desync") || e.contains("Desync") || e.contains("'g'"), "{way:?} rank {rank}: {e}");
                    continue;
                }
                let (merged, values, fast) = o.as_ref().map_err(|e| TestCaseError::fail(format!("{way:?} rank {rank}: {e}")))?;
                prop_assert_eq!(merged, &reference, "{:?} rank {}", way, rank);
                let fast_expected = states.len() == 1 || (all_same && !matches!(way, Way::NoFastPath));
                prop_assert_eq!(*fast, fast_expected, "{:?} rank {}", way, rank);
                match values {
                    Some(v) => prop_assert_eq!(v, &states, "{:?} rank {}", way, rank),
                    None => prop_assert!(*fast, "{:?} rank {}: no per-rank values", way, rank),
                }
            }
        }
        // The errors, word for word, are the same every way.
        if desync {
            let texts: Vec<&Vec<Outcome>> = outcomes.iter().map(|(_, o)| o).collect();
            for o in &texts[1..] {
                prop_assert_eq!(*o, texts[0]);
            }
        }
    }
}

/// The slot shrinks as the world grows, so that the first round brings a
/// rank at most 64 KiB; a configured slot smaller than that is kept, and
/// none goes below the minimum.
#[test]
fn the_slot_shrinks_in_large_worlds() {
    let slot = |world: u32, opts: ChannelOptions| {
        let t = InProcessGroup::create(world).unwrap().swap_remove(0);
        Channel::with_options(Arc::new(t), opts)
            .unwrap()
            .slot_bytes()
    };
    let d = ChannelOptions::default;
    assert_eq!(slot(2, d()), 4096);
    assert_eq!(slot(16, d()), 4096);
    assert_eq!(slot(17, d()), 65536 / 17);
    assert_eq!(slot(64, d()), 1024);
    assert_eq!(slot(2, d().with_slot_bytes(100)), 100);
    assert_eq!(slot(2048, d()), envelope::MIN_SLOT_BYTES);
    for bad in [
        0,
        envelope::MIN_SLOT_BYTES - 1,
        envelope::MAX_SLOT_BYTES + 1,
    ] {
        let t = InProcessGroup::create(2).unwrap().swap_remove(0);
        let e = Channel::with_options(Arc::new(t), d().with_slot_bytes(bad)).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
        assert!(
            e.to_string().contains(&format!("slot size {bad} bytes")),
            "{e}"
        );
    }
}

/// The first exchange of `big(3, 0)` on every rank of an in-process world,
/// each rank's channel made with `opts(rank)` and a 5 s deadline.
fn first_exchange(world: u32, opts: impl Fn(u32) -> ChannelOptions) -> Vec<Result<(), Error>> {
    let handles: Vec<_> = InProcessGroup::create(world)
        .unwrap()
        .into_iter()
        .map(|t| {
            let opts = opts(t.rank()).with_timeout(Duration::from_secs(5));
            std::thread::spawn(move || {
                let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                ch.exchange("f", &big(3, 0)).map(drop)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Ranks with different slot sizes fail their first exchange at once, each
/// with a decode error that says what differs (not a message over a limit).
#[test]
fn ranks_with_different_slots_are_told_so() {
    let outcomes = first_exchange(2, |rank| {
        ChannelOptions::default().with_slot_bytes(if rank == 0 { 4096 } else { 8192 })
    });
    for (rank, r) in outcomes.into_iter().enumerate() {
        let e = r.expect_err("different slots must fail");
        assert!(
            matches!(e, Error::Decode { rank: Some(_), .. }),
            "rank {rank}: {e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("need the same slot size (ChannelOptions::slot_bytes)"),
            "rank {rank}: {text}"
        );
    }
}

/// Ranks with different fast-path settings fail their first exchange at
/// once, every rank with a decode error on the first round that names the
/// setting — the ranks with the fast path off too (found by a new user's
/// attack: they said only "invalid message type: 3, expected 1").
#[test]
fn ranks_with_different_fast_path_settings_are_told_so() {
    for off in [vec![1u32], vec![0], vec![0, 2]] {
        let world = if off.len() == 2 { 3 } else { 2 };
        let outcomes = first_exchange(world, |rank| {
            ChannelOptions::default().with_fast_path(!off.contains(&rank))
        });
        for (rank, r) in outcomes.into_iter().enumerate() {
            let e = r.expect_err("different settings must fail");
            let text = e.to_string();
            assert!(
                matches!(
                    &e,
                    Error::Decode {
                        rank: Some(_),
                        reason: compiler_collectives_core::DecodeError::Invalid {
                            field: "first round",
                            ..
                        },
                    }
                ),
                "off {off:?}, rank {rank}: {text}"
            );
            assert!(
                text.contains("the same fast-path setting"),
                "off {off:?}, rank {rank}: {text}"
            );
        }
    }
}

/// Every slot carries its envelope's length and its rank's limit: every
/// rank applies the smallest limit to every envelope, inline or in the
/// second round, so a rank whose limit is under another's envelope makes
/// every rank fail alike, naming the rank whose envelope is too long — not
/// one rank failing while another goes on (found by a new user's attack:
/// inline envelopes were checked against each rank's own limit). With
/// equal limits the same states exchange.
#[test]
fn every_rank_applies_the_smallest_limit() {
    // `sizes[r]`: rank r's sources; rank 0's envelope is the longest.
    let run = |limits: [usize; 3], sizes: [usize; 3]| -> Vec<Result<FrameState, Error>> {
        let ranks = InProcessGroup::create(3).unwrap();
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|t| {
                let limit = limits[t.rank() as usize];
                let n = sizes[t.rank() as usize];
                std::thread::spawn(move || {
                    let opts = ChannelOptions::default()
                        .with_timeout(Duration::from_secs(5))
                        .with_limits(envelope::Limits::default().with_max_message_bytes(limit));
                    let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                    let salt = u64::from(ch.rank());
                    ch.exchange("f", &big(n, salt)).map(|g| g.into_merged())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    // Two rounds (rank 0's envelope does not fit a slot), then one (every
    // envelope fits).
    for sizes in [[600, 400, 400], [100, 20, 20]] {
        let joined = run([1 << 20; 3], sizes);
        let want = joined[0].as_ref().unwrap().clone();
        assert!(joined.iter().all(|r| r.as_ref().ok() == Some(&want)));
        assert_eq!(want.len(), sizes[0]);
        let len0 = encode_payload(&big(sizes[0], 0)).unwrap().len();
        // Rank 2 accepts less than rank 0 sends; ranks 0 and 1 would accept it.
        for (rank, r) in run([1 << 20, 1 << 20, len0], sizes).into_iter().enumerate() {
            match r {
                Err(Error::Decode {
                    rank: Some(0),
                    reason:
                        compiler_collectives_core::DecodeError::TooLarge {
                            field: "message",
                            limit,
                            ..
                        },
                }) => assert_eq!(limit, len0 as u64, "{sizes:?} rank {rank}"),
                other => panic!("{sizes:?} rank {rank}: {:?}", other.map(|s| s.len())),
            }
        }
    }
}

/// A rank whose own envelope is over the message limit (the same on every
/// rank) fails with its peers, at once and with the same error naming it,
/// whether its envelope would have gone inline or in the second round, and
/// when every rank's state is the same too (found by a new user's attack:
/// the rank refused its own envelope alone, sending nothing, and its peers
/// waited for it until the deadline). Where no slot round runs (one rank,
/// the fast path off) it stays this rank's own `InvalidArgument`.
#[test]
fn a_rank_over_the_limit_fails_with_its_peers() {
    const LIMIT: usize = 1000;
    let limits = envelope::Limits::default().with_max_message_bytes(LIMIT);
    let run = |world: u32, sizes: Vec<usize>, fast_path: bool| -> Vec<Result<usize, Error>> {
        let ranks = InProcessGroup::create(world).unwrap();
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|t| {
                let (n, salt) = (sizes[t.rank() as usize], u64::from(t.rank()));
                std::thread::spawn(move || {
                    let opts = ChannelOptions::default()
                        .with_timeout(Duration::from_secs(20))
                        .with_fast_path(fast_path)
                        .with_limits(limits);
                    let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                    let mut state = big(n, salt);
                    let before = state.clone();
                    let got = ch
                        .exchange_in_place("f", &mut state, &ExchangeOptions::default())
                        .map(|g| g.merged().len());
                    if got.is_err() {
                        assert_eq!(state, before, "the state changed on an error");
                    }
                    got
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let envelope_len = |n: usize| {
        let mut buf = Vec::new();
        envelope::encode_into(
            &mut buf,
            0,
            "shape.frame_state",
            "f",
            "",
            &envelope::Limits::default(),
            |out| {
                out.extend_from_slice(&encode_payload(&big(n, 0)).unwrap());
                Ok(())
            },
        )
        .unwrap()
    };
    // Rank 0's envelope inline but over the limit; in the second round; every
    // rank's the same and over it.
    let (inline, spilled) = (120, 400);
    let (a, b) = (envelope_len(inline), envelope_len(spilled));
    assert!(a > LIMIT && a < 4048 && b > 4048, "{a}, {b}");
    for (sizes, same) in [
        (vec![inline, 3, 3], false),
        (vec![spilled, 3, 3], false),
        (vec![inline, inline, inline], true),
    ] {
        for (rank, r) in run(3, sizes.clone(), true).into_iter().enumerate() {
            match r {
                Err(Error::Decode {
                    rank: Some(0),
                    reason:
                        compiler_collectives_core::DecodeError::TooLarge {
                            field: "message",
                            len,
                            limit,
                        },
                }) => {
                    assert_eq!(len, envelope_len(sizes[0]) as u64, "{sizes:?} rank {rank}");
                    assert_eq!(limit, LIMIT as u64, "{sizes:?} rank {rank}");
                }
                other => panic!("{sizes:?} (same: {same}) rank {rank}: {other:?}"),
            }
        }
    }
    // Under the limit, the same ranks exchange.
    for r in run(3, vec![20, 3, 3], true) {
        assert_eq!(r.unwrap(), 20);
    }
    // No slot round: this rank's own error, nothing sent.
    for (world, fast_path) in [(1, true), (1, false)] {
        match &run(world, vec![inline], fast_path)[0] {
            Err(Error::InvalidArgument(text)) => {
                assert!(text.contains("over the limit of 1000 bytes"), "{text}");
            }
            other => panic!("world {world}, fast path {fast_path}: {other:?}"),
        }
    }
}

/// An in-process rank whose first-round contribution is changed after the
/// channel wrote it (what corruption in memory before the send, or on the
/// way, looks like): rank 1 replaces the first `from` byte sequence with `to`.
#[derive(Debug)]
struct Corrupting {
    inner: compiler_collectives_core::InProcessTransport,
    from: Vec<u8>,
    to: Vec<u8>,
}

impl Corrupting {
    fn changed(&self, data: &[u8]) -> Vec<u8> {
        let mut out = data.to_vec();
        if self.inner.rank() == 1 {
            if let Some(at) = out.windows(self.from.len()).position(|w| w == self.from) {
                out[at..at + self.to.len()].copy_from_slice(&self.to);
            }
        }
        out
    }
}

impl Transport for Corrupting {
    fn rank(&self) -> u32 {
        self.inner.rank()
    }
    fn world_size(&self) -> u32 {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        "corrupting"
    }
    fn capabilities(&self) -> compiler_collectives_core::Capabilities {
        self.inner.capabilities()
    }
    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<Vec<u8>>> {
        self.inner
            .all_gather(&self.changed(data), max_bytes, deadline)
    }
    fn all_gather_fixed(
        &self,
        data: &[u8],
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        self.inner.all_gather_fixed(&self.changed(data), deadline)
    }
    fn barrier(
        &self,
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        self.inner.barrier(deadline)
    }
    fn send(
        &self,
        peer: u32,
        tag: u32,
        data: &[u8],
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        self.inner.send(peer, tag, data, deadline)
    }
    fn recv(
        &self,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        deadline: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        self.inner.recv(peer, tag, max_bytes, deadline)
    }
    fn shutdown(&self) -> compiler_collectives_core::Result<()> {
        self.inner.shutdown()
    }
}

/// Rank 1's bytes change after it encoded them, the same for every rank
/// that receives them (rank 1 included). The in-place exchange must then
/// join what was gathered, as `exchange` does: the same result on every
/// rank when the changed bytes read (rank 1's size 5 became 6, its peers'
/// 6), the same error naming rank 1 when they do not (the entry count 1
/// became 2), and the state unchanged on an error. Before, rank 1 kept
/// `(5,10)` while its peers took `(6,10)`, and named rank 0 for the bytes
/// rank 1 sent.
#[test]
fn a_rank_whose_own_bytes_changed_on_the_way_agrees_with_its_peers() {
    let state = |d0: u64| {
        let mut s = FrameState::new();
        s.record(
            "x",
            &compiler_collectives_core::decisions::shapes::Observation::tensor([d0, 10]),
        );
        s
    };
    let payload = encode_payload(&state(5)).unwrap();
    // Static(5) is the atom code 7; the entry count is the payload's first byte.
    let size_at = payload.windows(4).position(|w| w == [2, 2, 7, 12]).unwrap();
    let mut six = payload.clone();
    six[size_at + 2] = 8;
    let mut two_entries = payload.clone();
    two_entries[0] = 2;
    for (what, to, reads) in [("5 → 6", six, true), ("1 → 2 entries", two_entries, false)] {
        for in_place in [false, true] {
            let ranks = InProcessGroup::create(3).unwrap();
            let from = payload.clone();
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|inner| {
                    let (from, to) = (from.clone(), to.clone());
                    std::thread::spawn(move || {
                        let r = inner.rank();
                        let t = Corrupting { inner, from, to };
                        let opts = ChannelOptions::default().with_timeout(Duration::from_secs(5));
                        let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                        let mut mine = state(if r == 1 { 5 } else { 6 });
                        let before = mine.clone();
                        if in_place {
                            let got = ch
                                .exchange_in_place("f", &mut mine, &ExchangeOptions::default())
                                .map(|g| g.merged().clone())
                                .map_err(|e| e.to_string());
                            if got.is_err() {
                                assert_eq!(mine, before, "rank {r}: changed on an error");
                            }
                            got
                        } else {
                            ch.exchange("f", &mine)
                                .map(|g| g.merged().clone())
                                .map_err(|e| e.to_string())
                        }
                    })
                })
                .collect();
            let outcomes: Vec<Result<FrameState, String>> =
                handles.into_iter().map(|h| h.join().unwrap()).collect();
            for (rank, o) in outcomes.iter().enumerate() {
                assert_eq!(o, &outcomes[0], "{what}, in place {in_place}: rank {rank}");
            }
            if reads {
                let merged = outcomes[0].as_ref().expect("the changed bytes read");
                assert_eq!(merged.get("x").size.to_string(), "(6,10)", "{what}");
            } else {
                let e = outcomes[0]
                    .as_ref()
                    .expect_err("the changed bytes do not read");
                assert!(e.contains("rank 1"), "{what}, in place {in_place}: {e}");
            }
        }
    }
}
