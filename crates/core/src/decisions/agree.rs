//! Must-agree values (docs/semantics.md, Other decision kinds): compiler version, configuration hash,
//! code fingerprint — anything every rank must hold identically before their
//! compilers may trust each other's decisions.
//!
//! [`MustAgree`] collects named values (canonical text) and checks them in one
//! exchange. When every rank holds the same values the exchange is one
//! slot round (the fast path); otherwise every rank gathers every
//! rank's values and returns the same [`Error::Disagreement`], which lists,
//! for the names that differ, each distinct combination of values with its
//! ranks, e.g. `ranks disagree on must-agree value 'compiler': rank [0] has
//! compiler='2.13.0'; ranks [1,2] have compiler='2.12.1'`. A name one rank
//! lists and another does not shows as `<absent>` there.
//!
//! The decision kind is [`AgreedValues`]: per name, the set of values seen
//! (join = union per name), a semilattice like every kind.
//!
//! ```
//! use compiler_collectives_core::{decisions::agree::MustAgree, Channel, InProcessGroup, Transport};
//!
//! let ranks = InProcessGroup::create(3)?;
//! let handles: Vec<_> = ranks.into_iter().map(|t| std::thread::spawn(move || {
//!     // Rank 2 was built from other sources.
//!     let code = if t.rank() == 2 { "9f1c" } else { "4be0" };
//!     let mut channel = Channel::new(std::sync::Arc::new(t))?;
//!     MustAgree::new()
//!         .value("compiler", "ccol 0.1.0")
//!         .value("code", code)
//!         .check(&mut channel, "startup")
//! })).collect();
//! for h in handles {
//!     let err = h.join().unwrap().unwrap_err();            // the same error on every rank
//!     assert_eq!(err.to_string(),
//!         "ranks disagree on must-agree value 'code': ranks [0,1] have code='4be0'; \
//!          rank [2] has code='9f1c'; the channel is unusable: abort it");
//! }
//! # Ok::<(), compiler_collectives_core::Error>(())
//! ```

use crate::decisions::join_map;
use crate::error::{group_ranks, Error, Result};
use crate::protocol::channel::{Channel, ExchangeOptions};
use crate::protocol::checks::ConfigText;
use crate::protocol::gathered::PerRank;
use crate::protocol::join::Join;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The must-agree decision kind: per name, every value some rank holds.
///
/// Join: union of the value sets per name (commutative, associative,
/// idempotent). All ranks agree exactly when the joined sets each hold one
/// value and every rank names the same names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgreedValues(pub BTreeMap<String, BTreeSet<String>>);

impl Join for AgreedValues {
    const KIND: &'static str = "agree.values";
    fn join(&mut self, other: &Self) {
        join_map(&mut self.0, &other.0, |mine, theirs| {
            mine.extend(theirs.iter().cloned());
        });
    }
}

impl AgreedValues {
    /// The value of `name` when exactly one value is present.
    fn single(&self, name: &str) -> Option<&str> {
        match self.0.get(name) {
            Some(set) if set.len() == 1 => set.iter().next().map(String::as_str),
            _ => None,
        }
    }
}

/// Named values every rank must hold identically, checked in one exchange.
///
/// Values are canonical text: hash or print them the same way on every rank
/// (e.g. a hex digest of the sorted configuration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MustAgree {
    values: BTreeMap<String, String>,
}

impl MustAgree {
    /// No values yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the value called `name`.
    #[must_use]
    pub fn value(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.values.insert(name.into(), value.into());
        self
    }

    /// The values, by name.
    pub fn values(&self) -> &BTreeMap<String, String> {
        &self.values
    }

    /// Checks that every rank holds the same names and values, under compile
    /// key `key` (the exchange's position, checked like any exchange's).
    ///
    /// Cost: one exchange — one all_gather of one slot (4096 bytes) per rank
    /// when every rank agrees or the values fit the slot, plus one all_gather
    /// of the values otherwise.
    ///
    /// # Errors
    /// [`Error::Disagreement`] on every rank, naming each differing value with
    /// its ranks (the first 16 differing names, each cut after 200 bytes,
    /// and how many more; fatal: the channel is marked unusable, as for any
    /// disagreement); the exchange's errors ([`Error::Timeout`],
    /// [`Error::Desync`], …).
    pub fn check(&self, channel: &mut Channel, key: &str) -> Result<()> {
        let local = AgreedValues(
            self.values
                .iter()
                .map(|(n, v)| (n.clone(), BTreeSet::from([v.clone()])))
                .collect(),
        );
        // Every rank's value (a flat exchange whatever the topology): the
        // join alone cannot show a name missing on some rank, nor name ranks.
        let every = ExchangeOptions::default().with_every_value(true);
        let gathered = channel.exchange_with(key, &local, &every)?;
        let per_rank = match gathered.per_rank() {
            PerRank::Values(v) => v,
            PerRank::Same => return Ok(()),
            other @ (PerRank::Tree | PerRank::Undecodable) => {
                return Err(Error::Decode {
                    rank: None,
                    reason: crate::DecodeError::Invalid {
                        field: "must-agree values",
                        detail: format!("every rank's values are not here ({other:?})"),
                    },
                })
            }
        };
        let merged = gathered.merged();
        let differing: Vec<&str> = merged
            .0
            .keys()
            .map(String::as_str)
            .filter(|name| {
                merged.single(name).is_none() || per_rank.iter().any(|v| !v.0.contains_key(*name))
            })
            .collect();
        if differing.is_empty() {
            return Ok(());
        }
        // Peers choose the names: the message shows at most MAX_NAMES_SHOWN,
        // each cut, so its size does not grow with what peers sent.
        let shown = &differing[..differing.len().min(MAX_NAMES_SHOWN)];
        let quoted: Vec<String> = shown.iter().map(|n| format!("'{}'", cut(n))).collect();
        let mut what = if differing.len() == 1 {
            format!("must-agree value {}", quoted[0])
        } else {
            format!("must-agree values {}", quoted.join(", "))
        };
        if differing.len() > shown.len() {
            what.push_str(&format!(" (and {} more)", differing.len() - shown.len()));
        }
        let groups = group_ranks((0u32..).zip(per_rank.iter().map(|v| RankValues {
            values: v,
            names: shown,
        })));
        Err(channel.fail(Error::Disagreement { what, groups }))
    }
}

/// Checks one must-agree value: [`MustAgree::check`] with a single name.
///
/// # Errors
/// As [`MustAgree::check`].
pub fn must_agree(channel: &mut Channel, key: &str, name: &str, value: &str) -> Result<()> {
    MustAgree::new().value(name, value).check(channel, key)
}

/// Most differing names an error lists (the first, in byte order).
const MAX_NAMES_SHOWN: usize = 16;
/// Longest name shown in an error, in bytes.
const MAX_NAME_SHOWN: usize = 200;

/// `name`, cut after [`MAX_NAME_SHOWN`] bytes.
fn cut(name: &str) -> std::borrow::Cow<'_, str> {
    if name.len() <= MAX_NAME_SHOWN {
        return name.into();
    }
    let mut end = MAX_NAME_SHOWN;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end]).into()
}

/// One rank's values of the differing names: `a='x', b=<absent>`.
struct RankValues<'a> {
    values: &'a AgreedValues,
    names: &'a [&'a str],
}

impl fmt::Display for RankValues<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, name) in self.names.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            // A rank sends exactly one value per name it lists.
            let shown = cut(name);
            match self.values.single(name) {
                Some(v) => write!(f, "{shown}={}", ConfigText::new(v))?,
                None => write!(f, "{shown}=<absent>")?,
            }
        }
        Ok(())
    }
}
