//! The reference compile cache on one rank, without a channel
//! (`collectives = false`): guards, recompiles and PyTorch's guard knobs
//! (docs/semantics.md).
//!
//! Cases are data-driven: `check(options, calls, expect)` runs one call per
//! element of `calls` on a fresh cache and renders what each call did; the
//! tables write a case a line, `[options] call; call => expect`:
//!
//! - `C1 x=(s0,10)/(S(1),1)` — compiled entry 1; its guards per source:
//!   sizes (`s0` = symbol 0, a number = must equal) `/` canonical strides
//!   (`*` = free); an int guard is `n=any` (dynamic) or `n=3`; `none` = must be None;
//! - `H1` — hit entry 1; `U` — ran uncompiled (recompile limit).
//!
//! Inputs are written `x=t(5,10)` (contiguous tensor), `x=t(4,4)/(1,4)`
//! (explicit strides), `n=i(3)` (int), `x=none`. Options are
//! `duck=0`, `spec01=0`, `limit=N`, `fs:x` / `fd:x` (force static / dynamic),
//! `md:x/ndim/dim` (mark dynamic).

use compiler_collectives_core::cache::{
    CacheOptions, CompileCache, CompiledFrame, DimGuard, FloatGuard, Inputs, Outcome, SourceGuard,
};
use compiler_collectives_core::decisions::shapes::{
    FrameState, Observation, Override, SourceDecision,
};
use compiler_collectives_core::Error;
use std::collections::BTreeMap;

mod common;
use common::{cases, observation};

// ---------------------------------------------------------------------------
// Notation
// ---------------------------------------------------------------------------

/// `"x=t(5,10) n=i(3)"` → inputs.
fn inputs(s: &str) -> Inputs {
    s.split_whitespace()
        .map(|item| {
            let (name, obs) = item
                .split_once('=')
                .unwrap_or_else(|| panic!("bad input {item:?}"));
            (name.to_string(), observation(obs))
        })
        .collect()
}

/// A fresh cache without a channel, configured by `opts`.
fn cache(opts: &str) -> CompileCache<u32> {
    let mut o = CacheOptions::default();
    o.collectives = false;
    let mut marks = Vec::new();
    for tok in opts.split_whitespace() {
        match tok.split_once(['=', ':']) {
            Some(("duck", v)) => o.duck_sizing = v == "1",
            Some(("spec01", v)) => o.specialize_zero_one = v == "1",
            Some(("limit", v)) => o.recompile_limit = v.parse().expect("limit"),
            Some(("auto", v)) => o.automatic_dynamic_shapes = v == "1",
            Some(("excl", v)) => o.automatic_dynamic_exclusion_guard = v == "1",
            Some(("fs", src)) => {
                o.overrides.insert(src.to_string(), Override::ForceStatic);
            }
            Some(("fd", src)) => {
                o.overrides.insert(src.to_string(), Override::ForceDynamic);
            }
            Some(("md", spec)) => {
                let parts: Vec<&str> = spec.split('/').collect();
                let [src, ndim, dim] = parts[..] else {
                    panic!("bad md {spec:?}")
                };
                marks.push((
                    src.to_string(),
                    ndim.parse().expect("ndim"),
                    dim.parse().expect("dim"),
                ));
            }
            _ => panic!("bad option {tok:?}"),
        }
    }
    let mut c = CompileCache::new("f@test.rs:1", o);
    for (src, ndim, dim) in marks {
        c.mark_dynamic(&src, ndim, dim).expect("a valid mark");
    }
    c
}

fn show_dim(g: &DimGuard) -> String {
    match g {
        DimGuard::Static(v) => v.to_string(),
        DimGuard::Symbol(s) => format!("s{s}"),
        DimGuard::Free => "any".to_string(),
    }
}

fn show_tuple(items: &[String]) -> String {
    if items.len() == 1 {
        format!("({},)", items[0])
    } else {
        format!("({})", items.join(","))
    }
}

fn show_guards(frame: &CompiledFrame) -> String {
    let parts: Vec<String> = frame
        .guards
        .iter()
        .map(|(source, g)| {
            let g = match g {
                SourceGuard::None => "none".to_string(),
                SourceGuard::Int(d) => show_dim(d),
                SourceGuard::Float(FloatGuard::Static(bits)) => {
                    format!("{:?}f", f64::from_bits(*bits))
                }
                SourceGuard::Float(FloatGuard::Free) => "anyf".to_string(),
                SourceGuard::Bool(b) => b.to_string(),
                SourceGuard::Tensor { sizes, strides } => {
                    let sizes: Vec<String> = sizes.iter().map(show_dim).collect();
                    let strides: Vec<String> = strides
                        .iter()
                        .map(|s| s.map_or_else(|| "*".to_string(), |s| s.to_string()))
                        .collect();
                    format!("{}/{}", show_tuple(&sizes), show_tuple(&strides))
                }
            };
            format!("{source}={g}")
        })
        .collect();
    parts.join(" ")
}

/// Runs `calls` on `c`, rendering each outcome.
fn run(c: &mut CompileCache<u32>, calls: &[&str]) -> String {
    let mut out = Vec::new();
    for call in calls {
        let outcome = c
            .call(&inputs(call), None, |f| f.index * 10)
            .unwrap_or_else(|e| panic!("call {call:?}: {e}"));
        out.push(match outcome {
            Outcome::Compiled(i) => {
                assert_eq!(c.artifact(i), Some(&(u32::try_from(i).unwrap() * 10)));
                format!("C{i} {}", show_guards(&c.frames()[i]))
            }
            Outcome::Hit(i) => format!("H{i}"),
            Outcome::Uncompiled => "U".to_string(),
        });
    }
    out.join(" | ")
}

fn check(opts: &str, calls: &[&str], expect: &str) {
    let mut c = cache(opts);
    assert_eq!(
        run(&mut c, calls),
        expect,
        "options {opts:?}, calls {calls:?}"
    );
}

/// Runs every case of `table` with [`check`], one case a line:
/// `[OPTIONS] CALL; CALL; ... => OUTCOMES`, where `[OPTIONS] ` may be left
/// out and the outcomes are `run`'s. Blank lines and `#` comments are passed
/// over.
fn check_table(table: &str) {
    for line in cases(table) {
        let (calls, expect) = line
            .split_once(" => ")
            .unwrap_or_else(|| panic!("bad case {line:?}"));
        let (opts, calls) = match calls.strip_prefix('[') {
            Some(rest) => rest
                .split_once("] ")
                .unwrap_or_else(|| panic!("bad options in {line:?}")),
            None => ("", calls),
        };
        let calls: Vec<&str> = calls.split(';').map(str::trim).collect();
        check(opts, &calls, expect);
    }
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

#[test]
fn first_call_compiles_static() {
    check_table(
        r"
        x=t(5,10) => C0 x=(5,10)/(S(1),1)
        x=t(5,10); x=t(5,10) => C0 x=(5,10)/(S(1),1) | H0
        n=i(3) => C0 n=3
        x=t() => C0 x=()/()
        x=t(5,10) n=i(3) y=none => C0 n=3 x=(5,10)/(S(1),1) y=none
        x=t(4,4)/(1,4) => C0 x=(4,4)/(1,S(0))
        ",
    );
}

#[test]
fn changed_dim_recompiles_dynamic() {
    check_table(
        r"
        x=t(5,10); x=t(6,10); x=t(7,10); x=t(5,10) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | H1 | H1
        x=t(5,10); x=t(5,11); x=t(5,12); x=t(6,12) => C0 x=(5,10)/(S(1),1) | C1 x=(5,s0)/(S(1),1) | H1 | C2 x=(s0,s1)/(S(1),1)
        # ndim changed ⇒ all dims dynamic
        x=t(5,10); x=t(5,10,3) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,s1,s2)/(S(1),S(2),1)
        # ints
        n=i(3); n=i(4); n=i(5); n=i(3) => C0 n=3 | C1 n=any | H1 | H1
        # tensor then int ⇒ everything dynamic
        x=t(5); x=i(5) => C0 x=(5,)/(1,) | C1 x=any
        # a source that becomes None
        x=t(5) y=t(3); x=t(5) y=none; x=t(5); x=t(5) y=t(3) => C0 x=(5,)/(1,) y=(3,)/(1,) | C1 x=(5,)/(1,) y=none | H1 | H0
        # a new source misses
        x=t(5); x=t(5) y=t(3) => C0 x=(5,)/(1,) | C1 x=(5,)/(1,) y=(3,)/(1,)
        ",
    );
}

#[test]
fn zero_one_specialisation() {
    check_table(
        r"
        x=t(5,10); x=t(6,10); x=t(1,10); x=t(0,10); x=t(1,10); x=t(2,10); x=t(0,10) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | C2 x=(1,10)/(S(1),1) | C3 x=(0,10)/(S(1),1) | H2 | H1 | H3
        # ints are never 0/1-specialised: Dynamo's automatic-dynamic int symbols
        # are created with do_not_specialize_zero_one (measured, torch 2.13)
        n=i(3); n=i(4); n=i(1); n=i(0); n=i(7) => C0 n=3 | C1 n=any | H1 | H1 | H1
        # off: symbols match 0 and 1
        [spec01=0] x=t(5,10); x=t(6,10); x=t(1,10); x=t(0,10) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | H1 | H1
        [spec01=0] n=i(3); n=i(1); n=i(0) => C0 n=3 | C1 n=any | H1
        [spec01=0] n=i(0); n=i(1); n=i(5) => C0 n=0 | C1 n=any | H1
        # the first dynamic compile itself seeing 1
        x=t(5); x=t(1); x=t(6) => C0 x=(5,)/(1,) | C1 x=(1,)/(1,) | C2 x=(s0,)/(1,)
        ",
    );
}

#[test]
fn duck_sizing() {
    check_table(
        r"
        # off by default, as for Dynamo's automatic-dynamic dims
        x=t(5,5); x=t(6,6); x=t(7,8) => C0 x=(5,5)/(S(1),1) | C1 x=(s0,s1)/(S(1),1) | H1
        [duck=1] x=t(5,5); x=t(6,6); x=t(7,7); x=t(7,8); x=t(9,9); x=t(3,4) => C0 x=(5,5)/(S(1),1) | C1 x=(s0,s0)/(S(1),1) | H1 | C2 x=(s0,s1)/(S(1),1) | H2 | H2
        [duck=0] x=t(5,5); x=t(6,6); x=t(7,7); x=t(7,8) => C0 x=(5,5)/(S(1),1) | C1 x=(s0,s1)/(S(1),1) | H1 | H1
        # across sources
        [duck=1] x=t(5) y=t(5); x=t(6) y=t(6); x=t(7) y=t(7); x=t(7) y=t(8) => C0 x=(5,)/(1,) y=(5,)/(1,) | C1 x=(s0,)/(1,) y=(s0,)/(1,) | H1 | C2 x=(s0,)/(1,) y=(s1,)/(1,)
        [duck=0] x=t(5) y=t(5); x=t(6) y=t(6); x=t(7) y=t(8) => C0 x=(5,)/(1,) y=(5,)/(1,) | C1 x=(s0,)/(1,) y=(s1,)/(1,) | H1
        # unequal at compile time ⇒ separate symbols, equal later still hits
        [duck=1] x=t(5,6); x=t(6,7); x=t(8,8) => C0 x=(5,6)/(S(1),1) | C1 x=(s0,s1)/(S(1),1) | H1
        # an int never shares a size's symbol
        [duck=1] n=i(5) x=t(5); n=i(6) x=t(6); n=i(7) x=t(8) => C0 n=5 x=(5,)/(1,) | C1 n=any x=(s0,)/(1,) | H1
        ",
    );
}

#[test]
fn recompile_limit() {
    check_table(
        r"
        [limit=2] x=t(5); x=t(6); x=t(1); x=t(0); x=t(7); x=t(5) => C0 x=(5,)/(1,) | C1 x=(s0,)/(1,) | U | U | H1 | H1
        [limit=0] x=t(5); x=t(5) => U | U
        [limit=1] n=i(1); n=i(2); n=i(1) => C0 n=1 | U | H0
        ",
    );
    // default: 8 compiles
    let mut c = cache("fs:n");
    let calls: Vec<String> = (0..12).map(|v| format!("n=i({v})")).collect();
    let calls: Vec<&str> = calls.iter().map(String::as_str).collect();
    let got = run(&mut c, &calls);
    assert_eq!(got.matches('C').count(), 8, "{got}");
    assert!(got.ends_with("C7 n=7 | U | U | U | U"), "{got}");
    assert_eq!(c.compiles(), 8);
    assert_eq!(c.compile_calls(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(c.frames().len(), 8);
    assert!(c.artifact(8).is_none());
}

#[test]
fn mark_dynamic_makes_first_compile_dynamic() {
    check_table(
        r"
        [md:x/2/0] x=t(5,10); x=t(6,10) => C0 x=(s0,10)/(S(1),1) | H0
        [md:x/2/1] x=t(5,10); x=t(5,11); x=t(6,10) => C0 x=(5,s0)/(S(1),1) | H0 | C1 x=(s0,s1)/(S(1),1)
        [md:x/2/0 md:x/2/1] x=t(5,10) => C0 x=(s0,s1)/(S(1),1)
        [md:x/2/0 md:x/2/1] x=t(6,6) => C0 x=(s0,s1)/(S(1),1)
        # 0/1 still specialise a marked dim
        [md:x/2/0] x=t(1,10); x=t(5,10) => C0 x=(1,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1)
        # a hint for another ndim makes the whole size dynamic
        [md:x/3/0] x=t(5,10) => C0 x=(s0,s1)/(S(1),1)
        # a hint for a source not passed changes nothing else
        [md:y/1/0] x=t(5) => C0 x=(5,)/(1,)
        ",
    );
}

#[test]
fn overrides_beat_the_merge() {
    check_table(
        r"
        [fs:x] x=t(5); x=t(6); x=t(7); x=t(6) => C0 x=(5,)/(1,) | C1 x=(6,)/(1,) | C2 x=(7,)/(1,) | H1
        [fs:x md:x/1/0] x=t(5) => C0 x=(5,)/(1,)
        [fd:x] x=t(5,10); x=t(6,11) => C0 x=(s0,s1)/(S(1),1) | H0
        [fd:x] x=t(5,5) => C0 x=(s0,s1)/(S(1),1)
        [fd:n] n=i(3); n=i(4) => C0 n=any | H0
        [fs:n] n=i(3); n=i(4); n=i(3) => C0 n=3 | C1 n=4 | H0
        # only the named source
        [fs:x] x=t(5) y=t(5); x=t(6) y=t(6) => C0 x=(5,)/(1,) y=(5,)/(1,) | C1 x=(6,)/(1,) y=(s0,)/(1,)
        # force static beats a layout change too
        [fs:x] x=t(4,4)/(4,1); x=t(4,4)/(1,4) => C0 x=(4,4)/(S(1),1) | C1 x=(4,4)/(1,S(0))
        ",
    );
}

#[test]
fn strides() {
    check_table(
        r"
        # contiguous, size changes: strides stay S(1),1 (no dynamic strides)
        x=t(5,10); x=t(6,10); x=t(6,11) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | C2 x=(s0,s1)/(S(1),1)
        # a transposed tensor after a contiguous one changes the guard
        x=t(4,4)/(4,1); x=t(4,4)/(1,4); x=t(4,4)/(4,1); x=t(4,4)/(1,4) => C0 x=(4,4)/(S(1),1) | C1 x=(4,4)/(1,*) | H0 | H1
        # a slice: strides that did not follow from sizes
        x=t(2,3)/(3,1); x=t(2,3)/(6,1); x=t(2,3)/(9,1) => C0 x=(2,3)/(S(1),1) | C1 x=(2,3)/(*,1) | H1
        # a contiguous tensor with size-1 dims
        x=t(3,1); x=t(3,1)/(1,1); x=t(4,1) => C0 x=(3,1)/(S(1),1) | H0 | C1 x=(s0,1)/(S(1),1)
        ",
    );
}

#[test]
fn contiguous_size_change_keeps_static_strides_in_state() {
    let mut c = cache("");
    run(&mut c, &["x=t(5,10)", "x=t(6,10)", "x=t(7,12)"]);
    let e = c.state().get("x");
    assert_eq!(
        e.to_string(),
        "{scalar: Dyn, size: (Dyn,Dyn), stride: (S(1),1)}"
    );
    assert!(c.frames().iter().all(|f| f.dynamic_strides.is_empty()));
}

#[test]
fn frame_records_decisions_and_realised_dims() {
    let mut c = cache("");
    run(
        &mut c,
        &[
            "x=t(5,10) n=i(3) y=t(4,4)/(4,1)",
            "x=t(6,10) n=i(4) y=t(4,4)/(1,4)",
            "x=t(1,10) n=i(1) y=t(4,4)/(4,1)",
        ],
    );
    let f = &c.frames()[1];
    assert_eq!(f.index, 1);
    assert_eq!(f.dynamic_dims, BTreeMap::from([("x".to_string(), vec![0])]));
    assert_eq!(f.dynamic_scalars.iter().collect::<Vec<_>>(), vec!["n"]);
    assert_eq!(
        f.dynamic_strides,
        BTreeMap::from([("y".to_string(), vec![1])])
    );
    assert_eq!(f.fast_path, None);
    // decisions are the group's, before 0/1 specialisation
    let f = &c.frames()[2];
    assert_eq!(
        f.decisions["x"],
        SourceDecision::Tensor {
            dynamic_sizes: vec![true, false],
            dynamic_strides: vec![false, false],
        }
    );
    assert_eq!(f.decisions["n"], SourceDecision::Int { dynamic: true });
    assert!(f.dynamic_dims.is_empty(), "{:?}", f.dynamic_dims);
    // an int stays symbolic at 1 (no 0/1 specialisation of ints)
    assert_eq!(f.dynamic_scalars.iter().collect::<Vec<_>>(), vec!["n"]);
    // y's strides were decided dynamic at compile 1: stride 4 is free, stride 1 stays specialised
    assert_eq!(show_guards(f), "n=any x=(1,10)/(S(1),1) y=(4,4)/(*,1)");
    assert_eq!(
        f.dynamic_strides,
        BTreeMap::from([("y".to_string(), vec![0])])
    );
}

#[test]
fn persisted_state_is_the_starting_point() {
    let mut state = FrameState::new();
    state.record("x", &Observation::tensor([5, 10]));
    state.record("x", &Observation::tensor([6, 10]));
    let mut c = CompileCache::<u32>::new("f", {
        let mut o = CacheOptions::default();
        o.collectives = false;
        o
    })
    .with_state(state.clone());
    assert_eq!(c.state(), &state);
    assert_eq!(
        run(&mut c, &["x=t(7,10)", "x=t(8,10)"]),
        "C0 x=(s0,10)/(S(1),1) | H0"
    );
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

#[test]
fn a_cache_that_needs_a_channel_and_gets_none_is_an_invalid_argument() {
    for (collectives, votes) in [(true, false), (false, true), (true, true)] {
        let mut o = CacheOptions::default();
        o.collectives = collectives;
        o.guard_collectives = votes;
        let mut c = CompileCache::<u32>::new("f", o);
        let mut compiled = false;
        let r = c.call(&inputs("x=t(5)"), None, |_| {
            compiled = true;
            0
        });
        assert!(
            matches!(r, Err(Error::InvalidArgument(_))),
            "collectives={collectives} votes={votes}: {r:?}"
        );
        assert!(!compiled);
        assert_eq!(c.compiles(), 0);
    }
    // the default options exchange
    let mut c = CompileCache::<u32>::new("f", CacheOptions::default());
    assert!(matches!(
        c.call(&inputs("x=t(5)"), None, |_| 0),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn strides_of_the_wrong_length_are_an_invalid_argument() {
    for bad in [
        "x=t(4,4)/(1,)",
        "x=t(4,4)/(4,1,1)",
        "x=t(4)/()",
        "x=t()/(1,)",
        "y=t(2) x=t(2,3)/(1,)",
    ] {
        let mut c = cache("");
        let r = c.call(&inputs(bad), None, |_| 0);
        match r {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains("'x'"), "{bad}: {msg}"),
            other => panic!("{bad}: {other:?}"),
        }
        assert_eq!(c.compiles(), 0);
        assert!(c.state().is_empty(), "{bad}: state {:?}", c.state());
    }
    // after an error, the cache still works
    let mut c = cache("");
    assert!(c.call(&inputs("x=t(4,4)/(1,)"), None, |_| 0).is_err());
    assert_eq!(run(&mut c, &["x=t(4,4)/(4,1)"]), "C0 x=(4,4)/(S(1),1)");
}

#[test]
fn options_text_names_every_knob() {
    let c = cache("duck=0 spec01=0 limit=3 fs:x fd:y");
    assert_eq!(
        c.options().config_text(),
        "votes=0 limit=3 spec01=0 duck=0 overrides={x=force_static,y=force_dynamic}"
    );
    assert_eq!(c.key(), "f@test.rs:1");
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

mod properties {
    use super::*;
    use compiler_collectives_core::protocol::join::Join;
    use proptest::prelude::*;

    fn tensor() -> impl Strategy<Value = Observation> {
        (1usize..4)
            .prop_flat_map(|n| {
                (
                    proptest::collection::vec(0u64..4, n),
                    proptest::option::of(proptest::collection::vec(0u64..9, n)),
                )
            })
            .prop_map(|(sizes, strides)| match strides {
                Some(s) => Observation::strided(sizes, s),
                None => Observation::tensor(sizes),
            })
    }

    fn call_inputs() -> impl Strategy<Value = Inputs> {
        let x = prop_oneof![4 => tensor(), 1 => Just(Observation::None), 1 => (0i64..3).prop_map(Observation::Int)];
        let n =
            prop_oneof![4 => (0i64..4).prop_map(Observation::Int), 1 => Just(Observation::None)];
        (x, n, tensor()).prop_map(|(x, n, y)| {
            Inputs::from([
                ("x".to_string(), x),
                ("n".to_string(), n),
                ("y".to_string(), y),
            ])
        })
    }

    fn options() -> impl Strategy<Value = (String, u32)> {
        let ov = prop_oneof![
            Just(""),
            Just("fs:x"),
            Just("fd:x"),
            Just("fd:n"),
            Just("fs:y")
        ];
        let md = prop_oneof![Just(""), Just("md:x/2/0"), Just("md:y/1/0")];
        (any::<bool>(), any::<bool>(), 0u32..6, ov, md).prop_map(|(duck, spec, limit, ov, md)| {
            (
                format!(
                    "duck={} spec01={} limit={limit} {ov} {md}",
                    u8::from(duck),
                    u8::from(spec)
                ),
                limit,
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the sequence of calls: a compiled entry matches the
        /// inputs it was compiled for (the same call again hits it), a hit
        /// entry matches, compiles never exceed the limit, and the state is
        /// the join of every compiled call's inputs and hints.
        #[test]
        fn cache_invariants((opts, limit) in options(), calls in proptest::collection::vec(call_inputs(), 1..12)) {
            let mut c = cache(&opts);
            let spec01 = c.options().specialize_zero_one;
            let mut expected_state = FrameState::new();
            for (k, inputs) in calls.iter().enumerate() {
                let before = c.compiles();
                let outcome = c.call(inputs, None, |f| f.index).unwrap();
                match outcome {
                    Outcome::Compiled(i) => {
                        prop_assert_eq!(i, before);
                        prop_assert!(c.compiles() <= usize::try_from(limit).unwrap());
                        prop_assert!(c.frames()[i].matches(inputs, spec01), "call {}: {:?}", k, c.frames()[i]);
                        prop_assert_eq!(c.call(inputs, None, |f| f.index).unwrap(), Outcome::Hit(i));
                        expected_state.join(&FrameState::from_inputs(inputs.iter()));
                    }
                    Outcome::Hit(i) => {
                        prop_assert_eq!(c.compiles(), before);
                        prop_assert!(c.frames()[i].matches(inputs, spec01));
                        // the newest matching entry
                        prop_assert!(c.frames()[i + 1..].iter().all(|f| !f.matches(inputs, spec01)));
                    }
                    Outcome::Uncompiled => {
                        prop_assert_eq!(c.compiles(), usize::try_from(limit).unwrap());
                        prop_assert!(c.frames().iter().all(|f| !f.matches(inputs, spec01)));
                    }
                }
            }
            // state = ⊔ of compiled inputs (+ hints, which only add Dynamic
            // atoms): every entry of expected_state is below the state.
            for (source, e) in expected_state.iter() {
                prop_assert_eq!(c.state().get(source).join(&e), c.state().get(source));
            }
            if !opts.contains("md:") {
                prop_assert_eq!(c.state(), &expected_state);
            }
        }
    }
}

#[test]
fn mark_dynamic_refuses_a_dim_outside_the_tensor() {
    let mut c: CompileCache<()> = CompileCache::new("f@test.rs:1", CacheOptions::default());
    assert!(c.mark_dynamic("x", 2, 1).is_ok());
    for (ndim, dim) in [(2, 2), (0, 0), (usize::MAX, 0), (65, 3)] {
        let e = c.mark_dynamic("x", ndim, dim).expect_err("refused");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(
            e.to_string().contains(&format!("ndim {ndim}, dim {dim}")),
            "{e}"
        );
    }
}

#[test]
fn floats_and_bools_are_guarded_as_dynamo_guards_them() {
    // Measured on torch 2.13 (tests/pytorch-oracle): a float is guarded by
    // its type and Python's ==, a dynamic float takes any float but a NaN,
    // a NaN or an infinity stays specialised, a bool is never recorded.
    check_table(
        r"
        s=f(2.5); s=f(2.5) => C0 s=2.5f | H0
        s=f(2.5); s=f(3.5); s=f(4.5) => C0 s=2.5f | C1 s=anyf | H1
        s=f(2.5); s=f(3.5); s=f(nan); s=f(inf); s=f(-inf) => C0 s=2.5f | C1 s=anyf | C2 s=NaNf | H1 | H1
        s=f(0.0); s=f(-0.0) => C0 s=0.0f | H0
        s=f(nan); s=f(nan) => C0 s=NaNf | H0
        s=f(inf); s=f(3.5) => C0 s=inff | C1 s=anyf
        # 3 and 3.0: equal in Python, so the entry stays static, but the
        # guard also checks the type
        s=i(3); s=f(3.0); s=i(3) => C0 s=3 | C1 s=3.0f | H0
        s=f(3.0); s=i(3) => C0 s=3.0f | C1 s=3
        s=b(true); s=b(false); s=b(true); s=i(1) => C0 s=true | C1 s=false | H0 | C2 s=1
        s=i(1); s=b(true); s=i(2) => C0 s=1 | C1 s=true | C2 s=any
        ",
    );
}

#[test]
fn without_automatic_dynamic_every_change_recompiles_static() {
    check_table(
        r"
        [auto=0] x=t(5,10); x=t(6,10); x=t(7,10); x=t(5,10) => C0 x=(5,10)/(S(1),1) | C1 x=(6,10)/(S(1),1) | C2 x=(7,10)/(S(1),1) | H0
        [auto=0] n=i(3); n=i(4); s=f(2.5) n=i(4); s=f(3.5) n=i(4) => C0 n=3 | C1 n=4 | C2 n=4 s=2.5f | C3 n=4 s=3.5f
        # this rank's own hint still makes its dim dynamic
        [auto=0 md:x/2/1] x=t(5,10); x=t(5,11); x=t(6,11) => C0 x=(5,s0)/(S(1),1) | H0 | C1 x=(6,s0)/(S(1),1)
        ",
    );
}

#[test]
fn the_exclusion_guard_sends_excluded_values_to_the_older_entry() {
    // The entry where x turned dynamic rejects x = 5 (its excluded size);
    // the static entry takes it. A second transition clears the first one's
    // exclusion (Dynamo's __ior__ re-derives excluded_sizes), and pairs of
    // several sources reject only together.
    check_table(
        r"
        [excl=1] x=t(5,10); x=t(6,10); x=t(5,10); x=t(7,10) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | H0 | H1
        [excl=0] x=t(5,10); x=t(6,10); x=t(5,10) => C0 x=(5,10)/(S(1),1) | C1 x=(s0,10)/(S(1),1) | H1
        [excl=1] n=i(3); n=i(4); n=i(3); n=i(5) => C0 n=3 | C1 n=any | H0 | H1
        [excl=1] x=t(5,8); x=t(6,8); x=t(5,9); x=t(5,8); x=t(6,9) => C0 x=(5,8)/(S(1),1) | C1 x=(s0,8)/(S(1),1) | C2 x=(s0,s1)/(S(1),1) | H0 | H2
        [excl=1] x=t(5) n=i(3); x=t(6) n=i(4); x=t(5) n=i(3); x=t(5) n=i(4) => C0 n=3 x=(5,)/(1,) | C1 n=any x=(s0,)/(1,) | H0 | H1
        [excl=1 auto=0] x=t(5); x=t(6); x=t(5) => C0 x=(5,)/(1,) | C1 x=(6,)/(1,) | H0
        ",
    );
}
