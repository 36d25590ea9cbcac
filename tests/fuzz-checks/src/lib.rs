//! What each fuzz target checks, written once.
//!
//! The cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) and the stable
//! replay test (`tests/replay.rs`, part of `cargo test`) call the same
//! functions through [`TARGETS`], so every input the fuzzer kept — the
//! committed corpus under `fuzz/corpus/<target>/` and every crash turned
//! regression under `fuzz/regressions/<target>/` — is checked on every CI
//! run without a nightly toolchain.
//!
//! A check feeds untrusted bytes (what a peer rank or a file controls) to a
//! decoder with [`Limits`] and panics only when a property is broken: a
//! decoder panicked, accepted something over its limits, or accepted
//! something that does not re-encode to an equal value. Errors are the
//! expected outcome for most inputs.
//!
//! Adding a target: one `fn(&[u8])` here and a line in [`TARGETS`], a
//! three-line `fuzz/fuzz_targets/<name>.rs`, and its `[[bin]]` entry in
//! `fuzz/Cargo.toml`.

use compiler_collectives_core::decisions::agree::AgreedValues;
use compiler_collectives_core::decisions::autotune::Timings;
use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::decisions::votes::{AllVote, AnyVote, Max, Min};
use compiler_collectives_core::persistence::profile::{
    Profile, ProfileLimits, PROFILE_HEADER_LEN, PROFILE_MAGIC, PROFILE_VERSION,
};
use compiler_collectives_core::protocol::envelope::{
    self, Envelope, Limits, DIGEST_MSG_LEN, WIRE_VERSION,
};
use compiler_collectives_core::Join;
use compiler_collectives_harness::scenario::{Scenario, ScenarioLimits};
use compiler_collectives_tcpstore::wire::{self as tcp, Query, Reply, Request};

/// A check: panics when `data` breaks a property.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the directory under `fuzz/corpus/` and the
/// cargo-fuzz target) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("envelope", envelope_decode),
    ("digest_msg", digest_msg_decode),
    ("slot", slot_decode),
    ("payload", payload_decode),
    ("scenario", scenario_parse),
    ("profile", profile_decode),
    ("tcpstore_request", tcpstore_request_decode),
    ("tcpstore_reply", tcpstore_reply_decode),
];

/// Small limits, so the fuzzer reaches every "over the limit" branch.
pub fn small_limits() -> Limits {
    Limits::default()
        .with_max_message_bytes(256)
        .with_max_key_bytes(32)
        .with_max_kind_bytes(24)
        .with_max_config_bytes(32)
}

/// An envelope from a peer: decoded under the default and under
/// [`small_limits`]; an accepted one respects the limits and re-encodes to
/// exactly the input (the wire form is canonical).
///
/// # Panics
/// When a property is broken.
pub fn envelope_decode(data: &[u8]) {
    let _ = envelope::peek_header(data);
    for limits in [Limits::default(), small_limits()] {
        if let Ok(env) = Envelope::decode(data, &limits) {
            assert_eq!(env.version, WIRE_VERSION);
            assert!(data.len() <= limits.max_message_bytes);
            assert!(env.kind.len() <= limits.max_kind_bytes);
            assert!(env.key.len() <= limits.max_key_bytes);
            assert!(env.config.len() <= limits.max_config_bytes);
            let again = env
                .encode(&limits)
                .expect("an accepted envelope re-encodes");
            assert_eq!(again, data, "decode/encode is not the identity");
        }
    }
    // What a small-limit rank accepts, a default-limit rank accepts too.
    if Envelope::decode(data, &small_limits()).is_ok() {
        assert!(Envelope::decode(data, &Limits::default()).is_ok());
    }
}

/// A fast-path digest message from a peer: an accepted message of this
/// build's version is exactly [`DIGEST_MSG_LEN`] bytes and re-encodes to the
/// input; one of another version is reported by its version only.
///
/// # Panics
/// When a property is broken.
pub fn digest_msg_decode(data: &[u8]) {
    if let Ok(msg) = envelope::decode_digest_msg(data) {
        if msg.version == WIRE_VERSION {
            assert_eq!(data.len(), DIGEST_MSG_LEN);
            let again = envelope::encode_digest_msg(msg.version, msg.seq, &msg.digest);
            assert_eq!(again.as_slice(), data);
        } else {
            assert_eq!((msg.seq, msg.digest), (0, [0; 16]));
        }
    }
}

/// A flat exchange's first-round slot from a peer: an accepted slot of this
/// build's version re-encodes to exactly the input (header, the envelope
/// when inline, zeros to the end), and its inline envelope lies within it;
/// one of another version is reported by its version only.
///
/// # Panics
/// When a property is broken.
pub fn slot_decode(data: &[u8]) {
    if let Ok(msg) = envelope::decode_slot(data) {
        if msg.version != WIRE_VERSION {
            assert_eq!(
                (msg.seq, msg.digest, msg.len, msg.limit),
                (0, [0; 16], 0, 0)
            );
            assert!(msg.inline.is_none());
            return;
        }
        let mut again = vec![0u8; data.len()];
        envelope::write_slot_header(
            &mut again,
            msg.seq,
            &msg.digest,
            msg.len,
            msg.inline.is_some(),
            msg.limit,
        );
        if let Some(env) = msg.inline {
            assert_eq!(env.len(), msg.len as usize);
            again[envelope::SLOT_HEADER_LEN..][..env.len()].copy_from_slice(env);
        }
        assert_eq!(again, data, "decode/encode is not the identity");
    }
}

/// Decodes `bytes` as a `J` payload; an accepted value re-encodes to bytes
/// that decode to the same value, and its join with itself is itself
/// (idempotence, which the fast path relies on).
fn payload_as<J: Join + PartialEq>(bytes: &[u8]) -> Option<J> {
    let v: J = envelope::decode_postcard(J::KIND, bytes).ok()?;
    let again = compiler_collectives_core::protocol::encode_payload(&v)
        .expect("an accepted value re-encodes");
    let back: J = envelope::decode_postcard(J::KIND, &again).expect("a re-encoded value decodes");
    assert_eq!(back, v, "decode(encode(v)) != v for {}", J::KIND);
    let mut twice = v.clone();
    twice.join(&v);
    assert_eq!(twice, v, "join is not idempotent on a decoded {}", J::KIND);
    Some(v)
}

/// Two values `a` and `b` of one kind from a peer: both decode (or not)
/// without panicking; when both decode, joining them does not panic and is
/// commutative (what a rank does with hostile but well-formed values).
fn pair_as<J: Join + PartialEq>(a: &[u8], b: &[u8]) {
    if let (Some(x), Some(y)) = (payload_as::<J>(a), payload_as::<J>(b)) {
        let mut xy = x.clone();
        xy.join(&y);
        let mut yx = y;
        yx.join(&x);
        assert_eq!(xy, yx, "join is not commutative for {}", J::KIND);
    }
}

/// Decision payloads from a peer. The first byte picks the kind (frame
/// state, any/all vote, max, min, autotuning timings, must-agree values,
/// whole profile); the rest is split at the second byte into
/// two payloads of that kind.
///
/// # Panics
/// When a property is broken.
pub fn payload_decode(data: &[u8]) {
    let [kind, split, rest @ ..] = data else {
        return;
    };
    let at = usize::from(*split).min(rest.len());
    let (a, b) = rest.split_at(at);
    match kind % 8 {
        0 => pair_as::<FrameState>(a, b),
        1 => pair_as::<AnyVote>(a, b),
        2 => pair_as::<AllVote>(a, b),
        3 => pair_as::<Max>(a, b),
        4 => pair_as::<Min>(a, b),
        5 => pair_as::<Timings>(a, b),
        6 => pair_as::<AgreedValues>(a, b),
        _ => pair_as::<Profile>(a, b),
    }
}

/// A scenario file (parsed and validated only, not run), under limits
/// small enough that an accepted file is cheap.
///
/// # Panics
/// When a property is broken.
pub fn scenario_parse(data: &[u8]) {
    let limits = ScenarioLimits::default()
        .with_max_world_size(16)
        .with_max_ndim(8)
        .with_max_steps(64)
        .with_max_file_bytes(1 << 16);
    if let Ok(s) = Scenario::from_slice(data, "<fuzz>", &limits) {
        assert!(s.world_size >= 1 && s.world_size <= limits.max_world_size);
    }
}

/// Limits small enough that the fuzzer reaches the "over the limit" branches
/// of the profile decoder.
pub fn small_profile_limits() -> ProfileLimits {
    ProfileLimits::default()
        .with_max_body_bytes(4096)
        .with_max_entries(16)
}

/// A profile file (what a crashed writer, a full disk or another tool may
/// leave): decoded under the default and under [`small_profile_limits`]; an
/// accepted profile respects the limits, re-encodes to bytes that decode to
/// the same profile, and its join with itself is itself.
///
/// The first byte picks the input: even, the rest is a whole file as is;
/// odd, the rest is a body that gets a valid header (magic, version, length,
/// checksum), so mutations reach the body decoder instead of stopping at
/// the checksum.
///
/// # Panics
/// When a property is broken.
pub fn profile_decode(data: &[u8]) {
    let [mode, rest @ ..] = data else {
        return;
    };
    if mode % 2 == 0 {
        profile_file(rest);
        return;
    }
    let Ok(len) = u32::try_from(rest.len()) else {
        return;
    };
    let mut file = Vec::with_capacity(PROFILE_HEADER_LEN + rest.len());
    file.extend_from_slice(&PROFILE_MAGIC);
    file.extend_from_slice(&PROFILE_VERSION.to_le_bytes());
    file.extend_from_slice(&0u16.to_le_bytes());
    file.extend_from_slice(&len.to_le_bytes());
    file.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(rest).to_le_bytes());
    file.extend_from_slice(rest);
    profile_file(&file);
}

fn profile_file(data: &[u8]) {
    for limits in [ProfileLimits::default(), small_profile_limits()] {
        if let Ok(p) = Profile::decode(data, &limits) {
            assert!(p.len() <= limits.max_entries);
            let again = p.encode().expect("an accepted profile re-encodes");
            let back = Profile::decode(&again, &limits).expect("a re-encoded profile decodes");
            assert_eq!(back, p, "decode(encode(p)) != p");
            let mut twice = p.clone();
            twice.join(&p);
            assert_eq!(twice, p, "join is not idempotent on a decoded profile");
        }
    }
    if Profile::decode(data, &small_profile_limits()).is_ok() {
        assert!(Profile::decode(data, &ProfileLimits::default()).is_ok());
    }
}

/// Small TCPStore limits, so the fuzzer reaches every "over the limit"
/// branch of the request and reply decoders.
pub fn tcp_small_limits() -> tcp::Limits {
    tcp::Limits::default()
        .with_max_key_bytes(16)
        .with_max_value_bytes(64)
        .with_max_keys(4)
        .with_max_message_bytes(128)
}

fn tcp_within(limits: &tcp::Limits, keys: &[&Vec<u8>], values: &[&Vec<u8>]) {
    assert!(keys.len() <= limits.max_keys.max(1));
    assert!(keys.iter().all(|k| k.len() <= limits.max_key_bytes));
    assert!(values.iter().all(|v| v.len() <= limits.max_value_bytes));
    let total: usize = keys.iter().chain(values).map(|b| b.len()).sum();
    assert!(total <= limits.max_message_bytes);
}

/// A request a TCPStore client sent (the server's decoder): decoded under
/// the default and [`tcp_small_limits`]; an accepted one respects the
/// limits and re-encodes to exactly the bytes it was read from.
///
/// # Panics
/// When a property is broken.
pub fn tcpstore_request_decode(data: &[u8]) {
    for limits in [tcp::Limits::default(), tcp_small_limits()] {
        let mut rest = data;
        if let Ok(req) = Request::read(&mut rest, &limits) {
            let used = &data[..data.len() - rest.len()];
            assert_eq!(req.encode(), used, "decode/encode is not the identity");
            let (keys, values): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) = match &req {
                Request::Set { key, value }
                | Request::Append { key, value }
                | Request::QueuePush { key, value } => (vec![key], vec![value]),
                Request::CompareSet {
                    key,
                    expected,
                    desired,
                } => (vec![key], vec![expected, desired]),
                Request::Get { key }
                | Request::DeleteKey { key }
                | Request::QueuePop { key }
                | Request::QueueLen { key }
                | Request::Add { key, .. }
                | Request::Barrier { key, .. } => (vec![key], vec![]),
                Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                    (keys.iter().collect(), vec![])
                }
                Request::MultiSet { pairs } => (
                    pairs.iter().map(|(k, _)| k).collect(),
                    pairs.iter().map(|(_, v)| v).collect(),
                ),
                _ => (vec![], vec![]),
            };
            tcp_within(&limits, &keys, &values);
        }
    }
}

/// A server's reply (the client's decoder): the first byte picks the query
/// (and how many keys a `MULTI_GET` asked for), the rest is what the server
/// sent; an accepted reply respects the limits.
///
/// # Panics
/// When a property is broken.
pub fn tcpstore_reply_decode(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Some(query) = Query::from_byte(pick % 19) else {
        return;
    };
    let keys = usize::from(pick / 19);
    for limits in [tcp::Limits::default(), tcp_small_limits()] {
        let mut input = rest;
        if let Ok(reply) = Reply::read(query, keys, &mut input, &limits) {
            match &reply {
                Reply::Value(v) => tcp_within(&limits, &[], &[v]),
                Reply::Popped(Some(v)) => tcp_within(&limits, &[], &[v]),
                Reply::Values(vs) => {
                    assert_eq!(vs.len(), keys);
                    tcp_within(&limits, &[], &vs.iter().collect::<Vec<_>>());
                }
                Reply::Keys(ks) => tcp_within(&limits, &ks.iter().collect::<Vec<_>>(), &[]),
                _ => {}
            }
        }
    }
}
