//! A frame state's payload read and written by hand: the exact bytes of its
//! postcard encoding (what [`crate::protocol::encode_payload`] writes), the
//! exact payloads [`crate::protocol::decode_payload`] accepts, without
//! serde's per-field calls. The exchange spends its CPU here: a 2000-source
//! state is written, read and joined once per rank per exchange.
//!
//! ```text
//! FrameState = varint(n) then n × (name, SizeEntry), names strictly increasing
//! name       = varint(len) then len bytes of UTF-8
//! SizeEntry  = scalar: atom(i64), size: dims(u64), stride: dims(Stride)
//! dims       = varint(0) Unset | varint(1) Dynamic | varint(2) varint(k) k × atom
//! atom       = varint: 0 Unset, 1 Dynamic, 2 + code(v) Static(v)
//! ```
//!
//! Varints are postcard's: little-endian groups of 7 bits, at most 5 bytes
//! for a variant index (last byte ≤ 0x0F), 10 for a length (last ≤ 0x01), 19
//! for an atom (last ≤ 0x03); longer-than-needed forms are accepted, as
//! postcard accepts them. The property tests of `tests/one_round.rs` check
//! both directions against postcard.

use crate::decisions::lattice::{Atom, Dims, SizeEntry, Stride};
use crate::protocol::compact::AtomValue;
use std::collections::BTreeMap;

/// Why a payload does not read (the detail of a `DecodeError::Payload`).
pub(crate) type Bad = String;

fn end() -> Bad {
    "the payload ends early".into()
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Every byte consumed, else the count of trailing bytes.
    fn finished(&self) -> Result<(), Bad> {
        match self.b.len() - self.at {
            0 => Ok(()),
            extra => Err(crate::error::counted(
                extra,
                "trailing byte",
                "trailing bytes",
            )),
        }
    }

    fn byte(&mut self) -> Result<u8, Bad> {
        let v = *self.b.get(self.at).ok_or_else(end)?;
        self.at += 1;
        Ok(v)
    }

    /// A varint of at most `max` bytes whose last byte is at most `last`.
    /// Most varints of a state are one byte: that case is inline.
    #[inline(always)]
    fn varint(&mut self, max: usize, last: u8) -> Result<u128, Bad> {
        match self.b.get(self.at) {
            Some(&v) if v < 0x80 => {
                self.at += 1;
                Ok(u128::from(v))
            }
            _ => self.long_varint(max, last),
        }
    }

    #[cold]
    #[inline(never)]
    fn long_varint(&mut self, max: usize, last: u8) -> Result<u128, Bad> {
        let first = self.byte()?;
        let mut out = u128::from(first & 0x7f);
        for i in 1..max {
            let v = self.byte()?;
            out |= u128::from(v & 0x7f) << (7 * i);
            if v & 0x80 == 0 {
                if i == max - 1 && v > last {
                    return Err("a varint overflows".into());
                }
                return Ok(out);
            }
        }
        Err("a varint is too long".into())
    }

    fn len(&mut self) -> Result<u64, Bad> {
        self.varint(10, 0x01)
            .map(|v| u64::try_from(v).unwrap_or(u64::MAX))
    }

    fn variant(&mut self) -> Result<u32, Bad> {
        self.varint(5, 0x0f)
            .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    }

    fn name(&mut self) -> Result<&'a str, Bad> {
        let len = usize::try_from(self.len()?).unwrap_or(usize::MAX);
        let end = self.at.checked_add(len).filter(|&e| e <= self.b.len());
        let bytes = &self.b[self.at..end.ok_or_else(end_of_name)?];
        self.at += len;
        std::str::from_utf8(bytes).map_err(|_| "a source name is not UTF-8".to_owned())
    }

    fn atom<V: AtomValue>(&mut self) -> Result<Atom<V>, Bad> {
        match self.varint(19, 0x03)? {
            0 => Ok(Atom::Unset),
            1 => Ok(Atom::Dynamic),
            c => V::from_code(c - 2)
                .map(Atom::Static)
                .ok_or_else(|| format!("atom code {c} is out of range")),
        }
    }
}

fn end_of_name() -> Bad {
    end()
}

/// `mine ← mine ⊔ (the dims at the reader)`, the same result as
/// [`Dims::join`], validating every atom whatever `mine` is.
fn join_dims<V: AtomValue + PartialEq + Clone>(
    r: &mut Reader<'_>,
    mine: &mut Dims<V>,
) -> Result<(), Bad> {
    match r.variant()? {
        0 => Ok(()),
        1 => {
            *mine = Dims::Dynamic;
            Ok(())
        }
        2 => {
            let k = r.len()?;
            match mine {
                Dims::Known(xs) if xs.len() as u64 == k => {
                    for x in xs.iter_mut() {
                        let a = r.atom::<V>()?;
                        if *x != a {
                            *x = x.join(&a);
                        }
                    }
                }
                Dims::Unset => {
                    // Each atom takes at least a byte: what is left bounds it.
                    let room = r.b.len() - r.at;
                    let mut v = Vec::with_capacity(usize::try_from(k).unwrap_or(room).min(room));
                    for _ in 0..k {
                        v.push(r.atom::<V>()?);
                    }
                    *mine = Dims::Known(v);
                }
                _ => {
                    for _ in 0..k {
                        r.atom::<V>()?;
                    }
                    *mine = Dims::Dynamic;
                }
            }
            Ok(())
        }
        other => Err(format!("tuple variant {other} is not one of 0, 1, 2")),
    }
}

fn join_entry(r: &mut Reader<'_>, mine: &mut SizeEntry) -> Result<(), Bad> {
    let scalar = r.atom::<i64>()?;
    if mine.scalar != scalar {
        mine.scalar = mine.scalar.join(&scalar);
    }
    join_dims::<u64>(r, &mut mine.size)?;
    join_dims::<Stride>(r, &mut mine.stride)
}

fn out_of_order(name: &str, previous: &str) -> Bad {
    format!("source '{name}' after '{previous}': names must be strictly increasing")
}

/// `entries ← entries ⊔ payload`: one pass over both sorted lists; a source
/// already held is joined in place (no allocation), a new one is read whole
/// and inserted after the pass.
pub(crate) fn join_into(
    entries: &mut BTreeMap<String, SizeEntry>,
    payload: &[u8],
) -> Result<(), Bad> {
    let mut r = Reader { b: payload, at: 0 };
    let n = r.len()?;
    if entries.is_empty() {
        *entries = read_entries(&mut r, n)?;
    } else {
        let mut new: Vec<(&str, SizeEntry)> = Vec::new();
        let mut previous: Option<&str> = None;
        let mut mine = entries.iter_mut().peekable();
        for _ in 0..n {
            let name = r.name()?;
            if let Some(p) = previous {
                if name <= p {
                    return Err(out_of_order(name, p));
                }
            }
            previous = Some(name);
            while mine.next_if(|(k, _)| k.as_str() < name).is_some() {}
            match mine.next_if(|(k, _)| k.as_str() == name) {
                Some((_, entry)) => join_entry(&mut r, entry)?,
                None => {
                    let mut entry = SizeEntry::unset();
                    join_entry(&mut r, &mut entry)?;
                    new.push((name, entry));
                }
            }
        }
        drop(mine);
        for (name, entry) in new {
            entries.insert(name.to_owned(), entry);
        }
    }
    r.finished()
}

fn read_entries(r: &mut Reader<'_>, n: u64) -> Result<BTreeMap<String, SizeEntry>, Bad> {
    // Each entry takes at least four bytes: what is left bounds the list.
    let room = (r.b.len() - r.at) / 4;
    let mut v: Vec<(String, SizeEntry)> =
        Vec::with_capacity(usize::try_from(n).unwrap_or(room).min(room));
    for _ in 0..n {
        let name = r.name()?;
        if let Some((p, _)) = v.last() {
            if name <= p.as_str() {
                return Err(out_of_order(name, p));
            }
        }
        let mut entry = SizeEntry::unset();
        join_entry(r, &mut entry)?;
        v.push((name.to_owned(), entry));
    }
    Ok(v.into_iter().collect())
}

/// Reads a whole payload: a frame state's entries (what `decode_payload`
/// returns for it).
pub(crate) fn read(payload: &[u8]) -> Result<BTreeMap<String, SizeEntry>, Bad> {
    let mut entries = BTreeMap::new();
    join_into(&mut entries, payload)?;
    Ok(entries)
}

/// Skips a varint of this rank's own payload (written by [`write`], so
/// well formed; still bounds-checked).
fn skip_varint(r: &mut Reader<'_>) -> Result<u128, Bad> {
    r.varint(19, 0xff)
}

/// Skips one dims field of this rank's own payload.
fn skip_dims(r: &mut Reader<'_>) -> Result<(), Bad> {
    if skip_varint(r)? == 2 {
        for _ in 0..skip_varint(r)? {
            skip_varint(r)?;
        }
    }
    Ok(())
}

/// One entry of this rank's own payload: its name's bytes, and where the
/// whole entry (name included) starts and ends.
type OwnEntry<'a> = (&'a [u8], usize, usize);

/// Reads the next entry of this rank's own payload, if any is left.
fn next_own<'a>(r: &mut Reader<'a>, left: &mut u64) -> Result<Option<OwnEntry<'a>>, Bad> {
    if *left == 0 {
        return Ok(None);
    }
    *left -= 1;
    let start = r.at;
    let len = usize::try_from(r.len()?).unwrap_or(usize::MAX);
    let end = r.at.checked_add(len).filter(|&e| e <= r.b.len());
    let name = &r.b[r.at..end.ok_or_else(end_of_name)?];
    r.at += len;
    skip_varint(r)?;
    skip_dims(r)?;
    skip_dims(r)?;
    Ok(Some((name, start, r.at)))
}

/// Reads one entry of a peer's payload strictly (every atom in range), building nothing.
fn check_entry(r: &mut Reader<'_>) -> Result<(), Bad> {
    fn dims<V: AtomValue>(r: &mut Reader<'_>) -> Result<(), Bad> {
        match r.variant()? {
            0 | 1 => Ok(()),
            2 => {
                for _ in 0..r.len()? {
                    r.atom::<V>()?;
                }
                Ok(())
            }
            other => Err(format!("tuple variant {other} is not one of 0, 1, 2")),
        }
    }
    r.atom::<i64>()?;
    dims::<u64>(r)?;
    dims::<Stride>(r)
}

/// What a peer's entry does to this rank's state, found by the first pass
/// of [`join_payloads`].
enum Change {
    /// Join the entry at `at` of payload `rank` into this rank's entry
    /// number `own` (the entry's name is this rank's).
    Join { own: usize, rank: usize, at: usize },
    /// A source this rank does not hold: the entry (name first) at `at` of
    /// payload `rank`.
    New { rank: usize, at: usize },
}

/// `entries ← entries ⊔ every payload but payloads[own]`, where
/// `payloads[own]` is the encoding of `entries` (see `Join::join_payloads`).
///
/// First pass, per peer payload in rank order: read it strictly in step
/// with this rank's own payload. An entry whose bytes equal this rank's
/// entry of the same place is that entry (the encoding is prefix-free), so
/// it is valid, in order, and changes nothing: a comparison. Any other entry
/// is read strictly and noted. Second pass, once every payload has read:
/// the noted entries are joined in place (a new source costs its entry).
/// On an error nothing has changed.
pub(crate) fn join_payloads(
    entries: &mut BTreeMap<String, SizeEntry>,
    own: usize,
    payloads: &[&[u8]],
) -> Result<(), (usize, Bad)> {
    let mine = payloads.get(own).copied().unwrap_or_default();
    let mut changes: Vec<Change> = Vec::new();
    for (rank, peer) in payloads.iter().enumerate() {
        if rank != own {
            scan_peer(mine, peer, rank, &mut changes).map_err(|e| (rank, e))?;
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    // Joins into entries this rank holds, in its entries' order (each peer's
    // are in order already; the sort interleaves peers).
    changes.sort_by_key(|c| match *c {
        Change::Join { own, .. } => own,
        Change::New { .. } => usize::MAX,
    });
    let mut held = entries.values_mut().enumerate().peekable();
    let mut new = Vec::new();
    for change in &changes {
        match *change {
            Change::Join { own, rank, at } => {
                while held.next_if(|(i, _)| *i < own).is_some() {}
                let Some((_, entry)) = held.peek_mut() else {
                    return Err((rank, "an entry this rank holds is missing".into()));
                };
                let mut r = Reader {
                    b: payloads[rank],
                    at,
                };
                join_entry(&mut r, entry).map_err(|e| (rank, e))?;
            }
            Change::New { rank, at } => new.push((rank, at)),
        }
    }
    drop(held);
    for (rank, at) in new {
        let mut r = Reader {
            b: payloads[rank],
            at,
        };
        let name = r.name().map_err(|e| (rank, e))?;
        if let Some(entry) = entries.get_mut(name) {
            join_entry(&mut r, entry).map_err(|e| (rank, e))?;
        } else {
            let mut entry = SizeEntry::unset();
            join_entry(&mut r, &mut entry).map_err(|e| (rank, e))?;
            entries.insert(name.to_owned(), entry);
        }
    }
    Ok(())
}

/// The first pass of [`join_payloads`] over one peer's payload.
fn scan_peer(mine: &[u8], peer: &[u8], rank: usize, changes: &mut Vec<Change>) -> Result<(), Bad> {
    let mut o = Reader { b: mine, at: 0 };
    let mut own_left = o.len()?;
    let mut cur = next_own(&mut o, &mut own_left)?;
    let mut index = 0usize;
    let mut r = Reader { b: peer, at: 0 };
    let n = r.len()?;
    // The peer's previous name (for the order check), from either payload.
    let mut previous: Option<&[u8]> = None;
    for _ in 0..n {
        if let Some((name, start, end)) = cur {
            let same = peer
                .get(r.at..r.at + (end - start))
                .is_some_and(|theirs| theirs == &mine[start..end]);
            if same {
                // This rank's own entry: valid, and after `previous` (every
                // earlier peer name is below this rank's current one).
                r.at += end - start;
                previous = Some(name);
                cur = next_own(&mut o, &mut own_left)?;
                index += 1;
                continue;
            }
        }
        let at = r.at;
        let name = r.name()?.as_bytes();
        if let Some(p) = previous {
            if name <= p {
                return Err(out_of_order(
                    &String::from_utf8_lossy(name),
                    &String::from_utf8_lossy(p),
                ));
            }
        }
        previous = Some(name);
        let body = r.at;
        check_entry(&mut r)?;
        while let Some((held, _, _)) = cur {
            if held >= name {
                break;
            }
            cur = next_own(&mut o, &mut own_left)?;
            index += 1;
        }
        match cur {
            Some((held, start, end)) if held == name => {
                // Equal bytes (after sources the peer lacks) change nothing.
                if peer[at..r.at] != mine[start..end] {
                    changes.push(Change::Join {
                        own: index,
                        rank,
                        at: body,
                    });
                }
                cur = next_own(&mut o, &mut own_left)?;
                index += 1;
            }
            _ => changes.push(Change::New { rank, at }),
        }
    }
    r.finished()
}

#[inline(always)]
fn put_varint(out: &mut Vec<u8>, v: u128) {
    if v < 0x80 {
        out.push(v.to_le_bytes()[0]);
    } else {
        put_long_varint(out, v);
    }
}

#[inline(never)]
fn put_long_varint(out: &mut Vec<u8>, mut v: u128) {
    while v >= 0x80 {
        out.push(v.to_le_bytes()[0] | 0x80);
        v >>= 7;
    }
    out.push(v.to_le_bytes()[0]);
}

#[inline(always)]
fn put_atom<V: AtomValue>(out: &mut Vec<u8>, a: &Atom<V>) {
    match a {
        Atom::Unset => out.push(0),
        Atom::Dynamic => out.push(1),
        Atom::Static(v) => put_varint(out, v.code().saturating_add(2)),
    }
}

fn put_dims<V: AtomValue>(out: &mut Vec<u8>, d: &Dims<V>) {
    match d {
        Dims::Unset => out.push(0),
        Dims::Dynamic => out.push(1),
        Dims::Known(xs) => {
            out.push(2);
            put_varint(out, xs.len() as u128);
            for a in xs {
                put_atom(out, a);
            }
        }
    }
}

/// The most bytes `put_dims` writes for `d`.
fn dims_bound<V>(d: &Dims<V>) -> usize {
    match d {
        Dims::Known(xs) => 11 + 19 * xs.len(),
        _ => 1,
    }
}

/// Appends the payload of a state with `entries` to `out`: postcard's bytes
/// exactly.
pub(crate) fn write(entries: &BTreeMap<String, SizeEntry>, out: &mut Vec<u8>) {
    put_varint(out, entries.len() as u128);
    for (name, e) in entries {
        // One reservation per entry, for its most bytes.
        out.reserve(10 + name.len() + 19 + dims_bound(&e.size) + dims_bound(&e.stride));
        put_varint(out, name.len() as u128);
        out.extend_from_slice(name.as_bytes());
        put_atom(out, &e.scalar);
        put_dims(out, &e.size);
        put_dims(out, &e.stride);
    }
}
