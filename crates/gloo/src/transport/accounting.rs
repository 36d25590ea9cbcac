//! Missing-rank accounting: which ranks did not come, and how each went
//! missing (silent, left, died, held up by an earlier failure), at the
//! rendezvous ([`rendezvous_timeout`]) and at a collective's headers
//! ([`GlooTransport::account_headers`]).

use super::departures::Records;
use super::framing::{parse_header, probe_slot, FLAG_ABORT, FLAG_FAILED, FLAG_SHUTDOWN, HEADER};
use super::pool::Pool;
use super::{Collective, Fail, GlooTransport, Round};
use crate::store::GlooStore;
use crate::sys::{self, Buffer};
use crate::GlooError;
use compiler_collectives_core::{Deadline, Error, PeerLoss};
use std::time::{Duration, Instant};

/// How often a rank accounting for missing headers after a broken pair
/// looks again.
const ACCOUNT_POLL: Duration = Duration::from_millis(20);
/// How often it probes the pairs of ranks still without a header.
const ACCOUNT_PROBE: Duration = Duration::from_millis(200);

/// The key under the group's prefix that says `rank` came to the rendezvous.
pub(super) fn arrived_key(rank: u32) -> String {
    format!("arrived/{rank}")
}

/// The timeout of a rendezvous: the ranks whose arrival key is missing, and
/// where it should be.
pub(super) fn rendezvous_timeout(
    store: &GlooStore,
    scoped: &GlooStore,
    prefix: &str,
    rank: u32,
    world: u32,
    start: Instant,
) -> Error {
    // Each key is asked for without waiting where the store can say so (a
    // Rust store's `try_get`): a store whose waits round up to a second (a
    // FileStore under torch) would add a second per missing rank.
    let missing: Vec<u32> = (0..world)
        .filter(|&r| r != rank)
        .filter(|&r| {
            let soon = Deadline::after(Duration::from_millis(1));
            !matches!(scoped.try_get_within(&arrived_key(r), soon), Ok(Some(_)))
        })
        .collect();
    let keys = match missing.as_slice() {
        [] => {
            "every rank's arrival key is there: Gloo's own rendezvous keys are missing".to_owned()
        }
        [r] => format!("its key '{prefix}/{}' never appeared", arrived_key(*r)),
        [r, ..] => format!(
            "their keys '{prefix}/arrived/<rank>' never appeared (first '{prefix}/{}')",
            arrived_key(*r)
        ),
    };
    Error::timeout(missing, Vec::new(), start.elapsed())
        .waiting_for(format!("Gloo's rendezvous in {}; {keys}", store.describe()))
}

impl GlooTransport {
    /// Posts a one-byte receive from each candidate on a probe slot: Gloo
    /// refuses it at once on a pair whose connection broke. Returns those
    /// peers. The probe buffers are leaked with `pool`.
    pub(super) fn broken_pairs(&self, pool: &mut Pool, k: u64, candidates: &[u32]) -> Vec<u32> {
        let slot = probe_slot(k);
        candidates
            .iter()
            .copied()
            .filter(|&p| match Buffer::new(&self.ctx, vec![0u8; 1]) {
                Ok(b) => {
                    let i = pool.add(b);
                    matches!(pool.get(i).recv(p, slot, 0, 1), Err(e) if e.status() == Some(sys::IO))
                }
                Err(_) => false,
            })
            .collect()
    }

    /// After the header wait of `round` failed with `e`: which of its
    /// `recv_from` are not in operation `k`, and how each went missing
    /// (docs/failures.md: every one of them, the same set whatever the order
    /// in which they went).
    ///
    /// A rank whose header says it shut down or aborted left that way; a
    /// rank without a header whose pair broke (`broken`, or found by a
    /// probe) left as its record in the store says ([`left_key`](super::departures::left_key): it
    /// reached this operation's header only after the leaver had closed its
    /// connections), else died. After a broken pair
    /// (`e` is Gloo's IO error) the other ranks without a header are
    /// watched until each has sent one or lost its pair, or until the
    /// deadline: a report waits for every rank to be accounted for, not for
    /// the first to go. At the deadline the ranks still without a header
    /// are silent, and the error is a timeout naming them with those that
    /// left. A rank whose header says it failed in an earlier operation
    /// ([`FLAG_FAILED`]) is held up by the same cause, as a rank checked in
    /// to the store post-mortem is: it is named (as aborted) only when no
    /// other rank is missing.
    pub(super) fn account_headers(
        &self,
        pool: &mut Pool,
        inbox: &Buffer,
        round: &Round<'_>,
        e: GlooError,
        mut broken: Vec<u32>,
    ) -> Fail {
        let Round { k, op } = *round;
        let Collective {
            recv_from,
            deadline,
            ..
        } = op;
        let io = e.status() == Some(sys::IO);
        let mut records = Records::default();
        let mut failed: Vec<u32> = Vec::new();
        let mut probed: Option<Instant> = None;
        // Gloo may still be writing this memory: read it volatile; it only
        // names missing ranks.
        let header_of = |p: u32| {
            parse_header(&inbox.read_volatile(p as usize * (HEADER + self.inline), HEADER))
        };
        loop {
            let mut left: Vec<(u32, PeerLoss)> = Vec::new();
            let mut silent: Vec<u32> = Vec::new();
            failed.clear();
            let unread: Vec<u32> = broken
                .iter()
                .copied()
                .filter(|&p| !records.has(p) && recv_from.contains(&p) && header_of(p).is_none())
                .collect();
            records.fetch(&self.store, &unread, k);
            for &p in recv_from {
                match header_of(p) {
                    Some((FLAG_SHUTDOWN, _)) => left.push((p, PeerLoss::Shutdown)),
                    Some((FLAG_ABORT, _)) => left.push((p, PeerLoss::Aborted)),
                    Some((FLAG_FAILED, _)) => failed.push(p),
                    Some(_) => {}
                    // Its connection is gone: it left (its record says how)
                    // or died.
                    None if broken.contains(&p) => {
                        left.push((p, records.departed(p).unwrap_or(PeerLoss::Disconnected)))
                    }
                    None => silent.push(p),
                }
            }
            if io && !silent.is_empty() && !deadline.expired() {
                // A probe on a broken pair fails at once; one on a live pair
                // stays posted (leaked with the pool), so probe seldom.
                if probed.is_none_or(|t| t.elapsed() >= ACCOUNT_PROBE) {
                    probed = Some(Instant::now());
                    broken.extend(self.broken_pairs(pool, k, &silent));
                    if broken.iter().any(|b| silent.contains(b)) {
                        continue;
                    }
                }
                std::thread::sleep(ACCOUNT_POLL.min(deadline.remaining()));
                continue;
            }
            // A rank that failed earlier is held up by the same cause: named
            // (as aborted) only when no other rank is missing.
            if silent.is_empty() && left.is_empty() {
                left.extend(failed.iter().map(|&p| (p, PeerLoss::Aborted)));
            }
            return match (silent.is_empty(), left.is_empty()) {
                // Every header came; a pair broke after its rank's header.
                (true, true) => {
                    let lost = self.broken_pairs(pool, k, recv_from);
                    Fail::Gloo(e, lost)
                }
                (true, false) => Fail::Core(Error::peer_lost(
                    left,
                    if io { e.to_string() } else { String::new() },
                )),
                (false, _) => Fail::Core(Error::timeout(silent, left, Duration::ZERO)),
            };
        }
    }
}
