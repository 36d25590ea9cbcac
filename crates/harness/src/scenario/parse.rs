//! Reading and validating a scenario file: the raw serde shapes of its JSON,
//! the [`ScenarioLimits`] it is held to, and [`Scenario::from_file`] /
//! [`Scenario::from_slice`], whose [`ScenarioError`]s name the file and the
//! field.

use super::{setup, Mode, Scenario};
use compiler_collectives_core::cache::{CacheOptions, Inputs};
use compiler_collectives_core::decisions::shapes::{Observation, Override};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// Bounds on what a scenario file may ask for, built with
/// `ScenarioLimits::default().with_…` (one `with_<field>` setter per field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct ScenarioLimits {
    /// Largest world size, in ranks (default 65 536).
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
    automatic_dynamic_shapes: Option<bool>,
    automatic_dynamic_exclusion_guard: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInput {
    size: Option<Vec<u64>>,
    stride: Option<Vec<u64>>,
    int: Option<i64>,
    float: Option<RawFloat>,
    bool: Option<bool>,
}

/// A float input's value: a JSON number (`-0.0` keeps its sign), or the
/// text `"nan"`, `"inf"` or `"-inf"` (JSON has no such numbers).
struct RawFloat(f64);

impl<'de> Deserialize<'de> for RawFloat {
    /// From the value's JSON text, so that an integer literal beyond what
    /// serde_json holds as an integer (64 bits) is checked as written, not
    /// as the float serde_json would round it to.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let raw = <&serde_json::value::RawValue>::deserialize(d)?;
        let text = raw.get().trim();
        if text.starts_with('"') {
            let v: String = serde_json::from_str(text).map_err(D::Error::custom)?;
            return match v.as_str() {
                "nan" => Ok(RawFloat(f64::NAN)),
                "inf" => Ok(RawFloat(f64::INFINITY)),
                "-inf" => Ok(RawFloat(f64::NEG_INFINITY)),
                other => Err(D::Error::custom(format!(
                    "{other:?} is not a float: write a number, or \"nan\", \"inf\" or \"-inf\""
                ))),
            };
        }
        let number = text.starts_with(|c: char| c == '-' || c.is_ascii_digit());
        if !number {
            return Err(D::Error::custom(format!(
                "{text} is not a float: write a number, or \"nan\", \"inf\" or \"-inf\""
            )));
        }
        if text.contains(['.', 'e', 'E']) {
            // The text is a JSON number (serde_json checked it); Rust's
            // parse rounds correctly, as serde_json's float_roundtrip does.
            return match text.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(RawFloat(v)),
                _ => Err(D::Error::custom(format!(
                    "{text} is out of a float's range"
                ))),
            };
        }
        if text == "-0" {
            return Ok(RawFloat(-0.0));
        }
        // An integer written as a float's value: only one a float holds
        // exactly. Below 2^53 in magnitude every integer is a float exactly.
        const EXACT: i128 = 1 << 53;
        match text.parse::<i128>() {
            Ok(v) if v.abs() <= EXACT => {
                // Exact: |v| ≤ 2^53.
                #[allow(clippy::cast_precision_loss)]
                Ok(RawFloat(v as f64))
            }
            _ => Err(D::Error::custom(format!(
                "{text} is not exactly a float (beyond ±2^53): write the float's value"
            ))),
        }
    }
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
        options.automatic_dynamic_shapes = o
            .automatic_dynamic_shapes
            .unwrap_or(options.automatic_dynamic_shapes);
        options.automatic_dynamic_exclusion_guard = o
            .automatic_dynamic_exclusion_guard
            .unwrap_or(options.automatic_dynamic_exclusion_guard);
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
                    let kinds = [
                        input.size.is_some(),
                        input.int.is_some(),
                        input.float.is_some(),
                        input.bool.is_some(),
                    ];
                    let given = kinds.iter().filter(|&&k| k).count();
                    if given > 1 || (given == 0 && input.stride.is_some()) {
                        return Err(fail(
                            field,
                            "give exactly one of `size` (a tensor), `int`, `float` or `bool`"
                                .into(),
                        ));
                    }
                    if input.stride.is_some() && input.size.is_none() {
                        return Err(fail(
                            format!("{field}.stride"),
                            "only a tensor (`size`) has a stride".into(),
                        ));
                    }
                    if input.float.is_some() || input.bool.is_some() {
                        continue;
                    }
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
                        (None, _, None) => return Err(fail(
                            field,
                            "give `size` (a tensor), `int`, `float` or `bool`, or null for None"
                                .into(),
                        )),
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
                                Some(RawInput {
                                    float: Some(RawFloat(v)),
                                    ..
                                }) => Observation::float(v),
                                Some(RawInput { bool: Some(b), .. }) => Observation::Bool(b),
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
}
