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
//!    order (a frame state straight from the received bytes,
//!    [`FrameState::join_encoded`]; a payload that does not decode →
//!    [`Error::Decode`] naming the rank). [`Channel::exchange_in_place`]
//!    instead joins every peer's payload into the caller's value
//!    ([`FrameState::join_payloads`]), after checking that the gathered copy
//!    of this rank's envelope is the one it sent (if not, it joins every
//!    gathered payload as `exchange` does, so that every rank still gets the
//!    same result or error).
//!
//! Every rank sees the same gathered bytes and so takes the same branch and
//! returns the same result or the same error. Exchanges pair by sequence
//! number: the `k`-th exchange of each rank meets the `k`-th of every other,
//! whatever compile key each rank passes (the key is checked, not used to
//! pair). Every rank must use the same slot size (it sets the first round's
//! size); with the fast path off, an exchange is one variable-length
//! all_gather of the envelopes instead.
//!
//! Deadlines and options: [`crate::protocol::options`]; the flat rounds:
//! [`crate::protocol::flat`]; the result: [`crate::protocol::gathered`].
//!
//! After a fatal error ([`Error::is_fatal`]) the channel refuses further
//! exchanges with [`Error::ChannelUnusable`]; call [`Channel::abort`].
//!
//! [`FrameState::join_encoded`]: crate::decisions::shapes::FrameState::join_encoded
//! [`FrameState::join_payloads`]: crate::decisions::shapes::FrameState::join_payloads

use crate::error::{Error, ExchangeInfo, FirstFailure, Poison, Result};
use crate::protocol::envelope::{
    self, Envelope, EnvelopeRef, Limits, MAX_SLOT_BYTES, MIN_SLOT_BYTES, SLOT_HEADER_LEN,
};
use crate::protocol::flat;
use crate::protocol::gathered::Local;
use crate::protocol::join::{encode_payload_into, Join};
use crate::protocol::Rounds;
use crate::transport::{Deadline, Transport};
use std::sync::Arc;
use std::time::Duration;

pub use crate::protocol::gathered::{Gathered, PerRank};
pub use crate::protocol::options::{
    parse_timeout_secs, timeout_from_env, ChannelOptions, ExchangeOptions, FlatReason, Topology,
    DEFAULT_TIMEOUT, SLOT_ROUND_BYTES, TIMEOUT_ENV,
};

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
    /// [`ChannelOptions::rank_map`].
    rank_map: Option<crate::RankMap>,
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
        let world = transport.world_size();
        if let Some(map) = &options.rank_map {
            if map.ranks().len() != world as usize {
                return Err(Error::InvalidArgument(format!(
                    "the rank map lists {} job ranks for a channel of {world}",
                    map.ranks().len()
                )));
            }
        }
        let global = |r: u32| options.rank_map.as_ref().map_or(r, |m| m.global(r));
        let trace = crate::protocol::trace::TraceFile::for_channel(
            options.trace_dir.as_deref(),
            global(transport.rank()),
        )?;
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
            rank_map: options.rank_map,
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
    /// own costs a comparison ([`FrameState::join_payloads`]). This is what a
    /// compiler that keeps its state between exchanges wants (Dynamo merges
    /// the gathered frame states into its own the same way).
    ///
    /// [`FrameState::join_payloads`]: crate::decisions::shapes::FrameState::join_payloads
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
        // The tree, unless the caller needs every rank's value.
        let tree = self.topology == Topology::Tree && !options.every_value;
        let slot_round = self.fast_path && !tree && self.transport.world_size() > 1;
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
        let mut rounds = Rounds {
            transport: &*self.transport,
            limits: &self.limits,
            fast_path: self.fast_path,
            deadline,
            traffic: crate::protocol::trace::Traffic::default(),
        };
        let outcome = if tree {
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
                    crate::protocol::tree::exchange(&mut rounds, &env, encoded, local.get())
                })
                .map(|(merged, fast)| (local.replaced_by(merged, fast), None, fast))
        } else {
            let own = self.transport.rank();
            flat::run(&mut rounds, &mut self.buf, self.slot_bytes, seq).and_then(|round| {
                let sent = self.buf.get(SLOT_HEADER_LEN..SLOT_HEADER_LEN + env_len);
                flat::finish(local, round, own, sent, &self.limits)
            })
        };
        let traffic = rounds.traffic;
        let result = match outcome {
            Ok((merged, payloads, fast)) => {
                self.last_completed = Some(seq);
                self.seq += 1;
                Ok(Gathered {
                    merged,
                    payloads,
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
                let e = self.in_job_ranks(e);
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
            seq,
            key,
            rank,
            world_size,
            traffic,
            elapsed,
            result.as_ref().map(|g| (g.merged(), g.fast_path())),
        );
        result
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
    /// the same values, so every rank finds the same error); returns it as
    /// the caller should report it (in job ranks under a
    /// [`ChannelOptions::rank_map`]).
    pub(crate) fn fail(&mut self, error: Error) -> Error {
        let error = self.in_job_ranks(error);
        if self.failed.is_none() {
            self.failed = Some(Poison::of(&error));
        }
        error
    }

    /// `error` naming job ranks under a [`ChannelOptions::rank_map`], as it
    /// is otherwise.
    fn in_job_ranks(&self, error: Error) -> Error {
        match &self.rank_map {
            Some(map) => error.in_global_ranks(map),
            None => error,
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
