//! Broadcast from every root, repeated barriers, send/recv with tags kept
//! apart, and a message past a peer's limit: what a transport moves
//! between ranks besides gathers.

use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::Error;

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    BROADCAST_EVERY_ROOT,
    BARRIER_REPEATED,
    SEND_RECV_RING,
    OVERSIZED_MESSAGE_NAMED,
];

behaviour!(BROADCAST_EVERY_ROOT = broadcast_every_root, min_world: 1, timed: false, needs: []);
fn broadcast_every_root(ctx: &Ctx) -> Result<(), String> {
    for root in 0..ctx.world() {
        let data = format!("from root {root}").into_bytes();
        let got = ctx
            .transport
            .broadcast(&data, root, 1 << 10, ctx.deadline())
            .map_err(|e| e.to_string())?;
        ensure(got == data, || {
            format!("root {root}: got {:?}", String::from_utf8_lossy(&got))
        })?;
    }
    Ok(())
}

behaviour!(BARRIER_REPEATED = barrier_repeated, min_world: 1, timed: false, needs: []);
fn barrier_repeated(ctx: &Ctx) -> Result<(), String> {
    for _ in 0..5 {
        ctx.transport
            .barrier(ctx.deadline())
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

behaviour!(SEND_RECV_RING = send_recv_ring, min_world: 2, timed: false, needs: []);
/// Point-to-point around the ring, with tags kept apart: each rank first
/// sends its next peer one message on tag 9, then three on tag 7; the
/// receiver takes the three tag-7 messages first, in order (a transport
/// that ignored tags would hand it the tag-9 message), then the tag-9 one.
/// Sending to oneself is an invalid argument.
fn send_recv_ring(ctx: &Ctx) -> Result<(), String> {
    let (me, n) = (ctx.rank(), ctx.world());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    let other = format!("{me}->{next} on tag 9");
    ctx.transport
        .send(next, 9, other.as_bytes(), ctx.deadline())
        .map_err(|e| format!("send on tag 9: {e}"))?;
    for i in 0u32..3 {
        let msg = format!("{me}->{next}#{i}");
        ctx.transport
            .send(next, 7, msg.as_bytes(), ctx.deadline())
            .map_err(|e| e.to_string())?;
    }
    let expect = |tag: u32, want: String| -> Result<(), String> {
        let got = ctx
            .transport
            .recv(prev, tag, 1 << 10, ctx.deadline())
            .map_err(|e| format!("receive on tag {tag}: {e}"))?;
        ensure(got == want.as_bytes(), || {
            format!(
                "receive on tag {tag} got {:?}, want {want}",
                String::from_utf8_lossy(&got)
            )
        })
    };
    for i in 0u32..3 {
        expect(7, format!("{prev}->{me}#{i}"))?;
    }
    expect(9, format!("{prev}->{me} on tag 9"))?;
    ctx.transport
        .barrier(ctx.deadline())
        .map_err(|e| e.to_string())?;
    let invalid = ctx.transport.send(me, 7, b"self", ctx.deadline());
    ensure(matches!(invalid, Err(Error::InvalidArgument(_))), || {
        format!("sending to oneself: {invalid:?}")
    })
}

behaviour!(
    OVERSIZED_MESSAGE_NAMED = oversized_message_named,
    min_world: 2, timed: false, needs: []
);
/// The last rank sends 64 bytes where its peers' limit is 32 (its own is
/// 64): every peer gets a decode error naming it. The sender itself either
/// completes with every buffer right (an engine that delivered its bytes,
/// such as threads of one process) or fails with a typed error (a peer
/// refused the bytes) — never a wrong buffer or a hang; then all ranks
/// still share one barrier on the same transport's fixed-size path.
fn oversized_message_named(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let big = ctx.rank() == odd;
    let data = if big { vec![1u8; 64] } else { vec![0u8; 8] };
    let limit = if big { 64 } else { 32 };
    let res = ctx.transport.all_gather(&data, limit, ctx.deadline());
    if big {
        return match res {
            Ok(bufs) => {
                let want = |r: u32| {
                    if r == odd {
                        vec![1u8; 64]
                    } else {
                        vec![0u8; 8]
                    }
                };
                ensure(
                    bufs.len() == ctx.world() as usize
                        && (0u32..).zip(&bufs).all(|(r, b)| *b == want(r)),
                    || format!("the sender got wrong buffers: {bufs:?}"),
                )
            }
            Err(Error::Decode { .. } | Error::PeerLost { .. } | Error::Timeout { .. }) => Ok(()),
            Err(e) => Err(format!("the sender got an error of kind {}: {e}", e.kind())),
        };
    }
    match res {
        Err(Error::Decode { rank: Some(r), .. }) if r == odd => Ok(()),
        other => Err(format!(
            "expected a decode error naming rank {odd}, got {other:?}"
        )),
    }
}
