//! The [`Transport`] and [`Store`] traits, and the [`Deadline`] and
//! [`Capabilities`] they take and give (module docs: [`crate::transport`]).

use crate::error::Result;
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// An absolute point in time by which an operation must finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(Instant);

impl Deadline {
    /// `timeout` from now. Timeouts too large to represent are clamped to
    /// about 100 years.
    pub fn after(timeout: Duration) -> Self {
        let now = Instant::now();
        Deadline(
            now.checked_add(timeout)
                .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
                .unwrap_or(now),
        )
    }

    /// At a given instant.
    pub fn at(instant: Instant) -> Self {
        Deadline(instant)
    }

    /// The instant.
    pub fn instant(self) -> Instant {
        self.0
    }

    /// Time left, zero once passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub fn expired(self) -> bool {
        Instant::now() >= self.0
    }
}

/// What a transport can do beyond moving bytes, as its engine allows.
/// Behaviours of the conformance suite are chosen by it, and
/// [`Channel`](crate::Channel) uses the tree exchange only over cheap
/// point-to-point. Built with [`Capabilities::none`] and the setters:
///
/// ```
/// use compiler_collectives_core::transport::Capabilities;
/// let c = Capabilities::none().with_names_missing_ranks().with_cheap_point_to_point();
/// assert!(c.names_missing_ranks && !c.tells_peers_it_left && c.cheap_point_to_point);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Capabilities {
    /// A timeout names the ranks that did not arrive
    /// ([`Error::Timeout`](crate::Error::Timeout)'s `missing_ranks`), and a
    /// lost connection the rank it belonged to.
    pub names_missing_ranks: bool,
    /// A rank that shuts down or aborts tells peers waiting for it, which
    /// fail at once ([`Error::PeerLost`](crate::Error::PeerLost)) instead of
    /// at their deadline.
    pub tells_peers_it_left: bool,
    /// [`send`](Transport::send)/[`recv`](Transport::recv) cost about what a
    /// collective of the same bytes costs (false where point-to-point goes
    /// through a store, as on NCCL).
    pub cheap_point_to_point: bool,
}

impl Capabilities {
    /// None of them.
    pub const fn none() -> Self {
        Capabilities {
            names_missing_ranks: false,
            tells_peers_it_left: false,
            cheap_point_to_point: false,
        }
    }

    /// With [`Capabilities::names_missing_ranks`].
    #[must_use]
    pub const fn with_names_missing_ranks(mut self) -> Self {
        self.names_missing_ranks = true;
        self
    }

    /// With [`Capabilities::tells_peers_it_left`].
    #[must_use]
    pub const fn with_tells_peers_it_left(mut self) -> Self {
        self.tells_peers_it_left = true;
        self
    }

    /// With [`Capabilities::cheap_point_to_point`].
    #[must_use]
    pub const fn with_cheap_point_to_point(mut self) -> Self {
        self.cheap_point_to_point = true;
        self
    }
}

/// Moves bytes between the `world_size` ranks of one process group.
///
/// One value is one rank's end of one communicator. Collective calls
/// ([`all_gather`](Transport::all_gather), [`broadcast`](Transport::broadcast),
/// [`barrier`](Transport::barrier)) must be made by every rank in the same
/// order; implementations may match them by call order. Calls on one
/// transport are not made concurrently by the protocol (one channel = one
/// transport), but implementations must be `Sync` so a handle can be shared.
///
/// The trait is object-safe: the protocol holds a `dyn Transport`.
///
/// Costs below are for the reference engines: a collective is one round of
/// the engine's own algorithm (ring or tree); `max_bytes` bounds what a peer
/// can make this rank allocate.
pub trait Transport: Send + Sync + Debug {
    /// This rank, in `0..world_size`.
    fn rank(&self) -> u32;

    /// Number of ranks in the group (≥ 1).
    fn world_size(&self) -> u32;

    /// A short name of the engine, e.g. `"in-process"`, `"gloo"`, `"nccl"`.
    fn backend(&self) -> &'static str;

    /// What this transport can do beyond moving bytes (the same on every
    /// rank of a group). Costs nothing.
    fn capabilities(&self) -> Capabilities;

    /// Gathers one byte string from every rank, possibly of different
    /// lengths (empty included). Returns `world_size` buffers, index = rank.
    ///
    /// Cost: engines without a variable-length all_gather issue two
    /// collectives (lengths, then padded data); the in-process engine copies
    /// each buffer once per receiving rank.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) naming the ranks that did not
    /// contribute by `deadline`; [`Error::PeerLost`](crate::Error::PeerLost)
    /// when a rank left; [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// when this rank's own `data` is longer than `max_bytes`;
    /// [`Error::Decode`](crate::Error::Decode) naming the sender
    /// ([`Error::message_too_large`](crate::Error::message_too_large)) when a
    /// peer's buffer is longer than the limit (engines that gather lengths
    /// first apply the smallest limit of all ranks, so every rank fails
    /// alike: [`crate::transport::toolkit::all_gather_varlen`]);
    /// [`Error::Backend`](crate::Error::Backend) for engine failures.
    fn all_gather(&self, data: &[u8], max_bytes: usize, deadline: Deadline)
        -> Result<Vec<Vec<u8>>>;

    /// Gathers `data.len()` bytes from every rank, where every rank passes
    /// the same length. Returns the concatenation, rank 0 first
    /// (`world_size * data.len()` bytes).
    ///
    /// Cost: one collective round (the flat exchange's slot round uses
    /// it). The default implementation calls [`all_gather`](Transport::all_gather).
    ///
    /// # Errors
    /// As [`all_gather`](Transport::all_gather); a peer that passed another
    /// length gives [`Error::Backend`](crate::Error::Backend) or, with the
    /// default implementation, [`Error::Decode`](crate::Error::Decode) naming it.
    fn all_gather_fixed(&self, data: &[u8], deadline: Deadline) -> Result<Vec<u8>> {
        let parts = self.all_gather(data, data.len(), deadline)?;
        let mut out = Vec::with_capacity(data.len().saturating_mul(parts.len()));
        for (rank, p) in parts.iter().enumerate() {
            if p.len() != data.len() {
                return Err(crate::Error::Decode {
                    rank: u32::try_from(rank).ok(),
                    reason: crate::DecodeError::FixedSize {
                        len: p.len(),
                        expected: data.len(),
                    },
                });
            }
            out.extend_from_slice(p);
        }
        Ok(out)
    }

    /// Gathers one byte string from every rank where every rank already
    /// knows every length: `lens[r]` is rank `r`'s, the same slice on every
    /// rank, and `data.len() == lens[rank]` (the flat exchange's second
    /// round, after a first round that carried the lengths). Returns
    /// `world_size` buffers, index = rank, each of its announced length.
    /// The caller bounds the lengths before calling: every rank allocates
    /// for them.
    ///
    /// Cost: one collective round on every engine. The default pads every
    /// contribution to the longest and calls
    /// [`all_gather_fixed`](Transport::all_gather_fixed) (one round where a
    /// variable-length all_gather is two, on NCCL and c10d); an engine whose
    /// [`all_gather`](Transport::all_gather) is one round (Gloo) may use it
    /// instead.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when `lens`
    /// does not hold one length per rank or `data` is not this rank's
    /// length; otherwise as [`all_gather_fixed`](Transport::all_gather_fixed).
    fn all_gather_sized(
        &self,
        data: &[u8],
        lens: &[usize],
        deadline: Deadline,
    ) -> Result<Vec<Vec<u8>>> {
        crate::transport::toolkit::check_sized(self.rank(), self.world_size(), data, lens)?;
        crate::transport::toolkit::padded_gather(data, lens, "sized", |b| {
            self.all_gather_fixed(b, deadline)
        })
    }

    /// Broadcasts `root`'s buffer to every rank. `data` is read on `root`
    /// only; every rank (root included) gets root's bytes back.
    ///
    /// Provided over [`all_gather`](Transport::all_gather) (the other ranks
    /// contribute nothing), so a backend need not write it: the protocol
    /// never broadcasts, and every engine's all_gather already names the
    /// ranks a failure is about.
    ///
    /// Cost: one [`all_gather`](Transport::all_gather).
    ///
    /// # Errors
    /// As [`all_gather`](Transport::all_gather) (a root's buffer over a
    /// rank's `max_bytes` is [`Error::Decode`](crate::Error::Decode) naming
    /// the root); [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// if `root` is not a rank or this root's own buffer is over
    /// `max_bytes`.
    fn broadcast(
        &self,
        data: &[u8],
        root: u32,
        max_bytes: usize,
        deadline: Deadline,
    ) -> Result<Vec<u8>> {
        crate::transport::toolkit::check_root(root, self.world_size())?;
        let mine: &[u8] = if root == self.rank() { data } else { &[] };
        crate::transport::toolkit::check_size("broadcast", mine.len(), max_bytes)?;
        let mut parts = self.all_gather(mine, max_bytes, deadline)?;
        let world = parts.len();
        if root as usize >= world {
            return Err(crate::Error::Decode {
                rank: None,
                reason: crate::DecodeError::Invalid {
                    field: "gathered buffers",
                    detail: format!("{world} buffers, no root {root}"),
                },
            });
        }
        Ok(parts.swap_remove(root as usize))
    }

    /// Waits until every rank has entered the barrier.
    ///
    /// Cost: one collective with no payload.
    ///
    /// # Errors
    /// As [`all_gather`](Transport::all_gather).
    fn barrier(&self, deadline: Deadline) -> Result<()>;

    /// Sends `data` to `peer` under `tag`. Messages between one pair of ranks
    /// with one tag arrive in order. May return before the peer received it.
    ///
    /// Cost: one point-to-point message.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `peer` is
    /// not a rank or is this rank; [`Error::PeerLost`](crate::Error::PeerLost),
    /// [`Error::Timeout`](crate::Error::Timeout), [`Error::Backend`](crate::Error::Backend).
    fn send(&self, peer: u32, tag: u32, data: &[u8], deadline: Deadline) -> Result<()>;

    /// Receives the next message from `peer` under `tag`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) naming `peer`;
    /// [`Error::Decode`](crate::Error::Decode) naming `peer` if the message is
    /// longer than `max_bytes`; otherwise as [`send`](Transport::send).
    fn recv(&self, peer: u32, tag: u32, max_bytes: usize, deadline: Deadline) -> Result<Vec<u8>>;

    /// Tells every peer that this rank will make no more calls, so that a
    /// peer waiting for it fails at once with
    /// [`Error::PeerLost`](crate::Error::PeerLost) (reason `Shutdown`)
    /// instead of at its deadline. Idempotent; later calls on this transport
    /// fail.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the notice could not be sent.
    fn shutdown(&self) -> Result<()>;

    /// Like [`shutdown`](Transport::shutdown), after an error: peers waiting
    /// for this rank fail at once with [`Error::PeerLost`](crate::Error::PeerLost)
    /// (reason `Aborted`), so they do not mistake it for a rank that finished.
    /// The default calls `shutdown`.
    ///
    /// # Errors
    /// As [`shutdown`](Transport::shutdown).
    fn abort(&self) -> Result<()> {
        self.shutdown()
    }
}

/// The rendezvous key–value store (c10d's `Store`, Gloo's `Store`):
/// `set`/`get`/`add`/`wait`, each bounded by a deadline.
///
/// The protocol does not use the store per exchange; backends use it to
/// bootstrap communicators (e.g. NCCL's unique id, Gloo's addresses).
pub trait Store: Send + Sync + Debug {
    /// Sets `key` to `value`, replacing any earlier value.
    ///
    /// Cost: one round trip to the store.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) (no ranks named) or
    /// [`Error::Backend`](crate::Error::Backend).
    fn set(&self, key: &str, value: &[u8], deadline: Deadline) -> Result<()>;

    /// Returns the value of `key`, waiting until it is set.
    ///
    /// Cost: one round trip, then waiting.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) if the key is still unset at
    /// `deadline`; [`Error::Backend`](crate::Error::Backend).
    fn get(&self, key: &str, deadline: Deadline) -> Result<Vec<u8>>;

    /// Adds `delta` to the integer at `key` (missing = 0) and returns the new
    /// value. Atomic across all clients.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if the key
    /// holds a value that is not a counter; otherwise as [`set`](Store::set).
    fn add(&self, key: &str, delta: i64, deadline: Deadline) -> Result<i64>;

    /// Waits until every key in `keys` is set.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) if some are still unset at
    /// `deadline`; [`Error::Backend`](crate::Error::Backend).
    fn wait(&self, keys: &[&str], deadline: Deadline) -> Result<()>;

    /// Deletes `key`; returns whether it existed.
    ///
    /// # Errors
    /// As [`set`](Store::set).
    fn delete(&self, key: &str, deadline: Deadline) -> Result<bool>;

    /// [`get`](Store::get) of a value of at most `max_bytes` bytes (a peer's
    /// point-to-point message, whose size the reader bounds). The provided
    /// version reads the value whole, then checks its length; a store that
    /// learns a value's length before its bytes can refuse it unread.
    ///
    /// # Errors
    /// As [`get`](Store::get); a longer value is
    /// [`Error::Decode`](crate::Error::Decode) (no rank) with
    /// [`DecodeError::TooLarge`](crate::DecodeError::TooLarge) on field
    /// `"value"`, giving its length and `max_bytes`.
    fn get_within(&self, key: &str, max_bytes: usize, deadline: Deadline) -> Result<Vec<u8>> {
        let v = self.get(key, deadline)?;
        if v.len() > max_bytes {
            return Err(crate::Error::Decode {
                rank: None,
                reason: crate::DecodeError::TooLarge {
                    field: "value",
                    len: v.len() as u64,
                    limit: max_bytes as u64,
                },
            });
        }
        Ok(v)
    }

    /// The value of `key` if it is set now, without waiting for it (the
    /// store post-mortem polls with it). The provided version is a
    /// [`get`](Store::get) that gives up after 1 ms; a store whose `get`
    /// cannot give up cheaply (c10d's TCPStore cancels a wait with a round
    /// trip of its own) checks the key first instead.
    ///
    /// # Errors
    /// As [`get`](Store::get), except that an unset key is `Ok(None)`.
    fn try_get(&self, key: &str, deadline: Deadline) -> Result<Option<Vec<u8>>> {
        let soon = Deadline::after(Duration::from_millis(1)).min(deadline);
        match self.get(key, soon) {
            Ok(v) => Ok(Some(v)),
            Err(crate::Error::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}
