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

use compiler_collectives_core::envelope::{self, Envelope, Limits, DIGEST_MSG_LEN, WIRE_VERSION};
use compiler_collectives_core::join::{AllVote, AnyVote, Max, Min};
use compiler_collectives_core::scenario::{Scenario, ScenarioLimits};
use compiler_collectives_core::shapes::FrameState;
use compiler_collectives_core::Join;

/// A check: panics when `data` breaks a property.
pub type Check = fn(&[u8]);

/// Every fuzz target: its name (the directory under `fuzz/corpus/` and the
/// cargo-fuzz target) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("envelope", envelope_decode),
    ("digest_msg", digest_msg_decode),
    ("payload", payload_decode),
    ("scenario", scenario_parse),
];

/// Small limits, so the fuzzer reaches every "over the limit" branch.
pub const SMALL_LIMITS: Limits = Limits {
    max_message_bytes: 256,
    max_key_bytes: 32,
    max_kind_bytes: 24,
    max_config_bytes: 32,
};

/// An envelope from a peer: decoded under the default and under
/// [`SMALL_LIMITS`]; an accepted one respects the limits and re-encodes to
/// exactly the input (the wire form is canonical).
///
/// # Panics
/// When a property is broken.
pub fn envelope_decode(data: &[u8]) {
    let _ = envelope::peek_header(data);
    for limits in [Limits::default(), SMALL_LIMITS] {
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
    if Envelope::decode(data, &SMALL_LIMITS).is_ok() {
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

/// Decodes `bytes` as a `J` payload; an accepted value re-encodes to bytes
/// that decode to the same value, and its join with itself is itself
/// (idempotence, which the fast path relies on).
fn payload_as<J: Join + PartialEq>(bytes: &[u8]) -> Option<J> {
    let v: J = envelope::decode_payload(J::KIND, bytes).ok()?;
    let again = compiler_collectives_core::protocol::encode_payload(&v)
        .expect("an accepted value re-encodes");
    let back: J = envelope::decode_payload(J::KIND, &again).expect("a re-encoded value decodes");
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
/// state, any/all vote, max, min); the rest is split at the second byte into
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
    match kind % 5 {
        0 => pair_as::<FrameState>(a, b),
        1 => pair_as::<AnyVote>(a, b),
        2 => pair_as::<AllVote>(a, b),
        3 => pair_as::<Max>(a, b),
        _ => pair_as::<Min>(a, b),
    }
}

/// A scenario file (parsed and validated only, not run), under limits
/// small enough that an accepted file is cheap.
///
/// # Panics
/// When a property is broken.
pub fn scenario_parse(data: &[u8]) {
    let limits = ScenarioLimits {
        max_world_size: 16,
        max_ndim: 8,
        max_steps: 64,
        max_file_bytes: 1 << 16,
    };
    if let Ok(s) = Scenario::from_slice(data, "<fuzz>", &limits) {
        assert!(s.world_size >= 1 && s.world_size <= limits.max_world_size);
    }
}
