//! [`C10dTransport`]: core's [`Transport`] over a [`C10dProcessGroup`], and
//! its post-mortem after a failure.

use crate::error::{timed, C10dError};
use crate::group::{C10dProcessGroup, PendingSend};
use crate::store::C10dStore;
use compiler_collectives_core::transport::toolkit::{self, PostMortem, DRAIN_LIMIT, LATE_CHECK_IN};
use compiler_collectives_core::{Deadline, Error, PeerLoss, Poison, Store, Transport};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

/// core's [`Transport`] over a [`C10dProcessGroup`]: byte strings travel as
/// uint8 tensors; a variable-length all_gather is core's lengths round (each
/// rank's length and limit) then a round padded to the longest.
///
/// c10d cannot tell which rank a timeout waited for, nor which peer a broken
/// connection belonged to. After a failed operation this transport asks
/// core's store post-mortem ([`PostMortem`]): it checks in ("I was in this
/// operation") and waits until every other rank has checked in or left, or
/// until the operation's deadline plus [`LATE_CHECK_IN`] (after a broken
/// connection, also until a single rank stayed unaccounted for
/// [`POST_MORTEM`](compiler_collectives_core::transport::toolkit::POST_MORTEM)). Ranks
/// that left are named with how; the others not accounted for are missing
/// on a timeout, dead on a broken connection. `shutdown` records this rank's
/// leaving in the store; otherwise the store is touched only after a
/// failure. A rank that shuts down cannot interrupt peers blocked in c10d:
/// they find out when their own operation fails.
///
/// A [`send`](Transport::send) returns once c10d has it in flight; its
/// deadline is when `peer` must have taken it. Every later call on the
/// transport first looks at the sends still in flight: one past its deadline
/// fails that call as a timeout of a receive from `peer` would (the
/// post-mortem among `peer` alone: [`Error::Timeout`] naming it, or
/// [`Error::PeerLost`] if it left), and leaves the transport unusable (later
/// calls get [`Error::ChannelUnusable`], first failure `Timeout`). A call
/// made before a send's deadline is not cut short by it: c10d cannot
/// interrupt a wait in progress, so that call ends by its own deadline.
/// `shutdown` and drop wait for each send at most until its deadline
/// ([`DRAIN_LIMIT`] in all).
#[derive(Debug)]
pub struct C10dTransport {
    pg: C10dProcessGroup,
    state: Mutex<State>,
    pending: Mutex<Vec<Outgoing>>,
    post_mortem: PostMortem,
    /// Keeps the store alive as long as the group.
    _store: Arc<C10dStore>,
}

/// One operation: its number (the post-mortem's), when it began and its
/// deadline.
#[derive(Clone, Copy, Debug)]
struct Op {
    op: u64,
    start: Instant,
    deadline: Deadline,
}

/// A send in flight: c10d's work, its receiver, when it was sent and by
/// when the receiver must take it.
#[derive(Debug)]
struct Outgoing {
    work: PendingSend,
    peer: u32,
    start: Instant,
    deadline: Deadline,
}

/// Operations are numbered from 1 in the order every rank calls them
/// (collectives only: point-to-point differs between ranks).
#[derive(Debug, Default)]
struct State {
    shut: bool,
    op: u64,
    done: u64,
    /// A send's missed deadline, once reported: what every later call gets.
    failed: Option<Poison>,
}

impl C10dTransport {
    /// A transport over `pg`; its post-mortem keys go to `store` (the
    /// group's own, prefixed one), which it keeps alive.
    pub fn new(pg: C10dProcessGroup, store: C10dStore) -> Self {
        let store = Arc::new(store);
        C10dTransport {
            post_mortem: PostMortem::new(
                Arc::clone(&store) as Arc<dyn Store>,
                "postmortem",
                pg.rank,
                pg.world,
            ),
            pg,
            state: Mutex::new(State::default()),
            pending: Mutex::new(Vec::new()),
            _store: store,
        }
    }

    /// The process group underneath.
    pub fn group(&self) -> &C10dProcessGroup {
        &self.pg
    }

    /// Frees the sends their receivers have taken, and fails on the first
    /// one still in flight past its deadline (see the type's docs): its
    /// receiver is accounted for at the next collective's number, as a
    /// receive's failure is.
    fn check_sends(&self, st: &State) -> compiler_collectives_core::Result<()> {
        loop {
            let late = {
                let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                pending.retain(|s| !s.work.finished());
                match pending.iter().position(|s| s.deadline.expired()) {
                    Some(i) => pending.remove(i),
                    None => return Ok(()),
                }
            };
            // One last look, as short as c10d waits (1 ms): a send taken by
            // now was taken; one that is not fails with c10d's timeout.
            if let Err(e) = late.work.wait(Duration::ZERO) {
                let op = Op {
                    op: st.op + 1,
                    start: late.start,
                    deadline: late.deadline,
                };
                return Err(self.failed_among(op, e, Some(late.peer)));
            }
        }
    }

    /// Waits for peers to take the sends still in flight, each at most until
    /// its deadline and all at most [`DRAIN_LIMIT`].
    fn drain(&self) {
        let until = Instant::now() + DRAIN_LIMIT;
        for s in self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            if Instant::now() >= until {
                break;
            }
            let left = s.deadline.instant().min(until);
            let left = left.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                // A send not taken in time is left to c10d (freed with its work).
                let _ = s.work.wait(left);
            }
        }
    }

    /// Turns failed operation `op` into core's error, naming the ranks not
    /// in it (see the type's docs).
    fn failed(&self, op: Op, e: C10dError) -> Error {
        self.failed_among(op, e, None)
    }

    /// [`Self::failed`] for an operation that waited on `peer` alone (a
    /// receive), when given: only it can be named.
    fn failed_among(
        &self,
        Op {
            op,
            start,
            deadline,
        }: Op,
        e: C10dError,
        peer: Option<u32>,
    ) -> Error {
        let network = matches!(e, C10dError::Torch { network: true, .. });
        let timeout = matches!(e, C10dError::Torch { timeout: true, .. });
        if !(network || timeout) {
            return e.into_core(start.elapsed());
        }
        // Live peers check in when they fail too: at once after a broken
        // connection, at the latest at this operation's deadline (they may
        // be blocked on a rank that is itself reporting).
        let until = Instant::now().max(deadline.instant()) + LATE_CHECK_IN;
        let quiet = network.then_some(toolkit::POST_MORTEM);
        let absent = match peer {
            Some(p) => self.post_mortem.account_among(op, &[p], until, quiet),
            None => self.post_mortem.account(op, until, quiet),
        };
        tracing::debug!(error = %e, ?absent, "c10d operation failed");
        match absent.into_error(network && !timeout, start.elapsed(), &e.to_string()) {
            Some(err) => err,
            None if timeout => Error::timeout(Vec::new(), Vec::new(), start.elapsed()),
            None => e.into_core(start.elapsed()),
        }
    }

    /// One c10d allgather of equal-sized byte strings, concatenated rank 0
    /// first; a failure goes through the post-mortem (`start`: when the
    /// operation began). The caller holds the guard.
    fn gather_bytes(&self, data: &[u8], op: Op) -> compiler_collectives_core::Result<Vec<u8>> {
        let parts = self
            .pg
            .all_gather(&Tensor::from_slice(data), op.deadline.remaining())
            .map_err(|e| self.failed(op, e))?;
        // One buffer, each part copied into its place (no per-part copy).
        let total = parts.iter().map(Tensor::numel).sum();
        let mut out = vec![0u8; total];
        let mut at = 0;
        for p in &parts {
            let n = p.numel();
            p.copy_data(&mut out[at..at + n], n);
            at += n;
        }
        Ok(out)
    }

    /// This transport's state, locked, unless it is shut down or failed;
    /// a send past its deadline fails it here (see the type's docs).
    fn guard(&self) -> compiler_collectives_core::Result<MutexGuard<'_, State>> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.shut {
            return Err(toolkit::shut_down(self.pg.rank));
        }
        if let Some(poison) = &g.failed {
            return Err(poison.error());
        }
        if let Err(e) = self.check_sends(&g) {
            g.failed = Some(Poison::of(&e));
            return Err(e);
        }
        Ok(g)
    }

    /// Runs the next collective, numbered, under the guard.
    fn collective<T>(
        &self,
        deadline: Deadline,
        body: impl FnOnce(Op) -> compiler_collectives_core::Result<T>,
    ) -> compiler_collectives_core::Result<T> {
        let mut g = self.guard()?;
        g.op += 1;
        let op = g.op;
        let out = body(Op {
            op,
            start: Instant::now(),
            deadline,
        })?;
        g.done = op;
        Ok(out)
    }
}

fn bytes_of(t: &Tensor) -> Vec<u8> {
    let n = t.numel();
    let mut out = vec![0u8; n];
    t.copy_data(&mut out, n);
    out
}

fn as_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

impl Transport for C10dTransport {
    fn rank(&self) -> u32 {
        self.pg.rank
    }

    fn world_size(&self) -> u32 {
        self.pg.world
    }

    fn backend(&self) -> &'static str {
        "c10d"
    }

    /// Missing and lost ranks are named (the store post-mortem) and
    /// point-to-point is ProcessGroupGloo's own send/recv; a rank that leaves
    /// cannot interrupt peers blocked inside a c10d collective.
    fn capabilities(&self) -> compiler_collectives_core::Capabilities {
        compiler_collectives_core::Capabilities::none()
            .with_names_missing_ranks()
            .with_cheap_point_to_point()
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<Vec<u8>>> {
        // The lengths round carries every rank's limit too, so every rank
        // applies the smallest one and all take the same branch.
        self.collective(deadline, |op| {
            toolkit::all_gather_varlen(data, max_bytes, deadline, |b, _| self.gather_bytes(b, op))
        })
    }

    fn all_gather_fixed(
        &self,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        self.collective(deadline, |op| self.gather_bytes(data, op))
    }

    fn barrier(&self, deadline: Deadline) -> compiler_collectives_core::Result<()> {
        self.collective(deadline, |op| {
            self.pg
                .barrier(deadline.remaining())
                .map_err(|e| self.failed(op, e))
        })
    }

    /// Puts the message (its length, then its bytes) in flight with c10d's
    /// `isend` and returns without waiting for `peer` to take it. `deadline`
    /// is when `peer` must have taken it: a later call on this transport
    /// fails once it has passed with the message still in flight (the
    /// type's docs say how); a call made before it is not cut short.
    fn send(
        &self,
        peer: u32,
        tag: u32,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<()> {
        toolkit::check_peer(peer, self.pg.rank, self.pg.world)?;
        let _g = self.guard()?;
        let start = Instant::now();
        let outgoing = |work| Outgoing {
            work,
            peer,
            start,
            deadline,
        };
        let len = timed(|| {
            self.pg
                .isend(&Tensor::from_slice(&[as_i64(data.len())]), peer, tag)
        })?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push(outgoing(len));
        if !data.is_empty() {
            pending.push(outgoing(timed(|| {
                self.pg.isend(&Tensor::from_slice(data), peer, tag)
            })?));
        }
        Ok(())
    }

    fn recv(
        &self,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        toolkit::check_peer(peer, self.pg.rank, self.pg.world)?;
        let g = self.guard()?;
        // Point-to-point is not numbered: a failure here is accounted for
        // at the next collective's number.
        let op = Op {
            op: g.op + 1,
            start: Instant::now(),
            deadline,
        };
        let mut len = Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu));
        self.pg
            .recv(&mut len, peer, tag, deadline.remaining())
            .map_err(|e| self.failed_among(op, e, Some(peer)))?;
        let n = usize::try_from(len.int64_value(&[0])).unwrap_or(usize::MAX);
        if n > max_bytes {
            return Err(Error::message_too_large(peer, n, max_bytes));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut body = Tensor::zeros([as_i64(n)], (Kind::Uint8, tch::Device::Cpu));
        self.pg
            .recv(&mut body, peer, tag, deadline.remaining())
            .map_err(|e| self.failed_among(op, e, Some(peer)))?;
        Ok(bytes_of(&body))
    }

    /// Lets peers take this rank's sends, then records in the store that
    /// this rank left (how many collectives it completed), so that a peer
    /// waiting for it names it as shut down.
    fn shutdown(&self) -> compiler_collectives_core::Result<()> {
        self.drain();
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !g.shut {
            g.shut = true;
            self.post_mortem.leave(PeerLoss::Shutdown, g.done);
        }
        Ok(())
    }
}

impl Drop for C10dTransport {
    fn drop(&mut self) {
        self.drain();
    }
}
