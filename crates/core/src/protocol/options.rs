//! The options of a [`Channel`](crate::Channel) and of one exchange, and
//! where an exchange's deadline comes from: [`DEFAULT_TIMEOUT`] (300 s),
//! replaced by [`ChannelOptions::timeout`] (which
//! [`ChannelOptions::from_env`] takes from the `CCOL_TIMEOUT_S` environment
//! variable: seconds, fractions allowed), replaced by a per-call
//! [`ExchangeOptions::timeout`]. A channel reads no environment variable
//! itself. One deadline covers every round of an exchange.

use crate::error::{Error, Result};
use crate::protocol::envelope::{Limits, DEFAULT_SLOT_BYTES};
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

/// Name of the environment variable that sets
/// [`ChannelOptions::hierarchical_from`] (a world size, from 2).
pub const HIERARCHICAL_FROM_ENV: &str = "CCOL_HIERARCHICAL_FROM";

/// Reads `CCOL_HIERARCHICAL_FROM`, if set; an empty value counts as unset.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable when it is set to
/// anything but an integer from 2 (surrounding spaces allowed).
pub fn hierarchical_from_env() -> Result<Option<u32>> {
    match std::env::var(HIERARCHICAL_FROM_ENV) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n >= 2)
            .map(Some)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{HIERARCHICAL_FROM_ENV}={v:?}: expected a world size from 2"
                ))
            }),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::InvalidArgument(format!(
            "{HIERARCHICAL_FROM_ENV} is not valid UTF-8"
        ))),
    }
}

/// Most bytes the flat exchange's first round brings one rank, over all
/// ranks' slots (64 KiB; see [`ChannelOptions::slot_bytes`]).
pub const SLOT_ROUND_BYTES: usize = 64 << 10;

/// Knobs of a [`Channel`](crate::Channel), built with
/// `ChannelOptions::default().with_…` (or [`from_env`](Self::from_env)`()?.with_…`):
/// one `with_<field>` setter per field. New knobs are added as fields with defaults.
#[derive(Clone, Debug, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ChannelOptions {
    /// Deadline of each exchange; `None` = [`DEFAULT_TIMEOUT`] (300 s).
    /// `with_timeout(Duration)` sets `Some`.
    #[setters(strip_option)]
    pub timeout: Option<Duration>,
    /// Bounds on what peers may send (default [`Limits::default`]).
    pub limits: Limits,
    /// Use the identical-envelope fast path (default on).
    pub fast_path: bool,
    /// Directory of per-rank JSON-lines trace files (`<dir>/rank-<r>.jsonl`,
    /// see [`crate::protocol::trace`]); `None` = no file (the default).
    /// `with_trace_dir(impl Into<PathBuf>)` sets `Some`.
    #[setters(strip_option, into)]
    pub trace_dir: Option<std::path::PathBuf>,
    /// Smallest world size that uses the hierarchical (tree) exchange of
    /// [`crate::protocol::tree`] (default [`crate::protocol::tree::DEFAULT_HIERARCHICAL_FROM`],
    /// 64 ranks; `u32::MAX` = never), over a transport with cheap
    /// point-to-point only ([`Channel::topology`](crate::Channel::topology) says which runs and why).
    /// Same decisions and errors as the flat exchange; O(payload · log N)
    /// bytes received per rank.
    pub hierarchical_from: u32,
    /// Size of the flat exchange's first round, in bytes (default
    /// [`DEFAULT_SLOT_BYTES`], 4096; from [`MIN_SLOT_BYTES`](crate::protocol::envelope::MIN_SLOT_BYTES) to
    /// [`MAX_SLOT_BYTES`](crate::protocol::envelope::MAX_SLOT_BYTES)): every rank sends exactly one slot, its
    /// envelope's digest and, when the envelope fits in the rest (slot − 48
    /// bytes), the envelope, so that small states take one collective round.
    /// Large worlds use a smaller slot, so that the round never brings a
    /// rank more than [`SLOT_ROUND_BYTES`] (64 KiB) in all:
    /// `max(MIN_SLOT_BYTES, min(slot_bytes, 64 KiB / world size))`
    /// ([`Channel::slot_bytes`](crate::Channel::slot_bytes)), e.g. 4096 bytes up to 16 ranks, 1024 at 64.
    /// Configuration every rank must share: ranks with different slot sizes
    /// fail their first exchange (the engine's fixed-size gather refuses
    /// contributions of another size: a decode error naming the rank on
    /// Gloo and in-process; the engine's error or the deadline on c10d and
    /// NCCL). [`Channel::with_options`](crate::Channel::with_options) checks
    /// the range.
    pub slot_bytes: usize,
    /// The job-wide ranks of the channel's members, for a channel among some
    /// of a job's ranks (`None`, the default: the channel's ranks are the
    /// job's). Every error the channel returns names ranks by their job rank
    /// ([`Error::in_global_ranks`](crate::Error::in_global_ranks)), and its
    /// trace file is `rank-<job rank>.jsonl`. `with_rank_map(RankMap)` sets
    /// `Some`; [`Channel::with_options`](crate::Channel::with_options) checks
    /// that it has one rank per member.
    #[setters(strip_option)]
    pub rank_map: Option<crate::RankMap>,
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
            rank_map: None,
        }
    }
}

impl ChannelOptions {
    /// The defaults with what the environment sets — the one place the
    /// library reads `CCOL_*` for a channel: `CCOL_TIMEOUT_S` (seconds) as
    /// [`timeout`](Self::timeout), `CCOL_TRACE_DIR` as
    /// [`trace_dir`](Self::trace_dir), `CCOL_HIERARCHICAL_FROM` as
    /// [`hierarchical_from`](Self::hierarchical_from). Unset or empty
    /// variables leave the defaults; later `with_…` calls replace what it
    /// read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `CCOL_TIMEOUT_S` when it is set but
    /// not a finite, positive number of seconds, or `CCOL_HIERARCHICAL_FROM`
    /// when it is set but not an integer from 2.
    pub fn from_env() -> Result<Self> {
        let defaults = ChannelOptions::default();
        Ok(ChannelOptions {
            timeout: timeout_from_env()?,
            trace_dir: crate::protocol::trace::trace_dir_from_env(),
            hierarchical_from: hierarchical_from_env()?.unwrap_or(defaults.hierarchical_from),
            ..defaults
        })
    }
}

/// How a channel's exchanges run ([`Channel::topology`](crate::Channel::topology)).
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

/// Per-call knobs of [`Channel::exchange_with`](crate::Channel::exchange_with),
/// built with `ExchangeOptions::default().with_…` (one `with_<field>` setter
/// per field).
#[derive(Clone, Debug, Default, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ExchangeOptions {
    /// Replaces the channel's deadline for this exchange; `None` (the
    /// default) keeps the channel's. `with_timeout(Duration)` sets `Some`.
    #[setters(strip_option)]
    pub timeout: Option<Duration>,
    /// The canonical text of whatever configuration shapes this decision
    /// (per-source overrides, options; default empty). It must be equal on
    /// every rank: ranks that differ get [`Error::Disagreement`] naming the
    /// values. `with_config(impl Into<String>)`.
    #[setters(into)]
    pub config: String,
    /// Whether the caller needs every rank's value
    /// ([`Gathered::per_rank`](crate::Gathered::per_rank)), not only the
    /// join: the exchange then runs flat whatever the channel's topology
    /// (the tree moves joins, not every value). Every rank must pass the
    /// same. Default `false`.
    pub every_value: bool,
}
