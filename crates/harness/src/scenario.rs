//! Scenario files: one multi-rank job each, shared by `ccol scenario run`,
//! the PyTorch oracle and the tests (docs/scenarios.md). The JSON Schema is
//! `tests/scenarios/scenario.schema.json`.
//!
//! ```json
//! { "name": "tensor", "world_size": 2,
//!   "options": { "collectives": true, "guard_collectives": false, "recompile_limit": 8 },
//!   "steps": [
//!     [ {"x": {"size": [5,10]}}, {"x": {"size": [6,10], "stride": [10,1]}} ],
//!     [ {"x": {"size": [8,10]}, "y": {"int": 3}}, {"x": {"size": [6,10]}} ] ],
//!   "expect": { "collectives": {"name": "tensor", "ranks": [ ... ]} } }
//! ```
//!
//! The program a scenario stands for: one compiled function whose arguments
//! are every source named anywhere in the file; at each step every rank calls
//! it once with its own inputs. A tensor source is summed, an int source is
//! used as a size (so ints are ≥ 0), a source absent from a rank's map (or
//! `null`) is passed as `None` and not read.
//!
//! Fields:
//! - `name` (string), `world_size` (1..=65 536), `description` (optional text);
//! - `options`: `collectives` (default true), `guard_collectives` (false),
//!   `recompile_limit` (8), `specialize_zero_one` (true), `duck_sizing` (false),
//!   `overrides` (source → `"force_static"` | `"force_dynamic"`);
//! - `steps`: one array per step, each with `world_size` maps from source
//!   name (an identifier) to `{"size": [...], "stride": [...]}` (stride
//!   optional, defaults to contiguous) or `{"int": n}` or `null`;
//! - per-rank setup (the [`setup`] module): `warm_cache` (rank → steps whose
//!   compile finds its artifact in that rank's persistent artifact cache),
//!   `mark_dynamic` (rank → source → dims), and the options `artifact_cache`
//!   and `cache_hit_agreement` (default true);
//! - `expect`: expected output per mode: `collectives` (collectives on,
//!   votes off), `no_collectives` (both off), `guard_collectives` (collectives
//!   off, votes on), `collectives_and_guard_collectives` (both on). Outputs
//!   compare by parsed equality, ignoring error `message` texts.

use compiler_collectives_core::cache::{CacheOptions, CompileCache, Inputs, Outcome};
use compiler_collectives_core::decisions::shapes::{Observation, Override};
use compiler_collectives_core::persistence::artifacts::ArtifactOrigin;
use compiler_collectives_core::persistence::profile::ProfileError;
use compiler_collectives_core::protocol::{Channel, ChannelOptions};
use compiler_collectives_core::transport::inprocess::InProcessGroup;
use compiler_collectives_core::{Error, Result};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub mod setup;
pub use setup::{ArtifactSteps, RankSetup};

/// Most ranks [`run_in_process`] starts (one thread each).
pub const MAX_IN_PROCESS_RANKS: u32 = 4096;

/// The scenario runner's default exchange deadline (docs/scenarios.md): 10 s.
pub const RUNNER_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds on what a scenario file may ask for. Configurable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScenarioLimits {
    /// Largest world size (default 65 536).
    pub max_world_size: u32,
    /// Largest number of tensor dimensions (default 64).
    pub max_ndim: usize,
    /// Largest number of steps (default 1 000 000).
    pub max_steps: usize,
    /// Largest file, in bytes (default 64 MiB: parsing takes several times the file size in memory).
    pub max_file_bytes: u64,
}

impl Default for ScenarioLimits {
    fn default() -> Self {
        ScenarioLimits {
            max_world_size: 65_536,
            max_ndim: compiler_collectives_core::cache::MAX_MARK_NDIM,
            max_steps: 1_000_000,
            max_file_bytes: 64 << 20,
        }
    }
}

/// A malformed scenario: which file, which field, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {}{message}", if field.is_empty() { String::new() } else { format!("field `{field}`: ") })]
pub struct ScenarioError {
    /// The file (or `<input>`).
    pub file: String,
    /// The field path, e.g. `steps[1][0].x.size[0]`; empty for the whole file.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A mode a scenario runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Compiler collectives on, guard votes off.
    Collectives,
    /// Both off.
    NoCollectives,
    /// Compiler collectives off, guard votes on.
    GuardCollectives,
    /// Both on.
    CollectivesAndGuardCollectives,
}

impl Mode {
    /// Every mode, in `expect` order.
    pub const ALL: [Mode; 4] = [
        Mode::Collectives,
        Mode::NoCollectives,
        Mode::GuardCollectives,
        Mode::CollectivesAndGuardCollectives,
    ];

    /// The `expect` key of this mode.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Collectives => "collectives",
            Mode::NoCollectives => "no_collectives",
            Mode::GuardCollectives => "guard_collectives",
            Mode::CollectivesAndGuardCollectives => "collectives_and_guard_collectives",
        }
    }

    /// The mode of an `expect` key.
    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The mode of a pair of switches.
    pub fn from_flags(collectives: bool, guard_collectives: bool) -> Mode {
        match (collectives, guard_collectives) {
            (true, false) => Mode::Collectives,
            (false, false) => Mode::NoCollectives,
            (false, true) => Mode::GuardCollectives,
            (true, true) => Mode::CollectivesAndGuardCollectives,
        }
    }

    /// `(collectives, guard_collectives)`.
    pub fn flags(self) -> (bool, bool) {
        match self {
            Mode::Collectives => (true, false),
            Mode::NoCollectives => (false, false),
            Mode::GuardCollectives => (false, true),
            Mode::CollectivesAndGuardCollectives => (true, true),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: Option<String>,
    world_size: u32,
    #[serde(default)]
    options: RawOptions,
    steps: Vec<Vec<RankInputs>>,
    #[serde(default)]
    expect: BTreeMap<String, Value>,
    #[serde(default)]
    warm_cache: Option<BTreeMap<String, Vec<u64>>>,
    #[serde(default)]
    mark_dynamic: BTreeMap<String, BTreeMap<String, Vec<usize>>>,
}

/// One rank's inputs at one step; a source named twice is an error (plain
/// maps would keep the last silently).
struct RankInputs(BTreeMap<String, Option<RawInput>>);

impl<'de> Deserialize<'de> for RankInputs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = RankInputs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from source name to input")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<RankInputs, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(k) = m.next_key::<String>()? {
                    if out.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!(
                            "source `{k}` is given twice"
                        )));
                    }
                    let v = m.next_value::<Option<RawInput>>()?;
                    out.insert(k, v);
                }
                Ok(RankInputs(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Longest scenario name, in bytes (it becomes part of the compile key).
pub const MAX_NAME_BYTES: usize = 1024;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawOptions {
    collectives: Option<bool>,
    guard_collectives: Option<bool>,
    recompile_limit: Option<u32>,
    specialize_zero_one: Option<bool>,
    duck_sizing: Option<bool>,
    #[serde(default)]
    overrides: BTreeMap<String, Override>,
    artifact_cache: Option<bool>,
    cache_hit_agreement: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    size: Option<Vec<u64>>,
    stride: Option<Vec<u64>>,
    int: Option<i64>,
}

/// A validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// Free text.
    pub description: Option<String>,
    /// Number of ranks.
    pub world_size: u32,
    /// Cache options from the file (its mode switches are the file's default mode).
    pub options: CacheOptions,
    /// Every source named anywhere, sorted (the function's arguments).
    pub sources: BTreeSet<String>,
    /// `steps[s][r]`: rank `r`'s inputs at step `s` (every source present,
    /// `None` where absent).
    pub steps: Vec<Vec<Inputs>>,
    /// Expected output per mode.
    pub expect: BTreeMap<Mode, Value>,
    /// Per-rank warm artifact caches and mark-dynamic hints.
    pub setup: RankSetup,
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the file and the field.
    pub fn from_file(path: &Path, limits: &ScenarioLimits) -> Result<Self, ScenarioError> {
        let file = path.display().to_string();
        let err = |message: String| ScenarioError {
            file: file.clone(),
            field: String::new(),
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
        if !meta.is_file() {
            return Err(err("not a regular file".into()));
        }
        // Read at most one byte past the limit: the size in the metadata can
        // change, and is 0 for files that are not what they seem.
        let mut text = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| {
                use std::io::Read as _;
                f.take(limits.max_file_bytes.saturating_add(1))
                    .read_to_end(&mut text)
            })
            .map_err(|e| err(format!("cannot read: {e}")))?;
        if text.len() as u64 > limits.max_file_bytes {
            return Err(err(format!(
                "over the limit of {} bytes",
                limits.max_file_bytes
            )));
        }
        Self::from_slice(&text, &file, limits)
    }

    /// Parses and validates scenario JSON; `file` names it in errors.
    ///
    /// # Errors
    /// [`ScenarioError`] naming the field: bad JSON, wrong types, negative
    /// sizes or ints, stride/size length mismatch, step lists that do not
    /// match `world_size`, limits exceeded, unknown fields.
    pub fn from_slice(
        bytes: &[u8],
        file: &str,
        limits: &ScenarioLimits,
    ) -> Result<Self, ScenarioError> {
        let fail = |field: String, message: String| ScenarioError {
            file: file.to_owned(),
            field,
            message,
        };
        if bytes.len() as u64 > limits.max_file_bytes {
            return Err(fail(
                String::new(),
                format!(
                    "{} bytes, over the limit of {} bytes",
                    bytes.len(),
                    limits.max_file_bytes
                ),
            ));
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(fail(
                String::new(),
                "a scenario file is one JSON object {\"name\": ..., \"world_size\": ..., \"steps\": [...]}".into(),
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawScenario = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
            let path = e.path().to_string();
            // "." is the whole file, "?" a path serde could not track (truncated input).
            let field = if path == "." || path == "?" {
                String::new()
            } else {
                path
            };
            fail(field, e.inner().to_string())
        })?;
        de.end().map_err(|e| {
            fail(
                String::new(),
                format!("more after the scenario object: {e}"),
            )
        })?;
        if raw.name.is_empty() || raw.name.len() > MAX_NAME_BYTES {
            return Err(fail(
                "name".into(),
                format!("must be 1 to {MAX_NAME_BYTES} bytes, is {}", raw.name.len()),
            ));
        }
        if raw.world_size == 0 || raw.world_size > limits.max_world_size {
            return Err(fail(
                "world_size".into(),
                format!(
                    "{} is outside 1..={}",
                    raw.world_size, limits.max_world_size
                ),
            ));
        }
        if raw.steps.len() > limits.max_steps {
            return Err(fail(
                "steps".into(),
                format!(
                    "{} steps, over the limit of {}",
                    raw.steps.len(),
                    limits.max_steps
                ),
            ));
        }
        let mut options = CacheOptions::default();
        let o = raw.options;
        // Unset options keep the reference cache's defaults.
        options.collectives = o.collectives.unwrap_or(options.collectives);
        options.guard_collectives = o.guard_collectives.unwrap_or(options.guard_collectives);
        options.recompile_limit = o.recompile_limit.unwrap_or(options.recompile_limit);
        options.specialize_zero_one = o.specialize_zero_one.unwrap_or(options.specialize_zero_one);
        options.duck_sizing = o.duck_sizing.unwrap_or(options.duck_sizing);
        options.cache_hit_agreement = o.cache_hit_agreement.unwrap_or(options.cache_hit_agreement);
        for source in o.overrides.keys() {
            if !is_identifier(source) {
                return Err(fail(
                    format!("options.overrides.{source}"),
                    "source names are identifiers ([A-Za-z_][A-Za-z0-9_]*)".into(),
                ));
            }
        }
        options.overrides = o.overrides;
        let mut sources = BTreeSet::new();
        for (s, step) in raw.steps.iter().enumerate() {
            if step.len() != raw.world_size as usize {
                return Err(fail(
                    format!("steps[{s}]"),
                    format!(
                        "{}, world_size is {}",
                        compiler_collectives_core::counted(
                            step.len(),
                            "rank entry",
                            "rank entries"
                        ),
                        raw.world_size
                    ),
                ));
            }
            for (r, inputs) in step.iter().enumerate() {
                for (source, input) in &inputs.0 {
                    let field = format!("steps[{s}][{r}].{source}");
                    if !is_identifier(source) {
                        return Err(fail(
                            field,
                            "source names are identifiers ([A-Za-z_][A-Za-z0-9_]*)".into(),
                        ));
                    }
                    sources.insert(source.clone());
                    let Some(input) = input else { continue };
                    match (&input.size, &input.stride, input.int) {
                        (Some(size), stride, None) => {
                            if size.len() > limits.max_ndim {
                                return Err(fail(
                                    format!("{field}.size"),
                                    format!(
                                        "{} dimensions, over the limit of {}",
                                        size.len(),
                                        limits.max_ndim
                                    ),
                                ));
                            }
                            if let Some(st) = stride {
                                if st.len() != size.len() {
                                    return Err(fail(
                                        format!("{field}.stride"),
                                        format!("{} strides for {} sizes", st.len(), size.len()),
                                    ));
                                }
                            }
                        }
                        (None, _, Some(v)) => {
                            if v < 0 {
                                return Err(fail(
                                    format!("{field}.int"),
                                    format!("{v} is negative; an int source is used as a size"),
                                ));
                            }
                            if input.stride.is_some() {
                                return Err(fail(
                                    format!("{field}.stride"),
                                    "an int has no stride".into(),
                                ));
                            }
                        }
                        (Some(_), _, Some(_)) => {
                            return Err(fail(
                                field,
                                "give either `size` (a tensor) or `int`, not both".into(),
                            ))
                        }
                        (None, _, None) => {
                            return Err(fail(
                                field,
                                "give `size` (a tensor) or `int`, or null for None".into(),
                            ))
                        }
                    }
                }
            }
        }
        if let Some(unknown) = options.overrides.keys().find(|k| !sources.contains(*k)) {
            return Err(fail(
                format!("options.overrides.{unknown}"),
                "names no source of the steps".into(),
            ));
        }
        let steps: Vec<Vec<Inputs>> = raw
            .steps
            .into_iter()
            .map(|step| {
                step.into_iter()
                    .map(|inputs| {
                        let mut full: Inputs = sources
                            .iter()
                            .map(|s| (s.clone(), Observation::None))
                            .collect();
                        for (source, input) in inputs.0 {
                            let obs = match input {
                                None => Observation::None,
                                Some(RawInput {
                                    size: Some(sizes),
                                    stride,
                                    ..
                                }) => Observation::Tensor {
                                    sizes,
                                    strides: stride,
                                },
                                Some(RawInput { int: Some(v), .. }) => Observation::Int(v),
                                Some(_) => Observation::None,
                            };
                            full.insert(source, obs);
                        }
                        full
                    })
                    .collect()
            })
            .collect();
        let setup = setup::parse(
            file,
            raw.world_size,
            &steps,
            o.artifact_cache,
            raw.warm_cache,
            raw.mark_dynamic,
        )?;
        let mut expect = BTreeMap::new();
        for (k, v) in raw.expect {
            let mode = Mode::from_name(&k).ok_or_else(|| {
                fail(
                    format!("expect.{k}"),
                    "unknown mode (collectives, no_collectives, guard_collectives, collectives_and_guard_collectives)"
                        .into(),
                )
            })?;
            if !v.is_object() {
                return Err(fail(
                    format!("expect.{k}"),
                    "an expected output is an object {\"name\": ..., \"ranks\": [...]}".into(),
                ));
            }
            expect.insert(mode, v);
        }
        Ok(Scenario {
            name: raw.name,
            description: raw.description,
            world_size: raw.world_size,
            options,
            sources,
            steps,
            expect,
            setup,
        })
    }

    /// The mode the file's own options select.
    pub fn default_mode(&self) -> Mode {
        Mode::from_flags(self.options.collectives, self.options.guard_collectives)
    }

    /// Cache options for `mode`.
    pub fn options_for(&self, mode: Mode) -> CacheOptions {
        let mut o = self.options.clone();
        (o.collectives, o.guard_collectives) = mode.flags();
        o
    }
}

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

/// Runs one rank of `scenario` in `mode` over `channel` (any transport), and
/// shuts the channel down at the end so that peers still waiting fail at
/// once. Never panics on scenario content.
pub fn run_rank(
    scenario: &Scenario,
    mode: Mode,
    rank: u32,
    channel: Option<Channel>,
) -> RankReport {
    run_rank_with(scenario, mode, rank, channel, None)
}

/// [`run_rank`] with a profile: the rank loads the state persisted for the
/// scenario's compile key (`scenario:<name>`) before its first step and
/// saves its state after every compile (see [`compiler_collectives_core::persistence::profile`]).
pub fn run_rank_with(
    scenario: &Scenario,
    mode: Mode,
    rank: u32,
    mut channel: Option<Channel>,
    profile: Option<&compiler_collectives_core::persistence::profile::ProfileStore>,
) -> RankReport {
    let options = scenario.options_for(mode);
    let mut cache: CompileCache<String> =
        CompileCache::new(format!("scenario:{}", scenario.name), options);
    let mut report = RankReport::new(rank);
    if let Some(store) = profile {
        match store.load_shapes(cache.key()) {
            Ok(Some(state)) => cache = cache.with_state(state),
            Ok(None) => {}
            Err(e) => report.error = Some(RankError::from_profile(&e)),
        }
    }
    for (source, (ndim, dims)) in scenario.setup.mark_dynamic.get(&rank).into_iter().flatten() {
        for &d in dims {
            if let Err(e) = cache.mark_dynamic(source, *ndim, d) {
                report.error = Some(RankError::from_error(&e));
            }
        }
    }
    let store = if scenario.setup.artifact_cache {
        match setup::ScenarioStore::new() {
            Ok(s) => Some(s),
            Err(e) => {
                report.error = Some(RankError::from_error(&Error::InvalidArgument(format!(
                    "cannot create the rank's artifact cache directory: {e}"
                ))));
                None
            }
        }
    } else {
        None
    };
    if store.is_some() {
        report.artifacts = Some(ArtifactSteps::default());
    }
    let warm = scenario.setup.warm_cache.get(&rank);
    let cache_key = cache.key().to_owned();
    for (s, step) in scenario.steps.iter().enumerate() {
        let Some(inputs) = step.get(rank as usize) else {
            break;
        };
        if report.error.is_some() {
            break;
        }
        let outcome = match &store {
            None => cache.call(inputs, channel.as_mut(), |_| String::new()),
            Some(store) => {
                store
                    .warm_now
                    .set(warm.is_some_and(|w| w.contains(&(s as u64))));
                cache
                    .call_persistent(inputs, channel.as_mut(), store, |frame, ch| {
                        setup::backend_compile(&cache_key, frame, ch)
                    })
                    .map(|call| {
                        let a = report.artifacts.get_or_insert_with(ArtifactSteps::default);
                        match call.origin {
                            Some(ArtifactOrigin::Loaded) => {
                                a.loaded_steps.push(s as u64);
                                a.disk_hit_steps.push(s as u64);
                            }
                            Some(ArtifactOrigin::Compiled { local_hit }) => {
                                a.compiled_steps.push(s as u64);
                                if local_hit {
                                    a.disk_hit_steps.push(s as u64);
                                }
                            }
                            None => {}
                        }
                        call.outcome
                    })
            }
        };
        let outcome = outcome.map_err(|e| {
            tracing::debug!(rank, step = s, error = %e, "scenario rank failed");
            RankError::from_error(&e)
        });
        let outcome = match (outcome, profile) {
            (Ok(Outcome::Compiled(i)), Some(store)) => store
                .save_shapes(cache.key(), cache.state())
                .map(|()| Outcome::Compiled(i))
                .map_err(|e| {
                    tracing::debug!(rank, step = s, error = %e, "scenario rank: profile not saved");
                    RankError::from_profile(&e)
                }),
            (o, _) => o,
        };
        match outcome {
            Ok(Outcome::Compiled(_)) => report.compile_steps.push(s as u64),
            Ok(Outcome::Hit(_)) => {}
            Ok(Outcome::Uncompiled) => report.uncompiled_steps += 1,
            Err(e) => {
                report.error = Some(e);
                break;
            }
        }
    }
    if let Some(last) = cache.frames().last() {
        report.dynamic_dims = last.dynamic_dims.clone();
        report.dynamic_scalars = last.dynamic_scalars.clone();
        report.dynamic_strides = last.dynamic_strides.clone();
        for (source, d) in &last.decisions {
            let text = match d {
                compiler_collectives_core::decisions::shapes::SourceDecision::Tensor {
                    dynamic_sizes,
                    ..
                } => {
                    let dims: Vec<usize> = (0..dynamic_sizes.len())
                        .filter(|&i| dynamic_sizes[i])
                        .collect();
                    if dims.is_empty() {
                        continue;
                    }
                    format!("{dims:?}")
                }
                compiler_collectives_core::decisions::shapes::SourceDecision::Int {
                    dynamic: true,
                } => "scalar".to_string(),
                _ => continue,
            };
            report.decided.insert(source.clone(), text);
        }
    }
    if let Some(ch) = channel.as_mut() {
        if report.error.is_some() {
            ch.abort();
        } else if let Err(e) = ch.shutdown() {
            tracing::warn!(rank, error = %e, "scenario: shutdown failed");
        }
    }
    report
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

/// Runs `scenario` in `mode` with one thread per rank over the in-process
/// engine, each exchange bounded by `timeout`.
///
/// # Errors
/// [`Error::InvalidArgument`] for more than [`MAX_IN_PROCESS_RANKS`] ranks or
/// if threads cannot be started.
pub fn run_in_process(scenario: &Scenario, mode: Mode, timeout: Duration) -> Result<RunReport> {
    run_in_process_with(scenario, mode, timeout, &RunOptions::default())
}

/// Options of a scenario run beyond mode and deadline. New knobs are added
/// as fields.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// Load and save decisions in this profile (every rank loads before its
    /// first step and saves after each compile).
    pub profile: Option<compiler_collectives_core::persistence::profile::ProfileStore>,
    /// Write each rank's trace file (`rank-<r>.jsonl`) into this directory.
    pub trace_dir: Option<std::path::PathBuf>,
}

/// [`run_in_process`] with a profile and trace files.
///
/// # Errors
/// As [`run_in_process`]; [`Error::InvalidArgument`] when a trace file
/// cannot be created.
pub fn run_in_process_with(
    scenario: &Scenario,
    mode: Mode,
    timeout: Duration,
    run: &RunOptions,
) -> Result<RunReport> {
    if scenario.world_size > MAX_IN_PROCESS_RANKS {
        return Err(Error::InvalidArgument(format!(
            "world_size {} is more ranks than the in-process runner starts threads for ({MAX_IN_PROCESS_RANKS}); \
             run larger worlds over processes",
            scenario.world_size
        )));
    }
    let (collectives, votes) = mode.flags();
    let transports = InProcessGroup::create(scenario.world_size)?;
    let scenario = Arc::new(scenario.clone());
    let mut handles = Vec::with_capacity(transports.len());
    for t in transports {
        let rank = compiler_collectives_core::Transport::rank(&t);
        let channel = if collectives || votes {
            let mut opts = ChannelOptions::default().with_timeout(timeout);
            opts.trace_dir.clone_from(&run.trace_dir);
            Some(Channel::with_options(Arc::new(t), opts)?)
        } else {
            None
        };
        let sc = Arc::clone(&scenario);
        let store = run.profile.clone();
        let h = std::thread::Builder::new()
            .name(format!("rank-{rank}"))
            .stack_size(512 << 10)
            .spawn(move || run_rank_with(&sc, mode, rank, channel, store.as_ref()))
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot start the thread of rank {rank}: {e}"))
            })?;
        handles.push((rank, h));
    }
    let mut ranks = Vec::with_capacity(handles.len());
    for (rank, h) in handles {
        ranks.push(h.join().unwrap_or_else(|_| {
            RankReport::failed(
                rank,
                "panic",
                format!("rank {rank} panicked (a bug: please report it)"),
            )
        }));
    }
    Ok(RunReport {
        name: scenario.name.clone(),
        mode,
        ranks,
    })
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
