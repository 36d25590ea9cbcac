//! [`Buffer`]: a Gloo unbound buffer over memory it owns, and
//! [`Interrupter`], through which another thread interrupts its wait.

use super::{checked, free_on_drop, made, Api, Context, PostFn, WaitFn};
use crate::GlooError;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Milliseconds until `until`, rounded up (Gloo takes whole milliseconds; a
/// wait must not end before its deadline).
fn ms_until(until: Instant) -> i64 {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left.as_millis() + u128::from(left.subsec_nanos() % 1_000_000 != 0);
    i64::try_from(ms).unwrap_or(i64::MAX)
}

fn rank_arg(rank: u32) -> Result<i32, GlooError> {
    i32::try_from(rank).map_err(|_| GlooError::Invalid("rank out of range".into()))
}

/// A Gloo unbound buffer over memory it owns.
///
/// Gloo's event loop writes the memory of a posted receive (within its
/// range: `send`/`recv` check ranges against the memory) until that receive
/// completes, and reads a posted send's range until it completes. The
/// transport touches those bytes only after `wait_recv`/`wait_send` said
/// so, except through [`Buffer::read_volatile`]; after an error, when a
/// transfer may still be in flight, it [`leak`](Buffer::leak)s the buffer
/// instead of freeing memory Gloo may still touch. Dropping frees the Gloo
/// buffer before the memory.
pub(crate) struct Buffer {
    api: &'static Api,
    ptr: NonNull<c_void>,
    mem: Vec<u8>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.mem.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: a Gloo unbound buffer may be posted to, waited on and freed from
// any thread (its state is guarded by its own mutex; the event loop
// completes it from Gloo's thread); the memory is an owned `Vec<u8>`.
unsafe impl Send for Buffer {}

// SAFETY (`free_on_drop!`'s contract): `ptr` came from ccol_gloo_buffer_new
// (in `Buffer::new`) and is freed once, by this Drop, before `mem` (fields
// drop after it); every use of it borrowed `self`; ccol_gloo_buffer_free
// catches exceptions. A buffer whose transfers may be in flight is leaked,
// never dropped (type docs).
free_on_drop!(Buffer, buffer_free);

impl Buffer {
    /// An unbound buffer of `ctx` over `mem`.
    pub(crate) fn new(ctx: &Context, mut mem: Vec<u8>) -> Result<Self, GlooError> {
        // Gloo needs a non-null pointer even for zero bytes.
        if mem.capacity() == 0 {
            mem.reserve(1);
        }
        let ptr = made("create buffer", |err| {
            // SAFETY: `ctx.ptr` is live (borrowed). The `mem.len()` bytes at
            // `mem`'s pointer stay valid for the Gloo buffer's whole life: the
            // returned Buffer owns `mem` and never reallocates it, Drop frees
            // the Gloo buffer before `mem`, `leak` keeps both for ever, and
            // `take_bytes` moves the allocation out without freeing it.
            unsafe {
                (ctx.api.buffer_new)(ctx.ptr.as_ptr(), mem.as_mut_ptr().cast(), mem.len(), err)
            }
        })?;
        Ok(Buffer {
            api: ctx.api,
            ptr,
            mem,
        })
    }

    fn in_range(&self, offset: usize, n: usize) -> Result<(), GlooError> {
        match offset.checked_add(n) {
            Some(end) if end <= self.mem.len() => Ok(()),
            _ => Err(GlooError::Invalid(format!(
                "bytes {offset}..+{n} are outside a buffer of {}",
                self.mem.len()
            ))),
        }
    }

    /// Posts, through `entry` (the adapter's `buffer_send` or
    /// `buffer_recv`), a transfer of `n` bytes at `offset` with `peer` on
    /// `slot`.
    fn post(
        &self,
        entry: PostFn,
        what: &str,
        peer: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        let peer = rank_arg(peer)?;
        self.in_range(offset, n)?;
        checked(what, |err| {
            // SAFETY: `entry` is ccol_gloo_buffer_send or
            // ccol_gloo_buffer_recv (what `send` and `recv`, the only callers,
            // pass), resolved with this signature; `ptr` is live (borrowed);
            // `offset + n` lies within the memory (checked above), so Gloo
            // reads (send) or writes (recv) only there; `err` is writable.
            unsafe { entry(self.ptr.as_ptr(), peer, slot, offset, n, err) }
        })
    }

    /// Posts a send of `n` bytes at `offset` to `dst` on `slot`.
    pub(crate) fn send(
        &self,
        dst: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        self.post(self.api.buffer_send, "send", dst, slot, offset, n)
    }

    /// Posts a receive of `n` bytes at `offset` from `src` on `slot`.
    pub(crate) fn recv(
        &self,
        src: u32,
        slot: u64,
        offset: usize,
        n: usize,
    ) -> Result<(), GlooError> {
        self.post(self.api.buffer_recv, "recv", src, slot, offset, n)
    }

    /// Waits, through `entry` (the adapter's `buffer_wait_recv` or
    /// `buffer_wait_send`), until `until` for one transfer to complete;
    /// returns its peer.
    fn wait(&self, entry: WaitFn, what: &str, until: Instant) -> Result<i32, GlooError> {
        let mut rank = -1;
        checked(what, |err| {
            // SAFETY: `entry` is ccol_gloo_buffer_wait_recv or
            // ccol_gloo_buffer_wait_send (what `wait_recv` and `wait_send`,
            // the only callers, pass), resolved with this signature; `ptr` is
            // live (borrowed); `rank` and `err` are writable.
            unsafe { entry(self.ptr.as_ptr(), ms_until(until), &mut rank, err) }
        })
        .map(|()| rank)
    }

    /// Waits until `until` for one receive to complete; returns its peer.
    /// Gloo's timeout closes every pair of the context.
    pub(crate) fn wait_recv(&self, until: Instant) -> Result<i32, GlooError> {
        self.wait(self.api.buffer_wait_recv, "wait recv", until)
    }

    /// Waits until `until` for one send to complete.
    pub(crate) fn wait_send(&self, until: Instant) -> Result<(), GlooError> {
        self.wait(self.api.buffer_wait_send, "wait send", until)
            .map(|_peer| ())
    }

    /// The memory (read only after the receives into it completed: type docs).
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.mem
    }

    /// The memory, writable (only while no receive into it is in flight).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    /// Copies `n` bytes at `at` (clamped to the memory) with volatile reads,
    /// byte by byte: for memory Gloo may still be writing, when the copy only
    /// serves to name the ranks whose bytes did not arrive.
    pub(crate) fn read_volatile(&self, at: usize, n: usize) -> Vec<u8> {
        let end = at.saturating_add(n).min(self.mem.len());
        let base = self.mem.as_ptr();
        (at.min(end)..end)
            // SAFETY: `i < mem.len()`, so the read is inside the allocation;
            // volatile, as another thread may be writing the byte.
            .map(|i| unsafe { std::ptr::read_volatile(base.add(i)) })
            .collect()
    }

    /// Moves the memory out (after every transfer on it completed), leaving
    /// an empty buffer: later sends and receives on it are refused as out of
    /// range.
    pub(crate) fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.mem)
    }

    /// Keeps the Gloo buffer and its memory alive for ever (after an error,
    /// when a transfer may still be in flight).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

/// Lets another thread interrupt a buffer's wait (`ccol_gloo_buffer_abort_wait`)
/// without closing any connection. The target is set only for the span of
/// [`Interrupter::with_target`], which borrows the buffer, so an interrupt
/// never reaches a buffer that has been freed.
#[derive(Debug, Default)]
pub(crate) struct Interrupter {
    target: Mutex<Option<Target>>,
}

#[derive(Debug)]
struct Target {
    api: &'static Api,
    buf: NonNull<c_void>,
    recv: bool,
}

// SAFETY: a Target is only used, under the Interrupter's lock, to call
// ccol_gloo_buffer_abort_wait, which Gloo allows from any thread (it takes
// the buffer's mutex); the buffer is alive while the Target is set
// (`with_target` borrows it and clears the Target before returning).
unsafe impl Send for Target {}

/// Clears the target when `with_target` ends, also on unwind.
struct ClearTarget<'a>(&'a Mutex<Option<Target>>);

impl Drop for ClearTarget<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

impl Interrupter {
    /// Runs `f` with `buf`'s receive (`recv`) or send wait as the target of
    /// [`Interrupter::interrupt`]; the target is cleared before this returns.
    pub(crate) fn with_target<R>(&self, buf: &Buffer, recv: bool, f: impl FnOnce() -> R) -> R {
        *self.target.lock().unwrap_or_else(PoisonError::into_inner) = Some(Target {
            api: buf.api,
            buf: buf.ptr,
            recv,
        });
        let _clear = ClearTarget(&self.target);
        f()
    }

    /// Interrupts the target's wait in progress (or its next one); the wait
    /// returns [`ABORTED`](super::ABORTED). Returns whether a target was set.
    pub(crate) fn interrupt(&self) -> bool {
        let target = self.target.lock().unwrap_or_else(PoisonError::into_inner);
        match &*target {
            Some(t) => {
                // SAFETY: the buffer is alive while it is the target (the
                // lock is held, and `with_target` clears the target under it
                // before its borrow of the buffer ends);
                // ccol_gloo_buffer_abort_wait catches exceptions.
                unsafe { (t.api.buffer_abort_wait)(t.buf.as_ptr(), i32::from(t.recv)) };
                true
            }
            None => false,
        }
    }
}
