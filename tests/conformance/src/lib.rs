//! Behaviours every compiler-collectives transport must show, written once.
//!
//! A behaviour is a function that **every rank** runs with its own
//! [`Ctx`]; it returns `Err(text)` when that rank saw something wrong. A
//! backend runs each behaviour on all ranks of a fresh group — threads for
//! the in-process engine, real processes for Gloo — and requires every rank
//! to return `Ok`. Backend differences are plain arguments of [`Ctx`].
//!
//! [`in_process_trials`] makes one case per behaviour and world size for
//! the in-process engine; multi-process backends run theirs through
//! [`process`] and look a behaviour up by name with [`find`] inside their
//! rank processes. Every runner has a hard limit per case: a hung rank
//! fails its case, never the whole run. [`skip`] is the one skip rule.
//!
//! Behaviours whose assertions are about time ([`Behaviour::timed`]) must be
//! run one at a time (the in-process runner holds [`TIMING_LOCK`]).

/// Registers a behaviour next to its function:
/// `behaviour!(CONST = function, min_world: 2, timed: false, needs: [NamesMissingRanks]);`
/// is the [`Behaviour`] `CONST`, named after the function (the name runners
/// select and print). Its area module lists `CONST` in its `BEHAVIOURS`,
/// and `behaviours/mod.rs` lists the areas: that sets its place in
/// [`BEHAVIOURS`].
macro_rules! behaviour {
    (
        $id:ident = $run:ident,
        min_world: $min:literal, timed: $timed:literal, needs: [$($cap:ident),* $(,)?]
    ) => {
        const $id: $crate::Behaviour = $crate::Behaviour {
            name: stringify!($run),
            min_world: $min,
            timed: $timed,
            run: $run,
            needs: &[$($crate::Capability::$cap),*],
        };
    };
}

mod behaviours;
mod in_process;
pub mod process;
mod ranks;
pub mod skip;

pub use in_process::{
    assert_all_ok, in_process_trials, run_in_process, run_in_process_within, IN_PROCESS_LIMIT,
    TIMING_LOCK,
};

use compiler_collectives_core::{
    decisions::votes::AnyVote, Capabilities, Channel, ChannelOptions, Deadline, Transport,
};
use std::sync::Arc;
use std::time::Duration;

/// What a rank gets to run a behaviour.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// This rank's transport (a fresh group per behaviour).
    pub transport: Arc<dyn Transport>,
    /// The deadline a behaviour should give operations that must succeed.
    pub timeout: Duration,
    /// The short deadline used by behaviours that wait for a timeout.
    pub short_timeout: Duration,
    /// The slack allowed past a deadline before an error must have come
    /// (docs/failures.md: within the deadline plus a small margin; 1 s).
    pub margin: Duration,
}

impl Ctx {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.transport.rank()
    }

    /// The number of ranks.
    pub fn world(&self) -> u32 {
        self.transport.world_size()
    }

    /// A channel over this rank's transport with `timeout`.
    pub fn channel(&self, timeout: Duration) -> Result<Channel, String> {
        Channel::with_options(
            Arc::clone(&self.transport),
            ChannelOptions::default().with_timeout(timeout),
        )
        .map_err(|e| e.to_string())
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.timeout)
    }
}

/// A capability a behaviour needs (one of core's [`Capabilities`]);
/// behaviours that need one a backend lacks are skipped for it, with the
/// reason printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Timeouts name the ranks that did not arrive.
    NamesMissingRanks,
    /// A rank that shuts down or aborts tells waiting peers at once.
    TellsPeersItLeft,
    /// Point-to-point is cheap (the tree exchange runs over it).
    CheapPointToPoint,
}

impl Capability {
    /// Whether `caps` has it.
    pub fn in_set(self, caps: &Capabilities) -> bool {
        match self {
            Capability::NamesMissingRanks => caps.names_missing_ranks,
            Capability::TellsPeersItLeft => caps.tells_peers_it_left,
            Capability::CheapPointToPoint => caps.cheap_point_to_point,
        }
    }
}

/// A behaviour: a name, the smallest world it needs, whether it asserts on
/// time, and the per-rank body.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// Unique name (used by multi-process runners to pick it).
    pub name: &'static str,
    /// Smallest world size it makes sense for.
    pub min_world: u32,
    /// Whether it asserts on elapsed time (run one at a time).
    pub timed: bool,
    /// The body every rank runs.
    pub run: fn(&Ctx) -> Result<(), String>,
    /// What the backend must be able to do.
    pub needs: &'static [Capability],
}

impl Behaviour {
    /// The first capability in `needs` that `has` lacks.
    pub fn missing(&self, has: &Capabilities) -> Option<Capability> {
        self.needs.iter().copied().find(|c| !c.in_set(has))
    }
}

/// Every behaviour, area by area (the modules under `behaviours/`).
pub const BEHAVIOURS: &[Behaviour] = &behaviours::ALL;

/// The line the hung rank of [`HUNG_RANK`] prints before it hangs.
pub const HUNG_MARK: &str = "HUNG: this rank sleeps forever on purpose";

/// Not a behaviour of the suite (not in [`BEHAVIOURS`]): the harness's own
/// check. The last rank prints [`HUNG_MARK`] and sleeps forever inside the
/// behaviour, as a rank stuck in an engine would; the others wait for it in
/// an exchange. A runner must fail such a case at its limit and go on
/// ([`process::harness_trials`], [`run_in_process_within`]).
pub const HUNG_RANK: Behaviour = Behaviour {
    name: "hung_rank",
    min_world: 2,
    timed: false,
    run: hung_rank,
    needs: &[],
};

fn hung_rank(ctx: &Ctx) -> Result<(), String> {
    if ctx.rank() + 1 == ctx.world() {
        println!("{HUNG_MARK}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let mut ch = ctx.channel(ctx.timeout)?;
    ch.exchange("f", &AnyVote(false))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The behaviour called `name` ([`BEHAVIOURS`] and [`HUNG_RANK`]).
pub fn find(name: &str) -> Option<&'static Behaviour> {
    BEHAVIOURS
        .iter()
        .chain(std::iter::once(&HUNG_RANK))
        .find(|b| b.name == name)
}

/// `Ok` when `cond` holds, else `Err(what())`.
fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}
