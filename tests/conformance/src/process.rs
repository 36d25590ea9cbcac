//! Running behaviours over real rank processes, for multi-process backends.
//!
//! A backend's conformance file is a test binary on this harness
//! (`harness = false`, [libtest-mimic](libtest_mimic)) that is both the
//! driver and the rank: [`role`] says which. The file declares its
//! [`Backend`] — name, world sizes and capability set, written out in the
//! file — and how a rank connects; the driver starts one process of itself
//! per rank ([`spawn`]), passing the role and rank through environment
//! variables, and each rank connects its transport and calls
//! [`rank_behaviour`] or [`rank_kill_loop`].
//!
//! **Nothing waits on a rank without a bound.** Ranks' output is read on
//! threads ([`Ranks`]); every case has a hard limit ([`CASE_LIMIT`] for a
//! behaviour), at which its ranks are killed and the case fails with what
//! each printed. [`harness_trials`] proves it on every backend: a rank that
//! hangs on purpose ([`crate::HUNG_RANK`]) must make its case fail at the
//! limit. Cases run one at a time ([`run`]), so deadline bounds are not
//! disturbed by other cases on a 2-core machine.

pub use crate::ranks::{run_within, Finished, OutputWithin, RankResult, Ranks};
use crate::skip::{skip_trial, Missing};
use crate::{find, Ctx, BEHAVIOURS};
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::{Capabilities, Channel, ChannelOptions, Transport};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::process::{Child, Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The hard limit of one behaviour case, from the start of its ranks:
/// rendezvous (at most 30 s in the suites) plus a behaviour (each waits at
/// most a few deadlines of [`Ctx::timeout`] or [`Ctx::short_timeout`]).
pub const CASE_LIMIT: Duration = Duration::from_secs(90);

/// The limit the hung-rank check runs under ([`harness_trials`]).
pub const HUNG_LIMIT: Duration = Duration::from_secs(10);

/// A multi-process backend as its conformance file declares it.
#[derive(Debug, Clone)]
pub struct Backend {
    /// The prefix of its case names (`gloo` → `gloo::<behaviour>::world_2`).
    pub name: &'static str,
    /// The world sizes every behaviour runs at.
    pub worlds: Vec<u32>,
    /// What it can do, written out in its file: behaviours that need a
    /// capability outside it are listed as skipped with the reason, and
    /// every rank of every case checks that its transport reports exactly
    /// this set ([`CAPABILITIES`]).
    pub capabilities: Capabilities,
}

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
/// The capabilities the backend's file declares (`{:?}` of
/// [`Capabilities`]), which every rank compares with its transport's.
pub const CAPABILITIES: &str = "CCOL_TEST_CAPABILITIES";

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
    let declared = std::env::var(CAPABILITIES).ok();
    let actual = format!("{:?}", ctx.transport.capabilities());
    let verdict = match declared {
        Some(d) if d != actual => Err(format!(
            "the transport reports {actual}, its conformance file declares {d}"
        )),
        _ => (b.run)(&ctx),
    };
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
        if let Err(e) = ch.exchange("loop", &s) {
            let ranks: Vec<String> = e.missing_ranks().iter().map(u32::to_string).collect();
            println!(
                "ERROR {} [{}] {} {}",
                e.kind(),
                ranks.join(","),
                now_ms(),
                e
            );
            std::thread::sleep(Duration::from_secs(2));
            return 0;
        }
    }
    0
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), in KiB;
/// `None` where the file is unavailable (not Linux).
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The number of entries under `dir`, recursively (store files).
pub fn count_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .map(|e| {
                let p = e.path();
                if p.is_dir() {
                    1 + count_files(&p)
                } else {
                    1
                }
            })
            .sum()
    })
}

/// The soak's exchange `i` on one rank: odd exchanges take the full path
/// (rank-dependent shapes), even ones the digest fast path; every fourth is
/// a vote. Checks the merged result.
///
/// # Errors
/// The exchange's error, or a wrong result.
pub fn soak_exchange(ch: &mut Channel, i: u64) -> Result<(), String> {
    let rank = u64::from(ch.rank());
    if i % 4 == 0 {
        let vote = compiler_collectives_core::decisions::votes::AnyVote(rank == 0);
        let g = ch
            .exchange("soak_vote", &vote)
            .map_err(|e| format!("exchange {i}: {e}"))?;
        return if g.any() {
            Ok(())
        } else {
            Err(format!("vote {i} lost rank 0's yes"))
        };
    }
    let batch = if i % 2 == 1 { 2 + rank } else { 2 };
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([batch, 8]));
    s.record("n", &Observation::Int(7));
    let g = ch
        .exchange("soak", &s)
        .map_err(|e| format!("exchange {i}: {e}"))?;
    let x = g.merged().get("x").size.to_string();
    let want = if i % 2 == 1 && ch.world_size() > 1 {
        "(Dyn,8)"
    } else {
        "(2,8)"
    };
    if x == want {
        Ok(())
    } else {
        Err(format!("exchange {i}: x = {x}, want {want}"))
    }
}

/// Resident memory growth over a soak: `warmup` exchanges, then RSS, then
/// `n` more, then RSS. Returns `(rss after warm-up, rss after, KiB)`.
///
/// # Errors
/// An exchange's error, or no `/proc/self/status`.
pub fn soak(ch: &mut Channel, warmup: u64, n: u64) -> Result<(u64, u64), String> {
    for i in 0..warmup {
        soak_exchange(ch, i)?;
    }
    let before = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
    for i in warmup..warmup + n {
        soak_exchange(ch, i)?;
    }
    let after = rss_kib().ok_or("no VmRSS in /proc/self/status")?;
    Ok((before, after))
}

/// A rank process that soaks a channel over `transport` (see [`soak`]) and
/// prints `SOAK <rss after warm-up KiB> <rss after KiB> <files after
/// warm-up> <files after>`, the files being those under the case's shared
/// directory (a file store's keys); returns the exit code.
pub fn rank_soak(transport: Arc<dyn Transport>, warmup: u64, n: u64) -> i32 {
    let dir = std::path::PathBuf::from(std::env::var(DIR).expect("dir"));
    let opts = ChannelOptions::default().with_timeout(Duration::from_secs(60));
    let run = || -> Result<String, String> {
        let mut ch = Channel::with_options(transport, opts).map_err(|e| e.to_string())?;
        let (before, _) = soak(&mut ch, warmup, 0)?;
        let files_before = count_files(&dir);
        let (_, after) = soak(&mut ch, 0, n)?;
        // Every rank has finished its last exchange before anyone counts.
        ch.exchange(
            "soak_end",
            &compiler_collectives_core::decisions::votes::AnyVote(false),
        )
        .map_err(|e| e.to_string())?;
        let files_after = count_files(&dir);
        Ok(format!(
            "SOAK {before} {after} {files_before} {files_after}"
        ))
    };
    let out = run();
    linger(env_u32(WORLD));
    match out {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            println!("VERDICT fail {e}");
            1
        }
    }
}

/// Runs `world` soak ranks (role `soak`, see [`rank_soak`]) and checks that
/// every rank's resident memory grew by less than 1 MiB and that no file
/// appeared in the store's directory; prints each rank's figures.
///
/// # Errors
/// A rank's failure, too much growth, or files that accumulated.
pub fn soak_case(prefix: &str, world: u32, env: &[(&str, String)], n: u64) -> Result<(), String> {
    let start = Instant::now();
    let (_dir, ranks) = spawn(world, "soak", env)?;
    let done = ranks.finish(Duration::from_secs(300));
    done.within_limit()?;
    for (r, res) in done.ranks.iter().enumerate() {
        let line = res
            .lines
            .iter()
            .find(|l| l.starts_with("SOAK "))
            .ok_or_else(|| format!("rank {r} (exit {:?}): {}", res.code, res.lines.join(" | ")))?;
        let v: Vec<u64> = line
            .split(' ')
            .skip(1)
            .map(|x| x.parse().unwrap_or(u64::MAX))
            .collect();
        let [before, after, files_before, files_after] = v[..] else {
            return Err(format!("rank {r}: {line}"));
        };
        let growth = after.saturating_sub(before);
        println!(
            "    {prefix} soak rank {r}: {n} exchanges after warm-up in {:.1} s; VmRSS {before} KiB -> {after} KiB (+{growth} KiB); store files {files_before} -> {files_after}",
            start.elapsed().as_secs_f64()
        );
        if growth >= 1024 {
            return Err(format!("rank {r}: resident memory grew by {growth} KiB"));
        }
        if files_after > files_before {
            return Err(format!(
                "rank {r}: store files grew from {files_before} to {files_after}"
            ));
        }
    }
    Ok(())
}

/// Starts `world` processes of this executable with `role`, a fresh shared
/// directory ([`DIR`]), and `env`. Returns the directory (keep it alive
/// while the ranks run) and the ranks.
///
/// # Errors
/// When the directory or a process cannot be made.
pub fn spawn(
    world: u32,
    role: &str,
    env: &[(&str, String)],
) -> Result<(tempfile::TempDir, Ranks), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("case directory: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let commands = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(ROLE, role)
                .env(RANK, r.to_string())
                .env(WORLD, world.to_string())
                .env(DIR, dir.path());
            for (k, v) in env {
                c.env(k, v);
            }
            c
        })
        .collect();
    Ok((dir, Ranks::start(commands)?))
}

/// Runs behaviour `name` on `world` rank processes (role `behaviour`)
/// under `limit` and requires every rank's `VERDICT ok`.
///
/// # Errors
/// A rank still running at the limit (all are killed; the text shows what
/// each printed), or each failing rank's exit code and output.
pub fn run_behaviour(
    name: &str,
    world: u32,
    env: &[(&str, String)],
    limit: Duration,
) -> Result<(), String> {
    let mut env = env.to_vec();
    env.push((BEHAVIOUR, name.to_owned()));
    let (_dir, ranks) = spawn(world, "behaviour", &env)?;
    let done = ranks.finish(limit);
    done.within_limit()?;
    if done.ranks.iter().all(|r| r.ok_with("VERDICT ok")) {
        Ok(())
    } else {
        Err(format!("a rank failed:\n{}", done.describe()))
    }
}

/// A harness case running `body`: its text error becomes the case's
/// failure.
pub fn trial(
    name: impl Into<String>,
    body: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Trial {
    Trial::test(name, move || body().map_err(Failed::from))
}

/// Every behaviour at each of the backend's world sizes, named
/// `<backend>::<behaviour>::world_<n>`, each under [`CASE_LIMIT`]; those
/// needing a capability the backend lacks are ignored with the reason.
/// `env` gives each case's extra environment.
pub fn behaviour_trials(backend: &Backend, env: fn() -> Vec<(&'static str, String)>) -> Vec<Trial> {
    let mut trials = Vec::new();
    for b in BEHAVIOURS {
        for &world in &backend.worlds {
            if world < b.min_world {
                continue;
            }
            let name = format!("{}::{}::world_{world}", backend.name, b.name);
            if let Some(cap) = b.missing(&backend.capabilities) {
                let why = format!("{} lacks {cap:?}", backend.name);
                trials.push(skipped_trial(name, Missing::machine(why)));
                continue;
            }
            let behaviour = b.name;
            let caps = format!("{:?}", backend.capabilities);
            trials.push(trial(name, move || {
                let mut env = env();
                env.push((CAPABILITIES, caps));
                run_behaviour(behaviour, world, &env, CASE_LIMIT)
            }));
        }
    }
    trials
}

/// The harness's own check, run on every backend: a rank that hangs on
/// purpose inside a behaviour ([`crate::HUNG_RANK`], the last of 2 ranks)
/// must make its case fail at [`HUNG_LIMIT`], with the ranks killed and the
/// hung rank's output in the failure; the check passes when that failure
/// came within the limit + 3 s. Prints the measured time.
pub fn harness_trials(backend: &Backend, env: fn() -> Vec<(&'static str, String)>) -> Vec<Trial> {
    let name = format!("{}::harness::hung_rank_fails_at_the_limit", backend.name);
    vec![trial(name, move || {
        let start = Instant::now();
        let res = run_behaviour(crate::HUNG_RANK.name, 2, &env(), HUNG_LIMIT);
        let took = start.elapsed();
        let err = match res {
            Ok(()) => return Err("a case with a hung rank passed".into()),
            Err(e) => e,
        };
        if !err.starts_with("hung: rank(s) [") || !err.contains(crate::HUNG_MARK) {
            return Err(format!(
                "the failure does not name the hung rank with its output:\n{err}"
            ));
        }
        let bound = HUNG_LIMIT + Duration::from_secs(3);
        if took < HUNG_LIMIT || took > bound {
            return Err(format!(
                "failed after {} ms, outside [{} ms, {} ms]",
                took.as_millis(),
                HUNG_LIMIT.as_millis(),
                bound.as_millis()
            ));
        }
        let shown: Vec<&str> = err.lines().take(4).collect();
        println!(
            "    hung rank: the case failed {} ms after its ranks started (limit {} ms); its failure began:\n      {}",
            took.as_millis(),
            HUNG_LIMIT.as_millis(),
            shown.join("\n      ")
        );
        Ok(())
    })]
}

/// 3 ranks (role `kill_loop`) exchange in a loop; the last is killed with
/// SIGKILL. Every survivor must name it (lost peer or timeout) within
/// `deadline` + 1 s of the kill; prints each survivor's latency. Returns the
/// slowest survivor's time from the kill to its error, in ms.
///
/// # Errors
/// What a survivor reported instead, or too late.
pub fn kill_trial(env: &[(&str, String)], deadline: Duration) -> Result<u128, String> {
    let (_dir, ranks) = spawn(3, "kill_loop", env)?;
    fault_trial(ranks, deadline, "the kill", true, |victim| {
        victim.kill().map_err(|e| e.to_string())
    })
}

/// How long the victim of a fault trial may take to say `READY`
/// (rendezvous included).
const READY_LIMIT: Duration = Duration::from_secs(60);

/// The common part of fault trials: `ranks` (role `kill_loop`, see
/// [`rank_kill_loop`]) exchange in a loop; once the last says `READY` and a
/// quarter second has passed, `fault` strikes it (kill, cut its link, …).
/// Every other rank must then report an error naming the last rank (lost
/// peer or timeout) within `deadline` + 1 s; the survivors are killed at
/// `deadline` + 10 s, the victim at the end. Returns the slowest
/// survivor's time to its error, in ms.
///
/// With `exact`, each survivor must name the victim alone — or, as aborted,
/// survivors that had already failed on the victim when it reached its
/// exchange (docs/failures.md: every rank not in it), whose own errors name the
/// victim. Without it — a
/// fault no survivor can see, like a cut link: a rank that got the victim's
/// last message moves on to the next exchange while another did not, and a
/// rank whose deadline passes first drops its connections — a survivor may
/// name other survivors instead of or besides the victim, provided the
/// victim is reachable from it by following the ranks each error names
/// (the rank it waited for was itself stuck on the victim).
///
/// # Errors
/// What a survivor reported instead, or too late; `fault`'s error; a rank
/// still running at the limit.
pub fn fault_trial(
    mut ranks: Ranks,
    deadline: Duration,
    what: &str,
    exact: bool,
    fault: impl FnOnce(&mut Child) -> Result<(), String>,
) -> Result<u128, String> {
    let victim_rank = ranks.len().checked_sub(1).ok_or("no victim")?;
    let ready = ranks.wait_line(victim_rank, READY_LIMIT, |l| l.trim() == "READY");
    if ready.is_none() {
        let lines = ranks.lines(victim_rank);
        return Err(format!(
            "the victim (rank {victim_rank}) did not say READY within {} s: {lines:?}",
            READY_LIMIT.as_secs()
        ));
    }
    std::thread::sleep(Duration::from_millis(250));
    let struck = fault(ranks.child_mut(victim_rank));
    let struck_at = now_ms();
    let done = ranks.finish_some(deadline + Duration::from_secs(10), |r| r != victim_rank);
    struck?;
    done.within_limit()?;
    let results = &done.ranks[..victim_rank];
    let victim = u32::try_from(victim_rank).map_err(|e| e.to_string())?;
    // Each survivor's (line, kind, named ranks, time).
    let mut reports = Vec::new();
    for (r, res) in results.iter().enumerate() {
        let err = res
            .lines
            .iter()
            .find(|l| l.starts_with("ERROR "))
            .ok_or_else(|| format!("rank {r} printed no error:\n{}", done.describe()))?;
        let parts: Vec<&str> = err.splitn(5, ' ').collect();
        let kind = parts.get(1).copied().unwrap_or("");
        let named: Vec<u32> = parts
            .get(2)
            .unwrap_or(&"")
            .trim_matches(['[', ']'])
            .split(',')
            .filter_map(|x| x.parse().ok())
            .collect();
        let at = parts
            .get(3)
            .and_then(|t| t.parse::<u128>().ok())
            .unwrap_or(0);
        reports.push((err, kind, named, at));
    }
    let mut worst = 0;
    // Whether following named ranks from survivor `r` reaches the victim.
    let leads_to_victim = |r: usize| {
        let mut seen = vec![false; reports.len()];
        let mut todo = vec![r];
        while let Some(x) = todo.pop() {
            if std::mem::replace(&mut seen[x], true) {
                continue;
            }
            for &o in &reports[x].2 {
                if o == victim {
                    return true;
                }
                if (o as usize) < reports.len() {
                    todo.push(o as usize);
                }
            }
        }
        false
    };
    for (r, (err, kind, named, at)) in reports.iter().enumerate() {
        // A survivor may also name, as aborted, survivors that failed on
        // the victim before it reached this exchange (they are not in it),
        // provided their own errors lead to the victim.
        let aborted_survivors = !named.is_empty()
            && named
                .iter()
                .all(|&o| o != victim && (o as usize) < reports.len())
            && err.contains("aborted")
            && leads_to_victim(r);
        let names_ok = if exact {
            *named == [victim] || aborted_survivors
        } else {
            leads_to_victim(r)
        };
        if !(*kind == "peer_lost" || *kind == "timeout") || !names_ok {
            return Err(format!("rank {r}: {err}\n{}", done.describe()));
        }
        let after = at.saturating_sub(struck_at);
        let bound = (deadline + Duration::from_secs(1)).as_millis();
        if after > bound {
            return Err(format!(
                "rank {r} reported {after} ms after {what} (bound {bound} ms): {err}"
            ));
        }
        let message = err.splitn(5, ' ').nth(4).unwrap_or("");
        println!("    rank {r}: {kind} naming {named:?}, {after} ms after {what}: {message}");
        worst = worst.max(after);
    }
    Ok(worst)
}

/// `trials` SIGKILL trials ([`kill_trial`]) named
/// `<backend>::sigkill_mid_exchange::trial_<i>`, each with a fresh `env()`,
/// then their summary (see [`trial_cases`]).
pub fn kill_trials(
    backend: &Backend,
    trials: u32,
    deadline: Duration,
    env: fn() -> Vec<(&'static str, String)>,
) -> Vec<Trial> {
    trial_cases(
        &format!("{}::sigkill_mid_exchange", backend.name),
        "SIGKILL",
        trials,
        deadline,
        move || kill_trial(&env(), deadline),
    )
}

/// `trials` cases named `<name>::trial_<i>` that each run `trial` (which
/// returns the worst time from its fault to a survivor's error, in ms), then
/// a `<name>::summary` case that prints how many trials passed and the worst
/// time-to-error over all of them, and fails unless every trial that ran
/// passed (it is ignored when a filter ran none).
pub fn trial_cases(
    name: &str,
    fault: &str,
    trials: u32,
    deadline: Duration,
    trial: impl Fn() -> Result<u128, String> + Send + Sync + 'static,
) -> Vec<Trial> {
    let trial = Arc::new(trial);
    let outcomes: Arc<Mutex<Vec<Result<u128, String>>>> = Arc::default();
    let mut cases: Vec<Trial> = (0..trials)
        .map(|t| {
            let (outcomes, trial) = (Arc::clone(&outcomes), Arc::clone(&trial));
            Trial::test(format!("{name}::trial_{t}"), move || {
                // Counted as failed until it returns (a panic leaves it so).
                let slot = {
                    let mut o = outcomes.lock().unwrap_or_else(|e| e.into_inner());
                    o.push(Err("panicked".into()));
                    o.len() - 1
                };
                let res = trial();
                outcomes.lock().unwrap_or_else(|e| e.into_inner())[slot] = res.clone();
                res.map(|_| ()).map_err(Failed::from)
            })
        })
        .collect();
    let (label, fault) = (name.to_owned(), fault.to_owned());
    cases.push(Trial::ignorable_test(format!("{name}::summary"), move || {
        let done = outcomes.lock().unwrap_or_else(|e| e.into_inner());
        if done.is_empty() {
            return Ok(Completion::ignored_with("no trial of it ran (filtered out)"));
        }
        let passed: Vec<u128> = done.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
        let max = passed.iter().copied().max().unwrap_or(0);
        let bound = (deadline + Duration::from_secs(1)).as_millis();
        println!(
            "    {fault} summary ({label}): {}/{} trials passed (every survivor reported a typed error leading to the struck rank); \
             worst time-to-error {max} ms (deadline {} ms, bound {bound} ms)",
            passed.len(),
            done.len(),
            deadline.as_millis()
        );
        if passed.len() == done.len() {
            Ok(Completion::Completed)
        } else {
            Err(format!("only {} of {} trials passed", passed.len(), done.len()).into())
        }
    }));
    cases
}

/// A case ignored with `missing`'s reason, or failing where the skip rule
/// says so ([`crate::skip::verdict`]).
pub fn skipped_trial(name: impl Into<String>, missing: Missing) -> Trial {
    let name = name.into();
    Trial::ignorable_test(name.clone(), move || skip_trial(&name, missing))
}

/// A case that runs `body`, which may skip itself with a [`Missing`]
/// reason (subject to the skip rule) or fail with its text.
pub fn trial_or_skip(
    name: impl Into<String>,
    body: impl FnOnce() -> Result<(), Outcome> + Send + 'static,
) -> Trial {
    let name = name.into();
    Trial::ignorable_test(name.clone(), move || match body() {
        Ok(()) => Ok(Completion::Completed),
        Err(Outcome::Skip(m)) => skip_trial(&name, m),
        Err(Outcome::Fail(e)) => Err(Failed::from(e)),
    })
}

/// How a case that may skip itself did not pass.
#[derive(Debug)]
pub enum Outcome {
    /// It cannot run here (subject to the skip rule).
    Skip(Missing),
    /// It failed.
    Fail(String),
}

impl From<String> for Outcome {
    fn from(e: String) -> Self {
        Outcome::Fail(e)
    }
}

/// Runs `trials` with libtest's command line on libtest's threads (for
/// in-process cases: timed behaviours serialise themselves on
/// [`crate::TIMING_LOCK`]); returns the exit code.
pub fn run_concurrently(trials: Vec<Trial>) -> ExitCode {
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// Runs `trials` one at a time with libtest's command line (filters,
/// `--list`, `--exact`, `--skip`, …) and returns the exit code.
pub fn run(trials: Vec<Trial>) -> ExitCode {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    libtest_mimic::run(&args, trials).exit_code()
}

/// Publishes `value` under `name` in the case's directory ([`DIR`]) for
/// the other ranks (written to a temporary file, then renamed, so a reader
/// never sees half of it): how a rank shares what only it knows, such as
/// the port a store server bound.
///
/// # Errors
/// When the directory is unset or not writable.
pub fn publish(name: &str, value: &str) -> Result<(), String> {
    let dir = std::path::PathBuf::from(std::env::var(DIR).map_err(|_| format!("{DIR} not set"))?);
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, value).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| format!("publishing {name}: {e}"))
}

/// Waits up to `limit` for the value another rank [`publish`]ed as `name`.
///
/// # Errors
/// When it did not appear in time.
pub fn fetch(name: &str, limit: Duration) -> Result<String, String> {
    let dir = std::path::PathBuf::from(std::env::var(DIR).map_err(|_| format!("{DIR} not set"))?);
    let until = Instant::now() + limit;
    loop {
        if let Ok(v) = std::fs::read_to_string(dir.join(name)) {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(format!(
                "no '{name}' published within {} ms",
                limit.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The roles a conformance file's rank processes take: a `behaviour` or
/// `kill_loop` rank runs it over `connect()` and exits with its code; any
/// other process (the driver, or a role of the file's own) returns.
pub fn exit_if_rank(connect: fn() -> Arc<dyn Transport>, kill_deadline: Duration) {
    let code = match role().as_deref() {
        Some("behaviour") => rank_behaviour(connect()),
        Some("kill_loop") => rank_kill_loop(connect(), kill_deadline),
        _ => return,
    };
    std::process::exit(code);
}
