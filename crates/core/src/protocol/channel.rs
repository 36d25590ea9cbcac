//! The exchange protocol: one [`Channel`] per communicator, one
//! [`Channel::exchange`] per decision point.
//!
//! An exchange (flat; the tree of [`crate::protocol::tree`] has its own
//! rounds and the same checks):
//! 1. encodes this rank's value as an [`Envelope`] (version, sequence number,
//!    compile key, decision kind, configuration, payload), written once into
//!    a buffer the channel keeps;
//! 2. gathers one fixed-size slot from every rank
//!    ([`ChannelOptions::slot_bytes`], default 4096 bytes): the envelope's
//!    digest and, when it fits, the envelope itself. If every slot equals
//!    this rank's, every envelope is identical and the result is this rank's
//!    own value (joins are idempotent): the fast path. If every envelope came
//!    inline, that one round is the whole exchange; otherwise a second round
//!    gathers the envelopes that did not fit, whose lengths every rank read
//!    in the slots ([`Transport::all_gather_sized`]: one round on every
//!    engine, after every rank applied the smallest message limit of all
//!    ranks, also from the slots);
//! 3. checks version, sequence number, compile key and kind
//!    (→ [`Error::Desync`] grouping the ranks), then the configuration
//!    (→ [`Error::Disagreement`]), and joins every rank's payload in rank
//!    order straight from the received bytes ([`Join::join_encoded`]; a
//!    payload that does not decode → [`Error::Decode`] naming the rank).
//!    [`Channel::exchange_in_place`] instead joins every peer's payload into
//!    the caller's value ([`Join::join_payloads`]), after checking that the
//!    gathered copy of this rank's envelope is the one it sent (if not, it
//!    joins every gathered payload as `exchange` does, so that every rank
//!    still gets the same result or error).
//!
//! Every rank sees the same gathered bytes and so takes the same branch and
//! returns the same result or the same error. Exchanges pair by sequence
//! number: the `k`-th exchange of each rank meets the `k`-th of every other,
//! whatever compile key each rank passes (the key is checked, not used to
//! pair). Every rank must use the same slot size (it sets the first round's
//! size); with the fast path off, an exchange is one variable-length
//! all_gather of the envelopes instead.
//!
//! Deadlines: [`DEFAULT_TIMEOUT`] (300 s), replaced by
//! [`ChannelOptions::timeout`] (which [`ChannelOptions::from_env`] takes from
//! the `CCOL_TIMEOUT_S` environment variable: seconds, fractions allowed),
//! replaced by a per-call [`ExchangeOptions::timeout`]. A channel reads no
//! environment variable itself. One deadline covers both rounds of an
//! exchange.
//!
//! After a fatal error ([`Error::is_fatal`]) the channel refuses further
//! exchanges with [`Error::ChannelUnusable`]; call [`Channel::abort`].

use crate::error::{counted, Error, ExchangeInfo, FirstFailure, Poison, Result};
use crate::protocol::checks::Census;
use crate::protocol::envelope::{
    self, Envelope, EnvelopeRef, Limits, DEFAULT_SLOT_BYTES, MAX_SLOT_BYTES, MIN_SLOT_BYTES,
    SLOT_HEADER_LEN, WIRE_VERSION,
};
use crate::protocol::join::{encode_payload_into, Join};
use crate::transport::{Deadline, Transport};
use crate::DecodeError;
use std::cell::OnceCell;
use std::sync::Arc;
use std::time::Duration;

/// The library's default exchange deadline: 300 s, because ranks may
/// legitimately be minutes apart while compiling.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Name of the environment variable that replaces [`DEFAULT_TIMEOUT`]
/// (seconds, e.g. `"30"` or `"2.5"`).
pub const TIMEOUT_ENV: &str = "CCOL_TIMEOUT_S";

/// Parses a timeout in seconds as `CCOL_TIMEOUT_S` and `--timeout` take it.
///
/// # Errors
/// [`Error::InvalidArgument`] for text that is not a finite, positive number
/// of seconds of at most ten years.
pub fn parse_timeout_secs(text: &str) -> Result<Duration> {
    let secs: f64 = text.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!("timeout '{text}' is not a number of seconds"))
    })?;
    if !secs.is_finite() || secs <= 0.0 || secs > 10.0 * 365.0 * 86400.0 {
        return Err(Error::InvalidArgument(format!(
            "timeout '{text}' must be a positive number of seconds (at most ten years)"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Reads `CCOL_TIMEOUT_S`, if set; an empty value counts as unset (as for
/// every `CCOL_*` variable).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable when it is set but not a
/// valid number of seconds.
pub fn timeout_from_env() -> Result<Option<Duration>> {
    match std::env::var(TIMEOUT_ENV) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => parse_timeout_secs(&v).map(Some).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{TIMEOUT_ENV}: {m}")),
            other => other,
        }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::InvalidArgument(format!(
            "{TIMEOUT_ENV} is not valid UTF-8"
        ))),
    }
}

/// Most bytes the flat exchange's first round brings one rank, over all
/// ranks' slots (64 KiB; see [`ChannelOptions::slot_bytes`]).
pub const SLOT_ROUND_BYTES: usize = 64 << 10;

/// Knobs of a [`Channel`]. New knobs are added as fields with defaults.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ChannelOptions {
    /// Deadline of each exchange; `None` = [`DEFAULT_TIMEOUT`] (300 s).
    pub timeout: Option<Duration>,
    /// Bounds on what peers may send.
    pub limits: Limits,
    /// Use the identical-envelope fast path (default on).
    pub fast_path: bool,
    /// Directory of per-rank JSON-lines trace files (`<dir>/rank-<r>.jsonl`,
    /// see [`crate::protocol::trace`]); `None` = no file.
    pub trace_dir: Option<std::path::PathBuf>,
    /// Smallest world size that uses the hierarchical (tree) exchange of
    /// [`crate::protocol::tree`] (default [`crate::protocol::tree::DEFAULT_HIERARCHICAL_FROM`],
    /// 64 ranks; `u32::MAX` = never), over a transport with cheap
    /// point-to-point only ([`Channel::topology`] says which runs and why).
    /// Same decisions and errors as the flat exchange; O(payload · log N)
    /// bytes received per rank.
    pub hierarchical_from: u32,
    /// Size of the flat exchange's first round, in bytes (default
    /// [`DEFAULT_SLOT_BYTES`], 4096; from [`MIN_SLOT_BYTES`] to
    /// [`MAX_SLOT_BYTES`]): every rank sends exactly one slot, its
    /// envelope's digest and, when the envelope fits in the rest (slot − 48
    /// bytes), the envelope, so that small states take one collective round.
    /// Large worlds use a smaller slot, so that the round never brings a
    /// rank more than [`SLOT_ROUND_BYTES`] (64 KiB) in all:
    /// `max(MIN_SLOT_BYTES, min(slot_bytes, 64 KiB / world size))`
    /// ([`Channel::slot_bytes`]), e.g. 4096 bytes up to 16 ranks, 1024 at 64.
    /// Configuration every rank must share: ranks with different slot sizes
    /// fail their first exchange (the engine's fixed-size gather refuses
    /// contributions of another size: a decode error naming the rank on
    /// Gloo and in-process; the engine's error or the deadline on c10d and
    /// NCCL).
    pub slot_bytes: usize,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            timeout: None,
            limits: Limits::default(),
            fast_path: true,
            trace_dir: None,
            hierarchical_from: crate::protocol::tree::DEFAULT_HIERARCHICAL_FROM,
            slot_bytes: DEFAULT_SLOT_BYTES,
        }
    }
}

impl ChannelOptions {
    /// The defaults with what the environment sets — the one place the
    /// library reads `CCOL_*` for a channel: `CCOL_TIMEOUT_S` (seconds) as
    /// [`timeout`](Self::timeout), `CCOL_TRACE_DIR` as
    /// [`trace_dir`](Self::trace_dir). Unset or empty variables leave the
    /// defaults; later `with_…` calls replace what it read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `CCOL_TIMEOUT_S` when it is set but
    /// not a finite, positive number of seconds.
    pub fn from_env() -> Result<Self> {
        Ok(ChannelOptions {
            timeout: timeout_from_env()?,
            trace_dir: crate::protocol::trace::trace_dir_from_env(),
            ..ChannelOptions::default()
        })
    }

    /// Sets the exchange deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sets the decode limits.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Turns the digest fast path on or off.
    #[must_use]
    pub fn with_fast_path(mut self, on: bool) -> Self {
        self.fast_path = on;
        self
    }

    /// Writes a trace file per rank into `dir` (see [`crate::protocol::trace`]).
    #[must_use]
    pub fn with_trace_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.trace_dir = Some(dir.into());
        self
    }

    /// Sets the smallest world size that uses the tree exchange.
    #[must_use]
    pub fn with_hierarchical_from(mut self, world_size: u32) -> Self {
        self.hierarchical_from = world_size;
        self
    }

    /// Sets the slot size of the flat exchange's first round, in bytes
    /// (see [`slot_bytes`](Self::slot_bytes); checked by
    /// [`Channel::with_options`]).
    #[must_use]
    pub fn with_slot_bytes(mut self, bytes: usize) -> Self {
        self.slot_bytes = bytes;
        self
    }
}

/// How a channel's exchanges run ([`Channel::topology`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// Flat: one all_gather of fixed-size slots (digest and, when it fits,
    /// the envelope), then one of the envelopes that did not fit; every rank
    /// receives every envelope.
    Flat(FlatReason),
    /// The binomial tree of [`crate::protocol::tree`] over point-to-point messages:
    /// O(payload · log N) bytes received per rank.
    Tree,
}

/// Why a channel runs its exchanges flat.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlatReason {
    /// One rank: there is no one to exchange with.
    OneRank,
    /// The world is smaller than [`ChannelOptions::hierarchical_from`].
    BelowHierarchicalFrom {
        /// The world size.
        world: u32,
        /// The smallest world that would use the tree.
        from: u32,
    },
    /// The transport's point-to-point is not cheap
    /// ([`crate::Capabilities::cheap_point_to_point`]): a tree of messages
    /// would cost more than the flat collectives.
    NoCheapPointToPoint {
        /// The transport's engine.
        backend: &'static str,
    },
}

impl std::fmt::Display for FlatReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlatReason::OneRank => f.write_str("one rank"),
            FlatReason::BelowHierarchicalFrom { world, from } => write!(
                f,
                "{world} ranks, below the tree exchange's {from} (ChannelOptions::with_hierarchical_from)"
            ),
            FlatReason::NoCheapPointToPoint { backend } => write!(
                f,
                "the {backend} transport's point-to-point is not cheap (its capabilities), \
                 so the tree exchange would cost more than the flat collectives"
            ),
        }
    }
}

/// Per-call knobs of [`Channel::exchange_with`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ExchangeOptions {
    /// Replaces the channel's deadline for this exchange.
    pub timeout: Option<Duration>,
    /// The canonical text of whatever configuration shapes this decision
    /// (per-source overrides, options; default empty). It must be equal on
    /// every rank: ranks that differ get [`Error::Disagreement`] naming the
    /// values.
    pub config: String,
}

impl ExchangeOptions {
    /// With the configuration text this decision depends on.
    #[must_use]
    pub fn with_config(mut self, config: impl Into<String>) -> Self {
        self.config = config.into();
        self
    }

    /// With a deadline for this exchange.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// The result of one exchange. It borrows the value passed in: when every
/// rank sent the same (the fast path, or a world of one), the join is that
/// value itself, not a copy ([`Gathered::into_merged`] copies it then).
/// After [`Channel::exchange_in_place`] the join is always the value passed
/// in (now joined), so `into_merged` always copies it.
#[derive(Clone, Debug)]
pub struct Gathered<'a, J> {
    merged: Merged<'a, J>,
    per_rank: Option<PerRank<J>>,
    seq: u64,
    fast: bool,
}

/// The join: this rank's own value, or one built from every rank's.
#[derive(Clone, Debug)]
enum Merged<'a, J> {
    Local(&'a J),
    Joined(J),
}

/// Every rank's payload, decoded on first use ([`Gathered::per_rank`]).
#[derive(Clone, Debug)]
struct PerRank<J> {
    /// The gathered buffers, moved here, not copied.
    bufs: Vec<Vec<u8>>,
    /// Each rank's payload: buffer, start, end.
    spans: Vec<Span>,
    values: OnceCell<Option<Vec<J>>>,
}

impl<J> Gathered<'_, J> {
    /// The join of every rank's value (the same on every rank).
    pub fn merged(&self) -> &J {
        match &self.merged {
            Merged::Local(v) => v,
            Merged::Joined(v) => v,
        }
    }

    /// Consumes the result, returning the join (a copy of the value passed
    /// in when every rank sent the same).
    pub fn into_merged(self) -> J
    where
        J: Clone,
    {
        match self.merged {
            Merged::Local(v) => v.clone(),
            Merged::Joined(v) => v,
        }
    }

    /// Whether the digest fast path applied (all envelopes identical).
    pub fn fast_path(&self) -> bool {
        self.fast
    }

    /// The sequence number of this exchange.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl<J: Join> Gathered<'_, J> {
    /// Every rank's value, index = rank; `None` when the fast path showed
    /// that every rank sent exactly what this rank sent, or when the
    /// hierarchical exchange ran (it moves joins, not every value).
    ///
    /// Decoded from the received payloads on the first call (the exchange
    /// itself joins them without building each rank's value); the exchange
    /// already decoded each of them strictly, so this succeeds.
    pub fn per_rank(&self) -> Option<&[J]> {
        let p = self.per_rank.as_ref()?;
        p.values
            .get_or_init(|| {
                let mut out = Vec::with_capacity(p.spans.len());
                for &(b, start, end) in &p.spans {
                    match J::read_payload(&p.bufs[b][start..end]) {
                        Ok(v) => out.push(v),
                        Err(e) => {
                            tracing::error!(error = %e, "a payload the exchange accepted did not decode again");
                            return None;
                        }
                    }
                }
                Some(out)
            })
            .as_deref()
    }
}

/// What an exchange returns: the join, each rank's payloads, whether
/// the fast path applied.
type Flat<'a, J> = (Merged<'a, J>, Option<PerRank<J>>, bool);

/// What the flat exchange's rounds brought.
enum Round {
    /// Every rank sent this rank's envelope (or the world is one rank).
    Fast,
    /// Every rank's envelope: the gathered buffers and, index = rank,
    /// where each envelope lies in them.
    Gathered { bufs: Vec<Vec<u8>>, envs: Vec<Span> },
}

/// The value an exchange was given: to read (the join is a new value) or
/// to join into.
enum Local<'a, J> {
    Shared(&'a J),
    InPlace(&'a mut J),
}

impl<'a, J> Local<'a, J> {
    fn get(&self) -> &J {
        match self {
            Local::Shared(v) => v,
            Local::InPlace(v) => v,
        }
    }

    /// The result when every rank sent this rank's value.
    fn unchanged(self) -> Merged<'a, J> {
        match self {
            Local::Shared(v) => Merged::Local(v),
            Local::InPlace(v) => Merged::Local(v),
        }
    }

    /// The result when the join is `merged` (the tree's).
    fn replaced_by(self, merged: J, fast: bool) -> Merged<'a, J> {
        match self {
            Local::Shared(v) if fast => Merged::Local(v),
            Local::Shared(_) => Merged::Joined(merged),
            Local::InPlace(v) => {
                if !fast {
                    *v = merged;
                }
                Merged::Local(v)
            }
        }
    }
}

/// Where bytes lie among gathered buffers: buffer index, start, end.
type Span = (usize, usize, usize);

/// One rank's handle on one exchange channel.
///
/// Calls are serialised by `&mut self`; a compiler that compiles on several
/// threads shares one channel behind a lock, so that the `k`-th exchange of
/// every rank is the same decision point.
#[derive(Debug)]
pub struct Channel {
    transport: Arc<dyn Transport>,
    timeout: Duration,
    limits: Limits,
    fast_path: bool,
    topology: Topology,
    seq: u64,
    last_completed: Option<u64>,
    /// The first fatal error's kind and message.
    failed: Option<Poison>,
    trace: Option<crate::protocol::trace::TraceFile>,
    /// [`ChannelOptions::slot_bytes`].
    slot_bytes: usize,
    /// This rank's slot: the header, then its envelope (kept between
    /// exchanges so that encoding allocates nothing once it is large enough).
    buf: Vec<u8>,
}

impl Channel {
    /// A channel over `transport` with default options (no environment is
    /// read: pass [`ChannelOptions::from_env`] to [`Channel::with_options`]
    /// for that).
    ///
    /// # Errors
    /// None today; kept fallible as [`Channel::with_options`].
    pub fn new(transport: Arc<dyn Transport>) -> Result<Self> {
        Self::with_options(transport, ChannelOptions::default())
    }

    /// A channel over a shared transport with `options` (it reads no
    /// environment variable: see [`ChannelOptions::from_env`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the trace file cannot be created or the
    /// slot size is out of range.
    pub fn with_options(transport: Arc<dyn Transport>, options: ChannelOptions) -> Result<Self> {
        let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if !(MIN_SLOT_BYTES..=MAX_SLOT_BYTES).contains(&options.slot_bytes) {
            return Err(Error::InvalidArgument(format!(
                "slot size {} bytes: must be from {MIN_SLOT_BYTES} to {MAX_SLOT_BYTES}",
                options.slot_bytes
            )));
        }
        let trace = crate::protocol::trace::TraceFile::for_channel(
            options.trace_dir.as_deref(),
            transport.rank(),
        )?;
        let world = transport.world_size();
        let from = options.hierarchical_from;
        let topology = if world <= 1 {
            Topology::Flat(FlatReason::OneRank)
        } else if world < from {
            Topology::Flat(FlatReason::BelowHierarchicalFrom { world, from })
        } else if !transport.capabilities().cheap_point_to_point {
            let reason = FlatReason::NoCheapPointToPoint {
                backend: transport.backend(),
            };
            tracing::info!(world, hierarchical_from = from, %reason, "flat exchange instead of the tree");
            Topology::Flat(reason)
        } else {
            Topology::Tree
        };
        Ok(Channel {
            transport,
            timeout,
            limits: options.limits,
            fast_path: options.fast_path,
            topology,
            seq: 0,
            last_completed: None,
            failed: None,
            trace,
            slot_bytes: (SLOT_ROUND_BYTES / world.max(1) as usize)
                .min(options.slot_bytes)
                .max(MIN_SLOT_BYTES),
            buf: Vec::new(),
        })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.transport.rank()
    }

    /// How this channel's exchanges run, and why not as a tree when they do
    /// not ([`FlatReason`]): the tree needs a world of at least
    /// [`ChannelOptions::hierarchical_from`] ranks and a transport with
    /// cheap point-to-point. Costs nothing.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.transport.world_size()
    }

    /// The transport underneath.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// The deadline each exchange gets unless a call says otherwise.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The slot size this channel's flat exchange uses, in bytes (see
    /// [`ChannelOptions::slot_bytes`]: the option, smaller in large worlds).
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Sequence number the next exchange will carry.
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// The last exchange every rank completed, if any.
    pub fn last_completed(&self) -> Option<u64> {
        self.last_completed
    }

    /// The first fatal error's message, once the channel is unusable.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_ref().map(|p| p.cause.as_str())
    }

    /// Exchanges `local` with every rank under compile key `key` and returns
    /// the join of every rank's value. Configuration that shapes the
    /// decision travels in [`ExchangeOptions::config`]
    /// ([`Channel::exchange_with`]).
    ///
    /// Cost: one all_gather of [`ChannelOptions::slot_bytes`] (4096) bytes
    /// per rank when every rank's envelope is identical or every envelope
    /// fits its slot; otherwise that plus one
    /// [`Transport::all_gather_sized`] of the envelopes that did not fit
    /// (their lengths came in the slots: one round on every engine). A world of one issues nothing. No
    /// copy of `local` is made unless it is needed (a join that differs
    /// from it, or [`Gathered::into_merged`] of a fast-path result).
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] (not fatal) if `key` or `config` exceed the limits;
    /// - [`Error::Timeout`] naming the ranks that did not arrive, with the
    ///   exchange and the last exchange completed;
    /// - [`Error::PeerLost`] when a rank shut down or disconnected;
    /// - [`Error::Desync`], [`Error::VersionMismatch`], [`Error::Disagreement`],
    ///   [`Error::Decode`] — the same on every rank;
    /// - [`Error::ChannelUnusable`] after an earlier fatal error.
    pub fn exchange<'a, J: Join>(&mut self, key: &str, local: &'a J) -> Result<Gathered<'a, J>> {
        self.exchange_with(key, local, &ExchangeOptions::default())
    }

    /// [`Channel::exchange`] with per-call options.
    ///
    /// # Errors
    /// As [`Channel::exchange`].
    pub fn exchange_with<'a, J: Join>(
        &mut self,
        key: &str,
        local: &'a J,
        options: &ExchangeOptions,
    ) -> Result<Gathered<'a, J>> {
        self.exchange_impl(key, Local::Shared(local), options)
    }

    /// Exchanges `state` with every rank under compile key `key` and joins
    /// every rank's value into it: on success `*state` is the join of every
    /// rank's value (the same on every rank) and the result borrows it
    /// ([`Gathered::merged`] is `state`). The same rounds, checks, errors
    /// and decisions as [`Channel::exchange`], without building a second
    /// value: a frame state joins each peer's payload straight from the
    /// received bytes, in place, and a source whose bytes equal this rank's
    /// own costs a comparison ([`Join::join_payloads`]). This is what a
    /// compiler that keeps its state between exchanges wants (Dynamo merges
    /// the gathered frame states into its own the same way).
    ///
    /// On an error `*state` is unchanged: every payload is read before any
    /// is joined. Should the gathered copy of this rank's own envelope
    /// differ from what it sent (bytes changed on the way, or in memory
    /// before the send), the join is of every gathered payload, this rank's
    /// too, as [`Channel::exchange`] computes it, so that every rank gets
    /// the same result or the same error. From
    /// [`ChannelOptions::hierarchical_from`] ranks (the tree exchange) the
    /// join is built as a new value and moved into `*state`.
    /// [`Gathered::per_rank`] gives every rank's value as sent (this
    /// rank's as it was before the join); [`Gathered::merged`] is `state`.
    ///
    /// # Errors
    /// As [`Channel::exchange`].
    pub fn exchange_in_place<'a, J: Join>(
        &mut self,
        key: &str,
        state: &'a mut J,
        options: &ExchangeOptions,
    ) -> Result<Gathered<'a, J>> {
        self.exchange_impl(key, Local::InPlace(state), options)
    }

    fn exchange_impl<'a, J: Join>(
        &mut self,
        key: &str,
        local: Local<'a, J>,
        options: &ExchangeOptions,
    ) -> Result<Gathered<'a, J>> {
        let config = options.config.as_str();
        if let Some(poison) = &self.failed {
            return Err(poison.error());
        }
        let seq = self.seq;
        // This rank's slot: a header, then the envelope, encoded in place.
        self.buf.clear();
        self.buf.resize(SLOT_HEADER_LEN, 0);
        let own_value: &J = local.get();
        // An envelope over the message limit is refused by every rank
        // together where the slot round runs: the slot announces its
        // length, and every rank fails with the same error naming this
        // rank (see `run`), instead of this rank alone while its peers wait
        // for it until the deadline. Elsewhere (one rank, the fast path off,
        // the tree) it is this rank's own error and nothing is sent.
        let slot_round =
            self.fast_path && self.topology != Topology::Tree && self.transport.world_size() > 1;
        let own_limits = if slot_round {
            Limits {
                max_message_bytes: usize::MAX,
                ..self.limits
            }
        } else {
            self.limits
        };
        let env_len = envelope::encode_into(
            &mut self.buf,
            seq,
            J::KIND,
            key,
            config,
            &own_limits,
            |out| encode_payload_into(own_value, out),
        )
        .map_err(|e| match e {
            envelope::EncodeError::Payload(detail) => Error::InvalidArgument(detail),
            other => Error::InvalidArgument(format!("this rank's own envelope: {other}")),
        })?;
        let start = std::time::Instant::now();
        let deadline = Deadline::after(options.timeout.unwrap_or(self.timeout));
        let _span = tracing::debug_span!("exchange", seq, key, kind = J::KIND).entered();
        let mut traffic = crate::protocol::trace::Traffic::default();
        let outcome = if self.topology == Topology::Tree {
            let encoded = &self.buf[SLOT_HEADER_LEN..];
            EnvelopeRef::decode(encoded, &self.limits)
                .map_err(|e| Error::InvalidArgument(format!("this rank's own envelope: {e}")))
                .and_then(|own| {
                    let env = Envelope {
                        version: own.version,
                        seq: own.seq,
                        kind: own.kind.to_owned(),
                        key: own.key.to_owned(),
                        config: own.config.to_owned(),
                        payload: own.payload.to_vec(),
                    };
                    crate::protocol::tree::exchange(
                        &*self.transport,
                        &env,
                        encoded,
                        local.get(),
                        &self.limits,
                        self.fast_path,
                        deadline,
                        &mut traffic,
                    )
                })
                .map(|(merged, fast)| (local.replaced_by(merged, fast), None, fast))
        } else {
            self.run(deadline, &mut traffic)
                .and_then(|round| self.finish_flat(local, round, env_len))
        };
        let result = match outcome {
            Ok((merged, per_rank, fast)) => {
                self.last_completed = Some(seq);
                self.seq += 1;
                Ok(Gathered {
                    merged,
                    per_rank,
                    seq,
                    fast,
                })
            }
            Err(mut e) => {
                // Report the whole exchange's wait, not the last round's.
                if let Error::Timeout { waited, .. } = &mut e {
                    *waited = start.elapsed();
                }
                let e = e.during(ExchangeInfo {
                    seq,
                    key: key.to_owned(),
                    last_completed: self.last_completed,
                });
                if e.is_fatal() {
                    self.failed = Some(Poison::of(&e));
                }
                Err(e)
            }
        };
        let (rank, world_size) = (self.rank(), self.world_size());
        let elapsed = start.elapsed();
        let own = self
            .trace
            .as_ref()
            .and(self.buf.get(SLOT_HEADER_LEN..SLOT_HEADER_LEN + env_len))
            .and_then(|b| EnvelopeRef::decode(b, &self.limits).ok());
        crate::protocol::trace::finish(
            self.trace.as_mut(),
            own,
            rank,
            world_size,
            traffic,
            elapsed,
            result.as_ref().map(|g| (g.merged(), g.fast_path())),
        );
        result
    }

    /// The flat exchange's join of what [`Channel::run`] gathered: checks
    /// every envelope, then joins into a new value or into the caller's.
    fn finish_flat<'a, J: Join>(
        &self,
        local: Local<'a, J>,
        round: Round,
        env_len: usize,
    ) -> Result<Flat<'a, J>> {
        let Round::Gathered { bufs, envs } = round else {
            return Ok((local.unchanged(), None, true));
        };
        let payloads = check_envelopes(&bufs, &envs, &self.limits)?;
        let merged = match local {
            Local::Shared(_) => Merged::Joined(join_new::<J>(&bufs, &payloads)?),
            Local::InPlace(state) => {
                let own = self.rank() as usize;
                // The join in place assumes that the gathered copy of this
                // rank's envelope is what it sent (the encoding of `state`).
                // Bytes changed on the way (or in memory before the send)
                // would make this rank join something its peers did not:
                // then join every gathered payload, as `exchange` does, and
                // every rank gets the same result or the same error.
                let sent = self.buf.get(SLOT_HEADER_LEN..SLOT_HEADER_LEN + env_len);
                let intact = envs
                    .get(own)
                    .and_then(|&(b, start, end)| bufs.get(b)?.get(start..end))
                    .is_some_and(|got| Some(got) == sent);
                if intact {
                    let views: Vec<&[u8]> =
                        payloads.iter().map(|&(b, s, e)| &bufs[b][s..e]).collect();
                    state
                        .join_payloads(own, &views)
                        .map_err(|(rank, reason)| Error::Decode {
                            rank: u32::try_from(rank).ok(),
                            reason,
                        })?;
                } else {
                    tracing::warn!(
                        rank = own,
                        "this rank's envelope came back changed from what it sent; joining every gathered payload"
                    );
                    *state = join_new::<J>(&bufs, &payloads)?;
                }
                Merged::Local(state)
            }
        };
        Ok((
            merged,
            Some(PerRank {
                bufs,
                spans: payloads,
                values: OnceCell::new(),
            }),
            false,
        ))
    }

    /// The flat exchange of the envelope in `self.buf` (after its slot
    /// header): see the module docs.
    fn run(
        &mut self,
        deadline: Deadline,
        traffic: &mut crate::protocol::trace::Traffic,
    ) -> Result<Round> {
        let t = &*self.transport;
        if t.world_size() == 1 {
            return Ok(Round::Fast);
        }
        let max = self.limits.max_message_bytes;
        if !self.fast_path {
            let mine = &self.buf[SLOT_HEADER_LEN..];
            let all = t.all_gather(mine, max, deadline)?;
            traffic.add(mine.len(), all.iter().map(Vec::len).sum());
            // A slot of this version where an envelope belongs: that rank
            // has the fast path on. Said as such, as the ranks with it on
            // say it (`mismatch`), rather than as a wrong message type.
            let slot_from = (0u32..).zip(&all).find(|(_, b)| {
                matches!(envelope::peek_header(b), Ok((v, m)) if v == WIRE_VERSION && m == envelope::MSG_SLOT)
            });
            if let Some((rank, b)) = slot_from {
                return Err(Error::Decode {
                    rank: Some(rank),
                    reason: DecodeError::Invalid {
                        field: "first round",
                        detail: format!(
                            "rank {rank} sent a {}-byte slot (its fast path is on) where this \
                             rank, with the fast path off, sends its envelope: the ranks need \
                             the same fast-path setting (ChannelOptions::with_fast_path), the \
                             same slot size and the same wire version",
                            b.len()
                        ),
                    },
                });
            }
            let spans: Vec<Span> = all
                .iter()
                .enumerate()
                .map(|(r, b)| (r, 0, b.len()))
                .collect();
            return Ok(Round::Gathered {
                bufs: all,
                envs: spans,
            });
        }
        let slot = self.slot_bytes;
        let env_len = self.buf.len() - SLOT_HEADER_LEN;
        let seq = self.seq;
        let digest = envelope::digest(&self.buf[SLOT_HEADER_LEN..]);
        let fits = env_len <= slot - SLOT_HEADER_LEN;
        let len32 = u32::try_from(env_len).map_err(|_| {
            Error::InvalidArgument(format!(
                "this rank's envelope of {env_len} bytes is over 4 GiB"
            ))
        })?;
        let limit = u64::try_from(self.limits.max_message_bytes).unwrap_or(u64::MAX);
        let spilled: Vec<u8>;
        let mine: &[u8] = if fits {
            envelope::write_slot_header(&mut self.buf, seq, &digest, len32, true, limit);
            self.buf.resize(slot, 0);
            &self.buf
        } else {
            let mut s = vec![0u8; slot];
            envelope::write_slot_header(&mut s, seq, &digest, len32, false, limit);
            spilled = s;
            &spilled
        };
        let all = t
            .all_gather_fixed(mine, deadline)
            .map_err(|e| other_first_round(e, slot))?;
        traffic.add(mine.len(), all.len());
        let world = t.world_size() as usize;
        if all.len() != slot * world {
            return Err(Error::Decode {
                rank: None,
                reason: DecodeError::Invalid {
                    field: "gathered slots",
                    detail: format!("{} bytes, want {world} × {slot}", all.len()),
                },
            });
        }
        let mut same = true;
        let mut versions = Census::default();
        // Each rank's envelope: where it lies in `all` when inline, else
        // its length (the second round's).
        let mut inline: Vec<Option<Span>> = Vec::with_capacity(world);
        let mut second_lens: Vec<usize> = Vec::with_capacity(world);
        let mut lens: Vec<(u32, u64)> = Vec::with_capacity(world);
        for (rank, chunk) in (0u32..).zip(all.chunks_exact(slot)) {
            let msg = envelope::decode_slot(chunk).map_err(|reason| Error::Decode {
                rank: Some(rank),
                reason,
            })?;
            versions.version(rank, msg.version);
            same &= msg.version == WIRE_VERSION && chunk == mine;
            let at = rank as usize * slot + SLOT_HEADER_LEN;
            inline.push(msg.inline.map(|e| (0, at, at + e.len())));
            second_lens.push(if msg.inline.is_some() {
                0
            } else {
                msg.len as usize
            });
            lens.push((msg.len, msg.limit));
        }
        versions.verdict(None)?;
        // Every rank applies the smallest limit of all ranks to every
        // envelope, inline or not, before the fast path, before reading any
        // envelope and before allocating for the second round, so every rank
        // takes the same branch whatever its own limit; a rank whose own
        // envelope is over it fails with its peers (its envelope is not
        // sent in full: the slot says its length).
        let smallest = lens.iter().map(|&(_, l)| l).min().unwrap_or(0);
        if let Some((rank, &(len, _))) = (0u32..)
            .zip(&lens)
            .find(|(_, &(len, _))| u64::from(len) > smallest)
        {
            return Err(Error::message_too_large(
                rank,
                len as usize,
                usize::try_from(smallest).unwrap_or(usize::MAX),
            ));
        }
        if same {
            return Ok(Round::Fast);
        }
        let mut bufs = vec![all];
        let spans: Vec<Span> = if second_lens.iter().all(|&l| l == 0) {
            inline.iter().map(|e| e.unwrap_or_default()).collect()
        } else {
            let own: &[u8] = if fits {
                &[]
            } else {
                &self.buf[SLOT_HEADER_LEN..]
            };
            let second = t.all_gather_sized(own, &second_lens, deadline)?;
            traffic.add(own.len(), second.iter().map(Vec::len).sum());
            let mut spans = Vec::with_capacity(world);
            for (rank, ((first, &want), rest)) in
                (0u32..).zip(inline.iter().zip(&second_lens).zip(&second))
            {
                if rest.len() != want {
                    return Err(Error::Decode {
                        rank: Some(rank),
                        reason: DecodeError::Invalid {
                            field: "second round",
                            detail: format!("{} bytes where its slot says {want}", rest.len()),
                        },
                    });
                }
                spans.push(match first {
                    Some(e) => *e,
                    None => (1 + rank as usize, 0, rest.len()),
                });
            }
            bufs.extend(second);
            spans
        };
        Ok(Round::Gathered { bufs, envs: spans })
    }

    /// Shuts the channel down cleanly: peers waiting for this rank fail at
    /// once with [`Error::PeerLost`] (reason `Shutdown`). Later exchanges
    /// fail with [`Error::ChannelUnusable`].
    ///
    /// # Errors
    /// The transport's error if the notice could not be sent.
    pub fn shutdown(&mut self) -> Result<()> {
        if self.failed.is_none() {
            self.failed = Some(Poison::new(
                FirstFailure::Shutdown,
                "this rank shut the channel down",
            ));
        }
        self.transport.shutdown()
    }

    /// Marks the channel unusable after a fatal error that a decision kind
    /// found in the gathered values of a completed exchange (every rank holds
    /// the same values, so every rank finds the same error).
    pub(crate) fn fail(&mut self, error: &Error) {
        if self.failed.is_none() {
            self.failed = Some(Poison::of(error));
        }
    }

    /// Abandons the channel after an error: marks it unusable and tells the
    /// peers (as [`Channel::shutdown`]), ignoring transport errors.
    pub fn abort(&mut self) {
        if self.failed.is_none() {
            self.failed = Some(Poison::new(
                FirstFailure::Abort,
                "this rank aborted the channel",
            ));
        }
        if let Err(e) = self.transport.abort() {
            tracing::warn!(error = %e, "abort: could not notify peers");
        }
    }
}

/// A peer's first round of another size than this rank's slot, as the
/// engine's fixed-size gather reports it (a message over the slot's size,
/// or a contribution of another size: nothing else in a fixed-size gather
/// is either), said as what it means: the ranks do not share the slot size,
/// the fast-path setting or the wire version.
fn other_first_round(e: Error, slot: usize) -> Error {
    match e {
        Error::Decode {
            rank: Some(rank),
            reason: DecodeError::TooLarge { len, .. },
        } => mismatch(rank, format!("{len} bytes"), slot),
        Error::Decode {
            rank: Some(rank),
            reason: DecodeError::FixedSize { len, expected },
        } => mismatch(
            rank,
            format!("{}, expected {expected}", counted(len, "byte", "bytes")),
            slot,
        ),
        other => other,
    }
}

fn mismatch(rank: u32, theirs: String, slot: usize) -> Error {
    Error::Decode {
        rank: Some(rank),
        reason: DecodeError::Invalid {
            field: "first round",
            detail: format!(
                "rank {rank} sent {theirs} where this rank's slot is {slot} bytes: the ranks \
                 need the same slot size (ChannelOptions::slot_bytes), the same fast-path \
                 setting and the same wire version"
            ),
        },
    }
}

/// The join of every gathered payload (`payloads`: index = rank) as a new
/// value: rank 0's is decoded, every later one joined into it with
/// [`Join::join_encoded`]; a payload that does not read names its rank.
fn join_new<J: Join>(bufs: &[Vec<u8>], payloads: &[Span]) -> Result<J> {
    let named = |rank: usize| {
        move |reason| Error::Decode {
            rank: u32::try_from(rank).ok(),
            reason,
        }
    };
    let mut it = payloads.iter().map(|&(b, s, e)| &bufs[b][s..e]);
    let first = it.next().ok_or_else(|| Error::Decode {
        rank: None,
        reason: DecodeError::Invalid {
            field: "gathered envelopes",
            detail: "none".into(),
        },
    })?;
    let mut merged = J::read_payload(first).map_err(named(0))?;
    for (rank, p) in (1usize..).zip(it) {
        merged.join_encoded(p).map_err(named(rank))?;
    }
    Ok(merged)
}

/// Checks every rank's envelope (the order and errors of `checks`) and
/// returns where each rank's payload lies, index = rank. Every payload is
/// read from the gathered bytes, this rank's too, so a rank whose own bytes
/// do not decode fails like its peers.
fn check_envelopes(bufs: &[Vec<u8>], envs: &[Span], limits: &Limits) -> Result<Vec<Span>> {
    let mut census = Census::default();
    let mut failure = None;
    let mut spans: Vec<Span> = Vec::with_capacity(envs.len());
    for (rank, &(b, start, end)) in (0u32..).zip(envs) {
        let bytes = &bufs[b][start..end];
        let decoded = envelope::peek_header(bytes).and_then(|(version, _)| {
            census.version(rank, version);
            if version == WIRE_VERSION {
                EnvelopeRef::decode(bytes, limits).map(Some)
            } else {
                Ok(None)
            }
        });
        match decoded {
            Ok(Some(env)) => {
                census.envelope_ref(rank, env);
                // The payload ends the envelope.
                spans.push((b, end - env.payload.len(), end));
            }
            Ok(None) => {}
            Err(reason) => {
                failure.get_or_insert(Error::Decode {
                    rank: Some(rank),
                    reason,
                });
            }
        }
    }
    census.verdict(failure)?;
    if spans.len() != envs.len() {
        return Err(Error::Decode {
            rank: None,
            reason: DecodeError::Invalid {
                field: "gathered envelopes",
                detail: format!("{} of {} read", spans.len(), envs.len()),
            },
        });
    }
    Ok(spans)
}
