//! Per-rank scenario setup: warm persistent artifact caches and mark-dynamic
//! hints (issue 9's scenario extensions), and how the runner realises them.
//!
//! - `"warm_cache": {"<rank>": [steps…]}` — the program compiles through a
//!   persistent artifact cache ([`compiler_collectives_core::persistence::artifacts`]), one directory per rank
//!   (empty at the start). Rank `r`'s cache already holds the artifact that a
//!   compile at each listed step (0-based) needs, as if an earlier run had
//!   written it; a listed step at which the rank does not compile has no
//!   effect. Implies `options.artifact_cache`.
//! - `"options": {"artifact_cache": true}` — the persistent cache without any
//!   warm entry; `"cache_hit_agreement"` (default true) keeps a disk hit only
//!   if every rank hit.
//! - `"mark_dynamic": {"<rank>": {"<source>": [dims…]}}` — rank `r` marks
//!   those dims of that tensor source dynamic before its first call (as
//!   `torch._dynamo.mark_dynamic`); the hint is part of what the rank sends, so
//!   with collectives on every rank compiles the dim dynamic. The source must
//!   be a tensor on that rank at some step; the dims must be below its ndim
//!   there.
//!
//! With the artifact cache, a backend compile is modelled as one that runs
//! collectives of its own: sharded autotuning ([`compiler_collectives_core::decisions::autotune`]) of four
//! tile candidates with fixed synthetic timings, one exchange under the key
//! `scenario:NAME/autotune` (only when the rank has a channel). That is what
//! makes a warm rank that skips its compile fall out of step without
//! agreement. The output then holds, per rank, `"artifacts": {"compiled_steps",
//! "loaded_steps", "disk_hit_steps"}`: steps whose compile ran the backend
//! compile, steps whose artifact came from the disk, and steps at which this
//! rank's disk held the artifact (kept or not).

use super::ScenarioError;
use compiler_collectives_core::cache::Inputs;
use compiler_collectives_core::decisions::autotune::{autotune, Strategy};
use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_core::persistence::artifacts::{
    artifact_key, ArtifactStore, DiskArtifacts,
};
use compiler_collectives_core::protocol::Channel;
use compiler_collectives_core::Result;
use serde_json::{json, Value};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What each rank brings besides its inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankSetup {
    /// Whether the program compiles through a persistent artifact cache.
    pub artifact_cache: bool,
    /// Per rank, the steps whose compile finds its artifact on that rank's disk.
    pub warm_cache: BTreeMap<u32, BTreeSet<u64>>,
    /// Per rank, per tensor source: `(ndim, dims)` marked dynamic.
    pub mark_dynamic: BTreeMap<u32, BTreeMap<String, (usize, Vec<usize>)>>,
}

/// Where one rank's compiles got their artifacts (steps, 0-based, ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArtifactSteps {
    /// Steps whose compile ran the backend compile.
    pub compiled_steps: Vec<u64>,
    /// Steps whose artifact was loaded from the disk.
    pub loaded_steps: Vec<u64>,
    /// Steps at which this rank's disk held the artifact (kept or dropped).
    pub disk_hit_steps: Vec<u64>,
}

impl ArtifactSteps {
    /// The JSON object of the runner's output.
    pub fn to_json(&self) -> Value {
        json!({
            "compiled_steps": self.compiled_steps,
            "loaded_steps": self.loaded_steps,
            "disk_hit_steps": self.disk_hit_steps,
        })
    }
}

/// A rank key of a per-rank map: a decimal rank below `world_size`.
fn rank_key(key: &str, world_size: u32) -> std::result::Result<u32, String> {
    let canonical = !key.is_empty()
        && key.bytes().all(|b| b.is_ascii_digit())
        && (key.len() == 1 || !key.starts_with('0'));
    match key.parse::<u32>() {
        Ok(r) if canonical && r < world_size => Ok(r),
        _ => Err(format!(
            "keys are ranks written in decimal, 0..{world_size} (world_size)"
        )),
    }
}

/// Validates the raw per-rank fields against the parsed steps.
pub(super) fn parse(
    file: &str,
    world_size: u32,
    steps: &[Vec<Inputs>],
    artifact_cache: Option<bool>,
    warm_cache: Option<BTreeMap<String, Vec<u64>>>,
    mark_dynamic: BTreeMap<String, BTreeMap<String, Vec<usize>>>,
) -> std::result::Result<RankSetup, ScenarioError> {
    let fail = |field: String, message: String| ScenarioError {
        file: file.to_owned(),
        field,
        message,
    };
    let mut setup = RankSetup {
        artifact_cache: artifact_cache.unwrap_or(warm_cache.is_some()),
        ..RankSetup::default()
    };
    if warm_cache.is_some() && !setup.artifact_cache {
        return Err(fail(
            "options.artifact_cache".into(),
            "is false, but `warm_cache` needs the persistent artifact cache".into(),
        ));
    }
    for (key, list) in warm_cache.unwrap_or_default() {
        let rank = rank_key(&key, world_size).map_err(|m| fail(format!("warm_cache.{key}"), m))?;
        let mut set = BTreeSet::new();
        for (i, &step) in list.iter().enumerate() {
            if step >= steps.len() as u64 {
                return Err(fail(
                    format!("warm_cache.{key}[{i}]"),
                    format!(
                        "step {step} is past the last step ({})",
                        compiler_collectives_core::counted(steps.len(), "step", "steps")
                    ),
                ));
            }
            set.insert(step);
        }
        setup.warm_cache.insert(rank, set);
    }
    for (key, sources) in mark_dynamic {
        let rank =
            rank_key(&key, world_size).map_err(|m| fail(format!("mark_dynamic.{key}"), m))?;
        let mut marks = BTreeMap::new();
        for (source, dims) in sources {
            let field = format!("mark_dynamic.{key}.{source}");
            let ndim = steps
                .iter()
                .find_map(|step| match step.get(rank as usize)?.get(&source)? {
                    Observation::Tensor { sizes, .. } => Some(sizes.len()),
                    _ => None,
                })
                .ok_or_else(|| {
                    fail(
                        field.clone(),
                        format!("rank {rank} never passes `{source}` as a tensor"),
                    )
                })?;
            for (i, &d) in dims.iter().enumerate() {
                if d >= ndim {
                    return Err(fail(
                        format!("{field}[{i}]"),
                        format!(
                            "dim {d} is out of range: `{source}` has {ndim} dims on rank {rank}"
                        ),
                    ));
                }
            }
            marks.insert(source, (ndim, dims));
        }
        setup.mark_dynamic.insert(rank, marks);
    }
    Ok(setup)
}

/// The scenario's artifact: text naming its key (what a loaded artifact must equal).
pub(super) fn artifact_for(key: &str) -> String {
    format!("compiled {key}")
}

/// One rank's persistent store: a fresh directory, made warm for a step's
/// compile by writing the artifact it asks for just before the lookup.
#[derive(Debug)]
pub(super) struct ScenarioStore {
    disk: DiskArtifacts,
    _dir: tempfile::TempDir,
    /// Whether the current step is a warm one for this rank.
    pub(super) warm_now: Cell<bool>,
}

impl ScenarioStore {
    pub(super) fn new() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ccol-scenario-artifacts-")
            .tempdir()?;
        Ok(ScenarioStore {
            disk: DiskArtifacts::open(dir.path())?,
            _dir: dir,
            warm_now: Cell::new(false),
        })
    }
}

impl ArtifactStore for ScenarioStore {
    fn load(&self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        if self.warm_now.get() && self.disk.load(key)?.is_none() {
            let bytes = postcard::to_allocvec(&artifact_for(key))
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            self.disk.store(key, &bytes)?;
        }
        self.disk.load(key)
    }

    fn store(&self, key: &str, bytes: &[u8]) -> std::io::Result<()> {
        self.disk.store(key, bytes)
    }
}

/// The candidates of the modelled backend compile's autotuning, with their
/// synthetic benchmark times in µs (tile_64 wins).
const TILES: [(&str, u64); 4] = [
    ("tile_16", 40),
    ("tile_32", 31),
    ("tile_64", 22),
    ("tile_128", 35),
];

/// The modelled backend compile: sharded autotuning over `channel` (when
/// the rank has one), then the artifact.
pub(super) fn backend_compile(
    cache_key: &str,
    frame: &compiler_collectives_core::cache::CompiledFrame,
    channel: Option<&mut Channel>,
) -> Result<String> {
    if let Some(ch) = channel {
        let names: Vec<&str> = TILES.iter().map(|(n, _)| *n).collect();
        autotune(
            ch,
            &format!("{cache_key}/autotune"),
            &names,
            Strategy::Sharded,
            |cand| {
                let us = TILES.iter().find(|(n, _)| *n == cand).map_or(0, |t| t.1);
                Ok(vec![Duration::from_micros(us)])
            },
        )?;
    }
    Ok(artifact_for(&artifact_key(cache_key, frame)))
}
