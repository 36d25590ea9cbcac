//! The flat exchange: every rank's envelope in one fixed-size slot round
//! (two rounds when an envelope does not fit its slot), then the checks and
//! the join (the module docs of [`crate::protocol::channel`] walk through
//! it). The tree ([`crate::protocol::tree`]) is the other topology.

use crate::error::{counted, Error, Result};
use crate::protocol::checks::Census;
use crate::protocol::envelope::{self, EnvelopeRef, Limits, SLOT_HEADER_LEN, WIRE_VERSION};
use crate::protocol::gathered::{Local, Merged, Payloads, Span};
use crate::protocol::join::{Join, Sealed};
use crate::protocol::Rounds;
use crate::DecodeError;
use std::cell::OnceCell;

/// What an exchange returns: the join, each rank's payloads, whether
/// the fast path applied.
pub(crate) type Flat<'a, J> = (Merged<'a, J>, Option<Payloads<J>>, bool);

/// What the flat exchange's rounds brought.
pub(crate) enum Round {
    /// Every rank sent this rank's envelope (or the world is one rank).
    Fast,
    /// Every rank's envelope: the gathered buffers and, index = rank,
    /// where each envelope lies in them.
    Gathered { bufs: Vec<Vec<u8>>, envs: Vec<Span> },
}

/// The flat exchange of the envelope in `buf` (after its slot header),
/// exchange number `seq`, in slots of `slot` bytes: see the module docs.
pub(crate) fn run(r: &mut Rounds<'_>, buf: &mut Vec<u8>, slot: usize, seq: u64) -> Result<Round> {
    let t = r.transport;
    let deadline = r.deadline;
    if t.world_size() == 1 {
        return Ok(Round::Fast);
    }
    let max = r.limits.max_message_bytes;
    if !r.fast_path {
        let mine = &buf[SLOT_HEADER_LEN..];
        let all = t.all_gather(mine, max, deadline)?;
        r.traffic.add(mine.len(), all.iter().map(Vec::len).sum());
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
    let env_len = buf.len() - SLOT_HEADER_LEN;
    let digest = envelope::digest(&buf[SLOT_HEADER_LEN..]);
    let fits = env_len <= slot - SLOT_HEADER_LEN;
    let len32 = u32::try_from(env_len).map_err(|_| {
        Error::InvalidArgument(format!(
            "this rank's envelope of {env_len} bytes is over 4 GiB"
        ))
    })?;
    let limit = u64::try_from(r.limits.max_message_bytes).unwrap_or(u64::MAX);
    let spilled: Vec<u8>;
    let mine: &[u8] = if fits {
        envelope::write_slot_header(buf, seq, &digest, len32, true, limit);
        buf.resize(slot, 0);
        buf
    } else {
        let mut s = vec![0u8; slot];
        envelope::write_slot_header(&mut s, seq, &digest, len32, false, limit);
        spilled = s;
        &spilled
    };
    let all = t
        .all_gather_fixed(mine, deadline)
        .map_err(|e| other_first_round(e, slot))?;
    r.traffic.add(mine.len(), all.len());
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
        let own: &[u8] = if fits { &[] } else { &buf[SLOT_HEADER_LEN..] };
        let second = t.all_gather_sized(own, &second_lens, deadline)?;
        r.traffic.add(own.len(), second.iter().map(Vec::len).sum());
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

/// The flat exchange's join of what [`run`] gathered: checks every
/// envelope, then joins into a new value or into the caller's (`own`:
/// this rank; `sent`: the envelope it sent).
pub(crate) fn finish<'a, J: Join>(
    local: Local<'a, J>,
    round: Round,
    own: u32,
    sent: Option<&[u8]>,
    limits: &Limits,
) -> Result<Flat<'a, J>> {
    let Round::Gathered { bufs, envs } = round else {
        return Ok((local.unchanged(), None, true));
    };
    let payloads = check_envelopes(&bufs, &envs, limits)?;
    let merged = match local {
        Local::Shared(_) => Merged::Joined(join_new::<J>(&bufs, &payloads)?),
        Local::InPlace(state) => {
            let own = own as usize;
            // The join in place assumes that the gathered copy of this
            // rank's envelope is what it sent (the encoding of `state`).
            // Bytes changed on the way (or in memory before the send)
            // would make this rank join something its peers did not:
            // then join every gathered payload, as `exchange` does, and
            // every rank gets the same result or the same error.
            let intact = envs
                .get(own)
                .and_then(|&(b, start, end)| bufs.get(b)?.get(start..end))
                .is_some_and(|got| Some(got) == sent);
            if intact {
                let views: Vec<&[u8]> = payloads.iter().map(|&(b, s, e)| &bufs[b][s..e]).collect();
                state
                    .join_payloads(own, &views, Sealed(()))
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
        Some(Payloads {
            bufs,
            spans: payloads,
            values: OnceCell::new(),
        }),
        false,
    ))
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
/// the kind's sealed `join_encoded` hook; a payload that does not read names its rank.
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
    let mut merged = J::read_payload(first, Sealed(())).map_err(named(0))?;
    for (rank, p) in (1usize..).zip(it) {
        merged.join_encoded(p, Sealed(())).map_err(named(rank))?;
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
