//! Running behaviours over real rank processes, for multi-process backends.
//!
//! A backend's test binary (without libtest's harness) is both the driver
//! and the rank: [`role`] says which. The driver starts one process of
//! itself per rank with [`spawn`], passing the role and rank through
//! environment variables; each rank connects its transport and calls
//! [`rank_behaviour`] or [`rank_kill_loop`]. [`run_cases`] runs cases one at a
//! time (deadline bounds are not disturbed by other tests) and prints
//! libtest-like lines.

use crate::{find, Capability, Ctx, BEHAVIOURS};
use compiler_collectives_core::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions, Transport};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The role of this process: unset for the driver.
pub const ROLE: &str = "CCOL_TEST_ROLE";
/// The rank of a rank process.
pub const RANK: &str = "CCOL_TEST_RANK";
/// The world size.
pub const WORLD: &str = "CCOL_TEST_WORLD";
/// A fresh directory per case, shared by its ranks (a file store, the linger barrier).
pub const DIR: &str = "CCOL_TEST_DIR";
/// The behaviour a rank runs.
pub const BEHAVIOUR: &str = "CCOL_TEST_BEHAVIOUR";

/// This process's role, if it is a rank.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// An integer environment variable the driver set.
///
/// # Panics
/// When it is missing (a harness bug).
pub fn env_u32(name: &str) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not set"))
}

/// Milliseconds since the Unix epoch (to compare times across processes).
pub fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// A barrier through the file system, outside the transport under test:
/// ranks stay alive until every rank has its verdict, as threads of one
/// process would (a rank that exits early looks like a lost peer).
pub fn linger(world: u32) {
    let dir = std::path::PathBuf::from(std::env::var(DIR).expect("dir"));
    let _ = std::fs::write(dir.join(format!("done-{}", env_u32(RANK))), b"");
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && !(0..world).all(|r| dir.join(format!("done-{r}")).exists()) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A rank process's body for a behaviour: runs the behaviour named in the
/// environment, lingers, prints `VERDICT ok` or `VERDICT fail …`; returns
/// the exit code.
pub fn rank_behaviour(transport: Arc<dyn Transport>) -> i32 {
    let name = std::env::var(BEHAVIOUR).expect("behaviour");
    let b = find(&name).expect("known behaviour");
    let ctx = Ctx {
        transport,
        timeout: Duration::from_secs(20),
        short_timeout: Duration::from_millis(1500),
        margin: Duration::from_secs(1),
    };
    let verdict = (b.run)(&ctx);
    linger(ctx.world());
    match verdict {
        Ok(()) => {
            println!("VERDICT ok");
            0
        }
        Err(e) => {
            println!("VERDICT fail {e}");
            1
        }
    }
}

/// A rank process that exchanges in a loop (rank-dependent shapes, so every
/// exchange takes the full path) until an error, then prints
/// `ERROR <kind> <ranks> <ms since epoch> <message>` and stays up 2 s (so
/// that each survivor reports the killed rank, not a survivor that exited).
pub fn rank_kill_loop(transport: Arc<dyn Transport>, deadline: Duration) -> i32 {
    let rank = transport.rank();
    let mut ch = Channel::with_options(transport, ChannelOptions::default().with_timeout(deadline))
        .expect("channel");
    println!("READY");
    for i in 0u64.. {
        let mut s = FrameState::new();
        s.record(
            "x",
            &Observation::tensor([u64::from(rank) + 2 + (i % 3), 8]),
        );
        if let Err(e) = ch.exchange("loop", "", &s) {
            println!(
                "ERROR {} {:?} {} {}",
                e.kind(),
                e.missing_ranks(),
                now_ms(),
                e
            );
            std::thread::sleep(Duration::from_secs(2));
            return 0;
        }
    }
    0
}

/// What one rank process printed and how it ended.
#[derive(Debug)]
pub struct RankResult {
    /// Exit code (`None`: killed, or killed by the driver at the limit).
    pub code: Option<i32>,
    /// Its stdout lines.
    pub lines: Vec<String>,
}

/// Starts `world` processes of this executable with `role`, a fresh shared
/// directory, and `env`. Returns the directory (keep it alive) and the children.
///
/// # Panics
/// When processes cannot be started (a harness failure).
pub fn spawn(world: u32, role: &str, env: &[(&str, String)]) -> (tempfile::TempDir, Vec<Child>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("own path");
    let children = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(ROLE, role)
                .env(RANK, r.to_string())
                .env(WORLD, world.to_string())
                .env(DIR, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().expect("spawn rank")
        })
        .collect();
    (dir, children)
}

/// Reads every child's output and waits for it, killing any still running
/// after `limit` in all.
pub fn collect(children: Vec<Child>, limit: Duration) -> Vec<RankResult> {
    let start = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            let lines: Vec<String> = c
                .stdout
                .take()
                .map(|out| BufReader::new(out).lines().map_while(Result::ok).collect())
                .unwrap_or_default();
            let mut code = None;
            while start.elapsed() < limit {
                if let Ok(Some(s)) = c.try_wait() {
                    code = s.code();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if code.is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
            RankResult { code, lines }
        })
        .collect()
}

/// Runs behaviour `name` on `world` rank processes (role `behaviour`) and
/// requires every rank's `VERDICT ok`.
///
/// # Errors
/// Each failing rank's exit code and output.
pub fn run_behaviour(name: &str, world: u32, env: &[(&str, String)]) -> Result<(), String> {
    let mut env = env.to_vec();
    env.push((BEHAVIOUR, name.to_owned()));
    let (_dir, children) = spawn(world, "behaviour", &env);
    let failures: Vec<String> = collect(children, Duration::from_secs(90))
        .iter()
        .enumerate()
        .filter(|(_, r)| r.code != Some(0) || !r.lines.iter().any(|l| l == "VERDICT ok"))
        .map(|(i, r)| format!("rank {i} (exit {:?}): {}", r.code, r.lines.join(" | ")))
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// 3 ranks (role `kill_loop`) exchange in a loop; the last is killed with
/// SIGKILL. Every survivor must name it (lost peer or timeout) within
/// `deadline` + 1 s of the kill; prints each survivor's latency. Returns the
/// slowest survivor's time from the kill to its error, in ms.
///
/// # Errors
/// What a survivor reported instead, or too late.
pub fn kill_trial(env: &[(&str, String)], deadline: Duration) -> Result<u128, String> {
    let (_dir, mut children) = spawn(3, "kill_loop", env);
    let mut victim = children.pop().ok_or("no victim")?;
    let mut reader = BufReader::new(victim.stdout.take().ok_or("stdout")?);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "READY" {
        return Err(format!("victim said {line:?}"));
    }
    std::thread::sleep(Duration::from_millis(250));
    victim.kill().map_err(|e| e.to_string())?;
    let killed_at = now_ms();
    let _ = victim.wait();
    let results = collect(children, deadline + Duration::from_secs(10));
    let mut worst = 0;
    for (r, res) in results.iter().enumerate() {
        let err = res
            .lines
            .iter()
            .find(|l| l.starts_with("ERROR "))
            .ok_or_else(|| format!("rank {r} printed no error: {:?}", res.lines))?;
        let parts: Vec<&str> = err.splitn(5, ' ').collect();
        let (kind, ranks) = (
            parts.get(1).copied().unwrap_or(""),
            parts.get(2).copied().unwrap_or(""),
        );
        let at = parts
            .get(3)
            .and_then(|t| t.parse::<u128>().ok())
            .unwrap_or(0);
        if !(kind == "peer_lost" || kind == "timeout") || ranks != "[2]" {
            return Err(format!("rank {r}: {err} (all ranks: {results:?})"));
        }
        let after = at.saturating_sub(killed_at);
        let bound = (deadline + Duration::from_secs(1)).as_millis();
        if after > bound {
            return Err(format!(
                "rank {r} reported {after} ms after the kill (bound {bound} ms): {err}"
            ));
        }
        println!("    rank {r}: {kind} naming [2], {after} ms after the kill");
        worst = worst.max(after);
    }
    Ok(worst)
}

/// `trials` SIGKILL trials ([`kill_trial`]) named
/// `<prefix>::sigkill_mid_exchange::trial_<i>`, each with a fresh `env()`,
/// then a `<prefix>::sigkill_mid_exchange::summary` case that prints the
/// number of trials that passed and the worst time from a kill to a
/// survivor's error, and fails unless every trial passed.
pub fn kill_cases(
    prefix: &str,
    trials: u32,
    deadline: Duration,
    env: fn() -> Vec<(&'static str, String)>,
) -> Vec<(String, Case)> {
    let worst: Arc<std::sync::Mutex<Vec<u128>>> = Arc::default();
    let mut cases: Vec<(String, Case)> = (0..trials)
        .map(|t| {
            let worst = Arc::clone(&worst);
            let case: Case = Box::new(move || {
                let ms = kill_trial(&env(), deadline)?;
                worst.lock().map_err(|e| e.to_string())?.push(ms);
                Ok(())
            });
            (format!("{prefix}::sigkill_mid_exchange::trial_{t}"), case)
        })
        .collect();
    let label = prefix.to_owned();
    let summary: Case = Box::new(move || {
        let done = worst.lock().map_err(|e| e.to_string())?;
        let max = done.iter().copied().max().unwrap_or(0);
        let bound = (deadline + Duration::from_secs(1)).as_millis();
        println!(
            "    SIGKILL summary ({label}): {}/{trials} trials passed; every survivor named the killed rank; \
             worst time-to-error {max} ms after the kill (deadline {} ms, bound {bound} ms)",
            done.len(),
            deadline.as_millis()
        );
        if done.len() == trials as usize {
            Ok(())
        } else {
            Err(format!("only {} of {trials} trials passed", done.len()))
        }
    });
    cases.push((format!("{prefix}::sigkill_mid_exchange::summary"), summary));
    cases
}

/// One case of a driver.
pub type Case = Box<dyn Fn() -> Result<(), String>>;

/// Named cases to run, and named cases skipped with their reason.
pub type Cases = (Vec<(String, Case)>, Vec<(String, String)>);

/// Every behaviour at each of `worlds`, named `<prefix>::<behaviour>::world_<n>`;
/// those needing a capability outside `has` go to the skipped list with the
/// reason. `env` gives each case's extra environment (e.g. a fresh port).
pub fn behaviour_cases(
    prefix: &str,
    worlds: &[u32],
    has: &'static [Capability],
    env: fn() -> Vec<(&'static str, String)>,
) -> Cases {
    let mut cases: Vec<(String, Case)> = Vec::new();
    let mut skipped = Vec::new();
    for b in BEHAVIOURS {
        for &world in worlds {
            if world < b.min_world {
                continue;
            }
            let name = format!("{prefix}::{}::world_{world}", b.name);
            if let Some(cap) = b.missing(has) {
                skipped.push((name, format!("{prefix} lacks {cap:?}")));
                continue;
            }
            let behaviour = b.name;
            cases.push((
                name,
                Box::new(move || run_behaviour(behaviour, world, &env())),
            ));
        }
    }
    (cases, skipped)
}

/// Runs the cases whose names contain one of the command-line filters (all
/// when none), one at a time; prints libtest-like lines and a closing
/// `test result:` line; returns the exit code.
pub fn run_cases(cases: Vec<(String, Case)>, skipped: Vec<(String, String)>) -> i32 {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let cases: Vec<_> = cases.into_iter().filter(|(n, _)| selected(n)).collect();
    let skipped: Vec<_> = skipped.into_iter().filter(|(n, _)| selected(n)).collect();
    println!("\nrunning {} tests", cases.len() + skipped.len());
    let (mut passed, mut failed) = (0, 0);
    let mut failures = Vec::new();
    for (name, case) in &cases {
        let start = Instant::now();
        match case() {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({} ms)", start.elapsed().as_millis());
            }
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED");
                failures.push(format!("---- {name} ----\n{e}"));
            }
        }
    }
    for (name, why) in &skipped {
        println!("test {name} ... skipped: {why}");
    }
    for f in &failures {
        println!("\n{f}");
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; {} ignored; 0 measured; 0 filtered out\n",
        skipped.len()
    );
    i32::from(failed > 0)
}
