//! The in-process runner: every behaviour over threads of one process
//! ([`InProcessGroup`]), each case within a limit.

use crate::{ensure, Behaviour, Ctx, BEHAVIOURS, HUNG_RANK};
use compiler_collectives_core::InProcessGroup;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Held while a timed behaviour runs, so timing assertions are not disturbed
/// by other tests on a 2-core machine.
pub static TIMING_LOCK: Mutex<()> = Mutex::new(());

/// How long an in-process case may run before its unfinished ranks are
/// reported as hung (their threads are left behind; the test fails and the
/// binary goes on).
pub const IN_PROCESS_LIMIT: Duration = Duration::from_secs(60);

/// Runs `behaviour` on `world` in-process ranks (threads) and returns every
/// rank's result, index = rank, within [`IN_PROCESS_LIMIT`].
pub fn run_in_process(behaviour: &Behaviour, world: u32) -> Vec<Result<(), String>> {
    run_in_process_within(behaviour, world, IN_PROCESS_LIMIT)
}

/// [`run_in_process`] with another limit: a rank that has not finished
/// when `limit` has passed gets an `Err` saying it hung.
pub fn run_in_process_within(
    behaviour: &Behaviour,
    world: u32,
    limit: Duration,
) -> Vec<Result<(), String>> {
    let _guard = behaviour
        .timed
        .then(|| TIMING_LOCK.lock().unwrap_or_else(|e| e.into_inner()));
    let transports = match InProcessGroup::create(world) {
        Ok(t) => t,
        Err(e) => return vec![Err(e.to_string())],
    };
    let (tx, rx) = std::sync::mpsc::channel();
    for (r, t) in transports.into_iter().enumerate() {
        let ctx = Ctx {
            transport: Arc::new(t),
            timeout: Duration::from_secs(20),
            short_timeout: Duration::from_millis(1500),
            margin: Duration::from_secs(1),
        };
        let (run, tx) = (behaviour.run, tx.clone());
        std::thread::spawn(move || {
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&ctx)))
                .unwrap_or_else(|_| Err("rank panicked".into()));
            let _ = tx.send((r, res));
        });
    }
    drop(tx);
    let start = Instant::now();
    let mut results: Vec<Option<Result<(), String>>> = (0..world).map(|_| None).collect();
    while results.iter().any(Option::is_none) {
        let left = limit.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((r, res)) => results[r] = Some(res),
            Err(_) => break,
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(format!(
                    "hung: not finished at the case's limit of {} ms (its thread is left behind)",
                    limit.as_millis()
                ))
            })
        })
        .collect()
}

/// Asserts that every rank returned `Ok`, listing each failing rank.
///
/// # Panics
/// When a rank failed (this is a test helper).
pub fn assert_all_ok(name: &str, world: u32, results: &[Result<(), String>]) {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(r, res)| res.as_ref().err().map(|e| format!("rank {r}: {e}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{name} at world size {world}:\n{}",
        failures.join("\n")
    );
}

/// Every behaviour at each of `worlds` over the in-process engine (ranks
/// as threads), named `in_process::<behaviour>::world_<n>`, each within
/// [`IN_PROCESS_LIMIT`]; a world below a behaviour's smallest is listed as
/// ignored with the reason. Plus the runner's own hung-rank check.
pub fn in_process_trials(worlds: &[u32]) -> Vec<libtest_mimic::Trial> {
    use libtest_mimic::{Completion, Failed, Trial};
    let mut trials = Vec::new();
    for b in BEHAVIOURS {
        for &world in worlds {
            let name = format!("in_process::{}::world_{world}", b.name);
            if world < b.min_world {
                let why = format!("needs at least {} ranks", b.min_world);
                trials.push(Trial::ignorable_test(name, move || {
                    Ok(Completion::ignored_with(why))
                }));
                continue;
            }
            trials.push(Trial::test(name, move || {
                let failures: Vec<String> = run_in_process(b, world)
                    .iter()
                    .enumerate()
                    .filter_map(|(r, res)| res.as_ref().err().map(|e| format!("rank {r}: {e}")))
                    .collect();
                if failures.is_empty() {
                    Ok(())
                } else {
                    Err(Failed::from(failures.join("\n")))
                }
            }));
        }
    }
    trials.push(Trial::test(
        "in_process::harness::hung_rank_fails_at_the_limit",
        || hung_rank_check().map_err(Failed::from),
    ));
    trials
}

/// A rank that hangs on purpose makes its in-process case fail at the limit
/// (the hung thread is left behind) instead of blocking the test binary.
fn hung_rank_check() -> Result<(), String> {
    let limit = Duration::from_secs(2);
    let start = Instant::now();
    let results = run_in_process_within(&HUNG_RANK, 2, limit);
    let took = start.elapsed();
    ensure(
        took >= limit && took < limit + Duration::from_secs(2),
        || format!("the case ended after {took:?} (limit {limit:?})"),
    )?;
    let want = "hung: not finished at the case's limit of 2000 ms";
    // Rank 0 waits for rank 1 in an exchange with a 20 s deadline: it has
    // not finished either.
    for (r, res) in results.iter().enumerate() {
        ensure(res.as_ref().is_err_and(|e| e.starts_with(want)), || {
            format!("rank {r}: {res:?}")
        })?;
    }
    Ok(())
}
