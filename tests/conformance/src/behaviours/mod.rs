//! The behaviours, one module per area, in the order of [`crate::BEHAVIOURS`]:
//!
//! | module             | area                                                        |
//! |--------------------|-------------------------------------------------------------|
//! | [`gathers`]        | all-gathers of every kind, and what they refuse              |
//! | [`point_to_point`] | broadcast, barrier, send/recv, a message past a peer's limit |
//! | [`exchange`]       | the flat exchange on agreeing ranks                          |
//! | [`desync`]         | ranks out of step: keys, sequence numbers, kinds, configs    |
//! | [`wire`]           | a peer whose bytes are wrong: wire versions, payloads        |
//! | [`deadlines`]      | deadlines and faults: slow, missing, after an error          |
//! | [`departures`]     | ranks that shut down, abort or close                         |
//! | [`decisions`]      | must-agree values, autotuning, cache-hit agreement           |
//! | [`tree`]           | the hierarchical exchange against the flat one               |
//!
//! A behaviour is a function registered next to it with `behaviour!`
//! (crate root); its module lists it in its `BEHAVIOURS`, and [`AREAS`]
//! lists the modules. A registered behaviour left out of its module's list
//! is an unused constant (a warning, an error under clippy's `-D warnings`).

use crate::{ensure, Behaviour};
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::{Error, RankGroup};

mod deadlines;
mod decisions;
mod departures;
mod desync;
mod exchange;
mod gathers;
mod point_to_point;
mod tree;
mod wire;

/// Every area's behaviours; their concatenation is [`crate::BEHAVIOURS`].
const AREAS: [&[Behaviour]; 9] = [
    gathers::BEHAVIOURS,
    point_to_point::BEHAVIOURS,
    exchange::BEHAVIOURS,
    desync::BEHAVIOURS,
    wire::BEHAVIOURS,
    deadlines::BEHAVIOURS,
    departures::BEHAVIOURS,
    decisions::BEHAVIOURS,
    tree::BEHAVIOURS,
];

/// Every behaviour, area by area.
pub(crate) const ALL: [Behaviour; count(&AREAS)] = concat(&AREAS);

const fn count(areas: &[&[Behaviour]]) -> usize {
    let (mut n, mut i) = (0, 0);
    while i < areas.len() {
        n += areas[i].len();
        i += 1;
    }
    n
}

/// `areas` one after the other (`N` is their [`count`]).
const fn concat<const N: usize>(areas: &[&[Behaviour]]) -> [Behaviour; N] {
    let mut all = [crate::HUNG_RANK; N];
    let (mut at, mut i) = (0, 0);
    while i < areas.len() {
        let mut j = 0;
        while j < areas[i].len() {
            all[at] = areas[i][j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(at == N, "N is not the count of the areas' behaviours");
    all
}

/// The frame state most behaviours exchange: `x` of shape `[batch, 10]` and
/// the scalar `n` = 3.
fn state(batch: u64) -> FrameState {
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([batch, 10]));
    s.record("n", &Observation::Int(3));
    s
}

/// `err` groups its ranks as `want` says: each group's ranks, and a text its
/// description contains, in order.
fn expect_groups(err: &Error, want: &[(&[u32], &str)]) -> Result<(), String> {
    let groups: &[RankGroup] = match err {
        Error::Desync { groups }
        | Error::VersionMismatch { groups }
        | Error::Disagreement { groups, .. } => groups,
        other => return Err(format!("expected grouped error, got {other}")),
    };
    ensure(groups.len() == want.len(), || {
        format!("groups {groups:?}, want {want:?}")
    })?;
    for (g, (ranks, what)) in groups.iter().zip(want) {
        ensure(g.ranks == *ranks && g.what.contains(what), || {
            format!("group {g:?}, want ranks {ranks:?} with '{what}' in {err}")
        })?;
    }
    Ok(())
}
