//! The exchange protocol: one [`Channel`] per communicator, one
//! [`Channel::exchange`] per decision point.
//!
//! An exchange:
//! 1. encodes this rank's value as an [`Envelope`] (version, sequence number,
//!    compile key, decision kind, configuration, payload);
//! 2. fast path: gathers one fixed-size 32-byte digest message from every
//!    rank; if every digest equals this rank's, every envelope is identical
//!    and the result is this rank's own value (joins are idempotent);
//! 3. otherwise gathers the envelopes, checks version, sequence number,
//!    compile key and kind (→ [`Error::Desync`] grouping the ranks), then the
//!    configuration (→ [`Error::Disagreement`]), decodes every payload
//!    (→ [`Error::Decode`] naming the rank) and joins them in rank order.
//!
//! Every rank sees the same gathered bytes and so takes the same branch and
//! returns the same result or the same error. Exchanges pair by sequence
//! number: the `k`-th exchange of each rank meets the `k`-th of every other,
//! whatever compile key each rank passes (the key is checked, not used to
//! pair).
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

use crate::error::{Error, ExchangeInfo, Result};
use crate::protocol::checks::Census;
use crate::protocol::envelope::{self, Envelope, Limits, DIGEST_MSG_LEN, WIRE_VERSION};
use crate::protocol::join::Join;
use crate::transport::{Deadline, Transport};
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
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            timeout: None,
            limits: Limits::default(),
            fast_path: true,
            trace_dir: None,
            hierarchical_from: crate::protocol::tree::DEFAULT_HIERARCHICAL_FROM,
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
}

/// How a channel's exchanges run ([`Channel::topology`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// Flat: one all_gather of fixed-size digests, then one of the
    /// envelopes when they differ; every rank receives every envelope.
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

/// The result of one exchange.
#[derive(Clone, Debug)]
pub struct Gathered<J> {
    merged: J,
    per_rank: Option<Vec<J>>,
    seq: u64,
    fast: bool,
}

impl<J> Gathered<J> {
    /// The join of every rank's value (the same on every rank).
    pub fn merged(&self) -> &J {
        &self.merged
    }

    /// Consumes the result, returning the join.
    pub fn into_merged(self) -> J {
        self.merged
    }

    /// Every rank's value, index = rank; `None` when the fast path showed
    /// that every rank sent exactly what this rank sent, or when the
    /// hierarchical exchange ran (it moves joins, not every value).
    pub fn per_rank(&self) -> Option<&[J]> {
        self.per_rank.as_deref()
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
    failed: Option<(&'static str, String)>,
    trace: Option<crate::protocol::trace::TraceFile>,
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
    /// [`Error::InvalidArgument`] if the trace file cannot be created.
    pub fn with_options(transport: Arc<dyn Transport>, options: ChannelOptions) -> Result<Self> {
        let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
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
        self.failed.as_ref().map(|(_, cause)| cause.as_str())
    }

    /// Exchanges `local` with every rank under compile key `key` and returns
    /// the join of every rank's value. Configuration that shapes the
    /// decision travels in [`ExchangeOptions::config`]
    /// ([`Channel::exchange_with`]).
    ///
    /// Cost: one all_gather of 32 bytes per rank when every rank's envelope
    /// is identical; otherwise that plus one variable-length all_gather of
    /// the envelopes. A world of one issues nothing.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] (not fatal) if `key` or `config` exceed the limits;
    /// - [`Error::Timeout`] naming the ranks that did not arrive, with the
    ///   exchange and the last exchange completed;
    /// - [`Error::PeerLost`] when a rank shut down or disconnected;
    /// - [`Error::Desync`], [`Error::VersionMismatch`], [`Error::Disagreement`],
    ///   [`Error::Decode`] — the same on every rank;
    /// - [`Error::ChannelUnusable`] after an earlier fatal error.
    pub fn exchange<J: Join>(&mut self, key: &str, local: &J) -> Result<Gathered<J>> {
        self.exchange_with(key, local, &ExchangeOptions::default())
    }

    /// [`Channel::exchange`] with per-call options.
    ///
    /// # Errors
    /// As [`Channel::exchange`].
    pub fn exchange_with<J: Join>(
        &mut self,
        key: &str,
        local: &J,
        options: &ExchangeOptions,
    ) -> Result<Gathered<J>> {
        let config = options.config.as_str();
        if let Some((first, cause)) = &self.failed {
            return Err(Error::unusable(first, cause.clone()));
        }
        let payload = postcard::to_allocvec(local).map_err(|e| {
            Error::InvalidArgument(format!("cannot encode the value of kind {}: {e}", J::KIND))
        })?;
        let env = Envelope {
            version: WIRE_VERSION,
            seq: self.seq,
            kind: J::KIND.to_owned(),
            key: key.to_owned(),
            config: config.to_owned(),
            payload,
        };
        let encoded = env
            .encode(&self.limits)
            .map_err(|e| Error::InvalidArgument(format!("this rank's own envelope: {e}")))?;
        let start = std::time::Instant::now();
        let deadline = Deadline::after(options.timeout.unwrap_or(self.timeout));
        let seq = self.seq;
        let _span = tracing::debug_span!("exchange", seq, key, kind = J::KIND).entered();
        let mut traffic = crate::protocol::trace::Traffic::default();
        let outcome = if self.topology == Topology::Tree {
            crate::protocol::tree::exchange(
                &*self.transport,
                &env,
                &encoded,
                local,
                &self.limits,
                self.fast_path,
                deadline,
                &mut traffic,
            )
            .map(|(merged, fast)| (merged, None, fast))
        } else {
            self.run::<J>(&env, &encoded, deadline, &mut traffic)
                .map(|per_rank| {
                    let merged = match &per_rank {
                        None => local.clone(),
                        Some(values) => join_all(values),
                    };
                    let fast = per_rank.is_none();
                    (merged, per_rank, fast)
                })
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
                    self.failed = Some((e.kind(), e.to_string()));
                }
                Err(e)
            }
        };
        let (rank, world_size) = (self.rank(), self.world_size());
        let elapsed = start.elapsed();
        crate::protocol::trace::finish(
            self.trace.as_mut(),
            &env,
            rank,
            world_size,
            traffic,
            elapsed,
            result.as_ref().map(|g| (g.merged(), g.fast_path())),
        );
        result
    }

    fn run<J: Join>(
        &self,
        env: &Envelope,
        encoded: &[u8],
        deadline: Deadline,
        traffic: &mut crate::protocol::trace::Traffic,
    ) -> Result<Option<Vec<J>>> {
        let t = &*self.transport;
        if t.world_size() == 1 {
            return Ok(None);
        }
        if self.fast_path {
            let mine =
                envelope::encode_digest_msg(WIRE_VERSION, env.seq, &envelope::digest(encoded));
            let all = t.all_gather_fixed(&mine, deadline)?;
            traffic.add(mine.len(), all.len());
            let mut same = true;
            let mut versions = Census::default();
            for (rank, chunk) in (0u32..).zip(all.chunks(DIGEST_MSG_LEN)) {
                let msg = envelope::decode_digest_msg(chunk).map_err(|reason| Error::Decode {
                    rank: Some(rank),
                    reason,
                })?;
                versions.version(rank, msg.version);
                same &= msg.version == WIRE_VERSION && chunk == mine.as_slice();
            }
            versions.verdict(None)?;
            if same {
                return Ok(None);
            }
        }
        let all = t.all_gather(encoded, self.limits.max_message_bytes, deadline)?;
        traffic.add(encoded.len(), all.iter().map(Vec::len).sum());
        // The checks and their order are the tree's too (`checks`).
        let mut census = Census::default();
        let mut failure = None;
        let mut envs = Vec::with_capacity(all.len());
        for (rank, bytes) in (0u32..).zip(&all) {
            let decoded = envelope::peek_header(bytes).and_then(|(version, _)| {
                census.version(rank, version);
                if version == WIRE_VERSION {
                    Envelope::decode(bytes, &self.limits).map(Some)
                } else {
                    Ok(None)
                }
            });
            match decoded {
                Ok(Some(env)) => {
                    census.envelope(rank, &env);
                    envs.push(env);
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
        drop(all);
        census.verdict(failure)?;
        // Every payload is decoded from the gathered bytes, this rank's too,
        // so a rank whose own bytes do not decode fails like its peers.
        let mut values = Vec::with_capacity(envs.len());
        for (rank, e) in (0u32..).zip(&envs) {
            values.push(
                envelope::decode_payload::<J>(&e.kind, &e.payload).map_err(|reason| {
                    Error::Decode {
                        rank: Some(rank),
                        reason,
                    }
                })?,
            );
        }
        Ok(Some(values))
    }

    /// Shuts the channel down cleanly: peers waiting for this rank fail at
    /// once with [`Error::PeerLost`] (reason `Shutdown`). Later exchanges
    /// fail with [`Error::ChannelUnusable`].
    ///
    /// # Errors
    /// The transport's error if the notice could not be sent.
    pub fn shutdown(&mut self) -> Result<()> {
        if self.failed.is_none() {
            self.failed = Some(("shutdown", "this rank shut the channel down".into()));
        }
        self.transport.shutdown()
    }

    /// Marks the channel unusable after a fatal error that a decision kind
    /// found in the gathered values of a completed exchange (every rank holds
    /// the same values, so every rank finds the same error).
    pub(crate) fn fail(&mut self, error: &Error) {
        if self.failed.is_none() {
            self.failed = Some((error.kind(), error.to_string()));
        }
    }

    /// Abandons the channel after an error: marks it unusable and tells the
    /// peers (as [`Channel::shutdown`]), ignoring transport errors.
    pub fn abort(&mut self) {
        if self.failed.is_none() {
            self.failed = Some(("abort", "this rank aborted the channel".into()));
        }
        if let Err(e) = self.transport.abort() {
            tracing::warn!(error = %e, "abort: could not notify peers");
        }
    }
}

/// Joins values in rank order (any order gives the same result).
fn join_all<J: Join>(values: &[J]) -> J {
    let mut it = values.iter();
    let mut acc = it.next().cloned().expect("world_size >= 1");
    for v in it {
        acc.join(v);
    }
    acc
}
