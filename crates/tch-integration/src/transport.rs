//! [`C10dTransport`]: core's [`Transport`] over a [`C10dProcessGroup`], and
//! its post-mortem after a failure.

use crate::error::C10dError;
use crate::group::{C10dProcessGroup, PendingSend};
use crate::store::C10dStore;
use compiler_collectives_core::{Deadline, Error, Store, Transport};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

/// How long a failed rank, once a single rank is left silent, waits for it
/// to check in before naming it. Short: every survivor's error must arrive
/// within the deadline + 1 s, and at a timeout the window comes after it.
pub const POST_MORTEM: Duration = Duration::from_millis(250);

/// How long a failed rank may take to record its own check-in.
const CHECK_IN_LIMIT: Duration = Duration::from_millis(500);

/// How long after an operation's deadline a failed rank still waits for
/// peers to check in (peers started the operation a little later).
const LATE_CHECK_IN: Duration = Duration::from_millis(900);

/// How long `shutdown` and drop wait for peers to take this rank's sends.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// core's [`Transport`] over a [`C10dProcessGroup`]: byte strings travel as
/// uint8 tensors; a variable-length all_gather is a lengths round (one int64
/// per rank) then a round padded to the longest.
///
/// c10d cannot tell which rank a timeout waited for, nor which peer a broken
/// connection belonged to. After a failed collective this transport finds out
/// through the store: every rank that failed sets `postmortem/<rank>`,
/// and until the operation's deadline plus [`POST_MORTEM`] the failing rank
/// collects the others' keys (stopping early when a single rank stayed
/// silent for the window);
/// ranks that set none are named (missing on a timeout, lost on a network
/// error).
/// The store is touched only after a failure. A rank that shuts down cannot
/// interrupt peers blocked in c10d; they fail at their deadline.
#[derive(Debug)]
pub struct C10dTransport {
    pg: C10dProcessGroup,
    lock: Mutex<bool>,
    pending: Mutex<Vec<PendingSend>>,
    /// Keeps the store alive as long as the group.
    store: C10dStore,
}

impl C10dTransport {
    /// A transport over `pg`, keeping `store` alive with it.
    pub fn new(pg: C10dProcessGroup, store: C10dStore) -> Self {
        C10dTransport {
            pg,
            lock: Mutex::new(false),
            pending: Mutex::new(Vec::new()),
            store,
        }
    }

    /// The process group underneath.
    pub fn group(&self) -> &C10dProcessGroup {
        &self.pg
    }

    /// Frees the sends their receivers have taken.
    fn reap(&self) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| !w.finished());
    }

    /// Waits (at most [`DRAIN_LIMIT`] in all) for peers to take the sends
    /// still in flight.
    fn drain(&self) {
        let until = Instant::now() + DRAIN_LIMIT;
        for w in self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || w.wait(left).is_err() {
                break;
            }
        }
    }

    /// Turns a failed operation into core's error, naming the ranks that did
    /// not check in after it (see the type's docs).
    fn failed(&self, start: Instant, deadline: Deadline, e: C10dError) -> Error {
        let network = matches!(e, C10dError::Torch { network: true, .. });
        let timeout = matches!(e, C10dError::Torch { timeout: true, .. });
        if !(network || timeout) {
            return e.into();
        }
        // Ranks may fail in different operations (one in a lengths round,
        // another in the padded round), and a transport fails only once: the
        // key is per rank, not per operation.
        let me = self.pg.rank;
        let key = |r: u32| format!("postmortem/{r}");
        // Live peers check in when they fail too: at once after a broken
        // connection, at the latest at this operation's deadline (they may be
        // blocked on a rank that is itself reporting). Wait for them until
        // then, plus the post-mortem window.
        let until = Instant::now().max(deadline.instant()) + LATE_CHECK_IN;
        let mut silent: Vec<u32> = (0..self.pg.world).filter(|&r| r != me).collect();
        if self
            .store
            .set(&key(me), b"", Deadline::after(CHECK_IN_LIMIT))
            .is_ok()
        {
            // One silent rank, quiet for the post-mortem window, is the usual
            // single failure: stop there. Several silent ranks may include
            // live ones blocked until their deadline: wait for them.
            let mut changed = Instant::now();
            while !silent.is_empty() && Instant::now() < until {
                let before = silent.len();
                let left = until.saturating_duration_since(Instant::now());
                silent.retain(|&r| !self.store.check_within(&key(r), left).unwrap_or(false));
                if silent.len() != before {
                    changed = Instant::now();
                }
                if silent.len() == 1 && changed.elapsed() >= POST_MORTEM {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        tracing::debug!(error = %e, ?silent, "c10d operation failed");
        if network && !silent.is_empty() {
            Error::PeerLost {
                ranks: silent,
                reason: compiler_collectives_core::PeerLoss::Disconnected,
                detail: e.to_string(),
                during: None,
            }
        } else if timeout {
            Error::Timeout {
                missing_ranks: silent,
                waited: start.elapsed(),
                during: None,
            }
        } else {
            e.into()
        }
    }

    /// One c10d allgather of equal-sized byte strings, concatenated rank 0
    /// first; a failure goes through the post-mortem (`start`: when the
    /// operation began). The caller holds the guard.
    fn gather_bytes(
        &self,
        data: &[u8],
        start: Instant,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        let parts = self
            .pg
            .all_gather(&Tensor::from_slice(data), deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(parts.iter().flat_map(bytes_of).collect())
    }

    fn guard(&self) -> compiler_collectives_core::Result<std::sync::MutexGuard<'_, bool>> {
        self.reap();
        let g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        if *g {
            return Err(Error::InvalidArgument(
                "this c10d transport is shut down".into(),
            ));
        }
        Ok(g)
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
        let _g = self.guard()?;
        let start = Instant::now();
        // The lengths round carries every rank's limit too, so every rank
        // applies the smallest one and all take the same branch.
        compiler_collectives_core::toolkit::all_gather_varlen(data, max_bytes, deadline, |b, d| {
            self.gather_bytes(b, start, d)
        })
    }

    fn all_gather_fixed(
        &self,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        let _g = self.guard()?;
        self.gather_bytes(data, Instant::now(), deadline)
    }

    fn broadcast(
        &self,
        data: &[u8],
        root: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        compiler_collectives_core::toolkit::check_root(root, self.pg.world)?;
        let _g = self.guard()?;
        let start = Instant::now();
        let mine = if root == self.pg.rank { data } else { &[] };
        let mut len = Tensor::from_slice(&[as_i64(mine.len())]);
        self.pg
            .broadcast(&mut len, root, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        let n = usize::try_from(len.int64_value(&[0])).unwrap_or(usize::MAX);
        if n > max_bytes {
            return Err(Error::message_too_large(root, n, max_bytes));
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut body = if root == self.pg.rank {
            Tensor::from_slice(mine)
        } else {
            Tensor::zeros([as_i64(n)], (Kind::Uint8, tch::Device::Cpu))
        };
        self.pg
            .broadcast(&mut body, root, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(bytes_of(&body))
    }

    fn barrier(&self, deadline: Deadline) -> compiler_collectives_core::Result<()> {
        let _g = self.guard()?;
        let start = Instant::now();
        self.pg
            .barrier(deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))
    }

    fn send(
        &self,
        peer: u32,
        tag: u32,
        data: &[u8],
        deadline: Deadline,
    ) -> compiler_collectives_core::Result<()> {
        compiler_collectives_core::toolkit::check_peer(peer, self.pg.rank, self.pg.world)?;
        let _g = self.guard()?;
        let _ = deadline;
        let len = self
            .pg
            .isend(&Tensor::from_slice(&[as_i64(data.len())]), peer, tag)?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.push(len);
        if !data.is_empty() {
            pending.push(self.pg.isend(&Tensor::from_slice(data), peer, tag)?);
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
        compiler_collectives_core::toolkit::check_peer(peer, self.pg.rank, self.pg.world)?;
        let _g = self.guard()?;
        let start = Instant::now();
        let mut len = Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu));
        self.pg
            .recv(&mut len, peer, tag, deadline.remaining())
            .map_err(|e| self.failed(start, deadline, e))?;
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
            .map_err(|e| self.failed(start, deadline, e))?;
        Ok(bytes_of(&body))
    }

    fn shutdown(&self) -> compiler_collectives_core::Result<()> {
        self.drain();
        *self.lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        Ok(())
    }
}

impl Drop for C10dTransport {
    fn drop(&mut self) {
        self.drain();
    }
}
