//! A frame state is stored in its canonical wire form. These tests check it
//! against a model that shares none of that code: a `BTreeMap` of source
//! names to lattice entries, joined with `SizeEntry::join` and encoded with
//! postcard and the derived serde forms — over names and atoms of every
//! width (multi-byte varints, negative ints, `InferStride`, tuples of every
//! length, `Unset` and `Dynamic` tuples).

use compiler_collectives_core::decisions::lattice::{Atom, Dims, Scalar, SizeEntry, Stride};
use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::protocol::{decode_payload, encode_payload};
use compiler_collectives_core::Join;
use proptest::prelude::*;
use std::collections::BTreeMap;

type Model = BTreeMap<String, SizeEntry>;

mod strategies;
use strategies::{atom, dims};

/// Small values (one-byte codes, so entries often coincide) and values of
/// every width.
fn size_value() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..4, any::<u64>()]
}

fn stride_value() -> impl Strategy<Value = Stride> {
    prop_oneof![
        (0u64..4).prop_map(Stride::Int),
        (0u32..3).prop_map(Stride::Infer),
        any::<u64>().prop_map(Stride::Int),
        any::<u32>().prop_map(Stride::Infer),
    ]
}

fn entry() -> impl Strategy<Value = SizeEntry> {
    (
        atom(strategies::scalar()),
        dims(atom(size_value()), 5),
        dims(atom(stride_value()), 5),
    )
        .prop_map(|(scalar, size, stride)| SizeEntry {
            scalar,
            size,
            stride,
        })
}

/// Names from a small pool (so states share sources), some non-ASCII and
/// some over 127 bytes (a two-byte length).
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u32..12).prop_map(|i| format!("L['x{i}']")),
        1 => Just("é".to_owned()),
        1 => Just("".to_owned()),
        1 => (0usize..2).prop_map(|i| format!("{}{i}", "y".repeat(130))),
    ]
}

fn model() -> impl Strategy<Value = Model> {
    proptest::collection::btree_map(name(), entry(), 0..8)
}

fn state(m: &Model) -> FrameState {
    m.iter().map(|(k, v)| (k.as_str(), v.clone())).collect()
}

fn model_of(s: &FrameState) -> Model {
    s.iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The lattice's join per source, missing = ⊥.
fn model_join(a: &Model, b: &Model) -> Model {
    let mut out = a.clone();
    for (k, e) in b {
        let joined = out.get(k).map_or_else(|| e.clone(), |m| m.join(e));
        out.insert(k.clone(), joined);
    }
    out
}

/// postcard's bytes of the model: the payload a frame state must write.
fn model_bytes(m: &Model) -> Vec<u8> {
    postcard::to_allocvec(m).unwrap()
}

/// The model's payload with every varint one byte longer than it needs to
/// be where postcard's decoder still takes it (a continuation bit on the
/// last byte, then a zero byte).
fn padded(m: &Model) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u128, max: usize) {
        let mut bytes = Vec::new();
        loop {
            let b = v.to_le_bytes()[0] & 0x7f;
            v >>= 7;
            if v == 0 {
                bytes.push(b);
                break;
            }
            bytes.push(b | 0x80);
        }
        if bytes.len() < max {
            *bytes.last_mut().unwrap() |= 0x80;
            bytes.push(0);
        }
        out.extend(bytes);
    }
    fn code<V: Clone>(a: &Atom<V>, f: impl Fn(&V) -> u128) -> u128 {
        match a {
            Atom::Unset => 0,
            Atom::Dynamic => 1,
            Atom::Static(v) => 2 + f(v),
        }
    }
    fn tuple<V: Clone>(out: &mut Vec<u8>, d: &Dims<V>, f: impl Fn(&V) -> u128) {
        match d {
            Dims::Unset => varint(out, 0, 5),
            Dims::Dynamic => varint(out, 1, 5),
            Dims::Known(xs) => {
                varint(out, 2, 5);
                varint(out, xs.len() as u128, 10);
                for a in xs {
                    varint(out, code(a, &f), 19);
                }
            }
        }
    }
    // The scalar code space (lattice::Scalar's docs), written out again:
    // ints by zigzag, floats at 2^64 + bits, bools at 2^65 + b, big ints at
    // 2^66 + zigzag.
    let zigzag = |v: i128| -> u128 {
        if v < 0 {
            (v.unsigned_abs() << 1) - 1
        } else {
            v.unsigned_abs() << 1
        }
    };
    let scalar = |v: &Scalar| -> u128 {
        match *v {
            Scalar::Int(x) => zigzag(i128::from(x)),
            Scalar::Float(bits) => (1u128 << 64) + u128::from(bits),
            Scalar::Bool(b) => (1u128 << 65) + u128::from(b),
            Scalar::BigInt(x) => (1u128 << 66) + zigzag(x),
        }
    };
    let stride = |s: &Stride| -> u128 {
        match *s {
            Stride::Int(n) => 2 * u128::from(n),
            Stride::Infer(j) => 2 * u128::from(j) + 1,
        }
    };
    let mut out = Vec::new();
    varint(&mut out, m.len() as u128, 10);
    for (k, e) in m {
        varint(&mut out, k.len() as u128, 10);
        out.extend_from_slice(k.as_bytes());
        varint(&mut out, code(&e.scalar, scalar), 19);
        tuple(&mut out, &e.size, |v| u128::from(*v));
        tuple(&mut out, &e.stride, stride);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// A state holds what it was given, writes postcard's bytes of it, and
    /// reads back from them.
    #[test]
    fn a_state_is_its_entries_in_postcards_bytes(m in model()) {
        let s = state(&m);
        prop_assert_eq!(model_of(&s), m.clone());
        prop_assert_eq!(s.len(), m.len());
        prop_assert_eq!(s.sources().collect::<Vec<_>>(), m.keys().map(String::as_str).collect::<Vec<_>>());
        let bytes = encode_payload(&s).unwrap();
        prop_assert_eq!(&bytes, &model_bytes(&m));
        prop_assert_eq!(decode_payload::<FrameState>(&bytes).unwrap(), s.clone());
        for (k, e) in &m {
            prop_assert!(s.contains(k));
            prop_assert_eq!(s.entry(k), Some(e.clone()));
            prop_assert_eq!(&s.get(k), e);
        }
        prop_assert_eq!(s.get("absent"), SizeEntry::unset());
        prop_assert_eq!(s.entry("absent"), None);
    }

    /// Longer-than-needed varints (which postcard accepts) read as the same
    /// state, stored canonically.
    #[test]
    fn padded_varints_read_as_the_same_canonical_state(m in model()) {
        let bytes = padded(&m);
        prop_assert_eq!(postcard::from_bytes::<Model>(&bytes).unwrap(), m.clone());
        let s = decode_payload::<FrameState>(&bytes).unwrap();
        prop_assert_eq!(&s, &state(&m));
        prop_assert_eq!(encode_payload(&s).unwrap(), model_bytes(&m));
        let mut joined = state(&m);
        joined.join_encoded(&bytes).unwrap();
        prop_assert_eq!(joined, state(&m));
    }

    /// Every way to join gives the lattice's join per source.
    #[test]
    fn every_join_is_the_lattices(a in model(), b in model(), c in model()) {
        let want = model_join(&a, &b);
        let mut s = state(&a);
        s.join(&state(&b));
        prop_assert_eq!(model_of(&s), want.clone());
        prop_assert_eq!(encode_payload(&s).unwrap(), model_bytes(&want));
        let mut s = state(&a);
        s.join_encoded(&model_bytes(&b)).unwrap();
        prop_assert_eq!(model_of(&s), want.clone());
        let mut s = state(&a);
        s.join_encoded(&padded(&b)).unwrap();
        prop_assert_eq!(model_of(&s), want);
        // Every rank's payload, this rank's (a's) in the middle.
        let all = model_join(&model_join(&a, &b), &c);
        let mut s = state(&a);
        let payloads = [model_bytes(&b), model_bytes(&a), padded(&c)];
        let views: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        s.join_payloads(1, &views).unwrap();
        prop_assert_eq!(model_of(&s), all);
    }

    /// `record_entry` joins into a source, `insert` sets it, `remove`
    /// takes it out, in any order.
    #[test]
    fn edits_are_the_models(
        start in model(),
        ops in proptest::collection::vec((0u8..3, name(), entry()), 0..12),
    ) {
        let mut s = state(&start);
        let mut m = start;
        for (op, k, e) in ops {
            match op {
                0 => {
                    s.record_entry(&k, &e);
                    let joined = m.get(&k).map_or_else(|| e.clone(), |x| x.join(&e));
                    m.insert(k, joined);
                }
                1 => prop_assert_eq!(s.insert(&k, &e), m.insert(k, e)),
                _ => prop_assert_eq!(s.remove(&k), m.remove(&k)),
            }
            prop_assert_eq!(model_of(&s), m.clone());
            prop_assert_eq!(encode_payload(&s).unwrap(), model_bytes(&m));
        }
    }

    /// `collect` keeps the last entry of a name given twice, as a map does.
    #[test]
    fn collect_keeps_the_last_entry_of_a_name(pairs in proptest::collection::vec((name(), entry()), 0..10)) {
        let s: FrameState = pairs.iter().cloned().collect();
        let m: Model = pairs.into_iter().collect();
        prop_assert_eq!(model_of(&s), m);
    }

    /// The serde forms are the model's: JSON both ways, and the same Debug text.
    #[test]
    fn serde_and_debug_forms_are_the_models(m in model()) {
        #[derive(serde::Serialize, serde::Deserialize, Debug)]
        struct FrameState {
            entries: Model,
        }
        let s = state(&m);
        let text = serde_json::to_string(&s).unwrap();
        let plain = FrameState { entries: m.clone() };
        prop_assert_eq!(&text, &serde_json::to_string(&plain).unwrap());
        prop_assert_eq!(
            serde_json::from_str::<compiler_collectives_core::decisions::shapes::FrameState>(&text).unwrap(),
            s.clone()
        );
        prop_assert_eq!(format!("{s:?}"), format!("{plain:?}"));
    }
}

/// Bytes a peer may send that do not read: each gives an error, and a state
/// joining them is unchanged.
#[test]
fn bad_payloads_are_refused_and_change_nothing() {
    let mut m = Model::new();
    m.insert("a".into(), SizeEntry::tensor(&[4, 2], None));
    m.insert("b".into(), SizeEntry::int(3));
    let good = model_bytes(&m);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("count past the end", vec![5]),
        ("cut in an entry", good[..good.len() - 1].to_vec()),
        ("trailing byte", [good.as_slice(), &[0]].concat()),
        ("name not UTF-8", vec![1, 1, 0xff, 1, 0, 0]),
        ("names out of order", {
            let mut v = vec![2];
            v.extend([1, b'b', 1, 0, 0]);
            v.extend([1, b'a', 1, 0, 0]);
            v
        }),
        ("a name twice", {
            let mut v = vec![2];
            v.extend([1, b'a', 1, 0, 0]);
            v.extend([1, b'a', 1, 0, 0]);
            v
        }),
        ("tuple variant 3", vec![1, 1, b'a', 1, 3, 0]),
        ("a size over u64", {
            // code 2 + 2^64 in a size tuple
            let mut v = vec![1, 1, b'a', 1, 2, 1];
            v.extend([0x82, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]);
            v.push(0);
            v
        }),
        ("an Infer stride over u32", {
            // code 2 + (2·2^32 + 1), odd: Infer(2^32)
            let mut v = vec![1, 1, b'a', 1, 0, 2, 1];
            v.extend([0x83, 0x80, 0x80, 0x80, 0x20]);
            v
        }),
        ("an atom varint of 20 bytes", {
            let mut v = vec![1, 1, b'a'];
            v.extend([0x80; 19]);
            v.push(0);
            v.extend([0, 0]);
            v
        }),
    ];
    for (what, bytes) in cases {
        // postcard, every byte consumed (as the protocol reads a payload).
        // postcard, every byte consumed (as the protocol reads a payload),
        // refuses all but the order of names, which only a canonical
        // payload keeps (a map decoder does not check it).
        let strict = postcard::take_from_bytes::<Model>(&bytes).map(|(_, rest)| rest.is_empty());
        let ordering = what.contains("order") || what.contains("twice");
        assert_eq!(
            matches!(strict, Ok(true)),
            ordering,
            "{what}: postcard on {bytes:?}"
        );
        assert!(decode_payload::<FrameState>(&bytes).is_err(), "{what}");
        let mut s = state(&m);
        assert!(s.join_encoded(&bytes).is_err(), "{what}");
        assert_eq!(s, state(&m), "{what}: changed");
        let mut s = state(&m);
        let own = encode_payload(&s).unwrap();
        let err = s
            .join_payloads(0, &[own.as_slice(), good.as_slice(), bytes.as_slice()])
            .unwrap_err();
        assert_eq!(err.0, 2, "{what}");
        assert_eq!(s, state(&m), "{what}: changed");
    }
}

/// The costs the type docs state: a join that changes nothing keeps the
/// bytes, and ⊥ ⊔ x is x.
#[test]
fn joins_that_change_nothing_keep_the_state() {
    let mut m = Model::new();
    m.insert("x".into(), SizeEntry::tensor(&[5, 10], None));
    let s = state(&m);
    let mut t = s.clone();
    t.join(&s);
    assert_eq!(t, s);
    let mut e = FrameState::new();
    e.join(&s);
    assert_eq!(e, s);
    let mut t = s.clone();
    t.join(&FrameState::new());
    assert_eq!(t, s);
    assert_eq!(s.as_bytes(), &model_bytes(&m)[1..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The join of many states (`join_all`), and the in-place join of many
    /// payloads (some equal to this rank's own, some padded), are the fold
    /// of the lattice's join; a bad payload among them names the first one
    /// in rank order that does not read, and changes nothing.
    #[test]
    fn many_at_once_is_the_fold(
        models in proptest::collection::vec(model(), 0..7),
        own in any::<prop::sample::Index>(),
        padding in proptest::collection::vec(any::<bool>(), 7),
        bad in proptest::collection::vec(any::<bool>(), 7),
    ) {
        let want = models.iter().fold(Model::new(), |a, m| model_join(&a, m));
        let states: Vec<FrameState> = models.iter().map(state).collect();
        prop_assert_eq!(model_of(&FrameState::join_all(&states)), want.clone());
        if models.is_empty() {
            return Ok(());
        }
        let own = own.index(models.len());
        let mut payloads: Vec<Vec<u8>> = models
            .iter()
            .zip(&padding)
            .enumerate()
            .map(|(r, (m, &pad))| if pad && r != own { padded(m) } else { model_bytes(m) })
            .collect();
        let views: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let mut s = states[own].clone();
        s.join_payloads(own, &views).unwrap();
        prop_assert_eq!(model_of(&s), want);
        // Damage some peers' payloads: the first damaged one in rank order
        // is named, and the state is unchanged.
        let mut first_bad = None;
        for (r, p) in payloads.iter_mut().enumerate() {
            if bad[r] && r != own {
                p.push(0xff);
                first_bad.get_or_insert(r);
            }
        }
        let views: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let mut s = states[own].clone();
        match (s.join_payloads(own, &views), first_bad) {
            (Ok(()), None) => {}
            (Err((r, _)), Some(b)) => {
                prop_assert_eq!(r, b);
                prop_assert_eq!(&s, &states[own]);
            }
            (other, b) => prop_assert!(false, "{:?} with damaged {:?}", other.map_err(|e| e.0), b),
        }
    }
}

/// The trait's provided `join_payloads` over canonical payloads and bytes
/// that do not read: read every payload in rank order (the first that does
/// not read names its index), then join every one but `own`'s.
fn provided(s: &FrameState, own: usize, payloads: &[Vec<u8>]) -> Result<Model, usize> {
    let mut values = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        let (m, rest) = postcard::take_from_bytes::<Model>(p).map_err(|_| i)?;
        // A canonical payload re-encodes to itself (names in order too).
        if !rest.is_empty() || model_bytes(&m) != *p {
            return Err(i);
        }
        values.push(m);
    }
    Ok(values
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != own)
        .fold(model_of(s), |a, (_, m)| model_join(&a, m)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever `payloads[own]` holds — this state's encoding, another
    /// state's, or bytes that do not read — the frame state's
    /// `join_payloads` is the provided version's (found by a new user's
    /// attack: it used to trust `payloads[own]` to be this state's).
    #[test]
    fn join_payloads_is_the_provided_version_whatever_own_holds(
        mine in model(),
        others in proptest::collection::vec(model(), 1..4),
        own in any::<prop::sample::Index>(),
        what in 0u8..3,
    ) {
        let s = state(&mine);
        let own = own.index(others.len() + 1);
        let mut payloads: Vec<Vec<u8>> = others.iter().map(model_bytes).collect();
        payloads.insert(own, match what {
            0 => model_bytes(&mine),
            1 => model_bytes(&others[0]),
            _ => vec![0xff, 0xff],
        });
        let views: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        let mut t = s.clone();
        let ours = t.join_payloads(own, &views).map(|()| model_of(&t)).map_err(|e| e.0);
        prop_assert_eq!(ours.clone(), provided(&s, own, &payloads));
        if ours.is_err() {
            prop_assert_eq!(t, s);
        }
    }
}
