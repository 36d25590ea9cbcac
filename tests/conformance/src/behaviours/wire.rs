//! A peer whose bytes are wrong: a later wire version (on the fast path and
//! off it) and corrupt payloads are named, on every rank that reads them.

use super::{expect_groups, state};
use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::decisions::shapes::FrameState;
use compiler_collectives_core::{protocol::envelope, Channel, ChannelOptions, Error};
use std::sync::Arc;

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    VERSION_MISMATCH_NAMED,
    CORRUPT_PAYLOAD_NAMED,
    VERSION_MISMATCH_FULL_PATH,
    CORRUPT_PAYLOAD_EVERY_RANK,
];

behaviour!(VERSION_MISMATCH_NAMED = version_mismatch_named, min_world: 2, timed: false, needs: []);
/// The last rank plays a peer of a later wire version: it sends a first
/// round of the slot's size by hand, magic and version 99 in front (the
/// layout every version keeps). Every other rank gets the
/// version-mismatch error naming it; then every rank all_gathers what it
/// concluded, and the v99 rank checks what its peers reported: each a
/// `version_mismatch` with this build's ranks and itself as v99.
fn version_mismatch_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let others: Vec<u32> = (0..odd).collect();
    let ours = format!("v{}", envelope::WIRE_VERSION);
    let want = [(&others[..], ours.as_str()), (&[odd][..], "v99")];
    let report = if ctx.rank() == odd {
        let mut msg = vec![0u8; envelope::DEFAULT_SLOT_BYTES];
        msg[..4].copy_from_slice(&envelope::MAGIC);
        msg[4..6].copy_from_slice(&99u16.to_le_bytes());
        ctx.transport
            .all_gather_fixed(&msg, ctx.deadline())
            .map_err(|e| e.to_string())?;
        String::new()
    } else {
        let mut ch = ctx.channel(ctx.timeout)?;
        let err = ch
            .exchange("f", &state(4))
            .err()
            .ok_or("a v99 peer was accepted")?;
        ensure(matches!(err, Error::VersionMismatch { .. }), || {
            format!("{err}")
        })?;
        expect_groups(&err, &want)?;
        report_of(&err)
    };
    let reports = ctx
        .transport
        .all_gather(report.as_bytes(), 1 << 16, ctx.deadline())
        .map_err(|e| format!("gathering the reports: {e}"))?;
    if ctx.rank() != odd {
        return Ok(());
    }
    let expected = format!("version_mismatch {others:?}={ours}; [{odd}]=v99");
    for (r, text) in (0u32..).zip(&reports[..odd as usize]) {
        let text = String::from_utf8_lossy(text);
        ensure(text == expected, || {
            format!("rank {r} reported {text:?}, want {expected:?}")
        })?;
    }
    Ok(())
}

/// An error's kind and rank groups, as one line a peer can compare:
/// `version_mismatch [0, 1]=v2; [2]=v99`.
fn report_of(err: &Error) -> String {
    let groups = match err {
        Error::Desync { groups }
        | Error::VersionMismatch { groups }
        | Error::Disagreement { groups, .. } => groups.as_slice(),
        _ => &[],
    };
    let groups: Vec<String> = groups
        .iter()
        .map(|g| format!("{:?}={}", g.ranks, g.what))
        .collect();
    format!("{} {}", err.kind(), groups.join("; "))
}

behaviour!(CORRUPT_PAYLOAD_NAMED = corrupt_payload_named, min_world: 2, timed: false, needs: []);
/// The last rank sends a valid header with a garbage payload.
fn corrupt_payload_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    if ctx.rank() == odd {
        let env = envelope::Envelope {
            version: envelope::WIRE_VERSION,
            seq: 0,
            kind: "shape.frame_state".into(),
            key: "f".into(),
            config: String::new(),
            payload: vec![0xff; 9],
        };
        let bytes = env
            .encode(&envelope::Limits::default())
            .map_err(|e| e.to_string())?;
        // The flat exchange's one round: this envelope inline in its slot.
        let mut slot = vec![0u8; envelope::DEFAULT_SLOT_BYTES];
        let len = u32::try_from(bytes.len()).map_err(|e| e.to_string())?;
        let limit = envelope::Limits::default().max_message_bytes as u64;
        envelope::write_slot_header(&mut slot, 0, &envelope::digest(&bytes), len, true, limit);
        slot[envelope::SLOT_HEADER_LEN..][..bytes.len()].copy_from_slice(&bytes);
        ctx.transport
            .all_gather_fixed(&slot, ctx.deadline())
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut ch = ctx.channel(ctx.timeout)?;
    match ch.exchange("f", &state(4)) {
        Err(Error::Decode { rank: Some(r), .. }) if r == odd => Ok(()),
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}

behaviour!(
    VERSION_MISMATCH_FULL_PATH = version_mismatch_full_path,
    min_world: 2, timed: false, needs: []
);
/// As [`version_mismatch_named`] with the fast path off: the last rank sends
/// a whole envelope of version 99 (the header layout every version keeps,
/// then whatever that version carries); the others read its version from
/// the header and report the mismatch naming it.
fn version_mismatch_full_path(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    if ctx.rank() == odd {
        let mut bytes = envelope::Envelope {
            version: envelope::WIRE_VERSION,
            seq: 0,
            kind: "shape.frame_state".into(),
            key: "f".into(),
            config: String::new(),
            payload: vec![0xab; 40],
        }
        .encode(&envelope::Limits::default())
        .map_err(|e| e.to_string())?;
        bytes[4..6].copy_from_slice(&99u16.to_le_bytes());
        ctx.transport
            .all_gather(&bytes, 1 << 20, ctx.deadline())
            .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let mut ch = Channel::with_options(
        Arc::clone(&ctx.transport),
        ChannelOptions::default()
            .with_timeout(ctx.timeout)
            .with_fast_path(false),
    )
    .map_err(|e| e.to_string())?;
    let err = ch
        .exchange("f", &state(4))
        .err()
        .ok_or("a v99 envelope was accepted")?;
    let others: Vec<u32> = (0..odd).collect();
    ensure(matches!(err, Error::VersionMismatch { .. }), || {
        format!("{err}")
    })?;
    let ours = format!("v{}", envelope::WIRE_VERSION);
    expect_groups(&err, &[(&others, ours.as_str()), (&[odd], "v99")])
}

/// A frame state whose encoder is broken: it sends bytes that no
/// [`FrameState`] decodes (what a rank with a corrupting encoder, or memory
/// corruption before sending, would put on the wire), under the same kind.
/// It decodes what others send as a plain frame state.
#[derive(Clone, Debug)]
struct GarbledFrameState(FrameState);

impl serde::Serialize for GarbledFrameState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&[0xff; 9])
    }
}

impl<'de> serde::Deserialize<'de> for GarbledFrameState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        FrameState::deserialize(d).map(GarbledFrameState)
    }
}

impl compiler_collectives_core::Join for GarbledFrameState {
    const KIND: &'static str = <FrameState as compiler_collectives_core::Join>::KIND;
    fn join(&mut self, other: &Self) {
        compiler_collectives_core::Join::join(&mut self.0, &other.0);
    }
}

behaviour!(
    CORRUPT_PAYLOAD_EVERY_RANK = corrupt_payload_every_rank,
    min_world: 2, timed: false, needs: []
);
/// The last rank exchanges through a real channel with a broken encoder:
/// **every** rank, the sender included, gets a decode error naming it (each
/// rank decodes every rank's payload from the gathered bytes, so all take
/// the same branch). Ranks 1, 3, … join in place
/// (`Channel::exchange_in_place`), the others with `exchange`: the same
/// error either way, and a state joined in place is left as it was.
fn corrupt_payload_every_rank(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    let in_place = ctx.rank() % 2 == 1;
    let none = compiler_collectives_core::ExchangeOptions::default();
    let res = if ctx.rank() == odd {
        if in_place {
            let mut garbled = GarbledFrameState(state(4));
            ch.exchange_in_place("f", &mut garbled, &none).map(|_| ())
        } else {
            ch.exchange("f", &GarbledFrameState(state(4))).map(|_| ())
        }
    } else if in_place {
        let mut mine = state(4);
        let res = ch.exchange_in_place("f", &mut mine, &none).map(|_| ());
        ensure(mine == state(4), || {
            "the state joined in place changed on an error".into()
        })?;
        res
    } else {
        ch.exchange("f", &state(4)).map(|_| ())
    };
    match res {
        Err(e @ Error::Decode { rank: Some(r), .. }) if r == odd => {
            let text = e.to_string();
            ensure(text.contains(&format!("rank {odd}")), || text.clone())?;
            let four = state(4);
            let next = ch.exchange("f", &four);
            ensure(matches!(next, Err(Error::ChannelUnusable { .. })), || {
                format!("after a decode error: {next:?}")
            })
        }
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}
