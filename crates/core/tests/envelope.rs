//! The wire format (docs/protocol.md): envelope round trips, strict and bounded
//! decoding, and decoders that never panic on garbage.

use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::decisions::votes::AnyVote;
use compiler_collectives_core::protocol::envelope::{
    self, decode_digest_msg, digest, encode_digest_msg, peek_header, Envelope, Limits,
    DIGEST_MSG_LEN, HEADER_LEN, MAGIC, WIRE_VERSION,
};
use compiler_collectives_core::protocol::{decode_payload, encode_payload};
use compiler_collectives_core::Join;
use compiler_collectives_core::{DecodeError, Error};
use proptest::prelude::*;
use std::time::{Duration, Instant};

/// Small limits, so that random lengths often cross them.
fn small() -> Limits {
    Limits::default()
        .with_max_message_bytes(256)
        .with_max_key_bytes(64)
        .with_max_kind_bytes(64)
        .with_max_config_bytes(64)
}

fn sample() -> Envelope {
    let mut state = FrameState::new();
    state.record("x", &Observation::tensor([5, 10]));
    state.record("n", &Observation::Int(3));
    Envelope {
        version: WIRE_VERSION,
        seq: 42,
        kind: FrameState::KIND.to_string(),
        key: "train_step@model.rs:88".to_string(),
        config: "votes=0 limit=8".to_string(),
        payload: encode_payload(&state).expect("encode"),
    }
}

fn sample_bytes() -> Vec<u8> {
    sample().encode(&Limits::default()).expect("encode")
}

fn header(version: u16, msg_type: u16, seq: u64, lens: [u32; 4]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&msg_type.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    for l in lens {
        out.extend_from_slice(&l.to_le_bytes());
    }
    out
}

fn assert_within(env: &Envelope, limits: &Limits) {
    for (what, len, max) in [
        ("kind", env.kind.len(), limits.max_kind_bytes),
        ("key", env.key.len(), limits.max_key_bytes),
        ("config", env.config.len(), limits.max_config_bytes),
        ("payload", env.payload.len(), limits.max_message_bytes),
    ] {
        assert!(len <= max, "{what} {len} bytes");
    }
    let total = HEADER_LEN + env.kind.len() + env.key.len() + env.config.len() + env.payload.len();
    assert!(total <= limits.max_message_bytes, "message {total} bytes");
}

// ---------------------------------------------------------------------------
// Layout and round trip
// ---------------------------------------------------------------------------

#[test]
fn layout_matches_the_documented_header() {
    let env = sample();
    let bytes = sample_bytes();
    assert_eq!(&bytes[..4], b"CCOL");
    assert_eq!(&bytes[4..6], &WIRE_VERSION.to_le_bytes());
    assert_eq!(&bytes[6..8], &1u16.to_le_bytes());
    assert_eq!(&bytes[8..16], &42u64.to_le_bytes());
    let lens = [
        env.kind.len(),
        env.key.len(),
        env.config.len(),
        env.payload.len(),
    ];
    for (k, len) in lens.iter().enumerate() {
        let at = 16 + 4 * k;
        let got = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        assert_eq!(usize::try_from(got).unwrap(), *len, "length field {k}");
    }
    assert_eq!(bytes.len(), HEADER_LEN + lens.iter().sum::<usize>());
    assert_eq!(
        &bytes[HEADER_LEN..HEADER_LEN + env.kind.len()],
        env.kind.as_bytes()
    );
    assert_eq!(peek_header(&bytes).unwrap(), (WIRE_VERSION, 1));
}

#[test]
fn round_trip_sample() {
    let bytes = sample_bytes();
    assert_eq!(
        Envelope::decode(&bytes, &Limits::default()).unwrap(),
        sample()
    );
    let empty = Envelope {
        version: WIRE_VERSION,
        seq: 0,
        kind: String::new(),
        key: String::new(),
        config: String::new(),
        payload: Vec::new(),
    };
    let bytes = empty.encode(&small()).unwrap();
    assert_eq!(bytes.len(), HEADER_LEN);
    assert_eq!(Envelope::decode(&bytes, &small()).unwrap(), empty);
}

#[test]
fn encode_refuses_fields_over_limits() {
    let tiny = Limits::default()
        .with_max_message_bytes(40)
        .with_max_key_bytes(4)
        .with_max_kind_bytes(4)
        .with_max_config_bytes(4);
    let base = Envelope {
        version: WIRE_VERSION,
        seq: 1,
        kind: "k".into(),
        key: "key".into(),
        config: "c".into(),
        payload: vec![0; 3],
    };
    assert!(base.encode(&tiny).is_ok());
    let over = |f: fn(&mut Envelope)| {
        let mut e = base.clone();
        f(&mut e);
        e.encode(&tiny)
    };
    assert!(matches!(
        over(|e| e.kind = "kind!".into()),
        Err(DecodeError::TooLarge { field: "kind", .. })
    ));
    assert!(matches!(
        over(|e| e.key = "key!!".into()),
        Err(DecodeError::TooLarge { field: "key", .. })
    ));
    assert!(matches!(
        over(|e| e.config = "cfg!!".into()),
        Err(DecodeError::TooLarge {
            field: "config",
            ..
        })
    ));
    assert!(matches!(
        over(|e| e.payload = vec![0; 40]),
        Err(DecodeError::TooLarge {
            field: "message",
            ..
        })
    ));
}

// ---------------------------------------------------------------------------
// Strict decoding
// ---------------------------------------------------------------------------

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_bytes();
    for len in 0..bytes.len() {
        match Envelope::decode(&bytes[..len], &Limits::default()) {
            Err(DecodeError::Truncated { got, .. }) => assert_eq!(got, len),
            other => panic!("prefix of {len}/{} bytes: {other:?}", bytes.len()),
        }
    }
}

#[test]
fn trailing_byte_is_an_error() {
    let mut bytes = sample_bytes();
    bytes.push(0);
    assert!(matches!(
        Envelope::decode(&bytes, &Limits::default()),
        Err(DecodeError::Trailing { extra: 1 })
    ));
    bytes.extend_from_slice(&[1, 2, 3]);
    assert!(matches!(
        Envelope::decode(&bytes, &Limits::default()),
        Err(DecodeError::Trailing { extra: 4 })
    ));
}

#[test]
fn bad_magic_is_an_error() {
    for at in 0..4 {
        let mut bytes = sample_bytes();
        bytes[at] ^= 0x20;
        match Envelope::decode(&bytes, &Limits::default()) {
            Err(DecodeError::BadMagic { found }) => assert_eq!(&found[..], &bytes[..4]),
            other => panic!("magic byte {at} flipped: {other:?}"),
        }
    }
    assert!(matches!(
        peek_header(b"GET / HTTP/1.1"),
        Err(DecodeError::BadMagic { .. })
    ));
    let mut digest_msg = encode_digest_msg(WIRE_VERSION, 1, &[0; 16]);
    digest_msg[0] = b'X';
    assert!(matches!(
        decode_digest_msg(&digest_msg),
        Err(DecodeError::BadMagic { .. })
    ));
}

#[test]
fn other_version_is_an_invalid_version_error() {
    for version in [0u16, WIRE_VERSION + 1, u16::MAX] {
        let mut bytes = sample_bytes();
        bytes[4..6].copy_from_slice(&version.to_le_bytes());
        let err = Envelope::decode(&bytes, &Limits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Invalid {
                    field: "version",
                    ..
                }
            ),
            "v{version}: {err:?}"
        );
        assert!(err.to_string().contains(&version.to_string()), "{err}");
        // The version is reported even when nothing after it is readable:
        // magic and version keep their place in every version.
        let err = Envelope::decode(&bytes[..8], &Limits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                DecodeError::Invalid {
                    field: "version",
                    ..
                }
            ),
            "v{version} (8 bytes): {err:?}"
        );
        assert_eq!(peek_header(&bytes[..8]).unwrap().0, version);
    }
}

#[test]
fn other_message_type_is_an_error() {
    let mut bytes = sample_bytes();
    bytes[6..8].copy_from_slice(&2u16.to_le_bytes());
    assert!(matches!(
        Envelope::decode(&bytes, &Limits::default()),
        Err(DecodeError::Invalid {
            field: "message type",
            ..
        })
    ));
    // A digest message is not an envelope.
    let msg = encode_digest_msg(WIRE_VERSION, 1, &[7; 16]);
    assert!(matches!(
        Envelope::decode(&msg, &Limits::default()),
        Err(DecodeError::Invalid {
            field: "message type",
            ..
        })
    ));
}

#[test]
fn huge_announced_payload_is_too_large_without_allocating() {
    // A 32-byte header announcing a 4 GiB payload.
    let bytes = header(WIRE_VERSION, 1, 0, [0, 0, 0, u32::MAX]);
    assert_eq!(bytes.len(), HEADER_LEN);
    let start = Instant::now();
    let err = Envelope::decode(&bytes, &Limits::default()).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    match err {
        DecodeError::TooLarge { field, len, limit } => {
            assert_eq!(field, "payload");
            assert_eq!(len, u64::from(u32::MAX));
            assert_eq!(limit, 64 << 20);
        }
        other => panic!("{other:?}"),
    }
    // Every field announced at 4 GiB.
    let bytes = header(WIRE_VERSION, 1, 0, [u32::MAX; 4]);
    assert!(matches!(
        Envelope::decode(&bytes, &Limits::default()),
        Err(DecodeError::TooLarge { .. })
    ));
    // Even with limits that allow it, a lying header is only truncated
    // (nothing is allocated for what is not there).
    let open = Limits::default()
        .with_max_message_bytes(usize::MAX)
        .with_max_key_bytes(usize::MAX)
        .with_max_kind_bytes(usize::MAX)
        .with_max_config_bytes(usize::MAX);
    let bytes = header(WIRE_VERSION, 1, 0, [u32::MAX; 4]);
    let start = Instant::now();
    assert!(matches!(
        Envelope::decode(&bytes, &open),
        Err(DecodeError::Truncated { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn each_field_over_its_limit_is_too_large() {
    let cases: [([u32; 4], &str); 4] = [
        ([65, 0, 0, 0], "kind"),
        ([0, 65, 0, 0], "key"),
        ([0, 0, 65, 0], "config"),
        ([0, 0, 0, 257], "payload"),
    ];
    for (lens, field) in cases {
        let mut bytes = header(WIRE_VERSION, 1, 0, lens);
        bytes.resize(
            HEADER_LEN
                + lens
                    .iter()
                    .map(|&l| usize::try_from(l).unwrap())
                    .sum::<usize>(),
            b'a',
        );
        let bytes = &bytes[..bytes.len().min(small().max_message_bytes)];
        match Envelope::decode(bytes, &small()) {
            Err(DecodeError::TooLarge { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // The whole message over max_message_bytes.
    let bytes = vec![0u8; small().max_message_bytes + 1];
    assert!(matches!(
        Envelope::decode(&bytes, &small()),
        Err(DecodeError::TooLarge {
            field: "message",
            ..
        })
    ));
}

#[test]
fn text_fields_must_be_utf8() {
    for (k, field) in ["kind", "key", "config"].into_iter().enumerate() {
        let mut lens = [0u32; 4];
        lens[k] = 2;
        let mut bytes = header(WIRE_VERSION, 1, 0, lens);
        bytes.extend_from_slice(&[0xC3, 0x28]);
        match Envelope::decode(&bytes, &Limits::default()) {
            Err(DecodeError::Invalid { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // The payload is bytes, not text.
    let mut bytes = header(WIRE_VERSION, 1, 0, [0, 0, 0, 2]);
    bytes.extend_from_slice(&[0xC3, 0x28]);
    assert_eq!(
        Envelope::decode(&bytes, &Limits::default())
            .unwrap()
            .payload,
        vec![0xC3, 0x28]
    );
}

// ---------------------------------------------------------------------------
// Digest messages
// ---------------------------------------------------------------------------

#[test]
fn digest_message_round_trip_and_strictness() {
    let d = digest(&sample_bytes());
    assert_ne!(d, digest(b"something else"));
    let msg = encode_digest_msg(WIRE_VERSION, 42, &d);
    assert_eq!(msg.len(), DIGEST_MSG_LEN);
    let got = decode_digest_msg(&msg).unwrap();
    assert_eq!((got.version, got.seq, got.digest), (WIRE_VERSION, 42, d));
    for len in 0..DIGEST_MSG_LEN {
        assert!(
            decode_digest_msg(&msg[..len]).is_err(),
            "digest prefix {len}"
        );
    }
    let mut long = msg.to_vec();
    long.push(0);
    assert!(decode_digest_msg(&long).is_err());
    // Another version decodes as far as its version.
    let other = encode_digest_msg(WIRE_VERSION + 1, 42, &d);
    assert_eq!(decode_digest_msg(&other).unwrap().version, WIRE_VERSION + 1);
    assert_eq!(
        decode_digest_msg(&other[..8]).unwrap().version,
        WIRE_VERSION + 1
    );
    // An envelope is not a digest message.
    let mut env = sample_bytes();
    env.truncate(DIGEST_MSG_LEN);
    assert!(matches!(
        decode_digest_msg(&env),
        Err(DecodeError::Invalid {
            field: "message type",
            ..
        })
    ));
}

// ---------------------------------------------------------------------------
// Payloads
// ---------------------------------------------------------------------------

#[test]
fn decode_payload_round_trip_and_rejects_trailing_bytes() {
    let env = sample();
    let state: FrameState = decode_payload(&env.payload).unwrap();
    assert_eq!(state.get("x").size.to_string(), "(5,10)");
    let mut bytes = env.payload.clone();
    bytes.push(0);
    match decode_payload::<FrameState>(&bytes) {
        Err(Error::Decode {
            rank: None,
            reason: DecodeError::Payload { kind, detail },
        }) => {
            assert_eq!(kind, FrameState::KIND);
            assert!(detail.contains("trailing"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    // The envelope-level helper too, for any kind.
    let mut vote = encode_payload(&AnyVote(true)).unwrap();
    assert!(
        envelope::decode_postcard::<AnyVote>(AnyVote::KIND, &vote)
            .unwrap()
            .0
    );
    vote.push(1);
    assert!(matches!(
        envelope::decode_postcard::<AnyVote>(AnyVote::KIND, &vote),
        Err(DecodeError::Payload { .. })
    ));
    // Truncated payloads are errors as well.
    for len in 0..env.payload.len() {
        assert!(
            decode_payload::<FrameState>(&env.payload[..len]).is_err(),
            "payload prefix {len}"
        );
    }
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

prop_compose! {
    /// Envelopes whose fields fit `small()` (text up to 16 chars = 64 bytes).
    fn small_envelope()(
        seq in any::<u64>(),
        kind in "[a-z._]{0,16}",
        key in "\\PC{0,16}",
        config in "\\PC{0,16}",
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) -> Envelope {
        Envelope { version: WIRE_VERSION, seq, kind, key, config, payload }
    }
}

/// A byte string that is mostly a valid envelope header (magic, version,
/// type) followed by random lengths and bytes, so decoding goes deep.
fn envelope_like() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(WIRE_VERSION), any::<u16>()],
        prop_oneof![Just(1u16), Just(2u16), any::<u16>()],
        any::<u64>(),
        proptest::collection::vec(prop_oneof![0u32..80, any::<u32>()], 4),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(version, msg_type, seq, lens, body)| {
            let mut bytes = header(version, msg_type, seq, [lens[0], lens[1], lens[2], lens[3]]);
            bytes.extend_from_slice(&body);
            bytes
        })
}

#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let m = prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        1 => any::<usize>().prop_map(Mutation::Truncate),
    ];
    proptest::collection::vec(m, 1..6)
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let n = bytes.len();
        match *m {
            Mutation::Set(i, b) if n > 0 => bytes[i % n] = b,
            Mutation::Insert(i, b) => bytes.insert(i % (n + 1), b),
            Mutation::Remove(i) if n > 0 => {
                bytes.remove(i % n);
            }
            Mutation::Truncate(i) => bytes.truncate(i % (n + 1)),
            _ => {}
        }
    }
    bytes
}

/// Feeds `bytes` to every decoder; none may panic, and a decoded envelope
/// stays within `small()`.
fn decode_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(env) = Envelope::decode(bytes, &small()) {
        assert_within(&env, &small());
        prop_assert_eq!(env.version, WIRE_VERSION);
        // A decoded envelope re-encodes to the same bytes (strictness).
        prop_assert_eq!(env.encode(&small()).unwrap(), bytes.to_vec());
        let _ = decode_payload::<FrameState>(&env.payload);
    }
    let _ = Envelope::decode(bytes, &Limits::default());
    if let Ok(msg) = decode_digest_msg(bytes) {
        if msg.version == WIRE_VERSION {
            prop_assert_eq!(bytes.len(), DIGEST_MSG_LEN);
        }
    }
    let _ = peek_header(bytes);
    let _ = decode_payload::<FrameState>(bytes);
    let _ = decode_payload::<AnyVote>(bytes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn envelope_round_trip(env in small_envelope()) {
        let bytes = env.encode(&small()).unwrap();
        prop_assert_eq!(bytes.len(), HEADER_LEN + env.kind.len() + env.key.len() + env.config.len() + env.payload.len());
        prop_assert_eq!(Envelope::decode(&bytes, &small()).unwrap(), env.clone());
        prop_assert_eq!(Envelope::decode(&bytes, &Limits::default()).unwrap(), env);
    }

    #[test]
    fn envelope_round_trip_default_limits(
        seq in any::<u64>(),
        kind in "\\PC{0,32}",
        key in "\\PC{0,200}",
        config in "\\PC{0,300}",
        payload in proptest::collection::vec(any::<u8>(), 0..2000),
    ) {
        let env = Envelope { version: WIRE_VERSION, seq, kind, key, config, payload };
        match env.encode(&Limits::default()) {
            Ok(bytes) => prop_assert_eq!(Envelope::decode(&bytes, &Limits::default()).unwrap(), env),
            // a 32-char kind may exceed 128 bytes
            Err(e) => prop_assert!(matches!(e, DecodeError::TooLarge { field: "kind", .. }), "{:?}", e),
        }
    }

    #[test]
    fn every_truncation_of_any_envelope_is_an_error(env in small_envelope(), cut in any::<prop::sample::Index>()) {
        let bytes = env.encode(&small()).unwrap();
        let len = cut.index(bytes.len());
        let err = Envelope::decode(&bytes[..len], &small());
        prop_assert!(matches!(err, Err(DecodeError::Truncated { .. })), "{:?}", err);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        decode_all(&bytes)?;
    }

    #[test]
    fn envelope_like_bytes_never_panic(bytes in envelope_like()) {
        decode_all(&bytes)?;
    }

    #[test]
    fn mutated_envelopes_never_panic(env in small_envelope(), ms in mutations()) {
        let bytes = mutate(env.encode(&small()).unwrap(), &ms);
        decode_all(&bytes)?;
    }

    #[test]
    fn mutated_digest_messages_never_panic(seq in any::<u64>(), d in any::<[u8; 16]>(), ms in mutations()) {
        let bytes = mutate(encode_digest_msg(WIRE_VERSION, seq, &d).to_vec(), &ms);
        decode_all(&bytes)?;
    }

    #[test]
    fn mutated_payloads_never_panic(ms in mutations()) {
        let bytes = mutate(sample().payload, &ms);
        let _ = decode_payload::<FrameState>(&bytes);
        // and wrapped in an envelope
        let env = Envelope { payload: bytes, ..sample() };
        if let Ok(encoded) = env.encode(&Limits::default()) {
            let back = Envelope::decode(&encoded, &Limits::default()).unwrap();
            let _ = decode_payload::<FrameState>(&back.payload);
        }
    }

    #[test]
    fn payload_round_trip(states in proptest::collection::vec(
        ("[a-c]", proptest::collection::vec(0u64..5, 0..4), any::<bool>(), -2i64..3),
        0..6,
    )) {
        let mut state = FrameState::new();
        for (source, sizes, is_tensor, v) in states {
            let obs = if is_tensor { Observation::tensor(sizes) } else { Observation::Int(v) };
            state.record(&source, &obs);
        }
        let bytes = encode_payload(&state).unwrap();
        let back: FrameState = decode_payload(&bytes).unwrap();
        prop_assert_eq!(back, state);
    }
}
