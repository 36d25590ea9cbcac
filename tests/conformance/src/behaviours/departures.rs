//! Ranks that leave: an abort and a shutdown are told apart, peers fail
//! fast and name every rank that left (docs/failures.md), a receive from a
//! closed sender fails, and a transport this rank shut down refuses at once.

use crate::{ensure, Behaviour, Ctx};
use compiler_collectives_core::{decisions::votes::AnyVote, Deadline, Error, PeerLoss};
use std::time::{Duration, Instant};

/// This area's behaviours, in [`crate::BEHAVIOURS`]' order.
pub(super) const BEHAVIOURS: &[Behaviour] = &[
    ABORT_IS_NOT_A_SHUTDOWN,
    SHUTDOWN_FAILS_PEERS_FAST,
    TWO_RANKS_LEAVE_AT_DIFFERENT_TIMES,
    LATE_RANK_AFTER_THE_OTHERS_CLOSED,
    RECV_AFTER_THE_SENDER_CLOSED,
    USE_AFTER_SHUTDOWN_IS_UNUSABLE,
];

behaviour!(
    ABORT_IS_NOT_A_SHUTDOWN = abort_is_not_a_shutdown,
    min_world: 2, timed: true, needs: [TellsPeersItLeft]
);
/// The last rank aborts its channel (as after an error of its own): the
/// others fail at once naming it, with the reason `Aborted`, not `Shutdown`.
fn abort_is_not_a_shutdown(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    if ctx.rank() == odd {
        ch.abort();
        return Ok(());
    }
    let start = Instant::now();
    match ch.exchange("f", &AnyVote(false)) {
        Err(Error::PeerLost { ranks, reason, .. }) => {
            ensure(ranks == vec![odd], || {
                format!("lost {ranks:?}, want [{odd}]")
            })?;
            ensure(reason == PeerLoss::Aborted, || format!("reason {reason:?}"))?;
            ensure(start.elapsed() < ctx.margin * 2, || {
                format!("took {:?}", start.elapsed())
            })
        }
        other => Err(format!(
            "expected a lost peer naming rank {odd}, got {other:?}"
        )),
    }
}

behaviour!(
    SHUTDOWN_FAILS_PEERS_FAST = shutdown_fails_peers_fast,
    min_world: 2, timed: true, needs: [TellsPeersItLeft]
);
/// The last rank shuts its channel down instead of exchanging: the others
/// fail at once (long before their 20 s deadline), naming it.
fn shutdown_fails_peers_fast(ctx: &Ctx) -> Result<(), String> {
    let odd = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.timeout)?;
    if ctx.rank() == odd {
        ch.shutdown().map_err(|e| e.to_string())?;
        return Ok(());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    match res {
        Err(Error::PeerLost { ranks, reason, .. }) => {
            ensure(ranks == vec![odd], || {
                format!("lost {ranks:?}, want [{odd}]")
            })?;
            ensure(reason == PeerLoss::Shutdown, || {
                format!("reason {reason:?}")
            })?;
            ensure(took < ctx.margin * 2, || format!("took {took:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming rank {odd}, got {other:?}"
        )),
    }
}

behaviour!(
    TWO_RANKS_LEAVE_AT_DIFFERENT_TIMES = two_ranks_leave_at_different_times,
    min_world: 3, timed: true, needs: []
);
/// The last rank shuts down at once, the one before it 400 ms later; the
/// others wait in an exchange. Their error names both, as shut down — the
/// exact set not in the exchange, not the first to go (docs/failures.md) — by the
/// deadline + margin, and soon after the second leaves on a backend that
/// tells peers it left.
fn two_ranks_leave_at_different_times(ctx: &Ctx) -> Result<(), String> {
    let (first, second) = (ctx.world() - 1, ctx.world() - 2);
    let later = Duration::from_millis(400);
    let mut ch = ctx.channel(ctx.short_timeout)?;
    if ctx.rank() == first {
        return ch.shutdown().map_err(|e| e.to_string());
    }
    if ctx.rank() == second {
        std::thread::sleep(later);
        return ch.shutdown().map_err(|e| e.to_string());
    }
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    let want = vec![second, first];
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.missing_ranks() == want.as_slice(), || {
                format!("named {:?}, want {want:?}: {e}", e.missing_ranks())
            })?;
            let how = [(second, PeerLoss::Shutdown), (first, PeerLoss::Shutdown)];
            ensure(e.departures() == how, || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = if ctx.transport.capabilities().tells_peers_it_left {
                later + ctx.margin
            } else {
                ctx.short_timeout + ctx.margin
            };
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming ranks {want:?}, got {other:?}"
        )),
    }
}

behaviour!(
    LATE_RANK_AFTER_THE_OTHERS_CLOSED = late_rank_after_the_others_closed,
    min_world: 2, timed: true, needs: []
);
/// Every rank but the last shuts its channel down and closes its transport
/// (its connections go); the last enters an exchange only a second later,
/// long after any notice a leaving rank waits to deliver. Its error still
/// names every other rank as shut down — not as disconnected, and not only
/// the first whose connection it found closed: the departures outlive the
/// connections (docs/failures.md, Exact missing-rank reports) — within the
/// deadline + margin.
fn late_rank_after_the_others_closed(ctx: &Ctx) -> Result<(), String> {
    let late = ctx.world() - 1;
    let mut ch = ctx.channel(ctx.short_timeout)?;
    // One exchange with everyone first, so that the connections are in use.
    ch.exchange("warm", &AnyVote(false))
        .map_err(|e| format!("first exchange: {e}"))?;
    if ctx.rank() != late {
        return ch.shutdown().map_err(|e| e.to_string());
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let res = ch.exchange("f", &AnyVote(false));
    let took = start.elapsed();
    let want: Vec<u32> = (0..late).collect();
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.missing_ranks() == want.as_slice(), || {
                format!("named {:?}, want {want:?}: {e}", e.missing_ranks())
            })?;
            let how: Vec<(u32, PeerLoss)> = want.iter().map(|&r| (r, PeerLoss::Shutdown)).collect();
            ensure(e.departures() == how.as_slice(), || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = ctx.short_timeout + ctx.margin;
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!(
            "expected a lost peer naming ranks {want:?}, got {other:?}"
        )),
    }
}

behaviour!(
    RECV_AFTER_THE_SENDER_CLOSED = recv_after_the_sender_closed,
    min_world: 2, timed: true, needs: [CheapPointToPoint]
);
/// Rank 0 shuts its transport down (its connections go); a second later the
/// last rank receives from it, point to point, as the tree exchange does:
/// the error names rank 0 as shut down, within the deadline + margin.
fn recv_after_the_sender_closed(ctx: &Ctx) -> Result<(), String> {
    let late = ctx.world() - 1;
    let t = &ctx.transport;
    t.barrier(ctx.deadline())
        .map_err(|e| format!("barrier: {e}"))?;
    if ctx.rank() == 0 {
        return t.shutdown().map_err(|e| e.to_string());
    }
    if ctx.rank() != late {
        return Ok(());
    }
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    let res = t.recv(0, 7, 64, Deadline::after(ctx.short_timeout));
    let took = start.elapsed();
    match res {
        Err(e @ Error::PeerLost { .. }) => {
            ensure(e.departures() == [(0, PeerLoss::Shutdown)], || {
                format!("{:?}: {e}", e.departures())
            })?;
            let bound = ctx.short_timeout + ctx.margin;
            ensure(took <= bound, || format!("took {took:?}, bound {bound:?}"))
        }
        other => Err(format!("expected rank 0 lost (shut down), got {other:?}")),
    }
}

behaviour!(
    USE_AFTER_SHUTDOWN_IS_UNUSABLE = use_after_shutdown_is_unusable,
    min_world: 1, timed: false, needs: []
);
/// Every operation on a transport this rank shut down fails at once with
/// `ChannelUnusable`, on every backend: nothing is sent, nothing waits.
fn use_after_shutdown_is_unusable(ctx: &Ctx) -> Result<(), String> {
    let t = &ctx.transport;
    t.shutdown().map_err(|e| e.to_string())?;
    let d = ctx.deadline();
    let start = Instant::now();
    let peer = (ctx.rank() + 1) % ctx.world();
    let mut results: Vec<(&str, Result<(), Error>)> = vec![
        ("all_gather", t.all_gather(b"x", 8, d).map(drop)),
        ("all_gather_fixed", t.all_gather_fixed(b"x", d).map(drop)),
        (
            "all_gather_sized",
            t.all_gather_sized(b"x", &vec![1; ctx.world() as usize], d)
                .map(drop),
        ),
        ("broadcast", t.broadcast(b"x", 0, 8, d).map(drop)),
        ("barrier", t.barrier(d)),
    ];
    if peer != ctx.rank() {
        results.push(("send", t.send(peer, 7, b"x", d)));
        results.push(("recv", t.recv(peer, 7, 8, d).map(drop)));
    }
    for (op, r) in results {
        ensure(matches!(r, Err(Error::ChannelUnusable { .. })), || {
            format!("{op} after shutdown: {r:?}")
        })?;
    }
    ensure(start.elapsed() < ctx.margin, || {
        format!("took {:?}", start.elapsed())
    })
}
