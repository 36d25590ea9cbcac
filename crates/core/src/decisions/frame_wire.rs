//! A frame state's storage: its entries kept in their canonical wire form
//! (the exact bytes of the postcard encoding [`crate::protocol::encode_payload`]
//! writes), with the offset of each entry. Sending a state copies its bytes,
//! the fast path's digest reads them in one pass, and a join is a merge of
//! two sorted byte strings that copies every entry the other side does not
//! change, so an exchange touches a few contiguous buffers instead of three
//! heap blocks per source.
//!
//! ```text
//! payload    = varint(n) then n × entry, names strictly increasing
//! entry      = name, then its SizeEntry: scalar: atom(Scalar), size: dims(u64), stride: dims(Stride)
//! name       = varint(len) then len bytes of UTF-8
//! dims       = varint(0) Unset | varint(1) Dynamic | varint(2) varint(k) k × atom
//! atom       = varint: 0 Unset, 1 Dynamic, 2 + code(v) Static(v)
//! ```
//!
//! Varints are postcard's: little-endian groups of 7 bits, at most 5 bytes
//! for a variant index (last byte ≤ 0x0F), 10 for a length (last ≤ 0x01), 19
//! for an atom (last ≤ 0x03). Reading a peer's bytes accepts what postcard
//! accepts (longer-than-needed varints too) and writes every entry it keeps
//! canonically (the shortest varints), so a stored state's bytes are always
//! canonical: two states are equal exactly when their bytes are, and an
//! entry whose bytes equal this state's entry is that entry (the encoding is
//! prefix-free). The property tests of `tests/frame_bytes.rs` check the
//! bytes against postcard (padded varints too) and every join and edit
//! against a map of lattice entries; those of `tests/one_round.rs` and
//! `tests/lattice.rs` check the exchange's joins and the lattice's laws.
//!
//! The join of two entries works on atom codes alone: the code of a value
//! is one-to-one, so `Unset ⊔ y = y`, equal codes join to themselves, and
//! any other pair of codes joins to `Dynamic` (code 1), whatever the atom's
//! type.

use crate::decisions::lattice::{Atom, Dims, Scalar, SizeEntry, Stride};
use crate::protocol::compact::AtomValue;

/// Why bytes do not read (the detail of a `DecodeError::Payload`).
pub(crate) type Bad = String;

fn end() -> Bad {
    "the payload ends early".into()
}

/// The entries of one state in wire form (see the module docs).
///
/// Invariant: `bytes` holds `starts.len()` canonical entries, names strictly
/// increasing, entry `i` starting at `starts[i]`; every constructor and
/// mutation keeps it (the readers validate, the writers are canonical).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Table {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl Table {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.starts.len()
    }

    /// The bytes of entries `from..to`.
    fn span(&self, from: usize, to: usize) -> &[u8] {
        let end = self.starts.get(to).copied().unwrap_or(self.bytes.len());
        let start = self.starts.get(from).copied().unwrap_or(end);
        &self.bytes[start..end]
    }

    /// Entry `i`'s bytes, name first.
    fn entry(&self, i: usize) -> &[u8] {
        self.span(i, i + 1)
    }

    /// Entry `i`'s name and the bytes of its size entry.
    #[inline]
    fn split(&self, i: usize) -> (&[u8], &[u8]) {
        let e = self.entry(i);
        let mut r = Reader { b: e, at: 0 };
        match r.name_bytes() {
            Ok(name) => (name, &e[r.at..]),
            Err(_) => (&[], e),
        }
    }

    /// Entry `i`'s name (UTF-8 by the invariant).
    fn name(&self, i: usize) -> &[u8] {
        self.split(i).0
    }

    /// Entry `i`'s name.
    pub(crate) fn name_str(&self, i: usize) -> &str {
        std::str::from_utf8(self.name(i)).unwrap_or_default()
    }

    /// Entry `i` as a name and a [`SizeEntry`].
    pub(crate) fn get(&self, i: usize) -> Option<(&str, SizeEntry)> {
        let (name, body) = self.split(i);
        let name = std::str::from_utf8(name).ok()?;
        let mut r = Reader { b: body, at: 0 };
        let entry = read_entry(&mut r).ok()?;
        Some((name, entry))
    }

    /// The index of the entry named `name`, or where it would go.
    pub(crate) fn find(&self, name: &str) -> Result<usize, usize> {
        let name = name.as_bytes();
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(mid).cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// Puts `new` (one whole entry, or nothing) in place of entry `i` when
    /// `replace`, else inserts it before entry `i`.
    fn splice(&mut self, i: usize, replace: bool, new: &[u8]) {
        let at = self.starts.get(i).copied().unwrap_or(self.bytes.len());
        let old = if replace { self.entry(i).len() } else { 0 };
        self.bytes.splice(at..at + old, new.iter().copied());
        let later = match (replace, new.is_empty()) {
            (true, true) => {
                self.starts.remove(i);
                i
            }
            (true, false) => i + 1,
            (false, _) => {
                self.starts.insert(i, at);
                i + 1
            }
        };
        for s in &mut self.starts[later..] {
            *s = *s + new.len() - old;
        }
    }

    /// `entry ⊔` the entry of `name` (inserted when absent).
    pub(crate) fn join_entry(&mut self, name: &str, entry: &SizeEntry) {
        let mut theirs = Vec::new();
        put_name(&mut theirs, name.as_bytes());
        let body = theirs.len();
        write_body(&mut theirs, entry);
        match self.find(name) {
            Ok(i) => {
                let (_, mine) = self.split(i);
                let mut joined = theirs[..body].to_vec();
                let mut r = Reader {
                    b: &theirs,
                    at: body,
                };
                if join_bodies(mine, &mut r, &mut joined).is_ok() && joined != self.entry(i) {
                    self.splice(i, true, &joined);
                }
            }
            Err(i) => self.splice(i, false, &theirs),
        }
    }

    /// Sets the entry of `name`; returns the one it replaces.
    pub(crate) fn insert(&mut self, name: &str, entry: &SizeEntry) -> Option<SizeEntry> {
        let mut new = Vec::new();
        write_entry(&mut new, name, entry);
        match self.find(name) {
            Ok(i) => {
                let old = self.get(i).map(|(_, e)| e);
                self.splice(i, true, &new);
                old
            }
            Err(i) => {
                self.splice(i, false, &new);
                None
            }
        }
    }

    /// Removes the entry of `name`; returns it.
    pub(crate) fn remove(&mut self, name: &str) -> Option<SizeEntry> {
        let i = self.find(name).ok()?;
        let old = self.get(i).map(|(_, e)| e);
        self.splice(i, true, &[]);
        old
    }

    /// A table of `entries`, sorted by name with no name twice.
    pub(crate) fn from_sorted<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a SizeEntry)>,
    ) -> Self {
        let mut t = Table::default();
        for (name, e) in entries {
            t.starts.push(t.bytes.len());
            write_entry(&mut t.bytes, name, e);
        }
        t
    }

    /// Appends the payload (`varint(n)`, then the entries) to `out`.
    pub(crate) fn write_payload(&self, out: &mut Vec<u8>) {
        put_varint(out, self.len() as u128);
        out.extend_from_slice(&self.bytes);
    }

    /// Whether `payload` is this table's payload (the count, then its bytes).
    fn is_payload(&self, payload: &[u8]) -> bool {
        let mut r = Reader { b: payload, at: 0 };
        r.len().is_ok_and(|n| n == self.len() as u64) && payload[r.at..] == self.bytes[..]
    }

    /// The payload's bytes without the count: for a digest or a comparison.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Reads a payload strictly into a new table (canonical bytes).
    pub(crate) fn read(payload: &[u8]) -> Result<Table, Bad> {
        let mut out = Table::default();
        out.merge_payload(&Table::default(), payload)?;
        Ok(out)
    }

    /// `self ← own ⊔ the payload`, read strictly. On an error `self` holds
    /// part of the join (callers merge into a scratch table).
    pub(crate) fn merge_payload(&mut self, own: &Table, payload: &[u8]) -> Result<(), Bad> {
        let mut r = Reader { b: payload, at: 0 };
        let n = r.len()?;
        self.merge(own, &payload[r.at..], n)
    }

    /// `self ← own ⊔ other` (both tables, so nothing can fail to read).
    pub(crate) fn merge_table(&mut self, own: &Table, other: &Table) -> Result<(), Bad> {
        self.merge(own, &other.bytes, other.len() as u64)
    }

    /// `self ← own ⊔ the n entries in peer`, one pass over both sorted
    /// lists. A peer entry whose bytes equal `own`'s entry at the same place
    /// is that entry (prefix-free encoding): it costs a comparison, and runs
    /// of them are copied at once. Any other peer entry is read strictly:
    /// joined into `own`'s entry of the same name, or written anew.
    fn merge(&mut self, own: &Table, peer: &[u8], n: u64) -> Result<(), Bad> {
        self.bytes.clear();
        self.starts.clear();
        // The join is usually about as long as the longer side (ranks
        // mostly saw the same sources); more grows the buffers as usual.
        self.bytes.reserve(own.bytes.len() + peer.len());
        // Each entry takes at least four bytes: what is left bounds `n`.
        let bound = usize::try_from(n).unwrap_or(usize::MAX).min(peer.len() / 4);
        self.starts.reserve(own.len() + bound);
        let mut r = Reader { b: peer, at: 0 };
        // `own`'s entries before `i` are done; those from `run` go out as they are.
        let (mut i, mut run) = (0usize, 0usize);
        // The peer's previous name: `own`'s entry it equalled, or its own.
        let mut previous: Option<Result<usize, &[u8]>> = None;
        for _ in 0..n {
            if i < own.len() {
                let e = own.entry(i);
                if peer.get(r.at..r.at + e.len()).is_some_and(|p| same(p, e)) {
                    // After `previous`: every earlier peer name is below `own`'s name `i`.
                    r.at += e.len();
                    previous = Some(Ok(i));
                    i += 1;
                    continue;
                }
            }
            // Most often the peer's entry differs from `own`'s entry `i` in
            // its size entry only: same name, found without a search.
            if i < own.len() {
                let (held, body) = own.split(i);
                let head = own.entry(i).len() - body.len();
                let e = own.entry(i);
                if peer
                    .get(r.at..r.at + head)
                    .is_some_and(|p| same(p, &e[..head]))
                {
                    r.at += head;
                    self.copy_run(own, run, i);
                    self.starts.push(self.bytes.len());
                    self.bytes.extend_from_slice(&e[..head]);
                    join_bodies(body, &mut r, &mut self.bytes)?;
                    previous = Some(Err(held));
                    i += 1;
                    run = i;
                    continue;
                }
            }
            let name = r.name_bytes()?;
            // `own`'s entries before `name` go out as they are.
            let held = loop {
                if i == own.len() {
                    break None;
                }
                let (held, body) = own.split(i);
                match held.cmp(name) {
                    std::cmp::Ordering::Less => i += 1,
                    std::cmp::Ordering::Equal => break Some(body),
                    std::cmp::Ordering::Greater => break None,
                }
            };
            self.copy_run(own, run, i);
            self.starts.push(self.bytes.len());
            put_name(&mut self.bytes, name);
            match held {
                // A name `own` holds at or after `i` is after `previous`
                // (every earlier peer name is below `own`'s name `i`), and UTF-8.
                Some(body) => {
                    join_bodies(body, &mut r, &mut self.bytes)?;
                    i += 1;
                }
                None => {
                    let Ok(text) = std::str::from_utf8(name) else {
                        return Err("a source name is not UTF-8".into());
                    };
                    if let Some(p) = previous {
                        let p = p.map_or_else(|bytes| bytes, |j| own.name(j));
                        if name <= p {
                            return Err(out_of_order(text, &String::from_utf8_lossy(p)));
                        }
                    }
                    copy_body(&mut r, &mut self.bytes)?;
                }
            }
            previous = Some(Err(name));
            run = i;
        }
        r.finished()?;
        self.copy_run(own, run, own.len());
        Ok(())
    }

    /// Appends `own`'s entries `from..to` as they are.
    fn copy_run(&mut self, own: &Table, from: usize, to: usize) {
        if from >= to {
            return;
        }
        let base = own.starts[from];
        let at = self.bytes.len();
        self.starts
            .extend(own.starts[from..to].iter().map(|&s| s - base + at));
        self.bytes.extend_from_slice(own.span(from, to));
    }
}

/// Joins every peer payload into `own` in rank order (`payloads[skip]` is
/// `own`'s own encoding and is not read; a payload equal to it is
/// skipped): the result, `None` when no payload can change `own`, or the
/// index of the first payload that does not read. `own` is not changed.
///
/// One two-way merge per peer, into two buffers used in turn. (A k-way
/// merge of every payload at once was measured slower: it reads a name per
/// input per source, where the two-way merge compares whole entries and
/// copies runs of equal ones at once.)
pub(crate) fn join_payloads(
    own: &Table,
    skip: usize,
    payloads: &[&[u8]],
) -> Result<Option<Table>, (usize, Bad)> {
    let mine = payloads.get(skip).copied();
    if !mine.is_some_and(|m| own.is_payload(m)) {
        // Not `own`'s encoding (the caller broke the precondition): what
        // the trait's provided version does, read every payload, `skip`'s
        // too, then join every other one.
        let mut tables = Vec::with_capacity(payloads.len());
        for (rank, p) in payloads.iter().enumerate() {
            tables.push(Table::read(p).map_err(|e| (rank, e))?);
        }
        let mut all: Vec<&Table> = vec![own];
        all.extend(
            tables
                .iter()
                .enumerate()
                .filter(|&(r, _)| r != skip)
                .map(|(_, t)| t),
        );
        return join_tables(&all).map(Some).map_err(|e| (skip, e));
    }
    let mut acc: Option<Table> = None;
    let mut scratch = Table::default();
    for (rank, peer) in payloads.iter().enumerate() {
        // This rank's own payload, or a copy of it: nothing to join.
        if rank == skip || Some(*peer) == mine {
            continue;
        }
        let from = acc.as_ref().unwrap_or(own);
        scratch.merge_payload(from, peer).map_err(|e| (rank, e))?;
        match &mut acc {
            Some(a) => std::mem::swap(a, &mut scratch),
            None => acc = Some(std::mem::take(&mut scratch)),
        }
    }
    Ok(acc)
}

/// The join of `tables`, by two-way merges into two buffers used in turn
/// (see [`join_payloads`] on a k-way merge).
pub(crate) fn join_tables(tables: &[&Table]) -> Result<Table, Bad> {
    let Some((first, rest)) = tables.split_first() else {
        return Ok(Table::default());
    };
    let mut acc = (*first).clone();
    let mut scratch = Table::default();
    for t in rest {
        if t.len() == 0 || **t == acc {
            continue;
        }
        scratch.merge_table(&acc, t)?;
        std::mem::swap(&mut acc, &mut scratch);
    }
    Ok(acc)
}

/// `a == b` for two slices of the same length, short ones (an entry is
/// about 16 bytes) compared eight bytes at a time without a call.
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut x, mut y) = (a, b);
    while let (Some((p, xs)), Some((q, ys))) =
        (x.split_first_chunk::<8>(), y.split_first_chunk::<8>())
    {
        if p != q {
            return false;
        }
        x = xs;
        y = ys;
    }
    x == y
}

fn out_of_order(name: &str, previous: &str) -> Bad {
    format!("source '{name}' after '{previous}': names must be strictly increasing")
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

    /// A name's bytes (not yet checked as UTF-8).
    #[inline]
    fn name_bytes(&mut self) -> Result<&'a [u8], Bad> {
        let len = usize::try_from(self.len()?).unwrap_or(usize::MAX);
        let stop = self.at.checked_add(len).filter(|&e| e <= self.b.len());
        let bytes = &self.b[self.at..stop.ok_or_else(end)?];
        self.at += len;
        Ok(bytes)
    }

    /// An atom's code, checked against the range of `V`. A one-byte code
    /// (below 128) is in range for every atom type.
    #[inline(always)]
    fn code<V: AtomValue>(&mut self) -> Result<u128, Bad> {
        match self.b.get(self.at) {
            Some(&v) if v < 0x80 => {
                self.at += 1;
                Ok(u128::from(v))
            }
            _ => self.long_code::<V>(),
        }
    }

    #[cold]
    #[inline(never)]
    fn long_code<V: AtomValue>(&mut self) -> Result<u128, Bad> {
        match self.long_varint(19, 0x03)? {
            c @ (0 | 1) => Ok(c),
            c if V::from_code(c - 2).is_some() => Ok(c),
            c => Err(format!("atom code {c} is out of range")),
        }
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

    /// A dims tag: 0 Unset, 1 Dynamic, 2 Known.
    fn tag(&mut self) -> Result<u32, Bad> {
        match self.variant()? {
            t @ 0..=2 => Ok(t),
            other => Err(format!("tuple variant {other} is not one of 0, 1, 2")),
        }
    }
}

/// The lattice's join on atom codes (see the module docs).
#[inline(always)]
fn join_code(a: u128, b: u128) -> u128 {
    if a == 0 || a == b {
        b
    } else if b == 0 {
        a
    } else {
        1
    }
}

/// Joins `mine` (an entry's size entry, canonical) with the one at `r`
/// (read strictly) and writes the result.
fn join_bodies(mine: &[u8], r: &mut Reader<'_>, out: &mut Vec<u8>) -> Result<(), Bad> {
    let mut m = Reader { b: mine, at: 0 };
    let (a, b) = (m.code::<Scalar>()?, r.code::<Scalar>()?);
    put_varint(out, join_code(a, b));
    join_dims::<u64>(&mut m, r, out)?;
    join_dims::<Stride>(&mut m, r, out)
}

/// Reads `k` atoms of `V`, writing them when `out` is given.
fn atoms<V: AtomValue>(
    r: &mut Reader<'_>,
    k: u64,
    mut out: Option<&mut Vec<u8>>,
) -> Result<(), Bad> {
    for _ in 0..k {
        let c = r.code::<V>()?;
        if let Some(o) = out.as_deref_mut() {
            put_varint(o, c);
        }
    }
    Ok(())
}

/// The rest of a dims field whose tag was `tag`: read, and written when
/// `out` is given.
fn dims_rest<V: AtomValue>(
    r: &mut Reader<'_>,
    tag: u32,
    mut out: Option<&mut Vec<u8>>,
) -> Result<(), Bad> {
    if let Some(o) = out.as_deref_mut() {
        o.push(tag.to_le_bytes()[0]);
    }
    if tag == 2 {
        let k = r.len()?;
        if let Some(o) = out.as_deref_mut() {
            put_varint(o, u128::from(k));
        }
        atoms::<V>(r, k, out)?;
    }
    Ok(())
}

fn join_dims<V: AtomValue>(
    m: &mut Reader<'_>,
    r: &mut Reader<'_>,
    out: &mut Vec<u8>,
) -> Result<(), Bad> {
    let (ta, tb) = (m.tag()?, r.tag()?);
    match (ta, tb) {
        (_, 0) => dims_rest::<V>(m, ta, Some(out)),
        (0, _) => dims_rest::<V>(r, tb, Some(out)),
        (2, 2) => {
            let (ka, kb) = (m.len()?, r.len()?);
            if ka == kb {
                out.push(2);
                put_varint(out, u128::from(ka));
                for _ in 0..ka {
                    let (a, b) = (m.code::<V>()?, r.code::<V>()?);
                    put_varint(out, join_code(a, b));
                }
            } else {
                atoms::<V>(m, ka, None)?;
                atoms::<V>(r, kb, None)?;
                out.push(1);
            }
            Ok(())
        }
        // One side Dynamic, the other Dynamic or known: Dynamic absorbs.
        // The peer's rest is read strictly all the same.
        _ => {
            dims_rest::<V>(m, ta, None)?;
            dims_rest::<V>(r, tb, None)?;
            out.push(1);
            Ok(())
        }
    }
}

/// Reads a size entry strictly and writes it canonically.
fn copy_body(r: &mut Reader<'_>, out: &mut Vec<u8>) -> Result<(), Bad> {
    let scalar = r.code::<Scalar>()?;
    put_varint(out, scalar);
    let t = r.tag()?;
    dims_rest::<u64>(r, t, Some(&mut *out))?;
    let t = r.tag()?;
    dims_rest::<Stride>(r, t, Some(out))
}

fn read_dims<V: AtomValue>(r: &mut Reader<'_>) -> Result<Dims<V>, Bad> {
    match r.tag()? {
        0 => Ok(Dims::Unset),
        1 => Ok(Dims::Dynamic),
        _ => {
            let k = r.len()?;
            // Each atom takes at least a byte: what is left bounds it.
            let room = r.b.len() - r.at;
            let mut v = Vec::with_capacity(usize::try_from(k).unwrap_or(room).min(room));
            for _ in 0..k {
                v.push(r.atom::<V>()?);
            }
            Ok(Dims::Known(v))
        }
    }
}

fn read_entry(r: &mut Reader<'_>) -> Result<SizeEntry, Bad> {
    Ok(SizeEntry {
        scalar: r.atom::<Scalar>()?,
        size: read_dims::<u64>(r)?,
        stride: read_dims::<Stride>(r)?,
    })
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

fn put_name(out: &mut Vec<u8>, name: &[u8]) {
    put_varint(out, name.len() as u128);
    out.extend_from_slice(name);
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

/// Appends one entry (name, then size entry) canonically.
fn write_entry(out: &mut Vec<u8>, name: &str, e: &SizeEntry) {
    put_name(out, name.as_bytes());
    write_body(out, e);
}

/// Appends a size entry canonically.
fn write_body(out: &mut Vec<u8>, e: &SizeEntry) {
    put_atom(out, &e.scalar);
    put_dims(out, &e.size);
    put_dims(out, &e.stride);
}
