//! [`C10dProcessGroup`] (c10d's `ProcessGroupGloo` on [`tch::Tensor`]s),
//! [`ReduceOp`], and the work handle of an asynchronous send.

use crate::error::{c_int, c_string, C10dError};
use crate::store::C10dStore;
use crate::sys::{GroupHandle, WorkHandle, WorkState};
use std::time::Duration;
use tch::Tensor;

/// Reduction of [`C10dProcessGroup::all_reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Product,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
}

impl ReduceOp {
    /// The shim's code (`ccol_c10d_pg_allreduce`).
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Product => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
        }
    }
}

/// A c10d `ProcessGroupGloo` (CPU tensors). Every operation waits for its
/// completion, at most its `timeout` (rounded up to the millisecond).
#[derive(Debug)]
pub struct C10dProcessGroup {
    handle: GroupHandle,
    pub(crate) rank: u32,
    pub(crate) world: u32,
}

/// `rank` and `tag` as the shim's `int32_t`s.
fn rank_and_tag(rank: u32, tag: u32) -> Result<(i32, i32), C10dError> {
    Ok((c_int(rank, "rank")?, c_int(tag, "tag")?))
}

impl C10dProcessGroup {
    /// Joins a `ProcessGroupGloo` of `world_size` ranks through `store`;
    /// `hostname` is the address peers reach this rank at.
    ///
    /// Cost: the group's rendezvous through the store (every rank connects
    /// to every other).
    ///
    /// # Errors
    /// [`C10dError::Invalid`] for a hostname with a NUL byte or a rank not
    /// below `world_size`; [`C10dError::Torch`] with libtorch's text
    /// (rendezvous timeouts included).
    pub fn gloo(
        store: &C10dStore,
        rank: u32,
        world_size: u32,
        hostname: &str,
        timeout: Duration,
    ) -> Result<Self, C10dError> {
        let h = c_string(hostname, "hostname")?;
        let r = c_int(rank, "rank")?;
        let w = c_int(world_size, "world size")?;
        let handle = GroupHandle::gloo(store.handle(), r, w, &h, timeout)?;
        Ok(C10dProcessGroup {
            handle,
            rank,
            world: world_size,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.handle.rank().unwrap_or(self.rank)
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.handle.size().unwrap_or(self.world)
    }

    /// Gathers `tensor` (same shape and kind on every rank) from every rank:
    /// `world_size` new tensors, index = rank.
    ///
    /// Cost: one c10d allgather.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when a rank does not join by `timeout`.
    pub fn all_gather(&self, tensor: &Tensor, timeout: Duration) -> Result<Vec<Tensor>, C10dError> {
        self.handle.all_gather(&tensor.contiguous(), timeout)
    }

    /// Reduces `tensor` in place across every rank.
    ///
    /// Cost: one c10d allreduce.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when a rank does not join by `timeout`.
    pub fn all_reduce(
        &self,
        tensor: &mut Tensor,
        op: ReduceOp,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        self.handle.all_reduce(tensor, op.code(), timeout)
    }

    /// Broadcasts `tensor` from `root` in place.
    ///
    /// Cost: one c10d broadcast.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when a rank does not join by `timeout`.
    pub fn broadcast(
        &self,
        tensor: &mut Tensor,
        root: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let r = c_int(root, "root")?;
        self.handle.broadcast(tensor, r, timeout)
    }

    /// Waits for every rank.
    ///
    /// Cost: one c10d barrier.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when a rank does not arrive by `timeout`.
    pub fn barrier(&self, timeout: Duration) -> Result<(), C10dError> {
        self.handle.barrier(timeout)
    }

    /// Sends `tensor` to `dst` under `tag` (blocks until it is taken).
    ///
    /// Cost: one point-to-point message.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when `dst` does not take it by `timeout`.
    pub fn send(
        &self,
        tensor: &Tensor,
        dst: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let (d, g) = rank_and_tag(dst, tag)?;
        self.handle.send(&tensor.contiguous(), d, g, timeout)
    }

    /// Receives into `tensor` from `src` under `tag`.
    ///
    /// Cost: one point-to-point message.
    ///
    /// # Errors
    /// [`C10dError`]; a timeout when nothing arrives by `timeout`.
    pub fn recv(
        &self,
        tensor: &mut Tensor,
        src: u32,
        tag: u32,
        timeout: Duration,
    ) -> Result<(), C10dError> {
        let (s, g) = rank_and_tag(src, tag)?;
        self.handle.recv(tensor, s, g, timeout)
    }

    /// Starts sending `tensor` to `dst` under `tag` without waiting for the
    /// receiver (a ring of sends then receives must not deadlock).
    pub(crate) fn isend(
        &self,
        tensor: &Tensor,
        dst: u32,
        tag: u32,
    ) -> Result<PendingSend, C10dError> {
        let (d, g) = rank_and_tag(dst, tag)?;
        self.handle.isend(tensor, d, g).map(PendingSend)
    }
}

/// A send in flight (c10d `Work`), freed on drop.
#[derive(Debug)]
pub(crate) struct PendingSend(WorkHandle);

impl PendingSend {
    /// Whether the receiver has taken it (or it failed): nothing left to wait for.
    pub(crate) fn finished(&self) -> bool {
        self.0.state() != WorkState::Running
    }

    /// Waits at most `timeout` for the receiver to take it.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<(), C10dError> {
        self.0.wait(timeout)
    }
}
