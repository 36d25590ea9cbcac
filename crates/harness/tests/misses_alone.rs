//! docs/failures.md, exact missing-rank reports: one rank misses alone (its artifact cache is
//! cold) while two or three others finish and shut down at different
//! moments. 20 runs of each scenario file, collectives on and no guard
//! votes: the waiting rank's error names exactly the set of other ranks
//! every time — never only those that had left when it noticed — and comes
//! within the deadline + 1 s. A deadline bound, so this file holds one test.

use compiler_collectives_harness::scenario::{run_in_process, Mode, Scenario, ScenarioLimits};
use std::path::Path;
use std::time::{Duration, Instant};

const RUNS: usize = 20;

#[test]
fn the_rank_that_misses_alone_names_every_other_rank_every_time() {
    let deadline = Duration::from_secs(3);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios");
    for (file, alone) in [
        ("18_misses_alone_two_finish.json", 2),
        ("19_misses_alone_three_finish.json", 2),
    ] {
        let scenario = Scenario::from_file(&dir.join(file), &ScenarioLimits::default())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let others: Vec<u32> = (0..scenario.world_size).filter(|&r| r != alone).collect();
        let mut named = Vec::new();
        for run in 0..RUNS {
            let start = Instant::now();
            let report = run_in_process(&scenario, Mode::Collectives, deadline)
                .unwrap_or_else(|e| panic!("{file} run {run}: {e}"));
            let took = start.elapsed();
            assert!(
                took <= deadline + Duration::from_secs(1),
                "{file} run {run}: {took:?}"
            );
            for rank in &report.ranks {
                match (&rank.error, rank.rank == alone) {
                    (Some(e), true) => {
                        assert_eq!(e.kind, "peer_lost", "{file} run {run}: {}", e.message);
                        assert_eq!(e.exchange, Some(1), "{file} run {run}: {}", e.message);
                        named.push(e.missing_ranks.clone());
                    }
                    (None, false) => {}
                    (e, _) => panic!("{file} run {run} rank {}: {e:?}", rank.rank),
                }
            }
        }
        let exact = named.iter().filter(|n| **n == others).count();
        assert_eq!(
            exact, RUNS,
            "{file}: named {named:?}, want {others:?} every time"
        );
    }
}
