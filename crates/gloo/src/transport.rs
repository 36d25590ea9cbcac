//! [`GlooTransport`]: core's [`Transport`] over a Gloo TCP full-mesh context.
//!
//! Every operation is built from Gloo's point-to-point unbound buffers, so
//! that a deadline can name the ranks that did not arrive:
//! - a collective (all_gather, barrier; broadcast is core's, over
//!   all_gather) is operation `k` of this rank; each sender posts a 16-byte
//!   header (magic, flags, length) on slot `2k` to every receiver, followed
//!   in the same message by its bytes when they fit [`inline_capacity`]
//!   (one message per peer: the common small collective costs one wake-up,
//!   not two), else its bytes on slot `2k + 1` (`framing` has the layout
//!   and every slot);
//!   receivers wait for the headers (the ranks whose header has not come are
//!   the missing ranks), check the announced lengths against `max_bytes`,
//!   then receive the bytes that did not come inline. The receives of
//!   collective `k + 1`'s headers are posted as soon as collective `k` ends
//!   (for collective 0, at connect): Gloo's TCP pair holds a send until its
//!   receiver has posted the matching receive and told the sender so, so a
//!   receive posted only on arrival costs every late rank a round trip
//!   through each peer's event loop (three wake-ups, not one, on a loaded
//!   machine); posted ahead, a sender's header goes out at once;
//! - `send`/`recv` use one slot pair per message, counted per (peer, tag);
//! - `shutdown` records in the store that this rank left
//!   ([`left_key`](departures::left_key)), posts a header with the shutdown
//!   flag for the next operation to every peer (peers already waiting there
//!   fail at once naming this rank), then closes the connections; a peer
//!   that finds a pair broken reads the record before calling its rank dead
//!   (one that arrives late, after the close, still names this rank as shut
//!   down).
//!
//! A Gloo timeout closes every pair of the context, so after any error the
//! transport is unusable; buffers whose transfers may still be in flight are
//! leaked rather than freed.
//!
//! This file holds the transport and its collective engine; beside it:
//! - `framing` — the header and the slots (the wire format);
//! - `accounting` — which ranks are missing, and how each went missing;
//! - `departures` — the records leaving ranks write in the store;
//! - `watchdog` — the thread that interrupts a wait at its deadline, and
//!   [`GlooInterrupt`];
//! - `reaper` — the thread that frees send buffers once their receivers
//!   took them;
//! - `pool` — the buffers of one operation, leaked unless it completed.

mod accounting;
mod departures;
mod framing;
mod pool;
mod reaper;
mod watchdog;

pub use watchdog::GlooInterrupt;

use crate::store::GlooStore;
use crate::sys::{self, Buffer, Context};
use crate::GlooError;
use accounting::{arrived_key, rendezvous_timeout};
use compiler_collectives_core::{
    transport::toolkit, Deadline, DecodeError, Error, ErrorKind, FirstFailure, PeerLoss, Poison,
    Transport,
};
use departures::Records;
use framing::{
    data_slot, header, header_slot, inline_capacity, p2p_slot, parse_header, FLAG_ABORT, FLAG_DATA,
    FLAG_FAILED, FLAG_SHUTDOWN, HEADER, SENTINEL_SLOT,
};
use pool::Pool;
use reaper::{Failure, Outgoing, Reaper};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use watchdog::Watchdog;

const BACKEND: &str = "gloo";
/// How long `shutdown` waits for its notices to leave.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(300);

/// Options of [`GlooTransport::connect`]. Built with
/// `GlooOptions::default().with_…` (one setter per field, documented there).
#[derive(Clone, Debug, derive_setters::Setters)]
#[setters(prefix = "with_", into)]
#[non_exhaustive]
pub struct GlooOptions {
    /// The address peers connect to for this rank (default `127.0.0.1`).
    pub hostname: String,
    /// Deadline of the rendezvous (default core's
    /// [`DEFAULT_TIMEOUT`](compiler_collectives_core::protocol::DEFAULT_TIMEOUT)).
    pub connect_timeout: Duration,
    /// Key prefix of this process group in the store (default `"ccol"`);
    /// two groups on one store need different prefixes.
    pub prefix: String,
}

impl Default for GlooOptions {
    fn default() -> Self {
        GlooOptions {
            hostname: "127.0.0.1".into(),
            connect_timeout: compiler_collectives_core::protocol::DEFAULT_TIMEOUT,
            prefix: "ccol".into(),
        }
    }
}

/// Where the header messages of collectives arrive: one place of
/// `16 + inline` bytes per rank, with a standing receive on a never-used
/// slot of every pair.
#[derive(Debug)]
struct Inbox {
    buf: Buffer,
    /// Rank `p`'s element: the header receive of the next collective is
    /// already posted on `p`'s pair (at the end of the one before; see the
    /// module docs). False where posting it failed: the next collective
    /// posts it again and accounts for the pair's error.
    posted: Vec<bool>,
}

#[derive(Debug, Default)]
struct State {
    /// `None` after an error.
    inbox: Option<Inbox>,
    op: u64,
    /// The collective that failed, if one did: this rank completed only
    /// the ones before it (what its departure record says).
    failed_op: Option<u64>,
    sent: HashMap<(u32, u32), u64>,
    received: HashMap<(u32, u32), u64>,
    shut: bool,
}

/// One rank's end of a Gloo TCP process group. See the module docs.
#[derive(Debug)]
pub struct GlooTransport {
    rank: u32,
    world: u32,
    ctx: Context,
    state: Mutex<State>,
    failed: Failure,
    reaper: Mutex<Reaper>,
    watchdog: Watchdog,
    /// [`inline_capacity`] of this world.
    inline: usize,
    /// The group's view of the rendezvous store (under its prefix), where a
    /// leaving rank records how it left.
    ///
    /// Locked: Gloo's stores are not all safe to call from two threads at
    /// once (its RedisStore shares one connection).
    store: Arc<Mutex<GlooStore>>,
}

/// One collective, as its caller describes it: this rank sends `data` to
/// `send_to` and receives from each of `recv_from` what it sent (its length
/// known only from its header, at most `max_bytes`), all by `deadline`.
#[derive(Clone, Copy, Debug)]
struct Collective<'a> {
    data: &'a [u8],
    send_to: &'a [u32],
    recv_from: &'a [u32],
    max_bytes: usize,
    deadline: Deadline,
}

/// A collective under way: `op` as this rank's collective number `k`,
/// which gives its slots ([`header_slot`], [`data_slot`]).
#[derive(Clone, Copy, Debug)]
struct Round<'a> {
    k: u64,
    op: Collective<'a>,
}

/// What went wrong while waiting, before it is turned into a core error.
enum Fail {
    Core(Error),
    Gloo(GlooError, Vec<u32>),
}

impl Inbox {
    /// Clears every peer's header and posts the header receive of
    /// collective `k` on every peer's pair (see the module docs). Called
    /// when no header receive is in flight (only the standing ones, which
    /// never write); a pair on which posting fails is left for collective
    /// `k` to post on again and account for.
    fn post_next(&mut self, rank: u32, k: u64, place: usize) {
        let peers = (0u32..).take(self.posted.len()).filter(|&p| p != rank);
        for p in peers.clone() {
            let at = p as usize * place;
            self.buf.bytes_mut()[at..at + HEADER].fill(0);
        }
        for p in peers {
            let ok = self
                .buf
                .recv(p, header_slot(k), p as usize * place, place)
                .is_ok();
            self.posted[p as usize] = ok;
        }
    }
}

impl GlooTransport {
    /// Joins a process group of `world_size` ranks as `rank`, rendezvousing
    /// through `store` under `options.prefix`.
    ///
    /// Cost: one store `set` and `world_size − 1` store waits, then one TCP
    /// connection per peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad rank or world size;
    /// [`Error::Timeout`] if peers do not rendezvous within
    /// `options.connect_timeout`; [`Error::Backend`] for Gloo's errors (with
    /// its message).
    pub fn connect(
        store: &GlooStore,
        rank: u32,
        world_size: u32,
        options: &GlooOptions,
    ) -> Result<Self, Error> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is not in a world of {world_size}"
            )));
        }
        let rank_i =
            i32::try_from(rank).map_err(|_| Error::InvalidArgument("rank too large".into()))?;
        let world_i = i32::try_from(world_size)
            .map_err(|_| Error::InvalidArgument("world too large".into()))?;
        // Gloo's PrefixStore joins prefix and key with '/'.
        let scoped = store.prefixed(&options.prefix)?;
        let host = sys::cstring(&options.hostname, "hostname")?;
        let start = Instant::now();
        // Each rank says it came before Gloo's own rendezvous, so that a
        // rendezvous that times out names the ranks that never did.
        scoped.set(&arrived_key(rank), b"1")?;
        let ctx = Context::connect(
            scoped.handle(),
            rank_i,
            world_i,
            &host,
            options.connect_timeout,
        )
        .map_err(|e| {
            if e.status() == Some(sys::TIMEOUT) {
                tracing::debug!(error = %e, "gloo rendezvous timed out");
                rendezvous_timeout(store, &scoped, &options.prefix, rank, world_size, start)
            } else {
                e.into()
            }
        })?;
        let failed: Failure = Arc::default();
        let place = HEADER + inline_capacity(world_size);
        let buf = Buffer::new(&ctx, vec![0u8; world_size as usize * place])?;
        for p in (0..world_size).filter(|&p| p != rank) {
            buf.recv(p, SENTINEL_SLOT, p as usize * place, 1)?;
        }
        let mut inbox = Inbox {
            buf,
            posted: vec![false; world_size as usize],
        };
        inbox.post_next(rank, 0, place);
        Ok(GlooTransport {
            rank,
            world: world_size,
            ctx,
            state: Mutex::new(State {
                inbox: Some(inbox),
                ..State::default()
            }),
            reaper: Mutex::new(Reaper::start(rank, Arc::clone(&failed))),
            watchdog: Watchdog::start(rank),
            inline: inline_capacity(world_size),
            failed,
            store: Arc::new(Mutex::new(scoped)),
        })
    }

    /// A handle that interrupts this transport's waits from any thread
    /// ([`GlooInterrupt::interrupt`]), e.g. on Ctrl-C: the wait in progress
    /// ends at once instead of at its deadline.
    pub fn interrupter(&self) -> GlooInterrupt {
        self.watchdog.interrupt_handle()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_peer(&self, peer: u32) -> Result<(), Error> {
        compiler_collectives_core::transport::toolkit::check_peer(peer, self.rank, self.world)
    }

    fn peers(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.world).filter(move |&r| r != self.rank)
    }

    fn begin(&self, st: &mut State) -> Result<u64, Error> {
        if st.shut {
            return Err(toolkit::shut_down(self.rank));
        }
        if let Some(poison) = self.failure() {
            return Err(poison.error());
        }
        let k = st.op;
        st.op += 1;
        Ok(k)
    }

    fn failure(&self) -> Option<Poison> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn fail(&self, st: &mut State, f: Fail, waited: Duration) -> Error {
        let e = match f {
            Fail::Core(mut e) => {
                if let Error::Timeout { waited: w, .. } = &mut e {
                    *w = waited;
                }
                e
            }
            Fail::Gloo(g, missing) => match g.status() {
                Some(sys::TIMEOUT | sys::ABORTED) => Error::timeout(missing, Vec::new(), waited),
                Some(sys::IO) if !missing.is_empty() => {
                    // A rank whose pair broke left as its record says (it
                    // closed before this rank got here), else died.
                    let mut records = Records::default();
                    records.fetch(&self.store, &missing, st.op);
                    let lost = missing
                        .into_iter()
                        .map(|r| (r, records.departed(r).unwrap_or(PeerLoss::Disconnected)))
                        .collect();
                    Error::peer_lost(lost, g.to_string())
                }
                _ => g.into(),
            },
        };
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_none() {
            *failed = Some(Poison::of(&e));
            self.tell_peers_it_failed(st.op);
        }
        e
    }

    /// Posts [`FLAG_FAILED`] as this rank's header of operation `next` to
    /// every peer and leaves the buffer to Gloo (peers that never reach
    /// that operation never take it).
    fn tell_peers_it_failed(&self, next: u64) {
        if let Ok(hdr) = Buffer::new(&self.ctx, header(FLAG_FAILED, 0)) {
            for p in self.peers() {
                let _ = hdr.send(p, header_slot(next), 0, HEADER);
            }
            hdr.leak();
        }
    }

    /// Runs `op` as this rank's next collective. Returns the received
    /// buffers, index = rank (empty for ranks this rank did not receive
    /// from).
    fn collective(&self, op: Collective<'_>) -> Result<Vec<Vec<u8>>, Error> {
        let start = Instant::now();
        let mut st = self.lock();
        let k = self.begin(&mut st)?;
        let Some(mut inbox) = st.inbox.take() else {
            let poison = self.failure().unwrap_or_else(|| {
                Poison::new(
                    FirstFailure::Error(ErrorKind::Backend),
                    "the Gloo transport lost its inbox after an earlier error",
                )
            });
            return Err(poison.error());
        };
        let r = self.collective_inner(&mut inbox, &Round { k, op });
        match r {
            Ok(v) => {
                st.inbox = Some(inbox);
                Ok(v)
            }
            Err(f) => {
                // Gloo may still write into it: keep it for ever.
                inbox.buf.leak();
                st.failed_op.get_or_insert(k);
                Err(self.fail(&mut st, f, start.elapsed()))
            }
        }
    }

    fn collective_inner(&self, inbox: &mut Inbox, round: &Round<'_>) -> Result<Vec<Vec<u8>>, Fail> {
        let Round { k, op } = *round;
        // Every collective receives from every peer: the receives posted
        // ahead (`Inbox::posted`) are for all of them.
        debug_assert_eq!(op.recv_from.len() + 1, self.world as usize);
        let Collective {
            data,
            send_to,
            recv_from,
            max_bytes,
            deadline,
        } = op;
        // Every buffer lives in the pool; on any error the pool leaks them all,
        // since Gloo may still be reading or writing their memory.
        let mut pool = Pool::default();
        let gl = |e: GlooError| Fail::Gloo(e, Vec::new());
        let (hslot, dslot) = (header_slot(k), data_slot(k));
        let n = self.world as usize;
        // Post our header and data to every receiver. They are taken when each
        // receiver posts its receives; the reaper waits for that.
        let mut sends = Pool::default();
        let inline = self.inline;
        let place = HEADER + inline;
        let mut first = header(FLAG_DATA, data.len() as u64);
        if data.len() <= inline {
            first.extend_from_slice(data);
        }
        let first_len = first.len();
        let hdr = sends.add(Buffer::new(&self.ctx, first).map_err(gl)?);
        let body = if data.len() <= inline || send_to.is_empty() {
            None
        } else {
            Some(sends.add(Buffer::new(&self.ctx, data.to_vec()).map_err(gl)?))
        };
        let at = |p: u32| move |e: GlooError| Fail::Gloo(e, vec![p]);
        // A pair found broken while posting (its rank left or died before
        // this operation) is accounted for with the headers below, not
        // reported alone: the error names every rank not here.
        let mut broken: Vec<u32> = Vec::new();
        let mut io_error: Option<GlooError> = None;
        let broke = |p: u32,
                     e: GlooError,
                     broken: &mut Vec<u32>,
                     io_error: &mut Option<GlooError>|
         -> Result<(), Fail> {
            if e.status() != Some(sys::IO) {
                return Err(Fail::Gloo(e, vec![p]));
            }
            broken.push(p);
            io_error.get_or_insert(e);
            Ok(())
        };
        for &p in send_to {
            let sent = sends
                .get(hdr)
                .send(p, hslot, 0, first_len)
                .and_then(|()| match body {
                    Some(b) => sends.get(b).send(p, dslot, 0, data.len()),
                    None => Ok(()),
                });
            if let Err(e) = sent {
                broke(p, e, &mut broken, &mut io_error)?;
            }
        }
        // Receive every header message into the inbox, one place of
        // `16 + inline` bytes per rank (Gloo takes a shorter message into a
        // longer receive): posted when the previous collective ended, except
        // on a pair where that failed, posted now. The inbox also holds a
        // standing receive on every pair, so a pair that breaks wakes this
        // wait even after its header has arrived. Only the headers need
        // clearing: a place's magic says whether its message came.
        let late: Vec<u32> = recv_from
            .iter()
            .copied()
            .filter(|&p| !inbox.posted[p as usize] && !broken.contains(&p))
            .collect();
        for &p in &late {
            let at = p as usize * place;
            inbox.buf.bytes_mut()[at..at + HEADER].fill(0);
        }
        for &p in &late {
            if let Err(e) = inbox.buf.recv(p, hslot, p as usize * place, place) {
                broke(p, e, &mut broken, &mut io_error)?;
            }
        }
        if let Some(e) = io_error {
            return Err(self.account_headers(&mut pool, &inbox.buf, round, e, broken));
        }
        for _ in recv_from {
            if let Err(e) = self.watchdog.wait_recv(&inbox.buf, deadline) {
                return Err(self.account_headers(&mut pool, &inbox.buf, round, e, Vec::new()));
            }
        }
        // Every header is here: check them.
        let mut lens = vec![0usize; n];
        let mut shut = Vec::new();
        let mut failed = Vec::new();
        for &p in recv_from {
            let at = p as usize * place;
            match parse_header(&inbox.buf.bytes()[at..at + HEADER]) {
                Some((FLAG_SHUTDOWN, _)) => shut.push((p, PeerLoss::Shutdown)),
                Some((FLAG_ABORT, _)) => shut.push((p, PeerLoss::Aborted)),
                Some((FLAG_FAILED, _)) => failed.push((p, PeerLoss::Aborted)),
                Some((FLAG_DATA, len)) => {
                    let len = usize::try_from(len).unwrap_or(usize::MAX);
                    if len > max_bytes {
                        return Err(Fail::Core(Error::message_too_large(p, len, max_bytes)));
                    }
                    lens[p as usize] = len;
                }
                other => {
                    return Err(Fail::Core(Error::Decode {
                        rank: Some(p),
                        reason: DecodeError::Invalid {
                            field: "gloo header",
                            detail: format!("{other:?}"),
                        },
                    }))
                }
            }
        }
        if !shut.is_empty() {
            return Err(Fail::Core(Error::peer_lost(shut, "")));
        }
        // Receive the data that did not come inline.
        let mut incoming: Vec<(u32, usize)> = Vec::new();
        for &p in recv_from {
            let len = lens[p as usize];
            if len <= inline {
                continue;
            }
            let b = pool.add(Buffer::new(&self.ctx, vec![0u8; len]).map_err(gl)?);
            pool.get(b).recv(p, dslot, 0, len).map_err(at(p))?;
            incoming.push((p, b));
        }
        for (i, &(_, b)) in incoming.iter().enumerate() {
            if let Err(e) = self.watchdog.wait_recv(pool.get(b), deadline) {
                let waiting: Vec<u32> = incoming[i..].iter().map(|(p, _)| *p).collect();
                let lost = self.broken_pairs(&mut pool, k, &waiting);
                let missing = if lost.is_empty() { waiting } else { lost };
                return Err(Fail::Gloo(e, missing));
            }
        }
        // A rank that failed earlier is named only once every other rank's
        // data came: a rank that dies meanwhile is the one to blame.
        if !failed.is_empty() {
            return Err(Fail::Core(Error::peer_lost(failed, "")));
        }
        // Everything addressed to us has arrived: the operation is complete
        // for this rank. Our own sends finish as the receivers take them.
        if !send_to.is_empty() {
            self.reap(sends, send_to.to_vec(), deadline)?;
        }
        let mut out = vec![Vec::new(); n];
        for &p in recv_from {
            let len = lens[p as usize];
            if len <= inline {
                let at = p as usize * place + HEADER;
                out[p as usize] = inbox.buf.bytes()[at..at + len].to_vec();
            }
        }
        // The inline bytes are copied out: the places are free for the next
        // collective's headers.
        inbox.post_next(self.rank, k + 1, place);
        for (p, b) in incoming {
            // The transfer into this memory has completed; moving the Vec
            // keeps its heap allocation where Gloo wrote it.
            out[p as usize] = pool.get_mut(b).take_bytes();
        }
        pool.release();
        Ok(out)
    }

    /// Hands send buffers to the reaper thread.
    fn reap(&self, pool: Pool, receivers: Vec<u32>, deadline: Deadline) -> Result<(), Fail> {
        let reaper = self.reaper.lock().unwrap_or_else(|e| e.into_inner());
        let out = Outgoing {
            pool,
            receivers,
            deadline,
        };
        if reaper.hand(out) {
            Ok(())
        } else {
            Err(Fail::Core(toolkit::shut_down(self.rank)))
        }
    }
}

impl From<GlooError> for Error {
    fn from(e: GlooError) -> Self {
        match e {
            GlooError::Invalid(m) => Error::InvalidArgument(m),
            other => Error::Backend {
                backend: BACKEND,
                message: other.to_string(),
                engine: Some(Box::new(other)),
            },
        }
    }
}

impl Transport for GlooTransport {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn world_size(&self) -> u32 {
        self.world
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// All of them: a connection per pair, so a deadline names the ranks that
    /// did not send and a broken pair its rank; a leaving rank sends its
    /// peers a notice; point-to-point is Gloo's own unbound buffers.
    fn capabilities(&self) -> compiler_collectives_core::Capabilities {
        compiler_collectives_core::Capabilities::none()
            .with_names_missing_ranks()
            .with_tells_peers_it_left()
            .with_cheap_point_to_point()
    }

    fn all_gather(
        &self,
        data: &[u8],
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>, Error> {
        toolkit::check_size("all_gather", data.len(), max_bytes)?;
        let peers: Vec<u32> = self.peers().collect();
        let mut out = self.collective(Collective {
            data,
            send_to: &peers,
            recv_from: &peers,
            max_bytes,
            deadline,
        })?;
        out[self.rank as usize] = data.to_vec();
        Ok(out)
    }

    /// Gloo's all_gather is one round of exact sizes (a header, then what
    /// did not fit in it): no padding, no copy into one buffer.
    fn all_gather_sized(
        &self,
        data: &[u8],
        lens: &[usize],
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>, Error> {
        toolkit::check_sized(self.rank, self.world, data, lens)?;
        let longest = lens.iter().copied().max().unwrap_or(0);
        let out = self.all_gather(data, longest, deadline)?;
        for (rank, (part, &want)) in (0u32..).zip(out.iter().zip(lens)) {
            if part.len() != want {
                return Err(Error::Decode {
                    rank: Some(rank),
                    reason: DecodeError::Invalid {
                        field: "sized contribution",
                        detail: format!("{} bytes where {want} were announced", part.len()),
                    },
                });
            }
        }
        Ok(out)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), Error> {
        let peers: Vec<u32> = self.peers().collect();
        self.collective(Collective {
            data: &[],
            send_to: &peers,
            recv_from: &peers,
            max_bytes: 0,
            deadline,
        })
        .map(|_| ())
    }

    fn send(&self, peer: u32, tag: u32, data: &[u8], deadline: Deadline) -> Result<(), Error> {
        self.check_peer(peer)?;
        let start = Instant::now();
        let mut st = self.lock();
        self.begin(&mut st)?;
        st.op -= 1; // point-to-point does not consume a collective number
        let count = st.sent.entry((peer, tag)).or_insert(0);
        let slot = p2p_slot(tag, *count);
        *count += 1;
        let gl = |e: GlooError| Fail::Gloo(e, vec![peer]);
        let r = (|| {
            let mut pool = Pool::default();
            let hdr =
                pool.add(Buffer::new(&self.ctx, header(FLAG_DATA, data.len() as u64)).map_err(gl)?);
            pool.get(hdr).send(peer, slot, 0, HEADER).map_err(gl)?;
            if !data.is_empty() {
                let body = pool.add(Buffer::new(&self.ctx, data.to_vec()).map_err(gl)?);
                pool.get(body)
                    .send(peer, slot + 1, 0, data.len())
                    .map_err(gl)?;
            }
            // The receiver takes the message when it posts its receive; the
            // reaper waits for that (until `deadline`) and frees the buffers.
            self.reap(pool, vec![peer], deadline)
        })();
        r.map_err(|f| self.fail(&mut st, f, start.elapsed()))
    }

    fn recv(
        &self,
        peer: u32,
        tag: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<u8>, Error> {
        self.check_peer(peer)?;
        let start = Instant::now();
        let mut st = self.lock();
        self.begin(&mut st)?;
        st.op -= 1;
        let count = st.received.entry((peer, tag)).or_insert(0);
        let slot = p2p_slot(tag, *count);
        *count += 1;
        let gl = |e: GlooError| Fail::Gloo(e, vec![peer]);
        let r = (|| {
            let mut pool = Pool::default();
            let hdr = pool.add(Buffer::new(&self.ctx, vec![0u8; HEADER]).map_err(gl)?);
            pool.get(hdr).recv(peer, slot, 0, HEADER).map_err(gl)?;
            self.watchdog
                .wait_recv(pool.get(hdr), deadline)
                .map_err(gl)?;
            // Only `send` posts on a point-to-point slot, always with
            // FLAG_DATA (the other flags go to collective header slots: see
            // `framing`); a peer that left is found by its broken pair, and
            // `fail` reads how it left.
            let len = match parse_header(pool.get(hdr).bytes()) {
                Some((FLAG_DATA, len)) => usize::try_from(len).unwrap_or(usize::MAX),
                other => {
                    return Err(Fail::Core(Error::Decode {
                        rank: Some(peer),
                        reason: DecodeError::Invalid {
                            field: "gloo header",
                            detail: format!("{other:?}"),
                        },
                    }))
                }
            };
            if len > max_bytes {
                return Err(Fail::Core(Error::message_too_large(peer, len, max_bytes)));
            }
            let mut out = Vec::new();
            if len > 0 {
                let body = pool.add(Buffer::new(&self.ctx, vec![0u8; len]).map_err(gl)?);
                pool.get(body).recv(peer, slot + 1, 0, len).map_err(gl)?;
                self.watchdog
                    .wait_recv(pool.get(body), deadline)
                    .map_err(gl)?;
                out = pool.get_mut(body).take_bytes();
            }
            pool.release();
            Ok(out)
        })();
        r.map_err(|f| self.fail(&mut st, f, start.elapsed()))
    }

    fn shutdown(&self) -> Result<(), Error> {
        self.leave(FLAG_SHUTDOWN)
    }

    fn abort(&self) -> Result<(), Error> {
        self.leave(FLAG_ABORT)
    }
}

impl GlooTransport {
    /// Shutdown or abort: drain sends, post `flag` as the header of the next
    /// operation to every peer (those waiting there fail at once, naming this
    /// rank), then close the connections.
    fn leave(&self, flag: u32) -> Result<(), Error> {
        let mut st = self.lock();
        if st.shut {
            return Ok(());
        }
        st.shut = true;
        // First, before any connection closes: a peer that reaches the next
        // collective after they did reads how this rank left here.
        // Collectives completed: up to the one that failed (interrupted,
        // timed out), if one did, so that a peer still at that one reads
        // how this rank left instead of taking it for dead.
        self.record_departure(flag, st.failed_op.unwrap_or(st.op));
        // Peers are still collecting what this rank sent in its last
        // operations: let them take it before the connections close.
        self.reaper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop(toolkit::DRAIN_LIMIT);
        {
            let k = st.op;
            let deadline = Deadline::after(SHUTDOWN_GRACE);
            if let Ok(hdr) = Buffer::new(&self.ctx, header(flag, 0)) {
                let mut posted = 0;
                for p in self.peers() {
                    if hdr.send(p, header_slot(k), 0, HEADER).is_ok() {
                        posted += 1;
                    }
                }
                // Peers waiting at operation k take the notice at once; others
                // never will, so wait only briefly.
                let mut done = 0;
                while done < posted && hdr.wait_send(deadline.instant()).is_ok() {
                    done += 1;
                }
                if done < posted {
                    hdr.leak();
                }
            }
        }
        self.ctx.close();
        Ok(())
    }
}

impl Drop for GlooTransport {
    fn drop(&mut self) {
        let shut = self.lock().shut;
        if !shut {
            // As `shutdown`, without the notice: let peers take what this
            // rank sent, then close.
            self.reaper
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .stop(toolkit::DRAIN_LIMIT);
            self.ctx.close();
        }
    }
}
