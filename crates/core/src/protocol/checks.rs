//! The checks every exchange makes on what the ranks sent, written once for
//! the flat exchange ([`crate::protocol::channel`]) and the tree
//! ([`crate::protocol::tree`]): both fill a [`Census`] and ask it for the
//! verdict, so both report the same error, with the same groups and text, in
//! the same order (docs/protocol.md, Checks):
//!
//! 1. wire versions → [`Error::VersionMismatch`];
//! 2. a message that does not decode → [`Error::Decode`] naming the lowest
//!    such rank (the flat exchange) or tree neighbour;
//! 3. positions (sequence number, compile key, and the decision kind when
//!    kinds differ) → [`Error::Desync`];
//! 4. configuration → [`Error::Disagreement`].
//!
//! The census groups ranks as sorted, coalesced half-open ranges, which is
//! also the tree's wire form of a subtree's report (a subtree is one range).

use crate::error::{group_ranks, Error, RankGroup, Result};
use crate::protocol::envelope::{Envelope, EnvelopeRef, WIRE_VERSION};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Half-open rank ranges `[start, end)`, sorted and coalesced.
pub(crate) type Ranges = Vec<(u32, u32)>;

/// Where a rank was: the exchange it was at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Position {
    pub(crate) seq: u64,
    pub(crate) key: String,
    pub(crate) kind: String,
}

/// What a set of ranks sent, grouped by value. Field order is wire format
/// (a tree summary carries it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Census {
    pub(crate) versions: Vec<(u16, Ranges)>,
    pub(crate) positions: Vec<(Position, Ranges)>,
    pub(crate) configs: Vec<(String, Ranges)>,
}

/// Adds `ranges` to the group of `what` (made if new), keeping its ranges
/// sorted and coalesced.
pub(crate) fn add<T: PartialEq>(groups: &mut Vec<(T, Ranges)>, what: T, ranges: &[(u32, u32)]) {
    let at = match groups.iter().position(|(w, _)| *w == what) {
        Some(i) => i,
        None => {
            groups.push((what, Vec::new()));
            groups.len() - 1
        }
    };
    add_at(groups, at, ranges);
}

/// Adds `ranges` to group `at`, keeping its ranges sorted and coalesced.
fn add_at<T>(groups: &mut [(T, Ranges)], at: usize, ranges: &[(u32, u32)]) {
    let list = &mut groups[at].1;
    // Ranks arrive in increasing order in the flat exchange: extend in place.
    if let ([(s, e)], Some(last)) = (ranges, list.last_mut()) {
        if *s >= last.0 && *s <= last.1 {
            last.1 = last.1.max(*e);
            return;
        }
        if *s > last.1 {
            list.push((*s, *e));
            return;
        }
    }
    list.extend_from_slice(ranges);
    list.sort_unstable();
    let mut merged: Ranges = Vec::with_capacity(list.len());
    for &(s, e) in list.iter() {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    *list = merged;
}

impl Census {
    /// Counts one rank that spoke wire version `version`.
    pub(crate) fn version(&mut self, rank: u32, version: u16) {
        add(&mut self.versions, version, &[(rank, rank + 1)]);
    }

    /// Counts one rank's decoded envelope: its position and configuration.
    pub(crate) fn envelope(&mut self, rank: u32, env: &Envelope) {
        self.envelope_ref(
            rank,
            EnvelopeRef {
                version: env.version,
                seq: env.seq,
                kind: &env.kind,
                key: &env.key,
                config: &env.config,
                payload: &env.payload,
            },
        );
    }

    /// [`Census::envelope`] of an envelope read in place: it copies the
    /// key, kind and configuration only for a group not yet counted (the
    /// first rank of each), not for every rank.
    pub(crate) fn envelope_ref(&mut self, rank: u32, env: EnvelopeRef<'_>) {
        let one = [(rank, rank + 1)];
        match self
            .positions
            .iter()
            .position(|(p, _)| p.seq == env.seq && p.key == env.key && p.kind == env.kind)
        {
            Some(i) => add_at(&mut self.positions, i, &one),
            None => add(
                &mut self.positions,
                Position {
                    seq: env.seq,
                    key: env.key.to_owned(),
                    kind: env.kind.to_owned(),
                },
                &one,
            ),
        }
        match self.configs.iter().position(|(c, _)| c == env.config) {
            Some(i) => add_at(&mut self.configs, i, &one),
            None => add(&mut self.configs, env.config.to_owned(), &one),
        }
    }

    /// Adds another census (a child's subtree) to this one.
    pub(crate) fn absorb(&mut self, other: Census) {
        for (v, r) in other.versions {
            add(&mut self.versions, v, &r);
        }
        for (p, r) in other.positions {
            add(&mut self.positions, p, &r);
        }
        for (c, r) in other.configs {
            add(&mut self.configs, c, &r);
        }
    }

    /// Whether every range lies in `span` and each field covers at most the
    /// span's ranks in all (a peer could claim others; this also bounds what
    /// expanding the groups allocates).
    pub(crate) fn within(&self, span: (u32, u32)) -> bool {
        fn field<T>(groups: &[(T, Ranges)], (lo, hi): (u32, u32)) -> bool {
            let mut total = 0u64;
            for (_, rs) in groups {
                for &(s, e) in rs {
                    if s >= e || s < lo || e > hi {
                        return false;
                    }
                    total += u64::from(e - s);
                }
            }
            total <= u64::from(hi - lo)
        }
        field(&self.versions, span) && field(&self.positions, span) && field(&self.configs, span)
    }

    /// Whether every position counted has decision kind `kind` (the tree
    /// decodes a subtree's joined value only then).
    pub(crate) fn all_of_kind(&self, kind: &str) -> bool {
        self.positions.iter().all(|(p, _)| p.kind == kind)
    }

    /// The verdict, the same on every rank that holds the same census and
    /// `failure` (the decode error of the lowest rank whose message did not
    /// decode): see the module docs for the order.
    ///
    /// # Errors
    /// [`Error::VersionMismatch`], `failure`, [`Error::Desync`],
    /// [`Error::Disagreement`], first to apply.
    pub(crate) fn verdict(&self, failure: Option<Error>) -> Result<()> {
        if self.versions.len() > 1 || self.versions.iter().any(|(v, _)| *v != WIRE_VERSION) {
            let text: Vec<(String, &Ranges)> = self
                .versions
                .iter()
                .map(|(v, r)| (format!("v{v}"), r))
                .collect();
            return Err(Error::VersionMismatch {
                groups: expand(&text),
            });
        }
        if let Some(e) = failure {
            return Err(e);
        }
        if self.positions.len() > 1 {
            let kinds_differ = self
                .positions
                .iter()
                .any(|(p, _)| p.kind != self.positions[0].0.kind);
            let text: Vec<(PositionText<'_>, &Ranges)> = self
                .positions
                .iter()
                .map(|(p, r)| (PositionText(p, kinds_differ), r))
                .collect();
            return Err(Error::Desync {
                groups: expand(&text),
            });
        }
        if self.configs.len() > 1 {
            // Long texts that share a start are shown from just before
            // where they first differ, so the message shows the difference.
            let first = self.configs[0].0.as_bytes();
            let same = self.configs[1..]
                .iter()
                .map(|(c, _)| {
                    first
                        .iter()
                        .zip(c.as_bytes())
                        .take_while(|(a, b)| a == b)
                        .count()
                })
                .min()
                .unwrap_or(0);
            let text: Vec<(ConfigText<'_>, &Ranges)> = self
                .configs
                .iter()
                .map(|(c, r)| (ConfigText::differing_from(c, same), r))
                .collect();
            return Err(Error::Disagreement {
                what: CONFIG_WHAT.into(),
                groups: expand(&text),
            });
        }
        Ok(())
    }
}

/// Rank groups of an error from grouped ranges.
fn expand(groups: &[(impl fmt::Display, &Ranges)]) -> Vec<RankGroup> {
    group_ranks(
        groups
            .iter()
            .flat_map(|(what, rs)| rs.iter().flat_map(|&(s, e)| s..e).map(move |r| (r, what))),
    )
}

/// A desync group's text: `#seq 'key'`, then ` (kind)` when kinds differ.
struct PositionText<'a>(&'a Position, bool);

impl fmt::Display for PositionText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} '{}'", self.0.seq, self.0.key)?;
        if self.1 {
            write!(f, " ({})", self.0.kind)?;
        }
        Ok(())
    }
}

/// What a configuration disagreement is about.
pub(crate) const CONFIG_WHAT: &str =
    "the configuration that shapes this decision (overrides, options)";

/// Quotes text for error groups, cut after 200 bytes.
pub(crate) struct ConfigText<'a>(pub(crate) &'a str, usize);

/// Bytes of a quoted text an error shows.
const SHOWN: usize = 200;
/// Bytes shown before the first difference of texts longer than [`SHOWN`].
const BEFORE_DIFFERENCE: usize = 40;

impl<'a> ConfigText<'a> {
    /// The text from its start.
    pub(crate) fn new(text: &'a str) -> Self {
        ConfigText(text, 0)
    }

    /// A text that is the same as the others of its error up to byte
    /// `same`: when it is too long to show whole, shown from a little
    /// before that byte, so the difference is in the message.
    pub(crate) fn differing_from(text: &'a str, same: usize) -> Self {
        if text.len() <= SHOWN || same + BEFORE_DIFFERENCE < SHOWN {
            return ConfigText(text, 0);
        }
        let mut from = same.saturating_sub(BEFORE_DIFFERENCE).min(text.len());
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        ConfigText(text, from)
    }
}

impl fmt::Display for ConfigText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (text, from) = (self.0, self.1);
        if from == 0 && text.len() <= SHOWN {
            return write!(f, "'{text}'");
        }
        let mut end = (from + SHOWN).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let open = if from > 0 { "…" } else { "" };
        let close = if end < text.len() { "…" } else { "" };
        write!(
            f,
            "'{open}{}{close}' ({} bytes",
            &text[from..end],
            text.len()
        )?;
        if from > 0 {
            write!(f, ", shown from byte {from}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_configurations_are_shown_where_they_differ() {
        let common = "x".repeat(500);
        let (a, b) = (
            format!("{common}limit=8;tail"),
            format!("{common}limit=4;tail"),
        );
        let mut census = Census::default();
        add(&mut census.configs, a.clone(), &[(0, 1)]);
        add(&mut census.configs, b.clone(), &[(1, 2)]);
        let text = census.verdict(None).expect_err("they differ").to_string();
        assert!(text.contains("limit=8;tail'"), "{text}");
        assert!(text.contains("limit=4;tail'"), "{text}");
        assert!(text.contains("(512 bytes, shown from byte 466)"), "{text}");
        // Short texts are shown whole.
        assert_eq!(ConfigText::differing_from("a=1", 2).to_string(), "'a=1'");
        // A long text that differs early is shown from its start.
        let early = ConfigText::differing_from(&a, 3).to_string();
        assert!(
            early.starts_with("'xxx") && early.ends_with("…' (512 bytes)"),
            "{early}"
        );
    }

    #[test]
    fn ranges_coalesce_in_any_order() {
        let mut g: Vec<(u8, Ranges)> = Vec::new();
        for r in [0u32, 1, 2, 5, 6, 3] {
            add(&mut g, 7, &[(r, r + 1)]);
        }
        add(&mut g, 7, &[(9, 12), (4, 5)]);
        add(&mut g, 8, &[(12, 13)]);
        add(&mut g, 8, &[(7, 9), (13, 14)]);
        assert_eq!(
            g,
            vec![(7, vec![(0, 7), (9, 12)]), (8, vec![(7, 9), (12, 14)])]
        );
    }

    fn env(seq: u64, key: &str, config: &str) -> Envelope {
        Envelope {
            version: WIRE_VERSION,
            seq,
            kind: "vote.any".into(),
            key: key.into(),
            config: config.into(),
            payload: vec![0],
        }
    }

    fn undecodable(rank: u32) -> Option<Error> {
        Some(Error::Decode {
            rank: Some(rank),
            reason: crate::DecodeError::Invalid {
                field: "header",
                detail: "bad magic".into(),
            },
        })
    }

    /// Versions, then the decode failure, then positions, then
    /// configuration: whatever else is wrong too (the flat exchange used to
    /// report an unreadable header before another rank's version).
    #[test]
    fn the_verdict_takes_the_checks_in_order() {
        let mut c = Census::default();
        for r in 0..4 {
            c.version(r, if r == 3 { 99 } else { WIRE_VERSION });
        }
        c.envelope(0, &env(0, "a", ""));
        c.envelope(2, &env(1, "b", "x"));
        let e = c.verdict(undecodable(1)).unwrap_err();
        assert!(matches!(e, Error::VersionMismatch { .. }), "{e}");
        assert!(
            e.to_string().contains(&format!(
                "ranks [0,1,2] speak v{WIRE_VERSION}; rank [3] speaks v99"
            )),
            "{e}"
        );

        let mut c = Census::default();
        for r in 0..3 {
            c.version(r, WIRE_VERSION);
        }
        c.envelope(0, &env(0, "a", ""));
        c.envelope(2, &env(1, "b", "x"));
        assert!(matches!(
            c.verdict(undecodable(1)),
            Err(Error::Decode { rank: Some(1), .. })
        ));
        let e = c.verdict(None).unwrap_err();
        assert!(matches!(e, Error::Desync { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("rank [0] at #0 'a'; rank [2] at #1 'b'"),
            "{e}"
        );

        let mut c = Census::default();
        for r in 0..3 {
            c.version(r, WIRE_VERSION);
            c.envelope(r, &env(0, "a", if r == 1 { "x" } else { "" }));
        }
        let e = c.verdict(None).unwrap_err();
        assert!(matches!(e, Error::Disagreement { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("ranks [0,2] have ''; rank [1] has 'x'"),
            "{e}"
        );
    }
}
