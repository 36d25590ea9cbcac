//! The size-entry lattice, stride canonicalisation and per-dimension
//! decisions (docs/semantics.md).
//!
//! Table tests are data-driven, rust-analyzer style: one `check_*` helper per
//! table, one line per case. Values use the lattice's own `Display` notation:
//! `?` = Unset (⊥), `Dyn` = Dynamic (⊤), `(5,10)` a known tuple, `(3,)` a
//! 1-tuple, `S(1)` = `InferStride(1)`. An entry is written
//! `scalar size stride`, e.g. `Dyn (Dyn,10) (S(1),1)`. Observations are
//! written `t(5,10)` (contiguous tensor), `t(4,4)/(1,4)` (explicit strides),
//! `i(3)` (int), `none`, and `md(2,0)` (a mark-dynamic hint: ndim 2, dim 0).
//! Every binary join is also checked in the other order.
//!
//! The property tests at the end check the join laws (commutative,
//! associative, idempotent, identity) for `Atom`, `Dims`, `SizeEntry` and
//! `FrameState`.

use compiler_collectives_core::decisions::lattice::{
    canonical_strides, contiguous_strides, Atom, Dims, Scalar, SizeEntry, Stride,
};
use compiler_collectives_core::decisions::shapes::{
    decide, FrameState, Observation, Override, SourceDecision,
};
use compiler_collectives_core::protocol::join::Join;
use proptest::prelude::*;

mod common;
use common::{cases, observation};

// ---------------------------------------------------------------------------
// Notation
// ---------------------------------------------------------------------------

/// Splits `a,b,(c,d),e` at top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = s[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

fn atom<V>(s: &str, value: impl Fn(&str) -> V) -> Atom<V> {
    match s.trim() {
        "?" => Atom::Unset,
        "Dyn" => Atom::Dynamic,
        v => Atom::Static(value(v)),
    }
}

fn inner(t: &str) -> &str {
    t.strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or_else(|| panic!("bad tuple {t:?}"))
}

fn dims<V>(s: &str, value: impl Fn(&str) -> V) -> Dims<V> {
    match s.trim() {
        "?" => Dims::Unset,
        "Dyn" => Dims::Dynamic,
        t => Dims::Known(
            split_top(inner(t))
                .into_iter()
                .map(|a| atom(a, &value))
                .collect(),
        ),
    }
}

/// A scalar as `Scalar`'s Display writes it: `3`, `2.0`, `-0.0`, `NaN`,
/// `inf`, `True`.
fn int(s: &str) -> Scalar {
    match s {
        "True" => Scalar::Bool(true),
        "False" => Scalar::Bool(false),
        "NaN" => Scalar::float(f64::NAN),
        _ if s.contains('.') || s.contains("inf") => {
            Scalar::float(s.parse().unwrap_or_else(|_| panic!("bad float {s:?}")))
        }
        _ => Scalar::int(s.parse().unwrap_or_else(|_| panic!("bad int {s:?}")))
            .unwrap_or_else(|| panic!("int {s:?} beyond the carried bound")),
    }
}

fn num(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| panic!("bad number {s:?}"))
}

fn stride(s: &str) -> Stride {
    match s.strip_prefix("S(").and_then(|t| t.strip_suffix(')')) {
        Some(j) => Stride::Infer(j.parse().unwrap_or_else(|_| panic!("bad S(j) {s:?}"))),
        None => Stride::Int(num(s)),
    }
}

fn nums(t: &str) -> Vec<u64> {
    split_top(inner(t)).into_iter().map(num).collect()
}

/// An entry from `scalar size stride`, e.g. `Dyn (Dyn,10) (S(1),1)`.
fn entry(s: &str) -> SizeEntry {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [scalar, size, st] = parts[..] else {
        panic!("bad entry {s:?}")
    };
    SizeEntry {
        scalar: atom(scalar, int),
        size: dims(size, num),
        stride: dims(st, stride),
    }
}

fn show(e: &SizeEntry) -> String {
    format!("{} {} {}", e.scalar, e.size, e.stride)
}

/// The entry an observation (or an `md(ndim,dim)` hint) records.
fn observed(s: &str) -> SizeEntry {
    match s.strip_prefix("md") {
        Some(t) => {
            let v = nums(t);
            let [ndim, dim] = v[..] else {
                panic!("bad hint {s:?}")
            };
            SizeEntry::mark_dynamic(
                usize::try_from(ndim).unwrap(),
                usize::try_from(dim).unwrap(),
            )
        }
        None => observation(s).entry(),
    }
}

fn join_all(entries: &[SizeEntry]) -> SizeEntry {
    entries
        .iter()
        .fold(SizeEntry::unset(), |acc, x| acc.join(x))
}

/// Joins space-separated observations/hints, checking the reversed order
/// gives the same.
fn join_observed(list: &str) -> SizeEntry {
    let mut entries: Vec<SizeEntry> = list.split_whitespace().map(observed).collect();
    let forward = join_all(&entries);
    entries.reverse();
    assert_eq!(join_all(&entries), forward, "reversed join of {list:?}");
    forward
}

// ---------------------------------------------------------------------------
// The size-entry lattice: atom and tuple joins
// ---------------------------------------------------------------------------

/// Joins each case of `table` both ways, one case a line: `a ⊔ b = expect`
/// says that `a ⊔ b` and `b ⊔ a` display as `expect`. Blank lines and `#`
/// comments are passed over.
fn check_joins<T: std::fmt::Display>(
    parse: impl Fn(&str) -> T,
    join: impl Fn(&T, &T) -> T,
    table: &str,
) {
    for line in cases(table) {
        let (a, rest) = line
            .split_once(" ⊔ ")
            .unwrap_or_else(|| panic!("bad case {line:?}"));
        let (b, expect) = rest
            .split_once(" = ")
            .unwrap_or_else(|| panic!("bad case {line:?}"));
        let (x, y) = (parse(a), parse(b));
        assert_eq!(join(&x, &y).to_string(), expect, "{a} ⊔ {b}");
        assert_eq!(join(&y, &x).to_string(), expect, "{b} ⊔ {a}");
    }
}

#[test]
fn atom_join() {
    check_joins(
        |s| atom(s, int),
        Atom::join,
        r"
        # Unset ⊔ y = y; x ⊔ Unset = x
        ? ⊔ ? = ?
        ? ⊔ 3 = 3
        3 ⊔ ? = 3
        ? ⊔ Dyn = Dyn
        Dyn ⊔ ? = Dyn
        ? ⊔ 0 = 0
        ? ⊔ -7 = -7
        # Dynamic absorbs
        Dyn ⊔ Dyn = Dyn
        Dyn ⊔ 3 = Dyn
        3 ⊔ Dyn = Dyn
        # equal ⇒ x (scalar 3 ⊔ 3 = 3)
        3 ⊔ 3 = 3
        0 ⊔ 0 = 0
        -1 ⊔ -1 = -1
        9223372036854775807 ⊔ 9223372036854775807 = 9223372036854775807
        # unequal ⇒ Dynamic (scalar 3 ⊔ 4 = Dyn)
        3 ⊔ 4 = Dyn
        0 ⊔ 1 = Dyn
        -1 ⊔ 1 = Dyn
        ",
    );
}

#[test]
fn atom_accessors() {
    assert!(Atom::<i64>::Dynamic.is_dynamic());
    assert!(!Atom::<i64>::Unset.is_dynamic());
    assert!(!Atom::Static(3i64).is_dynamic());
    assert_eq!(Atom::Static(3i64).value(), Some(&3));
    assert_eq!(Atom::<i64>::Unset.value(), None);
    assert_eq!(Atom::<i64>::Dynamic.value(), None);
}

#[test]
fn dims_join() {
    check_joins(
        |s| dims(s, num),
        Dims::join,
        r"
        # Unset is the identity
        ? ⊔ ? = ?
        ? ⊔ (5,10) = (5,10)
        (5,10) ⊔ ? = (5,10)
        ? ⊔ Dyn = Dyn
        ? ⊔ () = ()
        ? ⊔ (?,Dyn) = (?,Dyn)
        # Dynamic absorbs
        Dyn ⊔ Dyn = Dyn
        Dyn ⊔ (5,10) = Dyn
        (5,10) ⊔ Dyn = Dyn
        Dyn ⊔ () = Dyn
        # different lengths ⇒ whole tuple Dynamic ((4,2) ⊔ (3,) = Dyn)
        (4,2) ⊔ (3,) = Dyn
        (4,2) ⊔ (4,2,1) = Dyn
        () ⊔ (1,) = Dyn
        (?,Dyn) ⊔ (?,Dyn,?) = Dyn
        # element-wise ((5,10) ⊔ (6,10) = (Dyn,10))
        (5,10) ⊔ (6,10) = (Dyn,10)
        (5,10) ⊔ (5,10) = (5,10)
        (5,10) ⊔ (6,11) = (Dyn,Dyn)
        (3,) ⊔ (3,) = (3,)
        (3,) ⊔ (4,) = (Dyn,)
        () ⊔ () = ()
        (?,10) ⊔ (5,?) = (5,10)
        (?,Dyn) ⊔ (5,10) = (5,Dyn)
        (Dyn,?) ⊔ (?,Dyn) = (Dyn,Dyn)
        (1,2,3,4) ⊔ (1,0,3,5) = (1,Dyn,3,Dyn)
        ",
    );
}

#[test]
fn stride_dims_join() {
    check_joins(
        |s| dims(s, stride),
        Dims::join,
        r"
        # InferStride(j) equals only InferStride(j)
        (S(1),1) ⊔ (S(1),1) = (S(1),1)
        (S(1),1) ⊔ (S(2),1) = (Dyn,1)
        (S(1),1) ⊔ (3,1) = (Dyn,1)
        (S(1),1) ⊔ (1,1) = (Dyn,1)
        (S(0),1) ⊔ (0,1) = (Dyn,1)
        (S(1),1) ⊔ (1,S(0)) = (Dyn,Dyn)
        (6,1) ⊔ (S(1),1) = (Dyn,1)
        (S(1),1) ⊔ ? = (S(1),1)
        (S(1),1) ⊔ Dyn = Dyn
        (S(1),1) ⊔ (1,) = Dyn
        ",
    );
}

#[test]
fn infer_stride_equals_only_itself() {
    assert_eq!(Stride::Infer(1), Stride::Infer(1));
    assert_ne!(Stride::Infer(1), Stride::Infer(0));
    assert_ne!(Stride::Infer(1), Stride::Int(1));
    assert_ne!(Stride::Infer(0), Stride::Int(0));
    let (s2, i2) = (Atom::Static(Stride::Infer(2)), Atom::Static(Stride::Int(2)));
    assert_eq!(s2.join(&i2), Atom::Dynamic);
    assert_eq!(s2.join(&s2), s2);
}

fn check_dynamic_at(d: &str, expect: &str, all_static: bool) {
    let x = dims(d, num);
    let got: String = (0..expect.len())
        .map(|i| if x.is_dynamic_at(i) { 'D' } else { 'S' })
        .collect();
    assert_eq!(got, expect, "is_dynamic_at of {d}");
    assert_eq!(x.all_static(), all_static, "all_static of {d}");
}

#[test]
fn dims_queries() {
    check_dynamic_at("?", "SS", false);
    check_dynamic_at("Dyn", "DD", false);
    check_dynamic_at("()", "S", true);
    check_dynamic_at("(5,10)", "SSS", true);
    check_dynamic_at("(Dyn,10)", "DS", false);
    check_dynamic_at("(?,10)", "SS", false);
    check_dynamic_at("(?,Dyn)", "SD", false);
    assert_eq!(Dims::from_values([5u64, 10]).to_string(), "(5,10)");
}

// ---------------------------------------------------------------------------
// The size-entry lattice: constructors
// ---------------------------------------------------------------------------

fn check_entry(e: SizeEntry, expect: &str) {
    assert_eq!(show(&e), expect);
    assert_eq!(entry(expect), e, "the notation round-trips");
}

#[test]
fn constructors() {
    // tensor observation = {scalar: Dynamic, size, stride: canonical}
    check_entry(SizeEntry::tensor(&[5, 10], None), "Dyn (5,10) (S(1),1)");
    check_entry(
        SizeEntry::tensor(&[2, 3], Some(&[3, 1])),
        "Dyn (2,3) (S(1),1)",
    );
    check_entry(
        SizeEntry::tensor(&[4, 4], Some(&[1, 4])),
        "Dyn (4,4) (1,S(0))",
    );
    check_entry(SizeEntry::tensor(&[2, 3], Some(&[6, 1])), "Dyn (2,3) (6,1)");
    check_entry(SizeEntry::tensor(&[7], None), "Dyn (7,) (1,)");
    check_entry(SizeEntry::tensor(&[], None), "Dyn () ()");
    check_entry(
        SizeEntry::tensor(&[2, 3, 4], None),
        "Dyn (2,3,4) (S(1),S(2),1)",
    );
    // int observation = {scalar: v, size: Dynamic, stride: Dynamic}
    check_entry(SizeEntry::int(3), "3 Dyn Dyn");
    check_entry(SizeEntry::int(-2), "-2 Dyn Dyn");
    // mark-dynamic hint = {scalar: Unset, size: (Unset…, Dynamic at i, …), stride: Unset}
    check_entry(SizeEntry::mark_dynamic(2, 0), "? (Dyn,?) ?");
    check_entry(SizeEntry::mark_dynamic(3, 1), "? (?,Dyn,?) ?");
    check_entry(SizeEntry::mark_dynamic(1, 0), "? (Dyn,) ?");
    check_entry(SizeEntry::mark_dynamic(2, 5), "? (?,?) ?");
    // ⊥
    check_entry(SizeEntry::unset(), "? ? ?");
    check_entry(SizeEntry::default(), "? ? ?");
    // Observation::entry agrees with the constructors.
    assert_eq!(observed("t(5,10)"), SizeEntry::tensor(&[5, 10], None));
    assert_eq!(
        observed("t(4,4)/(1,4)"),
        SizeEntry::tensor(&[4, 4], Some(&[1, 4]))
    );
    assert_eq!(observed("i(3)"), SizeEntry::int(3));
    assert_eq!(observed("none"), SizeEntry::unset());
    assert_eq!(observed("md(2,1)"), SizeEntry::mark_dynamic(2, 1));
    // Display of a whole entry
    assert_eq!(
        SizeEntry::tensor(&[5, 10], None).to_string(),
        "{scalar: Dyn, size: (5,10), stride: (S(1),1)}"
    );
}

// ---------------------------------------------------------------------------
// The size-entry lattice, consequences: joins of observations
// ---------------------------------------------------------------------------

fn check_obs(list: &str, expect: &str) {
    assert_eq!(show(&join_observed(list)), expect, "join of {list:?}");
}

#[test]
fn observation_joins() {
    // same observation ⇒ unchanged
    check_obs("t(5,10) t(5,10)", "Dyn (5,10) (S(1),1)");
    // same ndim, differing dims ⇒ those dims dynamic; contiguous strides stay
    check_obs("t(5,10) t(6,10)", "Dyn (Dyn,10) (S(1),1)");
    check_obs("t(5,10) t(5,11)", "Dyn (5,Dyn) (S(1),1)");
    check_obs("t(5,10) t(6,11)", "Dyn (Dyn,Dyn) (S(1),1)");
    check_obs(
        "t(5,10,2) t(5,11,2) t(5,12,2)",
        "Dyn (5,Dyn,2) (S(1),S(2),1)",
    );
    // different ndim ⇒ whole size AND stride dynamic
    check_obs("t(4,2) t(3)", "Dyn Dyn Dyn");
    check_obs("t(4,2) t(4,2,1)", "Dyn Dyn Dyn");
    check_obs("t() t(1)", "Dyn Dyn Dyn");
    // tensor on one rank, int on another ⇒ everything dynamic
    check_obs("t(5,10) i(3)", "Dyn Dyn Dyn");
    check_obs("t() i(0)", "Dyn Dyn Dyn");
    // ints
    check_obs("i(3) i(3)", "3 Dyn Dyn");
    check_obs("i(3) i(4)", "Dyn Dyn Dyn");
    // None contributes nothing
    check_obs("t(5,10) none", "Dyn (5,10) (S(1),1)");
    check_obs("i(3) none", "3 Dyn Dyn");
    check_obs("none none", "? ? ?");
    check_obs("", "? ? ?");
    // strides that changed with the layout become dynamic
    check_obs("t(4,4)/(4,1) t(4,4)/(1,4)", "Dyn (4,4) (Dyn,Dyn)");
    check_obs("t(2,3)/(3,1) t(2,3)/(6,1)", "Dyn (2,3) (Dyn,1)");
    // a stride that changed only because a size changed stays S(j)
    check_obs("t(2,3)/(3,1) t(2,4)/(4,1)", "Dyn (2,Dyn) (S(1),1)");
    // mark-dynamic hints
    check_obs("md(2,0) t(5,10)", "Dyn (Dyn,10) (S(1),1)");
    check_obs("md(2,1) t(5,10)", "Dyn (5,Dyn) (S(1),1)");
    check_obs("md(2,0) md(2,1) t(5,10)", "Dyn (Dyn,Dyn) (S(1),1)");
    check_obs("md(2,0) md(2,1)", "? (Dyn,Dyn) ?");
    check_obs("md(2,0) t(5,10) t(5,10)", "Dyn (Dyn,10) (S(1),1)");
    check_obs("md(3,0) t(5,10)", "Dyn Dyn (S(1),1)"); // a hint of another ndim
    check_obs("md(1,0) i(3)", "3 Dyn Dyn");
}

// ---------------------------------------------------------------------------
// The size-entry lattice, FrameState: a source absent on some ranks contributes nothing
// ---------------------------------------------------------------------------

/// One rank's state from `x=t(5,10) n=i(3)`; `x=md(2,0)` records a hint.
fn frame(rank: &str) -> FrameState {
    let mut s = FrameState::new();
    for item in rank.split_whitespace() {
        let (source, obs) = item
            .split_once('=')
            .unwrap_or_else(|| panic!("bad input {item:?}"));
        if obs.starts_with("md") {
            s.record_entry(source, &observed(obs));
        } else {
            s.record(source, &observation(obs));
        }
    }
    s
}

fn show_frame(s: &FrameState) -> String {
    let parts: Vec<String> = s
        .iter()
        .map(|(k, v)| format!("{k}: {}", show(&v)))
        .collect();
    parts.join("; ")
}

/// Ranks separated by `|`; joined in both orders.
fn check_frame(ranks: &str, expect: &str) {
    let states: Vec<FrameState> = ranks.split('|').map(frame).collect();
    let fold = |it: &mut dyn Iterator<Item = &FrameState>| {
        let mut acc = FrameState::new();
        for s in it {
            acc.join(s);
        }
        acc
    };
    let forward = fold(&mut states.iter());
    assert_eq!(show_frame(&forward), expect, "ranks {ranks:?}");
    assert_eq!(
        fold(&mut states.iter().rev()),
        forward,
        "reversed ranks {ranks:?}"
    );
}

#[test]
fn frame_state_joins() {
    check_frame("", "");
    check_frame(" | ", "");
    // absent on one rank ⇒ the other's observation as is (not dynamic)
    check_frame("x=t(5,10) | ", "x: Dyn (5,10) (S(1),1)");
    check_frame("x=t(5,10) | x=none", "x: Dyn (5,10) (S(1),1)");
    check_frame("n=i(3) | | n=i(3)", "n: 3 Dyn Dyn");
    check_frame("x=none | x=none", "");
    // differing on two ranks, absent on a third
    check_frame("x=t(5,10) | x=t(6,10) | ", "x: Dyn (Dyn,10) (S(1),1)");
    // sources are independent
    check_frame(
        "x=t(5) n=i(1) | x=t(5) n=i(2)",
        "n: Dyn Dyn Dyn; x: Dyn (5,) (1,)",
    );
    check_frame("x=t(5) | y=t(6)", "x: Dyn (5,) (1,); y: Dyn (6,) (1,)");
    // tensor on one rank, int on another
    check_frame("x=t(5) | x=i(5)", "x: Dyn Dyn Dyn");
    // recording twice on one rank joins
    check_frame("x=t(5) x=t(6)", "x: Dyn (Dyn,) (1,)");
    // a mark-dynamic on one rank propagates to the merge
    check_frame("x=t(5,10) | x=t(5,10) x=md(2,1)", "x: Dyn (5,Dyn) (S(1),1)");
    check_frame(
        "x=t(5,10) | y=md(2,1)",
        "x: Dyn (5,10) (S(1),1); y: ? (?,Dyn) ?",
    );
}

#[test]
fn frame_state_basics() {
    let inputs = [
        ("x".to_string(), observation("t(5,10)")),
        ("n".to_string(), observation("i(3)")),
    ];
    let from_inputs = FrameState::from_inputs(inputs.iter().map(|(k, v)| (k, v)));
    assert_eq!(from_inputs, frame("x=t(5,10) n=i(3)"));
    assert_eq!(frame("x=t(5,10)").get("missing"), SizeEntry::unset());
    assert_eq!(<FrameState as Join>::KIND, "shape.frame_state");
}

// ---------------------------------------------------------------------------
// Stride canonicalisation
// ---------------------------------------------------------------------------

/// `sizes/strides` → canonical strides, e.g. `(2,3)/(3,1)` → `[S(1),1]`.
fn check_canon(input: &str, expect: &str) {
    let (sizes, strides) = input.split_once('/').expect("sizes/strides");
    let got: Vec<String> = canonical_strides(&nums(sizes), &nums(strides))
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(format!("[{}]", got.join(",")), expect, "{input}");
}

#[test]
fn canonical_stride_examples() {
    // docs/semantics.md, Stride canonicalisation: the examples
    check_canon("(2,3)/(3,1)", "[S(1),1]");
    check_canon("(2,4)/(4,1)", "[S(1),1]");
    check_canon("(4,4)/(1,4)", "[1,S(0)]"); // transposed
    check_canon("(2,3)/(6,1)", "[6,1]"); // a slice
    check_canon("(3,1)/(1,1)", "[S(1),1]");
    // more
    check_canon("()/()", "[]");
    check_canon("(7,)/(1,)", "[1]");
    check_canon("(7,)/(2,)", "[2]");
    check_canon("(2,3,4)/(12,4,1)", "[S(1),S(2),1]");
    check_canon("(2,3,4)/(1,2,6)", "[1,S(0),S(1)]"); // column-major
    check_canon("(2,3,4)/(12,1,3)", "[S(2),1,S(1)]"); // permuted (0,2,1)
    check_canon("(5,1)/(1,1)", "[S(1),1]");
    check_canon("(1,5)/(5,1)", "[S(1),1]");
    check_canon("(4,4)/(0,1)", "[0,1]"); // broadcast (expand)
    check_canon("(3,2)/(4,1)", "[4,1]"); // padded rows
    check_canon("(2,3)/(3,)", "[3]"); // unequal lengths: extra elements ignored
}

#[test]
fn contiguous_stride_examples() {
    assert_eq!(contiguous_strides(&[]), Vec::<u64>::new());
    assert_eq!(contiguous_strides(&[5]), vec![1]);
    assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
    assert_eq!(contiguous_strides(&[2, 0, 4]), vec![4, 4, 1]);
    assert_eq!(
        contiguous_strides(&[u64::MAX, u64::MAX, 2]),
        vec![u64::MAX, 2, 1]
    );
}

// ---------------------------------------------------------------------------
// From merged entry to decisions
// ---------------------------------------------------------------------------

/// `size:<S|D per dim> stride:<S|D per dim>`, `int:S|D` or `none`.
fn show_decision(d: &SourceDecision) -> String {
    let bits = |v: &[bool]| {
        v.iter()
            .map(|&b| if b { 'D' } else { 'S' })
            .collect::<String>()
    };
    match d {
        SourceDecision::Tensor {
            dynamic_sizes,
            dynamic_strides,
        } => {
            format!(
                "size:{} stride:{}",
                bits(dynamic_sizes),
                bits(dynamic_strides)
            )
        }
        SourceDecision::Int { dynamic } => format!("int:{}", if *dynamic { 'D' } else { 'S' }),
        SourceDecision::Float { dynamic } => {
            format!("float:{}", if *dynamic { 'D' } else { 'S' })
        }
        SourceDecision::Bool => "bool".to_string(),
        SourceDecision::None => "none".to_string(),
    }
}

/// `ov` is `""`, `"fs"` (force static) or `"fd"` (force dynamic).
fn check_decide(e: &str, obs: &str, ov: &str, expect: &str) {
    let ov = match ov {
        "" => None,
        "fs" => Some(Override::ForceStatic),
        "fd" => Some(Override::ForceDynamic),
        _ => panic!("bad override {ov:?}"),
    };
    let got = decide(&entry(e), &observation(obs), ov);
    assert_eq!(show_decision(&got), expect, "{e} for {obs} with {ov:?}");
}

#[test]
fn decisions() {
    // (entry, observation, override, decision), one line per case
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, &str)] = &[
        // size dim i dynamic iff size Dynamic or size[i] Dynamic
        ("Dyn (5,10) (S(1),1)", "t(5,10)", "", "size:SS stride:SS"),
        ("Dyn (Dyn,10) (S(1),1)", "t(5,10)", "", "size:DS stride:SS"),
        ("Dyn (5,Dyn) (S(1),1)", "t(5,10)", "", "size:SD stride:SS"),
        ("Dyn Dyn Dyn", "t(5,10)", "", "size:DD stride:SS"),
        ("? (?,Dyn) ?", "t(5,10)", "", "size:SD stride:SS"),
        ("? ? ?", "t(5,10)", "", "size:SS stride:SS"),
        // stride dynamic only when every size atom is concrete
        ("Dyn (5,10) (Dyn,Dyn)", "t(5,10)", "", "size:SS stride:DD"),
        ("Dyn (5,10) (Dyn,1)", "t(5,10)", "", "size:SS stride:DS"),
        ("Dyn (5,10) Dyn", "t(5,10)", "", "size:SS stride:DD"),
        ("Dyn (Dyn,10) (Dyn,Dyn)", "t(5,10)", "", "size:DS stride:SS"),
        ("Dyn (?,10) (Dyn,Dyn)", "t(5,10)", "", "size:SS stride:SS"),
        ("Dyn Dyn (Dyn,Dyn)", "t(5,10)", "", "size:DD stride:SS"),
        ("Dyn (5,10) ?", "t(5,10)", "", "size:SS stride:SS"),
        // scalar dynamic iff Dynamic
        ("3 Dyn Dyn", "i(3)", "", "int:S"),
        ("Dyn Dyn Dyn", "i(3)", "", "int:D"),
        ("? ? ?", "i(3)", "", "int:S"),
        ("? (Dyn,) ?", "i(3)", "", "int:S"),
        // None
        ("Dyn Dyn Dyn", "none", "", "none"),
        ("Dyn Dyn Dyn", "none", "fd", "none"),
        // overrides beat the merge
        ("Dyn (Dyn,Dyn) (S(1),1)", "t(5,10)", "fs", "size:SS stride:SS"),
        ("Dyn Dyn Dyn", "t(5,10)", "fs", "size:SS stride:SS"),
        ("Dyn (5,10) (Dyn,Dyn)", "t(5,10)", "fs", "size:SS stride:SS"),
        ("Dyn (5,10) (S(1),1)", "t(5,10)", "fd", "size:DD stride:SS"),
        ("? ? ?", "t(5,10)", "fd", "size:DD stride:SS"),
        ("Dyn Dyn Dyn", "i(3)", "fs", "int:S"),
        ("3 Dyn Dyn", "i(3)", "fd", "int:D"),
        // the observation decides the number of dimensions
        ("Dyn (Dyn,10) (S(1),1)", "t(5,10,2)", "", "size:DSS stride:SSS"),
        ("Dyn () ()", "t()", "", "size: stride:"),
        ("Dyn () ()", "t()", "fd", "size: stride:"),
        // a float: dynamic iff scalar Dynamic and the value finite (Dynamo
        // specialises NaN and infinities, wrap_symfloat)
        ("2.5 Dyn Dyn", "f(2.5)", "", "float:S"),
        ("Dyn Dyn Dyn", "f(2.5)", "", "float:D"),
        ("Dyn Dyn Dyn", "f(-0.0)", "", "float:D"),
        ("Dyn Dyn Dyn", "f(nan)", "", "float:S"),
        ("Dyn Dyn Dyn", "f(inf)", "", "float:S"),
        ("Dyn Dyn Dyn", "f(-inf)", "fd", "float:S"),
        ("? ? ?", "f(2.5)", "fd", "float:D"),
        ("Dyn Dyn Dyn", "f(2.5)", "fs", "float:S"),
        // a bool is a constant
        ("Dyn Dyn Dyn", "b(true)", "", "bool"),
        ("Dyn Dyn Dyn", "b(false)", "fd", "bool"),
    ];
    for &(e, obs, ov, expect) in cases {
        check_decide(e, obs, ov, expect);
    }
}

/// The full path: observations → join → decide.
fn check_seen(seen: &str, now: &str, expect: &str) {
    let got = decide(&join_observed(seen), &observation(now), None);
    assert_eq!(show_decision(&got), expect, "seen {seen:?}, now {now}");
}

#[test]
fn decisions_from_joined_observations() {
    check_seen("t(5,10) t(6,10)", "t(7,10)", "size:DS stride:SS");
    check_seen("t(4,2) t(3)", "t(3)", "size:D stride:S");
    check_seen("t(4,4)/(4,1) t(4,4)/(1,4)", "t(4,4)", "size:SS stride:DD");
    check_seen("t(4,4)/(4,1) t(5,4)/(1,5)", "t(4,4)", "size:DS stride:SS");
    check_seen("t(2,3) t(2,4)", "t(2,5)", "size:SD stride:SS");
    check_seen("md(2,1) t(2,3)", "t(2,3)", "size:SD stride:SS");
    check_seen("i(3) i(3)", "i(3)", "int:S");
    check_seen("i(3) i(4)", "i(3)", "int:D");
    check_seen("i(3) t(3)", "i(3)", "int:D");
    check_seen("i(3) t(3)", "t(3)", "size:D stride:S");
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

fn atom_i64() -> impl Strategy<Value = Atom<Scalar>> {
    prop_oneof![
        Just(Atom::Unset),
        Just(Atom::Dynamic),
        (-1i64..3).prop_map(|v| Atom::Static(Scalar::Int(v))),
        // Python calls 1, 1.0 and True equal, 0.0 and -0.0 equal and NaN
        // unequal to itself; the lattice's laws hold on identity.
        prop_oneof![
            Just(Scalar::float(1.0)),
            Just(Scalar::Bool(true)),
            Just(Scalar::float(0.0)),
            Just(Scalar::float(-0.0)),
            Just(Scalar::float(f64::NAN)),
            Just(Scalar::BigInt(1 << 70)),
        ]
        .prop_map(Atom::Static),
    ]
}

fn atom_u64() -> impl Strategy<Value = Atom<u64>> {
    prop_oneof![
        Just(Atom::Unset),
        Just(Atom::Dynamic),
        (0u64..3).prop_map(Atom::Static)
    ]
}

fn stride_value() -> impl Strategy<Value = Stride> {
    prop_oneof![
        (0u64..3).prop_map(Stride::Int),
        (0u32..3).prop_map(Stride::Infer)
    ]
}

fn atom_stride() -> impl Strategy<Value = Atom<Stride>> {
    prop_oneof![
        Just(Atom::Unset),
        Just(Atom::Dynamic),
        stride_value().prop_map(Atom::Static)
    ]
}

fn dims_of<V: std::fmt::Debug + Clone + 'static>(
    a: impl Strategy<Value = Atom<V>> + 'static,
) -> impl Strategy<Value = Dims<V>> {
    prop_oneof![
        1 => Just(Dims::Unset),
        1 => Just(Dims::Dynamic),
        4 => proptest::collection::vec(a, 0..4).prop_map(Dims::Known),
    ]
}

fn any_observation() -> impl Strategy<Value = Observation> {
    let sizes = proptest::collection::vec(0u64..4, 0..4);
    prop_oneof![
        3 => sizes.clone().prop_map(Observation::tensor),
        2 => sizes
            .prop_flat_map(|s| {
                let n = s.len();
                (Just(s), proptest::collection::vec(0u64..7, n))
            })
            .prop_map(|(s, st)| Observation::strided(s, st)),
        2 => (-1i64..3).prop_map(Observation::Int),
        1 => Just(Observation::None),
    ]
}

/// Entries as they arise (observations, hints) and arbitrary ones.
fn size_entry() -> impl Strategy<Value = SizeEntry> {
    prop_oneof![
        4 => any_observation().prop_map(|o| o.entry()),
        1 => Just(SizeEntry::unset()),
        1 => (0usize..4, 0usize..4).prop_map(|(n, d)| SizeEntry::mark_dynamic(n, d)),
        2 => (atom_i64(), dims_of(atom_u64()), dims_of(atom_stride())).prop_map(|(scalar, size, stride)| SizeEntry {
            scalar,
            size,
            stride,
        }),
    ]
}

/// One rank's frame state: some of the sources a, b, c (so sources are
/// missing on some ranks), each with observations and hints recorded.
fn frame_state() -> impl Strategy<Value = FrameState> {
    let source = prop_oneof![Just("a"), Just("b"), Just("c")];
    // Ok = an observation (recorded as a compiler front-end would), Err = a
    // raw entry or a mark-dynamic hint.
    let item = prop_oneof![
        4 => (source.clone(), any_observation()).prop_map(|(s, o)| (s, Ok(o))),
        1 => (source.clone(), 0usize..4, 0usize..4).prop_map(|(s, n, d)| (s, Err(SizeEntry::mark_dynamic(n, d)))),
        1 => (source, size_entry()).prop_map(|(s, e)| (s, Err(e))),
    ];
    proptest::collection::vec(item, 0..5).prop_map(
        |items: Vec<(&str, Result<Observation, SizeEntry>)>| {
            let mut st = FrameState::new();
            for (s, item) in items {
                match item {
                    Ok(obs) => st.record(s, &obs),
                    Err(entry) => st.record_entry(s, &entry),
                }
            }
            st
        },
    )
}

fn fs_join(a: &FrameState, b: &FrameState) -> FrameState {
    let mut out = a.clone();
    out.join(b);
    out
}

/// Stamps out the four laws for a type with a binary `join`.
macro_rules! join_laws {
    ($module:ident, $strategy:expr, $join:expr, $bottom:expr) => {
        mod $module {
            use super::*;
            proptest! {
                #![proptest_config(ProptestConfig::with_cases(512))]
                #[test]
                fn commutative(a in $strategy, b in $strategy) {
                    let j = $join;
                    prop_assert_eq!(j(&a, &b), j(&b, &a));
                }
                #[test]
                fn associative(a in $strategy, b in $strategy, c in $strategy) {
                    let j = $join;
                    prop_assert_eq!(j(&j(&a, &b), &c), j(&a, &j(&b, &c)));
                }
                #[test]
                fn idempotent(a in $strategy) {
                    let j = $join;
                    prop_assert_eq!(j(&a, &a), a.clone());
                }
                #[test]
                fn identity(a in $strategy) {
                    let j = $join;
                    let bottom = $bottom;
                    prop_assert_eq!(j(&a, &bottom), a.clone());
                    prop_assert_eq!(j(&bottom, &a), a.clone());
                }
                #[test]
                fn upper_bound(a in $strategy, b in $strategy) {
                    // a ≤ a ⊔ b: joining a into the result changes nothing.
                    let j = $join;
                    let ab = j(&a, &b);
                    prop_assert_eq!(j(&ab, &a), ab.clone());
                    prop_assert_eq!(j(&ab, &b), ab);
                }
            }
        }
    };
}

join_laws!(
    atom_laws,
    atom_i64(),
    |x: &Atom<Scalar>, y: &Atom<Scalar>| x.join(y),
    Atom::<Scalar>::Unset
);
join_laws!(
    stride_atom_laws,
    atom_stride(),
    |x: &Atom<Stride>, y: &Atom<Stride>| x.join(y),
    Atom::<Stride>::Unset
);
join_laws!(
    dims_laws,
    dims_of(atom_u64()),
    |x: &Dims<u64>, y: &Dims<u64>| x.join(y),
    Dims::<u64>::Unset
);
join_laws!(
    stride_dims_laws,
    dims_of(atom_stride()),
    |x: &Dims<Stride>, y: &Dims<Stride>| x.join(y),
    Dims::<Stride>::Unset
);
join_laws!(
    size_entry_laws,
    size_entry(),
    |x: &SizeEntry, y: &SizeEntry| x.join(y),
    SizeEntry::unset()
);
join_laws!(frame_state_laws, frame_state(), fs_join, FrameState::new());

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every arrival order of the ranks' states gives the same merge.
    #[test]
    fn frame_state_order_independent(
        (states, shuffled) in proptest::collection::vec(frame_state(), 0..6)
            .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
    ) {
        let fold = |v: &[FrameState]| v.iter().fold(FrameState::new(), |acc, s| fs_join(&acc, s));
        prop_assert_eq!(fold(&states), fold(&shuffled));
    }

    /// FrameState join is the per-source SizeEntry join with missing = ⊥.
    #[test]
    fn frame_state_join_is_per_source(a in frame_state(), b in frame_state()) {
        let ab = fs_join(&a, &b);
        for source in ["a", "b", "c"] {
            prop_assert_eq!(ab.get(source), a.get(source).join(&b.get(source)));
            prop_assert_eq!(
                ab.contains(source),
                a.contains(source) || b.contains(source)
            );
        }
    }

    /// Contiguous strides canonicalise to [S(1), S(2), …, S(n-1), 1]
    /// whatever the sizes (all ≥ 2), so changing only sizes — dim 0 or any
    /// other — keeps the canonical form.
    #[test]
    fn contiguous_canonical_strides_ignore_sizes(
        (a, b) in (1usize..6).prop_flat_map(|n| (
            proptest::collection::vec(2u64..1000, n),
            proptest::collection::vec(2u64..1000, n),
        ))
    ) {
        let ca = canonical_strides(&a, &contiguous_strides(&a));
        let cb = canonical_strides(&b, &contiguous_strides(&b));
        prop_assert_eq!(&ca, &cb);
        let n = a.len();
        let expect: Vec<Stride> = (0..n)
            .map(|i| if i + 1 == n { Stride::Int(1) } else { Stride::Infer(u32::try_from(i + 1).unwrap()) })
            .collect();
        prop_assert_eq!(&ca, &expect);
        // only dim 0 changed
        let mut a0 = a.clone();
        a0[0] = b[0];
        prop_assert_eq!(canonical_strides(&a0, &contiguous_strides(&a0)), ca);
    }

    /// Contiguous tensors of the same ndim (sizes ≥ 2) join without dynamic strides.
    #[test]
    fn contiguous_tensors_never_get_dynamic_strides(
        (a, b) in (1usize..5).prop_flat_map(|n| (
            proptest::collection::vec(2u64..50, n),
            proptest::collection::vec(2u64..50, n),
        ))
    ) {
        let j = SizeEntry::tensor(&a, None).join(&SizeEntry::tensor(&b, None));
        for d in 0..a.len() {
            prop_assert!(!j.stride.is_dynamic_at(d));
            prop_assert!(!j.is_stride_dynamic(d));
            prop_assert_eq!(j.is_size_dynamic(d), a[d] != b[d]);
        }
    }

    /// canonical_strides never panics and returns one atom per dimension.
    #[test]
    fn canonical_strides_total(
        sizes in proptest::collection::vec(any::<u64>(), 0..6),
        strides in proptest::collection::vec(any::<u64>(), 0..6),
    ) {
        let c = canonical_strides(&sizes, &strides);
        prop_assert_eq!(c.len(), sizes.len().min(strides.len()));
        // the smallest stride is always recorded as a number
        if let Some(min) = strides.iter().take(c.len()).min() {
            prop_assert!(c.contains(&Stride::Int(*min)));
        }
    }
}

/// Folds the entries of `list` (observations) in order with
/// `SizeEntry::fold` (Dynamo's `|=`, Python's `==` on scalars).
fn check_fold(list: &str, expect: &str) {
    let mut it = list.split_whitespace().map(observed);
    let mut acc = it.next().expect("one observation at least");
    for e in it {
        acc.fold(&e);
    }
    assert_eq!(show(&acc), expect, "fold of {list}");
}

#[test]
fn fold_compares_scalars_as_python() {
    // Python calls these equal: the first value stays.
    check_fold("i(3) f(3.0)", "3 Dyn Dyn");
    check_fold("f(3.0) i(3)", "3.0 Dyn Dyn");
    check_fold("f(0.0) f(-0.0)", "0.0 Dyn Dyn");
    check_fold("f(-0.0) f(0.0)", "-0.0 Dyn Dyn");
    check_fold("f(2.5) f(2.5) f(2.5)", "2.5 Dyn Dyn");
    check_fold("f(inf) f(inf)", "inf Dyn Dyn");
    // NaN equals nothing, itself included.
    check_fold("f(nan)", "NaN Dyn Dyn");
    check_fold("f(nan) f(nan)", "Dyn Dyn Dyn");
    // Unequal values: dynamic, as the join.
    check_fold("f(2.5) f(3.5)", "Dyn Dyn Dyn");
    check_fold("i(3) f(3.5)", "Dyn Dyn Dyn");
    check_fold("i(3) i(3) i(4)", "Dyn Dyn Dyn");
    // Sizes and strides join; a bool records nothing.
    check_fold("t(5,10) t(6,10)", "Dyn (Dyn,10) (S(1),1)");
    check_fold("b(true) i(1)", "1 Dyn Dyn");
}

#[test]
fn python_eq_of_scalars() {
    #[rustfmt::skip]
    let cases: &[(&str, &str, bool)] = &[
        ("3", "3.0", true), ("3", "3.5", false), ("True", "1", true), ("True", "1.0", true),
        ("False", "0.0", true), ("False", "-0.0", true), ("True", "False", false),
        ("0.0", "-0.0", true), ("NaN", "NaN", false), ("inf", "inf", true), ("inf", "-inf", false),
        // 2^60 + 1 is not the float 2^60 (Python compares exactly).
        ("1152921504606846977", "1152921504606846976.0", false),
        ("1152921504606846976", "1152921504606846976.0", true),
        ("1267650600228229401496703205376", "1.2676506002282294e30", true),
        ("170141183460469231731687303715884105", "1.7014118346046923e35", false),
    ];
    for &(a, b, eq) in cases {
        assert_eq!(int(a).python_eq(&int(b)), eq, "{a} == {b}");
        assert_eq!(int(b).python_eq(&int(a)), eq, "{b} == {a}");
    }
}
