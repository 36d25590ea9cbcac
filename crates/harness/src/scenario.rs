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
//!
//! The code is split along what it does: reading and validating a file
//! (`scenario/parse.rs`: [`Scenario::from_slice`], [`ScenarioLimits`],
//! [`ScenarioError`]), running it (`scenario/run.rs`: [`run_rank`],
//! [`run_in_process`]), its output and the comparison with expectations
//! (`scenario/report.rs`: [`RunReport`], [`check_expectation`]), and the
//! per-rank setup ([`setup`]). This file holds what they share: the
//! [`Scenario`] and its [`Mode`]s.

use compiler_collectives_core::cache::{CacheOptions, Inputs};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

mod parse;
mod report;
mod run;
pub mod setup;

pub use parse::{ScenarioError, ScenarioLimits, MAX_NAME_BYTES};
pub use report::{check_expectation, strip_messages, RankError, RankReport, RunReport};
pub use run::{
    run_in_process, run_in_process_with, run_rank, run_rank_with, RunOptions, MAX_IN_PROCESS_RANKS,
    RUNNER_TIMEOUT,
};
pub use setup::{ArtifactSteps, RankSetup};

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

impl Scenario {
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
