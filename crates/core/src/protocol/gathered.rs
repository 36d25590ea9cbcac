//! What an exchange returns ([`Gathered`]): the join of every rank's
//! value, borrowed from the caller when every rank sent the same, and every
//! rank's payload, decoded on demand; and the value an exchange was given
//! (`Local`).

use crate::protocol::join::{Join, Sealed};
use std::cell::OnceCell;

/// The result of one exchange. It borrows the value passed in: when every
/// rank sent the same (the fast path, or a world of one), the join is that
/// value itself, not a copy ([`Gathered::into_merged`] copies it then).
/// After [`Channel::exchange_in_place`](crate::Channel::exchange_in_place) the join is always the value passed
/// in (now joined), so `into_merged` always copies it.
#[derive(Clone, Debug)]
pub struct Gathered<'a, J> {
    pub(crate) merged: Merged<'a, J>,
    pub(crate) payloads: Option<Payloads<J>>,
    pub(crate) seq: u64,
    pub(crate) fast: bool,
}

/// The join: this rank's own value, or one built from every rank's.
#[derive(Clone, Debug)]
pub(crate) enum Merged<'a, J> {
    Local(&'a J),
    Joined(J),
}

/// Every rank's payload, decoded on first use ([`Gathered::per_rank`]).
#[derive(Clone, Debug)]
pub(crate) struct Payloads<J> {
    /// The gathered buffers, moved here, not copied.
    pub(crate) bufs: Vec<Vec<u8>>,
    /// Each rank's payload: buffer, start, end.
    pub(crate) spans: Vec<Span>,
    pub(crate) values: OnceCell<Option<Vec<J>>>,
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
    /// Every rank's value, index = rank ([`PerRank::Values`]), or why this
    /// exchange does not have them: every rank sent exactly what this rank
    /// sent ([`PerRank::Same`]), or the hierarchical exchange ran
    /// ([`PerRank::Tree`]; pass
    /// [`ExchangeOptions::with_every_value`](crate::ExchangeOptions::with_every_value)
    /// when every value is needed).
    ///
    /// Decoded from the received payloads on the first call (the exchange
    /// itself joins them without building each rank's value); the exchange
    /// already decoded each of them strictly, so this succeeds
    /// ([`PerRank::Undecodable`] would be a bug of a kind's reader).
    pub fn per_rank(&self) -> PerRank<'_, J> {
        let Some(p) = self.payloads.as_ref() else {
            return if self.fast {
                PerRank::Same
            } else {
                PerRank::Tree
            };
        };
        let values = p
            .values
            .get_or_init(|| {
                let mut out = Vec::with_capacity(p.spans.len());
                for &(b, start, end) in &p.spans {
                    match J::read_payload(&p.bufs[b][start..end], Sealed(())) {
                        Ok(v) => out.push(v),
                        Err(e) => {
                            tracing::error!(error = %e, "a payload the exchange accepted did not decode again");
                            return None;
                        }
                    }
                }
                Some(out)
            })
            .as_deref();
        values.map_or(PerRank::Undecodable, PerRank::Values)
    }
}

/// Every rank's value, or why an exchange does not have them
/// ([`Gathered::per_rank`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum PerRank<'g, J> {
    /// Every rank's value, index = rank.
    Values(&'g [J]),
    /// The fast path showed that every rank sent exactly this rank's value
    /// (or the world is one rank): [`Gathered::merged`] is that value.
    Same,
    /// The hierarchical exchange ran: it moves joins, not every value.
    Tree,
    /// A payload the exchange accepted did not decode again (logged as an
    /// error): a bug of the kind's reader.
    Undecodable,
}

impl<'g, J> PerRank<'g, J> {
    /// The values, when every rank's is here ([`PerRank::Values`]).
    pub fn values(&self) -> Option<&'g [J]> {
        match self {
            PerRank::Values(v) => Some(v),
            _ => None,
        }
    }
}

/// The value an exchange was given: to read (the join is a new value) or
/// to join into.
pub(crate) enum Local<'a, J> {
    Shared(&'a J),
    InPlace(&'a mut J),
}

impl<'a, J> Local<'a, J> {
    pub(crate) fn get(&self) -> &J {
        match self {
            Local::Shared(v) => v,
            Local::InPlace(v) => v,
        }
    }

    /// The result when every rank sent this rank's value.
    pub(crate) fn unchanged(self) -> Merged<'a, J> {
        match self {
            Local::Shared(v) => Merged::Local(v),
            Local::InPlace(v) => Merged::Local(v),
        }
    }

    /// The result when the join is `merged` (the tree's).
    pub(crate) fn replaced_by(self, merged: J, fast: bool) -> Merged<'a, J> {
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
pub(crate) type Span = (usize, usize, usize);
