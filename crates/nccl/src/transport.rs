//! [`NcclTransport`]: core's `Transport` over one NCCL communicator per
//! rank, and [`Communicator`], the owned communicator handle.
//!
//! Bytes are staged through two device buffers per transport (grown on
//! demand, never shrunk). Every collective: copy in (host → device), enqueue
//! the NCCL call on the transport's own non-blocking stream, record an
//! event, then poll the event and `ncclCommGetAsyncError` until done or the
//! deadline (crate docs, "Deadlines"); copy out only after the stream is
//! idle (a device → pageable-host copy blocks the calling thread).

use crate::sys::{Comm, Cuda, NcclLib, IN_PROGRESS, SUCCESS};
use crate::{NcclError, UniqueId};
use compiler_collectives_core::transport::toolkit::PostMortem;
use compiler_collectives_core::{
    Deadline, DecodeError, Error, ErrorKind, FirstFailure, PeerLoss, Poison, Store,
};
use cudarc::nccl::sys::ncclComm_t;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Knobs of [`NcclTransport::connect`]. Additive: build with
/// `NcclOptions::default().with_…` (one setter per field, documented there).
#[derive(Clone, Debug, derive_setters::Setters)]
#[setters(prefix = "with_", into)]
#[non_exhaustive]
pub struct NcclOptions {
    /// CUDA device ordinal of this rank (default `None`: `LOCAL_RANK`, else
    /// 0). `with_device(usize)` sets `Some`.
    #[setters(strip_option)]
    pub device: Option<usize>,
    /// Deadline of the bootstrap: fetching the unique id and creating the
    /// communicator (default 300 s, like an exchange).
    pub connect_timeout: Duration,
    /// How long, after a timeout, a rank waits for the others' check-ins
    /// in the store before naming the absent ones (default 250 ms).
    pub post_mortem: Duration,
    /// Prefix of every store key of this group (default `ccol/nccl`).
    pub prefix: String,
    /// The NCCL library to use (default `None`: [`crate::library`]).
    /// `with_lib(Arc<NcclLib>)` sets `Some`.
    #[setters(strip_option)]
    pub lib: Option<Arc<NcclLib>>,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            device: None,
            connect_timeout: compiler_collectives_core::protocol::DEFAULT_TIMEOUT,
            post_mortem: Duration::from_millis(250),
            prefix: "ccol/nccl".into(),
            lib: None,
        }
    }
}

/// How a wait on NCCL work ended badly.
enum WaitFail {
    Deadline,
    Nccl(c_int),
    Cuda(cudarc::driver::DriverError),
    /// A peer left the group (shut down or aborted) before completing this
    /// operation; the post-mortem names every rank that is not in it.
    PeerLeft,
}

/// What a waiting rank checks now and then: whether a peer left the group.
type Watch<'a> = &'a mut dyn FnMut() -> bool;

/// First look at the store after this long in one operation, then every
/// [`WATCH_EVERY`]: operations that complete in time never touch the store.
const WATCH_AFTER: Duration = Duration::from_millis(20);
const WATCH_EVERY: Duration = Duration::from_millis(100);

/// Sleeps 50 µs, doubling up to 1 ms, never past `deadline`.
fn backoff(delay: &mut Duration, deadline: Deadline) {
    std::thread::sleep((*delay).min(deadline.remaining()));
    *delay = (*delay * 2).min(Duration::from_millis(1));
}

/// Polls a non-blocking communicator until it leaves `ncclInProgress`.
fn wait_ready(comm: &Comm, deadline: Deadline) -> Result<(), WaitFail> {
    let mut delay = Duration::from_micros(50);
    loop {
        match comm.state() {
            SUCCESS => return Ok(()),
            IN_PROGRESS => {}
            code => return Err(WaitFail::Nccl(code)),
        }
        if deadline.expired() {
            return Err(WaitFail::Deadline);
        }
        backoff(&mut delay, deadline);
    }
}

/// One NCCL communicator, owned. Drop finalizes and destroys it (bounded:
/// after 5 s of a finalize that does not complete, it aborts instead);
/// Drop never panics.
pub struct Communicator {
    /// `None` only once released (by `abort` or Drop).
    comm: Option<Comm>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("comm", &self.raw())
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// Creates this rank's communicator with `ncclCommInitRankConfig`
    /// (non-blocking unless `blocking`), polling until it is ready or
    /// `deadline`, when it is aborted.
    ///
    /// This is the result-level call: it needs no CUDA stream, and the
    /// calling thread's current CUDA device is the one used. On a machine
    /// without a GPU it returns NCCL's `ncclUnhandledCudaError`.
    ///
    /// # Errors
    /// [`Error::Backend`] with [`NcclError::Nccl`] (code and last-error
    /// text); [`Error::Timeout`] (no ranks named) at the deadline;
    /// [`Error::InvalidArgument`] for `rank >= world`.
    pub fn init(
        lib: Arc<NcclLib>,
        id: &UniqueId,
        world: u32,
        rank: u32,
        blocking: bool,
        deadline: Deadline,
    ) -> Result<Self, Error> {
        if rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not below world size {world}"
            )));
        }
        let to_int = |v: u32| {
            c_int::try_from(v)
                .map_err(|_| Error::InvalidArgument(format!("{v} does not fit NCCL's int")))
        };
        let start = Instant::now();
        let comm = Comm::init(lib, id.to_raw(), to_int(world)?, to_int(rank)?, blocking)?;
        let waited = wait_ready(&comm, deadline);
        let this = Communicator { comm: Some(comm) };
        match waited {
            Ok(()) => Ok(this),
            Err(fail) => Err(this.fail(fail, "ncclCommInitRankConfig", start)),
        }
    }

    /// The raw handle (null once released).
    pub fn raw(&self) -> ncclComm_t {
        self.comm.as_ref().map_or(std::ptr::null_mut(), Comm::raw)
    }

    /// The live communicator.
    fn handle(&self) -> Option<&Comm> {
        self.comm.as_ref()
    }

    /// Aborts after a failed wait and turns it into an error.
    fn fail(self, fail: WaitFail, operation: &str, start: Instant) -> Error {
        let err = match fail {
            WaitFail::Deadline => Error::timeout(Vec::new(), Vec::new(), start.elapsed()),
            WaitFail::Nccl(code) => match self.handle() {
                Some(c) => c.error(code, operation).into(),
                None => released(),
            },
            WaitFail::Cuda(e) => NcclError::cuda(operation, &e).into(),
            WaitFail::PeerLeft => Error::peer_lost(Vec::new(), "a peer left the group"),
        };
        self.abort();
        err
    }

    /// `ncclCommAbort`: frees the communicator at once, interrupting NCCL
    /// work in flight. Peers blocked in a collective with this rank are not
    /// told (they reach their own deadlines).
    pub fn abort(mut self) {
        if let Some(c) = self.comm.take() {
            let rc = c.abort();
            if rc != SUCCESS && rc != IN_PROGRESS {
                tracing::debug!(code = rc, "ncclCommAbort failed");
            }
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let Some(comm) = self.comm.take() else {
            return;
        };
        let deadline = Deadline::after(Duration::from_secs(5));
        let rc = comm.finalize();
        let finalized = (rc == SUCCESS || rc == IN_PROGRESS) && wait_ready(&comm, deadline).is_ok();
        let rc = if finalized {
            comm.destroy()
        } else {
            comm.abort()
        };
        if rc != SUCCESS && rc != IN_PROGRESS {
            tracing::debug!(code = rc, "releasing the NCCL communicator failed");
        }
    }
}

/// Polls the event recorded after the NCCL call, the communicator, and
/// (after [`WATCH_AFTER`], every [`WATCH_EVERY`]) `watch`.
fn wait_done(
    cuda: &Cuda,
    comm: &Comm,
    deadline: Deadline,
    watch: Watch<'_>,
) -> Result<(), WaitFail> {
    cuda.record().map_err(WaitFail::Cuda)?;
    let mut delay = Duration::from_micros(20);
    let start = Instant::now();
    let mut next_watch = WATCH_AFTER;
    loop {
        if cuda.query().map_err(WaitFail::Cuda)? {
            return Ok(());
        }
        match comm.state() {
            SUCCESS | IN_PROGRESS => {}
            code => return Err(WaitFail::Nccl(code)),
        }
        if deadline.expired() {
            return Err(WaitFail::Deadline);
        }
        if start.elapsed() >= next_watch {
            next_watch = start.elapsed() + WATCH_EVERY;
            if watch() {
                return Err(WaitFail::PeerLeft);
            }
        }
        backoff(&mut delay, deadline);
    }
}

/// After an abort: gives the stream up to 500 ms to drain; marks the
/// resources leaked when it does not.
fn drain_after_abort(cuda: &mut Cuda) {
    let until = Instant::now() + Duration::from_millis(500);
    loop {
        match cuda.query() {
            Ok(true) => return,
            Ok(false) => {}
            Err(_) => break,
        }
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    tracing::warn!("NCCL work still running after abort: its buffers are leaked");
    cuda.mark_leaked();
}

/// Everything behind the transport's lock.
struct Inner {
    // Field order = drop order: the communicator before the CUDA resources.
    comm: Option<Communicator>,
    cuda: Cuda,
    /// Collective operations issued so far.
    op: u64,
    /// Collective operations completed so far (published when leaving).
    done: u64,
    /// Why the transport can no longer be used: the first failure's kind
    /// and message.
    dead: Option<Poison>,
}

impl Inner {
    /// The communicator, unless the transport failed or was shut down.
    fn usable(&self) -> Result<&Comm, Error> {
        if let Some(poison) = &self.dead {
            return Err(poison.error());
        }
        self.comm
            .as_ref()
            .and_then(Communicator::handle)
            .ok_or_else(released)
    }
}

/// The error of a call after the communicator was released.
fn released() -> Error {
    Error::unusable(
        FirstFailure::Error(ErrorKind::Backend),
        "the NCCL communicator was released",
    )
}

/// core's `Transport` over NCCL (module docs; deadlines in the crate docs).
///
/// - `all_gather`: two NCCL all_gathers — 16 bytes per rank (length and
///   this rank's `max_bytes`), then every buffer padded to the longest.
///   A buffer over any rank's limit is refused by every rank after the
///   first round, naming the sender.
/// - `all_gather_fixed`: one NCCL all_gather. Every rank must pass the same
///   length (the protocol's digests are fixed-size); NCCL cannot detect a
///   mismatch, which ends at the deadline at worst.
/// - `broadcast`: core's, over `all_gather`.
/// - `barrier`: one 1-byte NCCL all_gather.
/// - `send`/`recv`: through the store, not NCCL (NCCL's point-to-point
///   calls complete only when both sides are inside one group, which the
///   trait's send-now-receive-later contract cannot promise; the protocol
///   never uses them). One store `set` per message, one `get` and `delete`
///   per receive; per (peer, tag) in order. A message is read whole before
///   `max_bytes` is checked (core's `Store` has no bounded read).
/// - `shutdown`/`abort`: record `left/<rank>` in the store (how, and how
///   many operations this rank completed) and release the communicator.
///   NCCL has no remote notice, so a peer learns it from the store: a rank
///   whose operation has waited 20 ms looks for such keys every 100 ms; on
///   one it waits until every rank is accounted for and fails with
///   [`Error::PeerLost`] (reason `Shutdown` or `Aborted`) naming all the
///   ranks that left before completing that operation, or at its deadline
///   with [`Error::Timeout`] naming those and the silent ones. Operations
///   that complete in time never touch the store.
pub struct NcclTransport {
    rank: u32,
    world: u32,
    lib: Arc<NcclLib>,
    store: Arc<dyn Store>,
    /// Prefix of every store key of this group.
    prefix: String,
    post_mortem: PostMortem,
    /// How long after a deadline a timed-out rank waits for the others'
    /// check-ins ([`NcclOptions::post_mortem`]).
    window: Duration,
    inner: Mutex<Inner>,
    p2p: Mutex<HashMap<(bool, u32, u32), u64>>,
}

impl std::fmt::Debug for NcclTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclTransport")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("nccl", &self.lib.version_string())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// `LOCAL_RANK` as core's `RunEnv` parses it; `None` (device 0) when
/// torchrun's variables are missing or invalid.
fn local_rank() -> Option<usize> {
    let env = compiler_collectives_core::RunEnv::from_env().ok()?;
    usize::try_from(env.local_rank).ok()
}

impl NcclTransport {
    /// Joins the group: checks library, driver and device (this rank's is
    /// `options.device`, else `LOCAL_RANK`, else 0); rank 0 publishes the
    /// unique id under `<prefix>/unique-id`, the others fetch it; then the
    /// communicator is created (non-blocking) and this rank's arrival is
    /// checked by the same post-mortem as any operation.
    ///
    /// Cost: one store `set` (rank 0) or `get` (others), NCCL's own
    /// bootstrap, device buffers of 256 bytes each.
    ///
    /// # Errors
    /// The probe's typed errors as [`Error::Backend`] (no library, no
    /// driver, no device, device out of range); [`Error::Timeout`] if the id
    /// or a rank does not come by `connect_timeout`;
    /// [`Error::InvalidArgument`] for `rank >= world`.
    pub fn connect(
        store: Arc<dyn Store>,
        rank: u32,
        world: u32,
        options: &NcclOptions,
    ) -> Result<Self, Error> {
        if world == 0 || rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not below world size {world}"
            )));
        }
        let lib = match &options.lib {
            Some(l) => Arc::clone(l),
            None => crate::library()?,
        };
        let count = crate::device_count()?;
        let device = options.device.or_else(local_rank).unwrap_or(0);
        if device >= count {
            return Err(NcclError::DeviceOutOfRange { device, count }.into());
        }
        let deadline = Deadline::after(options.connect_timeout);
        let key = format!("{}/unique-id", options.prefix);
        let id = if rank == 0 {
            crate::publish_unique_id(&lib, store.as_ref(), &key, deadline)?
        } else {
            crate::fetch_unique_id(store.as_ref(), &key, deadline)?
        };
        let cuda = Cuda::new(device)?;
        let start = Instant::now();
        let comm = Communicator::init(Arc::clone(&lib), &id, world, rank, false, deadline);
        let this = NcclTransport {
            rank,
            world,
            lib,
            post_mortem: PostMortem::new(Arc::clone(&store), options.prefix.clone(), rank, world),
            store,
            prefix: options.prefix.clone(),
            window: options.post_mortem,
            inner: Mutex::new(Inner {
                comm: None,
                cuda,
                op: 0,
                done: 0,
                dead: None,
            }),
            p2p: Mutex::new(HashMap::new()),
        };
        match comm {
            Ok(c) => {
                this.lock().comm = Some(c);
                Ok(this)
            }
            Err(Error::Timeout { .. }) => {
                let absent = this
                    .post_mortem
                    .account(0, Instant::now() + this.window, None);
                Err(absent
                    .into_error(false, start.elapsed(), "")
                    .unwrap_or_else(|| Error::timeout(Vec::new(), Vec::new(), start.elapsed())))
            }
            Err(e) => Err(e),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave NCCL state half-made
        // that later calls would trust (they check `dead`), so poisoning is
        // ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One NCCL collective: `input` to the send buffer, `enqueue(comm,
    /// cuda)` (between the staging buffers, on the transport's stream),
    /// wait, `out_len` bytes back from the receive buffer.
    fn collective(
        &self,
        what: &str,
        input: &[u8],
        out_len: usize,
        deadline: Deadline,
        enqueue: impl FnOnce(&Comm, &Cuda) -> c_int,
    ) -> Result<Vec<u8>, Error> {
        let start = Instant::now();
        let mut inner = self.lock();
        let inner = &mut *inner;
        inner.usable()?;
        if let Err(e) = inner.cuda.stage_in(input, out_len) {
            inner.dead = Some(Poison::new(
                FirstFailure::Error(ErrorKind::Backend),
                e.to_string(),
            ));
            return Err(e.into());
        }
        self.run_op(inner, what, (start, deadline), enqueue)?;
        let mut out = vec![0u8; out_len];
        // The stream is idle: the copy blocks only for itself.
        inner.cuda.copy_out(&mut out).map_err(|e| {
            inner.dead = Some(Poison::new(
                FirstFailure::Error(ErrorKind::Backend),
                e.to_string(),
            ));
            Error::from(e)
        })?;
        Ok(out)
    }

    /// Enqueues one NCCL operation on the staging buffers and waits for it
    /// until `deadline` (module docs); on failure the transport is left
    /// unusable and the error counts from `start`.
    fn run_op(
        &self,
        inner: &mut Inner,
        what: &str,
        (start, deadline): (Instant, Deadline),
        enqueue: impl FnOnce(&Comm, &Cuda) -> c_int,
    ) -> Result<(), Error> {
        inner.usable()?;
        inner.op += 1;
        let op = inner.op;
        let Some(comm) = inner.comm.as_ref().and_then(Communicator::handle) else {
            return Err(released());
        };
        let rc = enqueue(comm, &inner.cuda);
        let waited = if rc == SUCCESS || rc == IN_PROGRESS {
            self.wait_op(&inner.cuda, comm, op, deadline)
        } else {
            Err(WaitFail::Nccl(rc))
        };
        match waited {
            Ok(()) => {
                inner.done = op;
                Ok(())
            }
            Err(fail) => Err(self.fail_op(inner, fail, what, op, (start, deadline))),
        }
    }

    /// After a failed wait: aborts the communicator, lets the stream drain,
    /// names the ranks not in operation `op` (the post-mortem: after a
    /// timeout it waits [`NcclOptions::post_mortem`] for the others'
    /// check-ins; after a peer left, until every rank is accounted for or
    /// the deadline plus that window), and marks the transport unusable.
    fn fail_op(
        &self,
        inner: &mut Inner,
        fail: WaitFail,
        what: &str,
        op: u64,
        (start, deadline): (Instant, Deadline),
    ) -> Error {
        let until = match fail {
            WaitFail::Deadline => {
                // Checked in first, so that peers' windows see it early.
                self.post_mortem.check_in(op);
                Some(Instant::now() + self.window)
            }
            WaitFail::PeerLeft => Some(Instant::now().max(deadline.instant()) + self.window),
            WaitFail::Nccl(_) | WaitFail::Cuda(_) => None,
        };
        let err = match fail {
            WaitFail::Nccl(code) => {
                let comm = inner.comm.as_ref().and_then(Communicator::handle);
                Some(Error::from(self.lib.error(code, what, comm)))
            }
            WaitFail::Cuda(e) => Some(Error::from(NcclError::cuda(what, &e))),
            WaitFail::Deadline | WaitFail::PeerLeft => None,
        };
        if let Some(c) = inner.comm.take() {
            c.abort();
        }
        drain_after_abort(&mut inner.cuda);
        let err = match (err, until) {
            (Some(e), _) => e,
            (None, Some(until)) => {
                let detail = format!("it left before NCCL operation #{op}");
                self.post_mortem
                    .account(op, until, None)
                    .into_error(false, start.elapsed(), &detail)
                    .unwrap_or_else(|| Error::timeout(Vec::new(), Vec::new(), start.elapsed()))
            }
            (None, None) => Error::timeout(Vec::new(), Vec::new(), start.elapsed()),
        };
        inner.dead = Some(Poison::of(&err));
        err
    }

    /// Waits for operation `op`, watching for peers that leave.
    fn wait_op(
        &self,
        cuda: &Cuda,
        comm: &Comm,
        op: u64,
        deadline: Deadline,
    ) -> Result<(), WaitFail> {
        wait_ready(comm, deadline)?;
        let others = self.post_mortem.others();
        wait_done(cuda, comm, deadline, &mut || {
            !self.post_mortem.left_before(op, &others).is_empty()
        })
    }

    /// The floor of every operation, for benchmarks: `iters` NCCL
    /// all_gathers of `bytes` per rank between buffers already on the
    /// device (no host copies, no lengths round), each waited for as the
    /// transport waits. Returns each one's time. Every rank must call it
    /// with the same arguments.
    ///
    /// # Errors
    /// As [`Transport::all_gather`](compiler_collectives_core::Transport::all_gather).
    pub fn raw_all_gather_floor(
        &self,
        bytes: usize,
        iters: u32,
        deadline: Deadline,
    ) -> Result<Vec<Duration>, Error> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.usable()?;
        let world = self.world as usize;
        inner.cuda.reserve(bytes, bytes.saturating_mul(world))?;
        let mut times = Vec::with_capacity(iters as usize);
        for _ in 0..iters {
            let start = Instant::now();
            self.run_op(inner, "ncclAllGather", (start, deadline), |comm, cuda| {
                comm.all_gather(cuda, bytes)
            })?;
            times.push(start.elapsed());
        }
        Ok(times)
    }

    fn all_gather_raw(&self, data: &[u8], deadline: Deadline) -> Result<Vec<u8>, Error> {
        let count = data.len();
        let total = count.checked_mul(self.world as usize).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{count} bytes from each of {} ranks do not fit in memory",
                self.world
            ))
        })?;
        self.collective("ncclAllGather", data, total, deadline, |comm, cuda| {
            comm.all_gather(cuda, count)
        })
    }

    /// `peer` is another rank and this transport is still usable (not shut
    /// down, aborted or failed): point-to-point goes through the store, so
    /// it checks that itself.
    fn check_usable_peer(&self, peer: u32) -> Result<(), Error> {
        compiler_collectives_core::transport::toolkit::check_peer(peer, self.rank, self.world)?;
        match &self.lock().dead {
            Some(poison) => Err(poison.error()),
            None => Ok(()),
        }
    }

    fn p2p_key(&self, src: u32, dst: u32, tag: u32, n: u64) -> String {
        format!("{}/p2p/{src}-{dst}-{tag}/{n}", self.prefix)
    }

    fn next_p2p(&self, recv: bool, peer: u32, tag: u32) -> u64 {
        let mut m = self.p2p.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry((recv, peer, tag)).or_insert(0);
        let cur = *n;
        *n += 1;
        cur
    }
}

impl compiler_collectives_core::Transport for NcclTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world
    }

    fn backend(&self) -> &'static str {
        "nccl"
    }

    /// NCCL itself has none, but the group's store gives two: the
    /// post-mortem names missing ranks, `left/<rank>` keys tell waiting
    /// peers. Point-to-point goes through the store (set, get, delete per
    /// message), so it is not cheap.
    fn capabilities(&self) -> compiler_collectives_core::Capabilities {
        compiler_collectives_core::Capabilities::none()
            .with_names_missing_ranks()
            .with_tells_peers_it_left()
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>, Error> {
        compiler_collectives_core::transport::toolkit::all_gather_varlen(
            data,
            max_bytes,
            deadline,
            |b, d| self.all_gather_raw(b, d),
        )
    }

    fn all_gather_fixed(&self, data: &[u8], deadline: Deadline) -> Result<Vec<u8>, Error> {
        if data.is_empty() {
            return Ok(Vec::new());
        }
        self.all_gather_raw(data, deadline)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), Error> {
        self.all_gather_raw(&[1], deadline).map(|_| ())
    }

    fn send(&self, peer: u32, tag: u32, data: &[u8], deadline: Deadline) -> Result<(), Error> {
        self.check_usable_peer(peer)?;
        let n = self.next_p2p(false, peer, tag);
        self.store
            .set(&self.p2p_key(self.rank, peer, tag, n), data, deadline)
    }

    fn recv(
        &self,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<u8>, Error> {
        self.check_usable_peer(peer)?;
        let n = self.next_p2p(true, peer, tag);
        let key = self.p2p_key(peer, self.rank, tag, n);
        let v = match self.store.get_within(&key, max_bytes, deadline) {
            Ok(v) => v,
            Err(Error::Timeout { waited, .. }) => {
                return Err(Error::timeout(vec![peer], Vec::new(), waited));
            }
            Err(Error::Decode {
                rank: None,
                reason: DecodeError::TooLarge { len, .. },
            }) => {
                let _ = self.store.delete(&key, deadline);
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                return Err(Error::message_too_large(peer, len, max_bytes));
            }
            Err(other) => return Err(other),
        };
        let _ = self.store.delete(&key, deadline);
        Ok(v)
    }

    fn shutdown(&self) -> Result<(), Error> {
        let mut inner = self.lock();
        if inner.dead.is_none() {
            inner.dead = Some(Poison::new(
                FirstFailure::Shutdown,
                format!("rank {} shut its transport down", self.rank),
            ));
            self.post_mortem.leave(PeerLoss::Shutdown, inner.done);
        }
        if let Some(c) = inner.comm.take() {
            if inner.cuda.make_current().is_ok() {
                drop(c);
            } else {
                c.abort();
            }
        }
        Ok(())
    }

    fn abort(&self) -> Result<(), Error> {
        let mut inner = self.lock();
        self.post_mortem.leave(PeerLoss::Aborted, inner.done);
        inner.dead = Some(Poison::new(
            FirstFailure::Abort,
            format!("rank {} aborted its transport", self.rank),
        ));
        if let Some(c) = inner.comm.take() {
            let _ = inner.cuda.make_current();
            c.abort();
        }
        Ok(())
    }
}
