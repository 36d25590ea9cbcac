//! Notation shared by the table tests (`mod common;`).

use compiler_collectives_core::decisions::shapes::Observation;

/// `(5,10)` → `[5, 10]`; `()` → `[]`.
fn tuple(s: &str) -> Vec<u64> {
    let inner = s
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or_else(|| panic!("bad tuple {s:?}"));
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().unwrap_or_else(|_| panic!("bad number {p:?}")))
        .collect()
}

/// An observation: `t(5,10)` (contiguous tensor), `t(4,4)/(1,4)` (explicit
/// strides), `i(3)` (int) or `none`.
pub(crate) fn observation(s: &str) -> Observation {
    if s == "none" {
        return Observation::None;
    }
    if let Some(v) = s.strip_prefix("i(").and_then(|t| t.strip_suffix(')')) {
        return Observation::Int(v.parse().unwrap_or_else(|_| panic!("bad int {s:?}")));
    }
    // f(2.5), f(-0.0), f(nan), f(inf): a float; b(true): a bool.
    if let Some(v) = s.strip_prefix("f(").and_then(|t| t.strip_suffix(')')) {
        return Observation::float(v.parse().unwrap_or_else(|_| panic!("bad float {s:?}")));
    }
    if let Some(v) = s.strip_prefix("b(").and_then(|t| t.strip_suffix(')')) {
        return Observation::Bool(v.parse().unwrap_or_else(|_| panic!("bad bool {s:?}")));
    }
    let t = s
        .strip_prefix('t')
        .unwrap_or_else(|| panic!("bad observation {s:?}"));
    match t.split_once('/') {
        Some((sizes, strides)) => Observation::strided(tuple(sizes), tuple(strides)),
        None => Observation::tensor(tuple(t)),
    }
}

/// The cases of a text table, one a line, trimmed; blank lines and `#`
/// comments are passed over.
pub(crate) fn cases(table: &str) -> impl Iterator<Item = &str> {
    table
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}
