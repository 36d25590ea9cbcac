//! The store post-mortem: after a failed collective, which ranks were not in
//! it, and how each went missing — for engines that cannot say (NCCL, c10d).
//!
//! Keys, under a group's prefix (one scheme for every backend):
//! - `present/<rank>`: this rank was in an operation when it failed (it
//!   arrived); value: the operation number, decimal.
//! - `left/<rank>`: this rank left the group; value `shutdown <done>` or
//!   `aborted <done>`, `<done>` the number of operations it had completed.
//!
//! Operations are numbered from 1 per group, in the order every rank calls
//! them; 0 stands for the group's set-up (any departure counts there).
//!
//! The rule is docs/failures.md's (Exact missing-rank reports): a failed rank reports once every other rank is
//! accounted for (present, or left before the operation), or when its wait
//! ends, naming every rank not accounted for — the same set in every run,
//! not the first one it noticed.

use crate::{Deadline, Error, PeerLoss, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a failed rank keeps waiting, after its own deadline, for peers
/// blocked until theirs to check in (peers start an operation a little
/// later). Short, so that every error still comes within the deadline + 1 s.
pub const LATE_CHECK_IN: Duration = Duration::from_millis(900);

/// With one rank left unaccounted for and quiet this long since the last
/// change, a rank whose engine saw a connection drop stops waiting: that
/// rank is the one that died.
pub const POST_MORTEM: Duration = Duration::from_millis(250);

/// How long `shutdown` and drop wait for peers to take this rank's sends
/// still in flight.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// How long one post-mortem store call may take (a mark, a lookup).
pub const STORE_CALL_LIMIT: Duration = Duration::from_millis(500);

/// How often a waiting post-mortem looks at the store again.
const POLL: Duration = Duration::from_millis(10);

/// The two keys a rank writes: that it left ([`departure_key`]), and that
/// it is present at a failed operation (`present/<rank>`).
#[derive(Clone, Copy, Debug)]
enum Mark {
    Left,
    Present,
}

/// The key of rank `rank`'s departure record, under its group's prefix:
/// `left/<rank>`. Every backend that records departures uses it.
pub fn departure_key(rank: u32) -> String {
    format!("left/{rank}")
}

/// The value of a rank's `left/<rank>` key: `shutdown <done>` for
/// [`PeerLoss::Shutdown`], else `aborted <done>`, `<done>` the number of
/// operations it had completed (decimal). Every backend that records
/// departures writes this.
pub fn departure_record(how: PeerLoss, done: u64) -> String {
    let how = if how == PeerLoss::Shutdown {
        PeerLoss::Shutdown
    } else {
        PeerLoss::Aborted
    };
    format!("{} {done}", how.as_str())
}

/// Reads a [`departure_record`]: how the rank left and how many operations
/// it had completed. A value another program wrote is read leniently (it
/// only names a departure): a word other than `shutdown` is an abort, a
/// missing or bad count is 0.
pub fn parse_departure(value: &[u8]) -> (PeerLoss, u64) {
    let text = String::from_utf8_lossy(value);
    let (word, done) = text.split_once(' ').unwrap_or((&text, "0"));
    let done: u64 = done.trim().parse().unwrap_or(0);
    let how = if word == PeerLoss::Shutdown.as_str() {
        PeerLoss::Shutdown
    } else {
        PeerLoss::Aborted
    };
    (how, done)
}

/// Ranks not in a failed operation, from a [`PostMortem::account`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Absent {
    /// Ranks neither present nor departed when the wait ended, ascending.
    pub silent: Vec<u32>,
    /// Ranks that left before the operation, each with how, ascending.
    pub left: Vec<(u32, PeerLoss)>,
}

impl Absent {
    /// Whether every rank was present.
    pub fn is_empty(&self) -> bool {
        self.silent.is_empty() && self.left.is_empty()
    }

    /// The error for a failed operation with these ranks absent:
    /// - none silent: [`Error::PeerLost`] naming those that left;
    /// - silent ranks after a dropped connection (`disconnected`): they died
    ///   ([`PeerLoss::Disconnected`]), an [`Error::PeerLost`] naming them
    ///   with those that left;
    /// - otherwise an [`Error::Timeout`] naming silent and departed ranks.
    ///
    /// `detail` is the engine's text (kept on a lost peer); `waited` how
    /// long this rank waited. `None` when every rank was present: the
    /// engine's own error is the one to report.
    pub fn into_error(self, disconnected: bool, waited: Duration, detail: &str) -> Option<Error> {
        if self.is_empty() {
            return None;
        }
        Some(if self.silent.is_empty() {
            Error::peer_lost(self.left, detail)
        } else if disconnected {
            let mut lost = self.left;
            lost.extend(self.silent.iter().map(|&r| (r, PeerLoss::Disconnected)));
            Error::peer_lost(lost, detail)
        } else {
            Error::timeout(self.silent, self.left, waited)
        })
    }
}

/// One rank's side of a group's post-mortem keys (module docs).
#[derive(Clone, Debug)]
pub struct PostMortem {
    store: Arc<dyn Store>,
    prefix: String,
    rank: u32,
    world: u32,
}

impl PostMortem {
    /// The post-mortem of rank `rank` of a group of `world`, its keys under
    /// `prefix` in `store` (every rank of the group uses the same prefix).
    pub fn new(store: Arc<dyn Store>, prefix: impl Into<String>, rank: u32, world: u32) -> Self {
        PostMortem {
            store,
            prefix: prefix.into(),
            rank,
            world,
        }
    }

    fn key(&self, mark: Mark, rank: u32) -> String {
        match mark {
            Mark::Left => format!("{}/{}", self.prefix, departure_key(rank)),
            Mark::Present => format!("{}/present/{rank}", self.prefix),
        }
    }

    fn lookup(&self, mark: Mark, rank: u32) -> Option<Vec<u8>> {
        self.store
            .try_get(&self.key(mark, rank), Deadline::after(STORE_CALL_LIMIT))
            .ok()
            .flatten()
    }

    /// Every rank but this one, ascending.
    pub fn others(&self) -> Vec<u32> {
        (0..self.world).filter(|r| *r != self.rank).collect()
    }

    /// Records that this rank left after completing `done` operations
    /// (`how`: [`PeerLoss::Shutdown`] or [`PeerLoss::Aborted`]; anything
    /// else is recorded as aborted). A store failure is logged, not
    /// returned: leaving goes on.
    pub fn leave(&self, how: PeerLoss, done: u64) {
        let value = departure_record(how, done);
        if let Err(e) = self.store.set(
            &self.key(Mark::Left, self.rank),
            value.as_bytes(),
            Deadline::after(STORE_CALL_LIMIT),
        ) {
            tracing::debug!(error = %e, "post-mortem: cannot record leaving");
        }
    }

    /// Records that this rank was in operation `op` when it failed, so that
    /// the others' post-mortems count it as present. Returns whether the
    /// store took it (a store failure is logged).
    pub fn check_in(&self, op: u64) -> bool {
        let value = op.to_string();
        match self.store.set(
            &self.key(Mark::Present, self.rank),
            value.as_bytes(),
            Deadline::after(STORE_CALL_LIMIT),
        ) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "post-mortem: cannot check in");
                false
            }
        }
    }

    /// Of `ranks`, those that left without completing operation `op`
    /// (1-based; 0: the set-up, where any departure counts), each with how.
    pub fn left_before(&self, op: u64, ranks: &[u32]) -> Vec<(u32, PeerLoss)> {
        ranks
            .iter()
            .filter_map(|&r| {
                let v = self.lookup(Mark::Left, r)?;
                let (how, done) = parse_departure(&v);
                (op == 0 || done < op).then_some((r, how))
            })
            .collect()
    }

    /// After operation `op` failed on this rank: checks in, then waits until
    /// every other rank is accounted for — checked in (at any operation: a
    /// rank held up by a third one is not to blame) or left before `op` —
    /// or until `until`, and returns those not present. When the store
    /// does not take this rank's check-in it cannot be asked either: every
    /// other rank is returned silent at once.
    ///
    /// With `quiet` set (the engine saw a connection drop), the wait also
    /// ends once a single rank is left unaccounted for and nothing changed
    /// for that long ([`POST_MORTEM`]): that rank is the one that died —
    /// unless some rank left meanwhile (ranks finishing one after another,
    /// the last of them maybe slower than the window).
    pub fn account(&self, op: u64, until: Instant, quiet: Option<Duration>) -> Absent {
        self.account_among(op, &self.others(), until, quiet)
    }

    /// [`PostMortem::account`] for an operation that waited on `ranks` only
    /// (a point-to-point receive waits on one): the others are not asked
    /// about, and are never among the absent.
    pub fn account_among(
        &self,
        op: u64,
        ranks: &[u32],
        until: Instant,
        quiet: Option<Duration>,
    ) -> Absent {
        let mut waiting: Vec<u32> = ranks.iter().copied().filter(|&r| r != self.rank).collect();
        if !self.check_in(op) {
            return Absent {
                silent: waiting,
                left: Vec::new(),
            };
        }
        let mut left: Vec<(u32, PeerLoss)> = Vec::new();
        let mut changed = Instant::now();
        loop {
            let before = waiting.len();
            waiting.retain(|&r| self.lookup(Mark::Present, r).is_none());
            let gone = self.left_before(op, &waiting);
            waiting.retain(|r| !gone.iter().any(|(g, _)| g == r));
            left.extend(gone);
            if waiting.len() != before {
                changed = Instant::now();
            }
            // Not while ranks are leaving: the quiet one may be leaving too.
            let single_quiet = quiet
                .is_some_and(|q| waiting.len() == 1 && left.is_empty() && changed.elapsed() >= q);
            if waiting.is_empty() || single_quiet || Instant::now() >= until {
                break;
            }
            std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
        }
        left.sort_by_key(|(r, _)| *r);
        Absent {
            silent: waiting,
            left,
        }
    }
}
