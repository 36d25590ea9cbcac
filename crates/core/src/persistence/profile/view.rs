//! What `ccol profile show` and `ccol profile diff` print: a profile as
//! JSON ([`Profile::to_json`], with each entry's [`persisted_decision`]) and
//! the differences between two profiles ([`Profile::diff`]).

use super::{Profile, ProfileKey, ProfileValue};
use serde_json::{json, Value};

impl Profile {
    /// A JSON view for people and tools:
    /// `{"entries": [{"key", "kind", "sources": [{"source", "scalar", "size",
    /// "stride", "dynamic"}]}]}` where `dynamic` is the decision the entry
    /// gives: sorted dynamic size dims, `"scalar"`, or `[]` when static.
    pub fn to_json(&self) -> Value {
        let entries: Vec<Value> = self
            .entries
            .iter()
            .map(|(k, v)| {
                let ProfileValue::Shapes(state) = v;
                let sources: Vec<Value> = state
                    .iter()
                    .map(|(source, e)| {
                        json!({
                            "source": source,
                            "scalar": e.scalar.to_string(),
                            "size": e.size.to_string(),
                            "stride": e.stride.to_string(),
                            "dynamic": persisted_decision(&e),
                        })
                    })
                    .collect();
                json!({"key": k.key, "kind": k.kind, "sources": sources})
            })
            .collect();
        json!({ "entries": entries })
    }

    /// What differs between `self` (A) and `other` (B), one line each, in
    /// (key, kind, source) order; empty when equal.
    pub fn diff(&self, other: &Profile) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&ProfileKey> =
            self.entries.keys().chain(other.entries.keys()).collect();
        for k in keys {
            let name = format!("'{}' ({})", k.key, k.kind);
            match (self.entries.get(k), other.entries.get(k)) {
                (Some(_), None) => out.push(format!("- {name}: only in A")),
                (None, Some(_)) => out.push(format!("+ {name}: only in B")),
                (Some(ProfileValue::Shapes(a)), Some(ProfileValue::Shapes(b))) => {
                    let sources: std::collections::BTreeSet<&str> =
                        a.sources().chain(b.sources()).collect();
                    for s in sources {
                        match (a.entry(s), b.entry(s)) {
                            (Some(_), None) => {
                                out.push(format!("- {name} source '{s}': only in A"));
                            }
                            (None, Some(_)) => {
                                out.push(format!("+ {name} source '{s}': only in B"));
                            }
                            (Some(x), Some(y)) if x != y => {
                                out.push(format!("~ {name} source '{s}': A {x}, B {y}"));
                            }
                            _ => {}
                        }
                    }
                }
                (None, None) => {}
            }
        }
        out
    }
}

/// The decision a persisted entry gives, as `ccol profile show` prints it:
/// the sorted dynamic size dims of a tensor (`[0]`, `[]` when static),
/// `"all"` when the size tuple itself is dynamic and the scalar too (an int
/// that varied, tensors of different ndim, or a tensor on one rank and an
/// int on another), `[]` for a static int.
pub fn persisted_decision(e: &crate::decisions::lattice::SizeEntry) -> Value {
    match &e.size {
        crate::decisions::lattice::Dims::Known(atoms) => {
            json!((0..atoms.len())
                .filter(|&i| e.is_size_dynamic(i))
                .collect::<Vec<_>>())
        }
        crate::decisions::lattice::Dims::Dynamic if e.is_scalar_dynamic() => json!("all"),
        _ => json!([]),
    }
}
