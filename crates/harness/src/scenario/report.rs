//! What a scenario run reports: each rank's [`RankReport`] and the run's
//! [`RunReport`] in the JSON output format of docs/scenarios.md (the one the
//! PyTorch oracle prints too), and [`check_expectation`], the comparison with
//! a file's expected output that ignores error messages.

use super::{ArtifactSteps, Mode, Scenario};
use compiler_collectives_core::persistence::profile::ProfileError;
use compiler_collectives_core::Error;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What one rank did in a scenario run.
#[derive(Clone, Debug, PartialEq)]
pub struct RankReport {
    /// The rank.
    pub rank: u32,
    /// Steps (0-based) at which frame compiles happened.
    pub compile_steps: Vec<u64>,
    /// Dynamic size dims of the entry compiled last, per tensor source.
    pub dynamic_dims: BTreeMap<String, Vec<usize>>,
    /// Int sources compiled symbolically in the entry compiled last.
    pub dynamic_scalars: BTreeSet<String>,
    /// Dynamic stride dims of the entry compiled last (tensors with static sizes).
    pub dynamic_strides: BTreeMap<String, Vec<usize>>,
    /// Steps that ran uncompiled (recompile limit reached).
    pub uncompiled_steps: u64,
    /// The group's decisions of the entry compiled last, before 0/1
    /// specialisation: per source, its dynamic size dims as text (`"[0, 1]"`)
    /// or `"scalar"`. Equal on every rank with collectives on, even where a
    /// rank compiled a size-1 dim static. Not part of the output of
    /// docs/scenarios.md.
    pub decided: BTreeMap<String, String>,
    /// The error that stopped this rank, if any.
    pub error: Option<RankError>,
    /// With the persistent artifact cache: where compiles got their artifacts.
    pub artifacts: Option<ArtifactSteps>,
}

/// A rank's failure, as the JSON output shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankError {
    /// [`Error::kind`].
    pub kind: String,
    /// Ranks named as missing or lost.
    pub missing_ranks: Vec<u32>,
    /// The exchange it failed in.
    pub exchange: Option<u64>,
    /// The full message.
    pub message: String,
}

impl RankError {
    /// From a library error.
    pub fn from_error(e: &Error) -> Self {
        RankError {
            kind: e.kind().as_str().to_owned(),
            missing_ranks: e.missing_ranks().to_vec(),
            exchange: e.exchange().map(|i| i.seq),
            message: e.to_string(),
        }
    }

    /// The report of a profile that could not be loaded or saved: kind
    /// `"profile"`, no rank, no exchange.
    pub fn from_profile(e: &ProfileError) -> Self {
        RankError {
            kind: "profile".to_owned(),
            missing_ranks: Vec::new(),
            exchange: None,
            message: e.to_string(),
        }
    }
}

impl RankReport {
    /// A rank that has done nothing yet.
    pub fn new(rank: u32) -> Self {
        RankReport {
            rank,
            compile_steps: Vec::new(),
            dynamic_dims: BTreeMap::new(),
            dynamic_scalars: BTreeSet::new(),
            dynamic_strides: BTreeMap::new(),
            uncompiled_steps: 0,
            decided: BTreeMap::new(),
            error: None,
            artifacts: None,
        }
    }

    /// A rank that failed before doing anything, with `kind` and `message`.
    pub fn failed(rank: u32, kind: &str, message: String) -> Self {
        RankReport {
            error: Some(RankError {
                kind: kind.to_owned(),
                missing_ranks: Vec::new(),
                exchange: None,
                message,
            }),
            ..RankReport::new(rank)
        }
    }

    /// The JSON object of docs/scenarios.md (Output) for this rank.
    pub fn to_json(&self) -> Value {
        let mut dynamic = Map::new();
        for (s, dims) in &self.dynamic_dims {
            dynamic.insert(s.clone(), json!(dims));
        }
        for s in &self.dynamic_scalars {
            dynamic.insert(s.clone(), json!("scalar"));
        }
        let mut strides = Map::new();
        for (s, dims) in &self.dynamic_strides {
            strides.insert(s.clone(), json!(dims));
        }
        let mut obj = Map::new();
        obj.insert("rank".into(), json!(self.rank));
        obj.insert("compiles".into(), json!(self.compile_steps.len()));
        obj.insert("compile_steps".into(), json!(self.compile_steps));
        obj.insert("dynamic".into(), Value::Object(dynamic));
        obj.insert("dynamic_strides".into(), Value::Object(strides));
        if let Some(a) = &self.artifacts {
            obj.insert("artifacts".into(), a.to_json());
        }
        if let Some(e) = &self.error {
            obj.insert(
                "error".into(),
                json!({
                    "kind": e.kind,
                    "missing_ranks": e.missing_ranks,
                    "exchange": e.exchange,
                    "message": e.message,
                }),
            );
        }
        Value::Object(obj)
    }
}

/// The output of a whole run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunReport {
    /// The scenario's name.
    pub name: String,
    /// The mode it ran in.
    pub mode: Mode,
    /// One report per rank.
    pub ranks: Vec<RankReport>,
}

impl RunReport {
    /// `{"name": ..., "ranks": [...]}` (docs/scenarios.md, Output).
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "ranks": self.ranks.iter().map(RankReport::to_json).collect::<Vec<_>>(),
        })
    }

    /// Whether any rank failed.
    pub fn failed(&self) -> bool {
        self.ranks.iter().any(|r| r.error.is_some())
    }
}

/// Removes every `message` key of error objects so outputs compare by
/// meaning, not by wording.
pub fn strip_messages(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "message")
                .map(|(k, v)| (k.clone(), strip_messages(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_messages).collect()),
        other => other.clone(),
    }
}

/// Compares a run with the file's expectation for its mode. `Ok(None)` when
/// the file has none for that mode; `Ok(Some(diff))` lists the differences
/// (empty when equal).
pub fn check_expectation(scenario: &Scenario, report: &RunReport) -> Option<Vec<String>> {
    let expected = scenario.expect.get(&report.mode)?;
    let got = strip_messages(&report.to_json());
    let want = strip_messages(expected);
    let mut diffs = Vec::new();
    diff_values("", &want, &got, &mut diffs);
    Some(diffs)
}

fn diff_values(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff_values(&p, x, y, out),
                    (Some(x), None) => out.push(format!("{p}: expected {x}, missing")),
                    (None, Some(y)) => out.push(format!("{p}: not expected, got {y}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b))
            if a.len() == b.len() && a.iter().all(Value::is_object) =>
        {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_values(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if want == got => {}
        _ => out.push(format!("{path}: expected {want}, got {got}")),
    }
}
