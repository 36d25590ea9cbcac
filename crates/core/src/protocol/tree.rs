//! The hierarchical exchange: a binomial tree over the transport's
//! point-to-point messages, for large worlds.
//!
//! The flat exchange gathers every rank's envelope on every rank, so each
//! rank receives `(N − 1) · payload` bytes. Above
//! [`ChannelOptions::hierarchical_from`](crate::ChannelOptions::hierarchical_from)
//! ranks (default [`DEFAULT_HIERARCHICAL_FROM`]) the channel uses this module
//! instead:
//!
//! 1. **fast path** (when on): a 33-byte message (the 32-byte digest message
//!    plus an "all same" flag) travels up the tree to rank 0, which sends one
//!    byte back down: every envelope identical or not. If identical, the
//!    result is this rank's own value, as in the flat fast path.
//! 2. **summary round**: each rank sends its parent a *summary* of its
//!    subtree — the join of the subtree's values, plus which ranks were at
//!    which position (sequence number, compile key, decision kind), held which
//!    configuration and spoke which wire version, as lists of rank ranges (in
//!    a binomial tree a subtree is one range, so the common case is one range
//!    per field). Rank 0 sends the summary of the whole world back down the
//!    tree; every rank forwards those exact bytes to its children and reads
//!    the same verdict from them.
//!
//! Tree: the parent of rank `r > 0` is `r & (r − 1)`; its children are
//! `r + 2^k` for `2^k` below the lowest set bit of `r` (every power of two
//! for rank 0), below `N`. Depth ⌈log₂ N⌉. A rank receives at most
//! ⌈log₂ N⌉ summaries from children and one from its parent, each about one
//! payload: O(payload · log N) bytes instead of O(payload · N).
//!
//! The verdict is the flat exchange's, checked in the same order: wire
//! versions ([`Error::VersionMismatch`]), undecodable messages
//! ([`Error::Decode`] naming the child whose message failed — the child, not
//! the rank below it that caused it), positions ([`Error::Desync`], groups
//! and text identical to the flat exchange), configuration
//! ([`Error::Disagreement`], identical), then the join. A missing rank gives
//! [`Error::Timeout`] naming the tree neighbour that did not send (its
//! subtree is behind it), on that neighbour's side of the tree.
//!
//! The result carries no per-rank values (`Gathered::per_rank` is `None`).

use crate::error::{DecodeError, Error, Result};
use crate::protocol::checks::{add, Census};
use crate::protocol::envelope::{self, Envelope, Limits, DIGEST_MSG_LEN, WIRE_VERSION};
use crate::protocol::join::{Join, Sealed};
use crate::protocol::Rounds;
use serde::{Deserialize, Serialize};

/// Default smallest world size that uses the tree: 64 ranks. Below it the
/// flat exchange is faster on the engines measured (`ccol bench`).
pub const DEFAULT_HIERARCHICAL_FROM: u32 = 64;

/// Decision kind of tree summary messages.
const TREE_KIND: &str = "ccol.tree_summary";
/// Message tags on the transport's point-to-point channel.
const TAG_DIGEST_UP: u32 = 0x4343_5401;
const TAG_DIGEST_DOWN: u32 = 0x4343_5402;
const TAG_SUMMARY_UP: u32 = 0x4343_5403;
const TAG_SUMMARY_DOWN: u32 = 0x4343_5404;

/// The parent of `rank` in the binomial tree rooted at 0 (`None` for 0).
pub fn parent(rank: u32) -> Option<u32> {
    (rank != 0).then(|| rank & (rank - 1))
}

/// The children of `rank` in a binomial tree of `world_size` ranks, smallest
/// subtree first.
pub fn children(rank: u32, world_size: u32) -> Vec<u32> {
    let limit = if rank == 0 {
        u64::from(world_size)
    } else {
        u64::from(rank & rank.wrapping_neg())
    };
    let mut out = Vec::new();
    let mut step = 1u64;
    while step < limit {
        let child = u64::from(rank) + step;
        if child >= u64::from(world_size) {
            break;
        }
        out.push(u32::try_from(child).unwrap_or(u32::MAX));
        step <<= 1;
    }
    out
}

/// The ranks `[start, end)` of `rank`'s subtree.
fn subtree(rank: u32, world_size: u32) -> (u32, u32) {
    if rank == 0 {
        return (0, world_size);
    }
    let span = u64::from(rank & rank.wrapping_neg());
    let end = (u64::from(rank) + span).min(u64::from(world_size));
    (rank, u32::try_from(end).unwrap_or(world_size))
}

/// What a subtree reports about itself: the census of its ranks, and the
/// lowest child rank whose message could not be decoded, with why.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Meta {
    census: Census,
    failure: Option<(u32, String)>,
}

impl Meta {
    fn fail(&mut self, rank: u32, why: String) {
        if self.failure.as_ref().is_none_or(|(r, _)| rank < *r) {
            self.failure = Some((rank, why));
        }
    }

    /// Whether the report stays within the sender's subtree `span`.
    fn valid(&self, span: (u32, u32)) -> bool {
        self.census.within(span)
            && self
                .failure
                .as_ref()
                .is_none_or(|(r, _)| *r >= span.0 && *r < span.1)
    }

    fn absorb(&mut self, other: Meta) {
        self.census.absorb(other.census);
        if let Some((rank, why)) = other.failure {
            self.fail(rank, why);
        }
    }
}

/// A summary message: the envelope format, kind [`TREE_KIND`], payload =
/// postcard of (meta, postcard of the subtree's join if any).
fn encode_summary<J: Join>(
    meta: &Meta,
    merged: Option<&J>,
    seq: u64,
    limits: &Limits,
) -> Result<Vec<u8>> {
    let value = merged
        .map(crate::protocol::join::encode_payload)
        .transpose()?;
    let payload = postcard::to_allocvec(&(meta, value))
        .map_err(|e| Error::InvalidArgument(format!("cannot encode a tree summary: {e}")))?;
    Envelope {
        version: WIRE_VERSION,
        seq,
        kind: TREE_KIND.to_owned(),
        key: String::new(),
        config: String::new(),
        payload,
    }
    .encode(limits)
    .map_err(|e| Error::InvalidArgument(format!("this rank's tree summary: {e}")))
}

/// Decodes a summary message from `from`, whose ranks are `span`. A message
/// of another wire version is reported as that version for the whole span.
fn decode_summary<J: Join>(
    bytes: &[u8],
    from: u32,
    span: (u32, u32),
    limits: &Limits,
) -> (Meta, Option<J>) {
    let mut meta = Meta::default();
    let (version, _) = match envelope::peek_header(bytes) {
        Ok(h) => h,
        Err(e) => {
            meta.fail(from, e.to_string());
            return (meta, None);
        }
    };
    if version != WIRE_VERSION {
        add(&mut meta.census.versions, version, &[span]);
        return (meta, None);
    }
    let env = match Envelope::decode(bytes, limits) {
        Ok(env) if env.kind == TREE_KIND => env,
        Ok(env) => {
            meta.fail(
                from,
                format!("message kind '{}', expected '{TREE_KIND}'", env.kind),
            );
            return (meta, None);
        }
        Err(e) => {
            meta.fail(from, e.to_string());
            return (meta, None);
        }
    };
    let (theirs, value): (Meta, Option<Vec<u8>>) =
        match envelope::decode_postcard(TREE_KIND, &env.payload) {
            Ok(x) => x,
            Err(e) => {
                meta.fail(from, e.to_string());
                return (meta, None);
            }
        };
    if !theirs.valid(span) {
        meta.fail(
            from,
            format!(
                "rank ranges outside or beyond its ranks {}..{}",
                span.0, span.1
            ),
        );
        return (meta, None);
    }
    // A subtree at another decision kind is a desync; its value is not ours to decode.
    let same_kind = theirs.census.all_of_kind(J::KIND);
    let merged = match value {
        Some(v) if same_kind => match J::read_payload(&v, Sealed(())) {
            Ok(j) => Some(j),
            Err(e) => {
                meta.fail(from, e.to_string());
                None
            }
        },
        _ => None,
    };
    meta.absorb(theirs);
    (meta, merged)
}

/// Turns the whole world's summary into the exchange's result, the same on
/// every rank: the census's verdict, then the joined value.
fn verdict<J: Join>(meta: &Meta, merged: Option<J>) -> Result<J> {
    let failure = meta.failure.as_ref().map(|(rank, why)| Error::Decode {
        rank: Some(*rank),
        reason: DecodeError::Invalid {
            field: "tree summary",
            detail: why.clone(),
        },
    });
    meta.census.verdict(failure)?;
    merged.ok_or_else(|| Error::Decode {
        rank: Some(0),
        reason: DecodeError::Invalid {
            field: "tree summary",
            detail: "the world's summary holds no value".into(),
        },
    })
}

/// One hierarchical exchange (see the module docs). Returns the join of every
/// rank's value and whether the fast path applied.
///
/// Cost: with the fast path, 2 · depth point-to-point hops of 33 and 1
/// bytes; then (unless identical) 2 · depth hops of one summary each.
///
/// # Errors
/// As [`crate::Channel::exchange`]; timeouts name the tree neighbour that
/// did not send.
pub(crate) fn exchange<J: Join>(
    r: &mut Rounds<'_>,
    env: &Envelope,
    encoded: &[u8],
    local: &J,
) -> Result<(J, bool)> {
    let (t, limits, deadline) = (r.transport, r.limits, r.deadline);
    let traffic = &mut r.traffic;
    let (me, n) = (t.rank(), t.world_size());
    let kids = children(me, n);
    let up = parent(me);
    if r.fast_path {
        let mine = envelope::encode_digest_msg(WIRE_VERSION, env.seq, &envelope::digest(encoded));
        let mut same = true;
        for &c in &kids {
            let msg = t.recv(c, TAG_DIGEST_UP, DIGEST_MSG_LEN + 1, deadline)?;
            traffic.add(0, msg.len());
            same &= msg.len() == DIGEST_MSG_LEN + 1
                && msg[DIGEST_MSG_LEN] == 1
                && msg[..DIGEST_MSG_LEN] == mine;
        }
        let all_same = match up {
            Some(p) => {
                let mut msg = mine.to_vec();
                msg.push(u8::from(same));
                t.send(p, TAG_DIGEST_UP, &msg, deadline)?;
                traffic.add(msg.len(), 1);
                t.recv(p, TAG_DIGEST_DOWN, 1, deadline)? == [1]
            }
            None => same,
        };
        for &c in &kids {
            t.send(c, TAG_DIGEST_DOWN, &[u8::from(all_same)], deadline)?;
            traffic.add(1, 0);
        }
        if all_same {
            return Ok((local.clone(), true));
        }
    }
    let mut meta = Meta::default();
    meta.census.version(me, WIRE_VERSION);
    meta.census.envelope(me, env);
    let mut merged = Some(local.clone());
    for &c in &kids {
        let bytes = t.recv(c, TAG_SUMMARY_UP, limits.max_message_bytes, deadline)?;
        traffic.add(0, bytes.len());
        let (theirs, value) = decode_summary::<J>(&bytes, c, subtree(c, n), limits);
        meta.absorb(theirs);
        if let (Some(acc), Some(v)) = (merged.as_mut(), value.as_ref()) {
            acc.join(v);
        }
    }
    let world = match up {
        Some(p) => {
            let summary = encode_summary(&meta, merged.as_ref(), env.seq, limits)?;
            t.send(p, TAG_SUMMARY_UP, &summary, deadline)?;
            let world = t.recv(p, TAG_SUMMARY_DOWN, limits.max_message_bytes, deadline)?;
            traffic.add(summary.len(), world.len());
            world
        }
        None => encode_summary(&meta, merged.as_ref(), env.seq, limits)?,
    };
    for &c in &kids {
        t.send(c, TAG_SUMMARY_DOWN, &world, deadline)?;
        traffic.add(world.len(), 0);
    }
    let from = up.unwrap_or(me);
    let (meta, merged) = decode_summary::<J>(&world, from, (0, n), limits);
    verdict(&meta, merged).map(|j| (j, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_shape() {
        assert_eq!(children(0, 8), vec![1, 2, 4]);
        assert_eq!(children(4, 8), vec![5, 6]);
        assert_eq!(children(4, 6), vec![5]);
        assert_eq!(children(3, 8), Vec::<u32>::new());
        assert_eq!(children(0, 1), Vec::<u32>::new());
        assert_eq!(parent(6), Some(4));
        assert_eq!(parent(0), None);
        assert_eq!(subtree(4, 6), (4, 6));
        assert_eq!(subtree(0, 5), (0, 5));
        // Every rank but 0 is the child of its parent, once.
        for n in [1u32, 2, 3, 5, 7, 64, 100] {
            let mut seen = vec![0u32; n as usize];
            for r in 0..n {
                for c in children(r, n) {
                    assert_eq!(parent(c), Some(r));
                    seen[c as usize] += 1;
                }
            }
            assert!(seen.iter().skip(1).all(|&k| k == 1), "world {n}");
        }
    }

    /// A child that claims ranks outside its subtree, or more ranks than it
    /// has (to make every rank expand huge groups), is a decode failure
    /// naming it.
    #[test]
    fn hostile_summaries_are_refused() {
        use crate::decisions::shapes::FrameState;
        let limits = Limits::default();
        let pos = |k: &str| crate::protocol::checks::Position {
            seq: 0,
            key: k.into(),
            kind: FrameState::KIND.into(),
        };
        let mut outside = Meta::default();
        add(&mut outside.census.positions, pos("a"), &[(0, 3)]);
        let mut repeated = Meta::default();
        for k in 0..100 {
            add(
                &mut repeated.census.positions,
                pos(&k.to_string()),
                &[(4, 6)],
            );
        }
        for meta in [outside, repeated] {
            let bytes = encode_summary::<FrameState>(&meta, None, 0, &limits).unwrap();
            let (got, value) = decode_summary::<FrameState>(&bytes, 4, (4, 6), &limits);
            assert!(value.is_none());
            let (rank, why) = got.failure.expect("refused");
            assert_eq!(rank, 4);
            assert!(why.contains("4..6"), "{why}");
            assert!(got.census.positions.is_empty());
        }
        let err = verdict::<FrameState>(
            &{
                let mut m = Meta::default();
                add(&mut m.census.versions, WIRE_VERSION, &[(0, 6)]);
                m.fail(4, "bad".into());
                m
            },
            None,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Decode { rank: Some(4), .. }), "{err}");
    }

    /// What a rank sends as a frame state: a state, or payload bytes of the
    /// frame state's kind that its writer would never write (a broken or
    /// hostile peer). Only this crate can override the wire hooks, so the
    /// test lives here.
    #[derive(Clone, Debug)]
    enum Sent {
        State(crate::decisions::shapes::FrameState),
        Raw(Vec<u8>),
    }

    impl Serialize for Sent {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            match self {
                Sent::State(f) => f.serialize(s),
                Sent::Raw(bytes) => s.serialize_bytes(bytes),
            }
        }
    }

    impl<'de> Deserialize<'de> for Sent {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            crate::decisions::shapes::FrameState::deserialize(d).map(Sent::State)
        }
    }

    impl Join for Sent {
        const KIND: &'static str = crate::decisions::shapes::FrameState::KIND;

        fn join(&mut self, other: &Self) {
            if let (Sent::State(a), Sent::State(b)) = (self, other) {
                a.join(b);
            }
        }

        fn read_payload(payload: &[u8], s: Sealed) -> std::result::Result<Self, DecodeError> {
            crate::decisions::shapes::FrameState::read_payload(payload, s).map(Sent::State)
        }

        fn write_payload(&self, out: &mut Vec<u8>, s: Sealed) -> std::result::Result<(), String> {
            match self {
                Sent::State(f) => f.write_payload(out, s),
                Sent::Raw(bytes) => {
                    out.extend_from_slice(bytes);
                    Ok(())
                }
            }
        }
    }

    /// A payload that does not read, from one rank of 64: the tree exchange
    /// fails on every rank with the frame state's own reason, as the flat one
    /// does (found by a new user's attack: the tree said postcard's "Serde
    /// Deserialization Error" where the flat exchange named the source).
    #[test]
    fn the_tree_reports_a_bad_payload_as_the_flat_exchange_does() {
        use crate::decisions::shapes::{FrameState, Observation};
        use crate::{Channel, ChannelOptions, ExchangeOptions, InProcessGroup};
        use std::sync::Arc;
        let one = |name: &str| {
            let mut s = FrameState::new();
            s.record(name, &Observation::tensor([4, 2]));
            crate::protocol::encode_payload(&s).unwrap()
        };
        // Two entries, "b" before "a"; and one entry cut short.
        let (a, b) = (one("a"), one("b"));
        assert_eq!((a[0], b[0]), (1, 1), "one entry: the count is one byte");
        let mut unordered = vec![2u8];
        unordered.extend_from_slice(&b[1..]);
        unordered.extend_from_slice(&a[1..]);
        let short = a[..a.len() - 1].to_vec();
        // Rank r's state: 20 tensors, a third with dim 0 depending on r.
        let state = |r: u64| {
            let mut s = FrameState::new();
            for i in 0..20 {
                let d0 = if i % 3 == 0 { 8 + r } else { 8 };
                s.record(&format!("s{i}"), &Observation::tensor([d0, 16, 4]));
            }
            s
        };
        for (bytes, reason) in [
            (unordered, "names must be strictly increasing"),
            (short, "the payload ends early"),
        ] {
            for (tree, in_place) in [(false, false), (true, false), (true, true)] {
                let opts = ChannelOptions::default()
                    .with_timeout(std::time::Duration::from_secs(60))
                    .with_hierarchical_from(if tree { 2 } else { u32::MAX });
                let ranks = InProcessGroup::create(64).unwrap();
                let handles: Vec<_> = (0..64u64)
                    .zip(ranks)
                    .map(|(r, t)| {
                        let (opts, bytes) = (opts.clone(), bytes.clone());
                        let mut value = if r == 37 {
                            Sent::Raw(bytes)
                        } else {
                            Sent::State(state(r))
                        };
                        std::thread::Builder::new()
                            .stack_size(256 << 10)
                            .spawn(move || {
                                let mut ch = Channel::with_options(Arc::new(t), opts).unwrap();
                                let none = ExchangeOptions::default();
                                let res = if in_place {
                                    ch.exchange_in_place("f", &mut value, &none).map(|_| ())
                                } else {
                                    ch.exchange_with("f", &value, &none).map(|_| ())
                                };
                                res.map_err(|e| e.to_string())
                            })
                            .unwrap()
                    })
                    .collect();
                let texts: Vec<String> = handles
                    .into_iter()
                    .map(|h| h.join().unwrap().expect_err("a bad payload fails"))
                    .collect();
                for (rank, t) in texts.iter().enumerate() {
                    assert!(
                        t.contains(reason),
                        "tree {tree}, in place {in_place}, rank {rank}: {t}"
                    );
                }
                assert!(
                    texts.iter().all(|t| *t == texts[0]),
                    "tree {tree}: ranks disagree: {texts:?}"
                );
            }
        }
    }
}
