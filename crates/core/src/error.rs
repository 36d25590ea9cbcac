//! The one error type of the library.
//!
//! Every transport and every exchange returns [`Error`]. Backends keep their
//! own error types and convert them into [`Error::Backend`], keeping the
//! engine's native code and text.

use std::fmt;
use std::time::Duration;

/// Where an error happened in the exchange protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeInfo {
    /// Sequence number of the exchange that failed (0-based per channel).
    pub seq: u64,
    /// Compile key this rank was exchanging under.
    pub key: String,
    /// The last exchange every rank completed on this channel, if any.
    pub last_completed: Option<u64>,
}

impl fmt::Display for ExchangeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exchange #{} '{}'", self.seq, self.key)?;
        match self.last_completed {
            Some(s) => write!(f, " (last exchange completed with every rank: #{s})"),
            None => write!(f, " (no exchange had completed on this channel)"),
        }
    }
}

/// How a peer was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLoss {
    /// The peer shut its channel down cleanly (it has no more exchanges).
    Shutdown,
    /// The peer's connection dropped or its process died.
    Disconnected,
    /// The peer abandoned its channel after an error of its own (a timeout,
    /// a lost peer, …); its own error says which.
    Aborted,
}

impl PeerLoss {
    /// What one rank (`many` false) or several did, e.g. `shut its channel
    /// down (it has no more exchanges)`.
    fn phrase(self, many: bool) -> &'static str {
        match (self, many) {
            (PeerLoss::Shutdown, false) => "shut its channel down (it has no more exchanges)",
            (PeerLoss::Shutdown, true) => "shut their channels down (they have no more exchanges)",
            (PeerLoss::Disconnected, _) => "disconnected",
            (PeerLoss::Aborted, false) => "aborted its channel after an error of its own",
            (PeerLoss::Aborted, true) => "aborted their channels after errors of their own",
        }
    }
}

impl PeerLoss {
    /// The stable name: `"shutdown"`, `"disconnected"` or `"aborted"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            PeerLoss::Shutdown => "shutdown",
            PeerLoss::Disconnected => "disconnected",
            PeerLoss::Aborted => "aborted",
        }
    }
}

impl fmt::Display for PeerLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.phrase(false))
    }
}

/// What an [`Error`] is, as a value ([`Error::kind`]): one per variant of
/// [`Error`]. Code that must tell errors apart matches on this (or on the
/// variant), never on an error's text.
///
/// [`ErrorKind::as_str`] gives the stable name that logs, the CLI's output,
/// the conformance table and the Python package print (`"timeout"`,
/// `"peer_lost"`, …); it never changes for an existing kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::PeerLost`].
    PeerLost,
    /// [`Error::Desync`].
    Desync,
    /// [`Error::VersionMismatch`].
    VersionMismatch,
    /// [`Error::Disagreement`].
    Disagreement,
    /// [`Error::Decode`].
    Decode,
    /// [`Error::Backend`].
    Backend,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::ChannelUnusable`].
    ChannelUnusable,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::Timeout,
        ErrorKind::PeerLost,
        ErrorKind::Desync,
        ErrorKind::VersionMismatch,
        ErrorKind::Disagreement,
        ErrorKind::Decode,
        ErrorKind::Backend,
        ErrorKind::InvalidArgument,
        ErrorKind::Unsupported,
        ErrorKind::ChannelUnusable,
    ];

    /// The kind's stable snake_case name, e.g. `"peer_lost"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::PeerLost => "peer_lost",
            ErrorKind::Desync => "desync",
            ErrorKind::VersionMismatch => "version_mismatch",
            ErrorKind::Disagreement => "disagreement",
            ErrorKind::Decode => "decode",
            ErrorKind::Backend => "backend",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::ChannelUnusable => "channel_unusable",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with a kind's name ([`ErrorKind::as_str`]), for tests and
/// logs; code that decides something matches on the enum.
impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// As `ErrorKind == &str`, the other way round.
impl PartialEq<ErrorKind> for &str {
    fn eq(&self, other: &ErrorKind) -> bool {
        *self == other.as_str()
    }
}

/// What first made a channel or transport unusable
/// ([`Error::ChannelUnusable`]'s `first`): an error, or this rank ending it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FirstFailure {
    /// An error of this kind.
    Error(ErrorKind),
    /// This rank shut it down.
    Shutdown,
    /// This rank aborted it.
    Abort,
}

impl FirstFailure {
    /// The error kind's name ([`ErrorKind::as_str`]), or `"shutdown"` /
    /// `"abort"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FirstFailure::Error(kind) => kind.as_str(),
            FirstFailure::Shutdown => "shutdown",
            FirstFailure::Abort => "abort",
        }
    }
}

impl fmt::Display for FirstFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compares with [`FirstFailure::as_str`], for tests and logs.
impl PartialEq<&str> for FirstFailure {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// The first failure of a channel or transport, kept so that every later
/// call gets [`Error::ChannelUnusable`] saying it (the channel's, Gloo's and
/// NCCL's poison slot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poison {
    /// What it was.
    pub first: FirstFailure,
    /// Its message.
    pub cause: String,
}

impl Poison {
    /// The poison `error` leaves: its kind and message.
    pub fn of(error: &Error) -> Self {
        Poison {
            first: FirstFailure::Error(error.kind()),
            cause: error.to_string(),
        }
    }

    /// This rank ended it: `first` is [`FirstFailure::Shutdown`] or
    /// [`FirstFailure::Abort`] (or an error kind), `cause` says how.
    pub fn new(first: FirstFailure, cause: impl Into<String>) -> Self {
        Poison {
            first,
            cause: cause.into(),
        }
    }

    /// What a call on the poisoned channel or transport gets.
    pub fn error(&self) -> Error {
        Error::ChannelUnusable {
            first: self.first,
            cause: self.cause.clone(),
        }
    }
}

/// A set of ranks that did the same thing, and what that was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankGroup {
    /// The ranks, ascending.
    pub ranks: Vec<u32>,
    /// What they were doing or holding, e.g. `#42 'train_step@model.rs:88'`.
    pub what: String,
}

/// The job-wide ranks of a channel's members, index = the channel's rank:
/// a channel among some of a job's ranks (the replicas of one pipeline
/// stage, say) names ranks in its errors by their number in the job, not
/// in the channel ([`Error::in_global_ranks`], applied by the channel to
/// every error it returns when
/// [`ChannelOptions::rank_map`](crate::ChannelOptions::rank_map) is set).
///
/// Strictly ascending, so that lists of ranks stay ascending once mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankMap(std::sync::Arc<[u32]>);

impl RankMap {
    /// The map of a channel whose rank `r` is job rank `global[r]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `global` is empty or not strictly
    /// ascending (a rank listed twice, or out of order).
    pub fn new(global: Vec<u32>) -> Result<Self> {
        if global.is_empty() {
            return Err(Error::InvalidArgument(
                "a rank map needs at least one rank".into(),
            ));
        }
        if let Some(w) = global.windows(2).find(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument(format!(
                "a rank map must list job ranks strictly ascending: {} then {}",
                w[0], w[1]
            )));
        }
        Ok(RankMap(global.into()))
    }

    /// The job rank of channel rank `r` (`r` itself beyond the map, which a
    /// channel of the map's size never names).
    pub fn global(&self, r: u32) -> u32 {
        self.0.get(r as usize).copied().unwrap_or(r)
    }

    /// Every member's job rank, index = channel rank.
    pub fn ranks(&self) -> &[u32] {
        &self.0
    }
}

/// Formats groups as `ranks [0,1,3] at #42 'a'; rank [2] at #42 'b'`.
/// `verb` is `[for one rank, for several]`, e.g. `[" speaks ", " speak "]`.
fn fmt_groups(f: &mut fmt::Formatter<'_>, groups: &[RankGroup], verb: [&str; 2]) -> fmt::Result {
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            f.write_str("; ")?;
        }
        let (word, sep) = if g.ranks.len() == 1 {
            ("rank", verb[0])
        } else {
            ("ranks", verb[1])
        };
        write!(f, "{word} {}{sep}{}", RankList(&g.ranks), g.what)?;
    }
    Ok(())
}

/// `error`'s message followed by each of its causes' (`source()`), joined by
/// `": "`: for errors that keep their detail in the source, as libloading's
/// keep dlerror's text (its Display says only "dlopen failed").
///
/// ```
/// #[derive(Debug)]
/// struct Load(std::io::Error);
/// impl std::fmt::Display for Load {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("dlopen failed")
///     }
/// }
/// impl std::error::Error for Load {
///     fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
///         Some(&self.0)
///     }
/// }
/// let e = Load(std::io::Error::other("libgloo.so.0: cannot open shared object file"));
/// assert_eq!(
///     compiler_collectives_core::with_sources(&e),
///     "dlopen failed: libgloo.so.0: cannot open shared object file"
/// );
/// ```
pub fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `n` with the noun in the right number: `counted(1, "byte", "bytes")` is
/// `1 byte`, `counted(2, …)` is `2 bytes`. Every message of the library (and of
/// the crates built on it) counts things this way.
pub fn counted<N>(n: N, one: &str, many: &str) -> String
where
    N: fmt::Display + PartialEq + From<u8>,
{
    if n == N::from(1) {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Displays a rank list as `[0,1,3]`.
#[derive(Debug)]
pub struct RankList<'a>(pub &'a [u32]);

impl fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        f.write_str("]")
    }
}

/// Groups `(rank, value)` pairs by value, ranks ascending, groups ordered by
/// their first rank.
pub fn group_ranks<T: fmt::Display>(items: impl IntoIterator<Item = (u32, T)>) -> Vec<RankGroup> {
    let mut groups: Vec<RankGroup> = Vec::new();
    for (rank, value) in items {
        let what = value.to_string();
        match groups.iter_mut().find(|g| g.what == what) {
            Some(g) => g.ranks.push(rank),
            None => groups.push(RankGroup {
                ranks: vec![rank],
                what,
            }),
        }
    }
    for g in &mut groups {
        g.ranks.sort_unstable();
    }
    groups.sort_by_key(|g| g.ranks.first().copied());
    groups
}

/// A strict decoder's complaint about bytes a peer sent or a file held.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the fixed header or than the header announces.
    #[error("truncated: {} needed, {got} present", counted(*needed, "byte", "bytes"))]
    Truncated {
        /// Bytes the header requires.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the header announces.
    #[error("{} after the message", counted(*extra, "trailing byte", "trailing bytes"))]
    Trailing {
        /// Bytes left over.
        extra: usize,
    },
    /// The first four bytes are not this protocol's magic.
    #[error("bad magic {found:02x?} (not a compiler-collectives message)")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },
    /// A field or the whole message is larger than the configured limit.
    #[error("{field} is {len} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// Which field.
        field: &'static str,
        /// Announced length in bytes.
        len: u64,
        /// Configured limit in bytes.
        limit: u64,
    },
    /// A field holds a value this version does not accept.
    #[error("invalid {field}: {detail}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A peer's contribution to a fixed-size gather
    /// ([`Transport::all_gather_fixed`](crate::Transport::all_gather_fixed))
    /// is not the length every rank passes.
    #[error("invalid fixed-size contribution: {}, expected {expected}", counted(*len, "byte", "bytes"))]
    FixedSize {
        /// The peer's length in bytes.
        len: usize,
        /// This rank's length in bytes.
        expected: usize,
    },
    /// The payload does not decode as the decision kind's type.
    #[error("payload of kind '{kind}' does not decode: {detail}")]
    Payload {
        /// The decision kind.
        kind: String,
        /// The decoder's message.
        detail: String,
    },
}

/// Everything that can go wrong in compiler-collectives.
///
/// Errors marked *fatal* ([`Error::is_fatal`]) leave the channel unusable:
/// ranks may be at different points of the protocol, so the only safe next
/// step is to abort the channel (and, usually, the job).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Some ranks did not arrive before the deadline. Fatal.
    #[error("timed out after {} ms {}{}{}", waited.as_millis(), Missing(missing_ranks, waiting_for.as_deref()), Departures(left, true), fmt_during(during))]
    Timeout {
        /// Every rank not in the exchange at the deadline, ascending: the
        /// silent ones and those in `left`. Empty when the engine cannot
        /// tell which.
        missing_ranks: Vec<u32>,
        /// Those of `missing_ranks` known to have left, each with how,
        /// ascending by rank; the others were silent (alive as far as this
        /// rank knows, but not in the exchange).
        left: Vec<(u32, PeerLoss)>,
        /// How long this rank waited.
        waited: Duration,
        /// What the wait was for, outside an exchange (a store key, a
        /// rendezvous): `store key 'k' in the TCPStore at host:port`
        /// ([`Error::waiting_for`]).
        waiting_for: Option<String>,
        /// The exchange that timed out, when it happened in one.
        during: Option<Box<ExchangeInfo>>,
    },
    /// A peer left: it shut its channel down or its connection dropped. Fatal.
    #[error("lost {} {}: {}{}{}", if ranks.len() == 1 { "rank" } else { "ranks" }, RankList(ranks), Departures(left, false), if detail.is_empty() { String::new() } else { format!(" ({detail})") }, fmt_during(during))]
    PeerLost {
        /// Every rank not in the exchange, ascending: all of them left or
        /// died (a rank reports once every peer is accounted for:
        /// docs/failures.md, "Exact missing-rank reports").
        ranks: Vec<u32>,
        /// How the lowest of `ranks` left (all of them, when they left the
        /// same way; `left` has each one's).
        reason: PeerLoss,
        /// Each of `ranks` with how it left, ascending by rank.
        left: Vec<(u32, PeerLoss)>,
        /// Engine detail (e.g. the socket error), may be empty.
        detail: String,
        /// The exchange it happened in, when it happened in one.
        during: Option<Box<ExchangeInfo>>,
    },
    /// Ranks are at different exchanges (sequence number, compile key or
    /// decision kind differ). Every rank gets the same groups. Fatal.
    #[error(
        "desync: {}; the channel is unusable: abort it",
        DisplayGroups(groups, [" at ", " at "])
    )]
    Desync {
        /// Each group of ranks with what they were doing, e.g.
        /// `#42 'train_step@model.rs:88'`.
        groups: Vec<RankGroup>,
    },
    /// Ranks speak different wire versions of the protocol. Fatal.
    #[error(
        "wire version mismatch: {}; the channel is unusable: abort it",
        DisplayGroups(groups, [" speaks ", " speak "])
    )]
    VersionMismatch {
        /// Each group of ranks with its wire version, e.g. `v1`.
        groups: Vec<RankGroup>,
    },
    /// Ranks hold different values of something they must agree on
    /// (per-source overrides, configuration, fingerprints). Fatal.
    #[error(
        "ranks disagree on {what}: {}; the channel is unusable: abort it",
        DisplayGroups(groups, [" has ", " have "])
    )]
    Disagreement {
        /// What must agree.
        what: String,
        /// Each distinct value with its ranks.
        groups: Vec<RankGroup>,
    },
    /// A message (from `rank`, when known) or a file failed strict decoding.
    /// Fatal when it came from a peer.
    #[error("cannot decode {}: {reason}{}", match rank { Some(r) => format!("the message from rank {r}"), None => "input".to_string() }, if rank.is_some() { "; the channel is unusable: abort it" } else { "" })]
    Decode {
        /// The rank that sent the bytes, if they came from a peer.
        rank: Option<u32>,
        /// What is wrong with them (its text is part of this error's
        /// message, so it is not also this error's `source()`).
        reason: DecodeError,
    },
    /// The engine (Gloo, NCCL, c10d, a store, …) reported an error. Fatal
    /// to a channel it happens in (its next exchange says so).
    #[error("{backend} error: {message}")]
    Backend {
        /// Which backend, e.g. `"gloo"`, `"file-store"`.
        backend: &'static str,
        /// The engine's own code and text.
        message: String,
        /// The backend's typed error, when it has one (its text is
        /// `message`, so it is not also this error's `source()`): downcast
        /// it for the engine's own fields.
        engine: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// An argument (or a file, or a variable) is out of range. Nothing was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The transport cannot do this.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The channel or transport can no longer be used: it failed earlier,
    /// or this rank shut it down (nothing was sent). Fatal.
    #[error(
        "the channel is unusable after {first} ({cause}); abort it and rebuild the process group"
    )]
    ChannelUnusable {
        /// The first error's kind, or [`FirstFailure::Shutdown`] /
        /// [`FirstFailure::Abort`] when this rank ended it (printed as
        /// [`FirstFailure::as_str`]).
        first: FirstFailure,
        /// The first error's message.
        cause: String,
    },
}

struct DisplayGroups<'a>(&'a [RankGroup], [&'a str; 2]);

/// How departed ranks went, grouped: `shut its channel down` when all went
/// the same way, else `rank [1] shut its channel down; rank [3]
/// disconnected`. In a timeout (`within`), the departed among the missing:
/// ` (of them rank [1] shut its channel down)`, nothing when none left.
struct Departures<'a>(&'a [(u32, PeerLoss)], bool);

impl fmt::Display for Departures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut groups: Vec<(PeerLoss, Vec<u32>)> = Vec::new();
        for &(rank, how) in self.0 {
            match groups.iter_mut().find(|(h, _)| *h == how) {
                Some((_, ranks)) => ranks.push(rank),
                None => groups.push((how, vec![rank])),
            }
        }
        let within = self.1;
        if groups.is_empty() {
            return f.write_str(if within { "" } else { "left" });
        }
        if within {
            f.write_str(" (of them ")?;
        }
        for (i, (how, ranks)) in groups.iter().enumerate() {
            let many = ranks.len() > 1;
            if groups.len() > 1 || within {
                if i > 0 {
                    f.write_str("; ")?;
                }
                let word = if ranks.len() == 1 { "rank" } else { "ranks" };
                write!(f, "{word} {} ", RankList(ranks))?;
            }
            f.write_str(how.phrase(many))?;
        }
        if within {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// "waiting for rank [3]", or a plain statement when the engine cannot tell.
struct Missing<'a>(&'a [u32], Option<&'a str>);

impl fmt::Display for Missing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.0.len(), self.1) {
            (0, Some(what)) => write!(f, "waiting for {what}"),
            (0, None) => f.write_str("waiting for peers (the engine cannot tell which)"),
            (1, _) => write!(f, "waiting for rank {}", RankList(self.0)),
            _ => write!(f, "waiting for ranks {}", RankList(self.0)),
        }?;
        match (self.0.len(), self.1) {
            (n, Some(what)) if n > 0 => write!(f, " ({what})"),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for DisplayGroups<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt_groups(f, self.0, self.1)
    }
}

/// ` in exchange #… ; the channel is unusable: abort it` when the error
/// happened in an exchange; nothing for a transport, store or rendezvous
/// call outside one (the policy applies to channels only).
fn fmt_during(during: &Option<Box<ExchangeInfo>>) -> String {
    match during {
        Some(info) => format!(" in {info}; the channel is unusable: abort it"),
        None => String::new(),
    }
}

impl Error {
    /// Whether the channel that returned this error is unusable afterwards.
    pub fn is_fatal(&self) -> bool {
        !matches!(
            self,
            Error::InvalidArgument(_) | Error::Unsupported(_) | Error::Decode { rank: None, .. }
        )
    }

    /// What this error is ([`ErrorKind::as_str`] gives its stable name:
    /// `"timeout"`, `"peer_lost"`, …).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::PeerLost { .. } => ErrorKind::PeerLost,
            Error::Desync { .. } => ErrorKind::Desync,
            Error::VersionMismatch { .. } => ErrorKind::VersionMismatch,
            Error::Disagreement { .. } => ErrorKind::Disagreement,
            Error::Decode { .. } => ErrorKind::Decode,
            Error::Backend { .. } => ErrorKind::Backend,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::ChannelUnusable { .. } => ErrorKind::ChannelUnusable,
        }
    }

    /// The ranks this error names as missing or lost (empty for others).
    pub fn missing_ranks(&self) -> &[u32] {
        match self {
            Error::Timeout { missing_ranks, .. } => missing_ranks,
            Error::PeerLost { ranks, .. } => ranks,
            _ => &[],
        }
    }

    /// The exchange the error happened in, for timeouts and lost peers.
    pub fn exchange(&self) -> Option<&ExchangeInfo> {
        match self {
            Error::Timeout { during, .. } | Error::PeerLost { during, .. } => during.as_deref(),
            _ => None,
        }
    }

    /// The same error naming every rank by its job rank through `map`
    /// (ranks, missing ranks, departures, groups, the sender of bytes that
    /// do not decode); lists stay ascending, as `map` is. Kinds, messages
    /// of engines and everything else are unchanged: the text is formatted
    /// from the mapped fields, never rewritten.
    #[must_use]
    pub fn in_global_ranks(self, map: &RankMap) -> Self {
        let list = |v: Vec<u32>| -> Vec<u32> { v.into_iter().map(|r| map.global(r)).collect() };
        let left = |v: Vec<(u32, PeerLoss)>| -> Vec<(u32, PeerLoss)> {
            v.into_iter().map(|(r, how)| (map.global(r), how)).collect()
        };
        let groups = |v: Vec<RankGroup>| -> Vec<RankGroup> {
            v.into_iter()
                .map(|g| RankGroup {
                    ranks: list(g.ranks),
                    what: g.what,
                })
                .collect()
        };
        match self {
            Error::Timeout {
                missing_ranks,
                left: l,
                waited,
                waiting_for,
                during,
            } => Error::Timeout {
                missing_ranks: list(missing_ranks),
                left: left(l),
                waited,
                waiting_for,
                during,
            },
            Error::PeerLost {
                ranks,
                reason,
                left: l,
                detail,
                during,
            } => Error::PeerLost {
                ranks: list(ranks),
                reason,
                left: left(l),
                detail,
                during,
            },
            Error::Desync { groups: g } => Error::Desync { groups: groups(g) },
            Error::VersionMismatch { groups: g } => Error::VersionMismatch { groups: groups(g) },
            Error::Disagreement { what, groups: g } => Error::Disagreement {
                what,
                groups: groups(g),
            },
            Error::Decode { rank, reason } => Error::Decode {
                rank: rank.map(|r| map.global(r)),
                reason,
            },
            other => other,
        }
    }

    /// Attaches the exchange context to a timeout or lost-peer error that has none.
    #[must_use]
    pub fn during(mut self, info: ExchangeInfo) -> Self {
        if let Error::Timeout { during, .. } | Error::PeerLost { during, .. } = &mut self {
            if during.is_none() {
                *during = Some(Box::new(info));
            }
        }
        self
    }

    /// A deadline passed with `missing` ranks not in the exchange (in any
    /// order; duplicates dropped), of which `left` (each with how) had left.
    /// A rank of `left` missing from `missing` is added to it.
    pub fn timeout(missing: Vec<u32>, left: Vec<(u32, PeerLoss)>, waited: Duration) -> Self {
        let left = sorted_departures(left);
        let mut missing_ranks = missing;
        missing_ranks.extend(left.iter().map(|(r, _)| *r));
        missing_ranks.sort_unstable();
        missing_ranks.dedup();
        Error::Timeout {
            missing_ranks,
            left,
            waited,
            waiting_for: None,
            during: None,
        }
    }

    /// The same error, saying what a [`Error::Timeout`] outside an exchange
    /// waited for (`store key 'k' in the TCPStore at host:port`); other
    /// errors are returned as they are.
    pub fn waiting_for(mut self, what: impl Into<String>) -> Self {
        if let Error::Timeout { waiting_for, .. } = &mut self {
            *waiting_for = Some(what.into());
        }
        self
    }

    /// Every rank not in the exchange left or died: `left` (in any order)
    /// says each one and how; `detail` is the engine's text, may be empty.
    /// With `left` empty the reason is `Disconnected` and no rank is named
    /// (an engine that cannot tell which peer it lost).
    pub fn peer_lost(left: Vec<(u32, PeerLoss)>, detail: impl Into<String>) -> Self {
        let left = sorted_departures(left);
        Error::PeerLost {
            ranks: left.iter().map(|(r, _)| *r).collect(),
            reason: left.first().map_or(PeerLoss::Disconnected, |(_, how)| *how),
            left,
            detail: detail.into(),
            during: None,
        }
    }

    /// The ranks this error names as having left, each with how (empty for
    /// other errors, and for the silent ranks of a timeout).
    pub fn departures(&self) -> &[(u32, PeerLoss)] {
        match self {
            Error::Timeout { left, .. } | Error::PeerLost { left, .. } => left,
            _ => &[],
        }
    }

    /// A peer's message of `len` bytes over the `limit` (bytes) this rank
    /// accepts: a decode error naming that rank.
    pub fn message_too_large(rank: u32, len: usize, limit: usize) -> Self {
        Error::Decode {
            rank: Some(rank),
            reason: DecodeError::TooLarge {
                field: "message",
                len: len as u64,
                limit: limit as u64,
            },
        }
    }

    /// What every later call gets once `first` made a channel or transport
    /// unusable: [`Error::ChannelUnusable`] keeping its kind and message.
    pub fn unusable_after(first: &Error) -> Self {
        Poison::of(first).error()
    }

    /// [`Error::ChannelUnusable`] after a first failure `first` with
    /// message `cause`.
    pub fn unusable(first: FirstFailure, cause: impl Into<String>) -> Self {
        Poison::new(first, cause).error()
    }

    /// Wraps a backend's error, keeping its text.
    pub fn backend<E>(backend: &'static str, err: E) -> Self
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Error::Backend {
            backend,
            message: err.to_string(),
            engine: Some(Box::new(err)),
        }
    }
}

/// Ascending by rank, one entry per rank (the first kept).
fn sorted_departures(mut left: Vec<(u32, PeerLoss)>) -> Vec<(u32, PeerLoss)> {
    left.sort_by_key(|(r, _)| *r);
    left.dedup_by_key(|(r, _)| *r);
    left
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
