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
        let g = ch
            .exchange(
                "soak_vote",
                "",
                &compiler_collectives_core::join::AnyVote(rank == 0),
            )
            .map_err(|e| format!("exchange {i}: {e}"))?;
        return if g.merged().0 {
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
        .exchange("soak", "", &s)
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
            "",
            &compiler_collectives_core::join::AnyVote(false),
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
    let (_dir, children) = spawn(world, "soak", env);
    let results = collect(children, Duration::from_secs(300));
    for (r, res) in results.iter().enumerate() {
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
    let (_dir, children) = spawn(3, "kill_loop", env);
    fault_trial(children, deadline, "the kill", true, |victim| {
        victim.kill().map_err(|e| e.to_string())
    })
}

/// The common part of fault trials: `children` (role `kill_loop`, see
/// [`rank_kill_loop`]) exchange in a loop; once the last says `READY` and a
/// quarter second has passed, `fault` strikes it (kill, cut its link, …).
/// Every other rank must then report an error naming the last rank (lost
/// peer or timeout) within `deadline` + 1 s. The victim is killed at the
/// end. Returns the slowest survivor's time to its error, in ms.
///
/// With `exact`, each survivor must name the victim alone. Without it — a
/// fault no survivor can see, like a cut link: a rank that got the victim's
/// last message moves on to the next exchange while another did not, and a
/// rank whose deadline passes first drops its connections — a survivor may
/// name other survivors instead of or besides the victim, provided the
/// victim is reachable from it by following the ranks each error names
/// (the rank it waited for was itself stuck on the victim).
///
/// # Errors
/// What a survivor reported instead, or too late; `fault`'s error.
pub fn fault_trial(
    mut children: Vec<Child>,
    deadline: Duration,
    what: &str,
    exact: bool,
    fault: impl FnOnce(&mut Child) -> Result<(), String>,
) -> Result<u128, String> {
    let victim_rank = children.len().saturating_sub(1);
    let mut victim = children.pop().ok_or("no victim")?;
    let mut reader = BufReader::new(victim.stdout.take().ok_or("stdout")?);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "READY" {
        let _ = victim.kill();
        return Err(format!("victim said {line:?}"));
    }
    std::thread::sleep(Duration::from_millis(250));
    let struck = fault(&mut victim);
    let struck_at = now_ms();
    let results = collect(children, deadline + Duration::from_secs(10));
    let _ = victim.kill();
    let _ = victim.wait();
    struck?;
    let victim = u32::try_from(victim_rank).map_err(|e| e.to_string())?;
    // Each survivor's (line, kind, named ranks, time).
    let mut reports = Vec::new();
    for (r, res) in results.iter().enumerate() {
        let err = res
            .lines
            .iter()
            .find(|l| l.starts_with("ERROR "))
            .ok_or_else(|| format!("rank {r} printed no error: {:?}", res.lines))?;
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
        let names_ok = if exact {
            *named == [victim]
        } else {
            leads_to_victim(r)
        };
        if !(*kind == "peer_lost" || *kind == "timeout") || !names_ok {
            return Err(format!("rank {r}: {err} (all ranks: {results:?})"));
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
/// `<prefix>::sigkill_mid_exchange::trial_<i>`, each with a fresh `env()`,
/// then their summary (see [`trial_cases`]).
pub fn kill_cases(
    prefix: &str,
    trials: u32,
    deadline: Duration,
    env: fn() -> Vec<(&'static str, String)>,
) -> Vec<(String, Case)> {
    trial_cases(
        &format!("{prefix}::sigkill_mid_exchange"),
        "SIGKILL",
        trials,
        deadline,
        move || kill_trial(&env(), deadline),
    )
}

/// `trials` cases named `<name>::trial_<i>` that each run `trial` (which
/// returns the worst time from its fault to a survivor's error, in ms), then
/// a `<name>::summary` case that prints how many trials passed and the worst
/// time-to-error over all of them, and fails unless every trial passed.
pub fn trial_cases(
    name: &str,
    fault: &str,
    trials: u32,
    deadline: Duration,
    trial: impl Fn() -> Result<u128, String> + 'static,
) -> Vec<(String, Case)> {
    let trial = Arc::new(trial);
    let worst: Arc<std::sync::Mutex<Vec<u128>>> = Arc::default();
    let mut cases: Vec<(String, Case)> = (0..trials)
        .map(|t| {
            let (worst, trial) = (Arc::clone(&worst), Arc::clone(&trial));
            let case: Case = Box::new(move || {
                let ms = trial()?;
                worst.lock().map_err(|e| e.to_string())?.push(ms);
                Ok(())
            });
            (format!("{name}::trial_{t}"), case)
        })
        .collect();
    let (label, fault) = (name.to_owned(), fault.to_owned());
    let summary: Case = Box::new(move || {
        let done = worst.lock().map_err(|e| e.to_string())?;
        let max = done.iter().copied().max().unwrap_or(0);
        let bound = (deadline + Duration::from_secs(1)).as_millis();
        println!(
            "    {fault} summary ({label}): {}/{trials} trials passed (every survivor reported a typed error leading to the struck rank); \
             worst time-to-error {max} ms (deadline {} ms, bound {bound} ms)",
            done.len(),
            deadline.as_millis()
        );
        if done.len() == trials as usize {
            Ok(())
        } else {
            Err(format!("only {} of {trials} trials passed", done.len()))
        }
    });
    cases.push((format!("{name}::summary"), summary));
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
