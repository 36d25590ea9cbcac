//! The shared conformance suite over libtorch's c10d (TCPStore +
//! ProcessGroupGloo) with real processes, at 2 and 3 ranks.
//!
//! A test binary without libtest's harness: as a test it is the driver,
//! starting one process of itself per rank (the role comes from environment
//! variables), one case at a time. Behaviours that need a capability c10d
//! lacks are listed as skipped with the reason. Arguments filter cases.

use compiler_collectives_conformance::{find, Capability, Ctx, BEHAVIOURS};
use compiler_collectives_core::Transport;
use compiler_collectives_tch::{C10dProcessGroup, C10dStore, C10dTransport};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROLE: &str = "CCOL_TEST_ROLE";
const RANK: &str = "CCOL_TEST_RANK";
const WORLD: &str = "CCOL_TEST_WORLD";
const PORT: &str = "CCOL_TEST_PORT";
const DIR: &str = "CCOL_TEST_DIR";
const BEHAVIOUR: &str = "CCOL_TEST_BEHAVIOUR";

/// What c10d gives: missing ranks are named (the store post-mortem); a rank
/// that leaves cannot interrupt peers blocked in c10d.
const HAS: &[Capability] = &[Capability::NamesMissingRanks];
const KILL_TRIALS: u32 = 5;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("behaviour") => std::process::exit(rank_behaviour()),
        Ok("kill_loop") => std::process::exit(rank_kill_loop()),
        _ => {}
    }
    std::process::exit(driver());
}

fn env_u32(name: &str) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not set"))
}

fn connect() -> Arc<dyn Transport> {
    let rank = env_u32(RANK);
    let world = env_u32(WORLD);
    let port = u16::try_from(env_u32(PORT)).expect("port");
    let t = Duration::from_secs(30);
    let store = C10dStore::tcp("127.0.0.1", port, world, rank == 0, true, t).expect("TCPStore");
    let scoped = store.prefixed("conformance").expect("prefix");
    let pg =
        C10dProcessGroup::gloo(&scoped, rank, world, "127.0.0.1", t).expect("ProcessGroupGloo");
    Arc::new(C10dTransport::new(pg, scoped))
}

fn rank_behaviour() -> i32 {
    let name = std::env::var(BEHAVIOUR).expect("behaviour");
    let b = find(&name).expect("known behaviour");
    let ctx = Ctx {
        transport: connect(),
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

/// A barrier through the file system, outside the transport under test.
fn linger(world: u32) {
    let dir = std::path::PathBuf::from(std::env::var(DIR).expect("dir"));
    let _ = std::fs::write(dir.join(format!("done-{}", env_u32(RANK))), b"");
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && !(0..world).all(|r| dir.join(format!("done-{r}")).exists()) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Exchanges in a loop until an error; prints its kind, ranks and time.
fn rank_kill_loop() -> i32 {
    use compiler_collectives_core::shapes::{FrameState, Observation};
    use compiler_collectives_core::{Channel, ChannelOptions};
    let t = connect();
    let rank = t.rank();
    let mut ch = Channel::with_options(t, ChannelOptions::default().with_timeout(KILL_DEADLINE))
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

/// 3 ranks exchange in a loop; the last is killed with SIGKILL. Every
/// survivor must name it (lost peer or timeout) within the deadline + 1 s.
fn kill_trial() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port().to_string();
    let mut children = Vec::new();
    for r in 0..3u32 {
        children.push(
            Command::new(&exe)
                .env(ROLE, "kill_loop")
                .env(RANK, r.to_string())
                .env(WORLD, "3")
                .env(PORT, &port)
                .env(DIR, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?,
        );
    }
    let mut victim = children.pop().ok_or("no victim")?;
    let mut reader = BufReader::new(victim.stdout.take().ok_or("stdout")?);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "READY" {
        return Err(format!("victim said {line:?}"));
    }
    std::thread::sleep(Duration::from_millis(300));
    victim.kill().map_err(|e| e.to_string())?;
    let killed_at = now_ms();
    let _ = victim.wait();
    let mut all = Vec::new();
    for mut c in children {
        let out = c.stdout.take().ok_or("stdout")?;
        let lines: Vec<String> = BufReader::new(out).lines().map_while(Result::ok).collect();
        let _ = c.wait();
        all.push(lines);
    }
    let context = |r: usize| format!("(kill at {killed_at}; all ranks: {all:?}, rank {r})");
    for (r, lines) in all.iter().enumerate() {
        let err = lines
            .iter()
            .find(|l| l.starts_with("ERROR "))
            .ok_or_else(|| format!("rank {r} printed no error: {lines:?}"))?;
        let parts: Vec<&str> = err.splitn(5, ' ').collect();
        let (kind, ranks, at) = (parts[1], parts[2], parts[3].parse::<u128>().unwrap_or(0));
        if !(kind == "peer_lost" || kind == "timeout") || ranks != "[2]" {
            return Err(format!("rank {r}: {err} {}", context(r)));
        }
        let after = at.saturating_sub(killed_at);
        let bound = (KILL_DEADLINE + Duration::from_secs(1)).as_millis();
        if after > bound {
            return Err(format!(
                "rank {r} reported {after} ms after the kill (bound {bound} ms): {err}"
            ));
        }
        println!("    rank {r}: {kind} naming [2], {after} ms after the kill");
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn run_behaviour(name: &str, world: u32) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let port = free_port().to_string();
    let mut children = Vec::new();
    for r in 0..world {
        let child = Command::new(&exe)
            .env(ROLE, "behaviour")
            .env(RANK, r.to_string())
            .env(WORLD, world.to_string())
            .env(PORT, &port)
            .env(DIR, dir.path())
            .env(BEHAVIOUR, name)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push(child);
    }
    let start = Instant::now();
    let mut failures = Vec::new();
    for (r, mut c) in children.into_iter().enumerate() {
        let out = c.stdout.take().expect("piped");
        let lines: Vec<String> = BufReader::new(out).lines().map_while(Result::ok).collect();
        let mut code = None;
        while start.elapsed() < Duration::from_secs(90) {
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
        if code != Some(0) || !lines.iter().any(|l| l == "VERDICT ok") {
            failures.push(format!("rank {r} (exit {code:?}): {}", lines.join(" | ")));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn driver() -> i32 {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected = |n: &str| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str()));
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut failures = Vec::new();
    let mut count = 0;
    for b in BEHAVIOURS {
        for world in [2u32, 3] {
            let name = format!("c10d::{}::world_{world}", b.name);
            if world < b.min_world || !selected(&name) {
                continue;
            }
            count += 1;
            if let Some(cap) = b.missing(HAS) {
                skipped += 1;
                println!("test {name} ... skipped: c10d lacks {cap:?}");
                continue;
            }
            let start = Instant::now();
            match run_behaviour(b.name, world) {
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
    }
    for t in 0..KILL_TRIALS {
        let name = format!("c10d::sigkill_mid_exchange::trial_{t}");
        if !selected(&name) {
            continue;
        }
        count += 1;
        let start = Instant::now();
        match kill_trial() {
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
    println!("\nran {count} cases");
    for f in &failures {
        println!("\n{f}");
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!("\ntest result: {verdict}. {passed} passed; {failed} failed; {skipped} ignored; 0 measured; 0 filtered out\n");
    i32::from(failed > 0)
}
