//! The shared conformance suite over Gloo with real processes, at 2, 3 and 4
//! ranks, plus SIGKILL trials.
//!
//! This is a test binary without the libtest harness: run as a test it is
//! the driver, which starts one process of itself per rank (the rank role is
//! chosen by environment variables) and checks every rank's verdict. Every
//! case runs one at a time, so deadline bounds are not disturbed by other
//! tests on a small machine. Arguments filter cases by substring.

use compiler_collectives_conformance::{find, Ctx, BEHAVIOURS};
use compiler_collectives_core::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions, Error, Transport};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ROLE: &str = "CCOL_TEST_ROLE";
const RANK: &str = "CCOL_TEST_RANK";
const WORLD: &str = "CCOL_TEST_WORLD";
const STORE: &str = "CCOL_TEST_STORE";
const BEHAVIOUR: &str = "CCOL_TEST_BEHAVIOUR";
const KILL_TRIALS: u32 = 10;
const KILL_DEADLINE: Duration = Duration::from_secs(3);

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("behaviour") => std::process::exit(rank_behaviour()),
        Ok("env_exchange") => std::process::exit(rank_env_exchange()),
        Ok("kill_loop") => std::process::exit(rank_kill_loop()),
        _ => std::process::exit(driver()),
    }
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
    let store = GlooStore::file(std::env::var(STORE).expect("store dir")).expect("file store");
    let opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(30));
    Arc::new(GlooTransport::connect(&store, rank, world, &opts).expect("rendezvous"))
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
    // Stay alive until every rank has its verdict, as threads of one process
    // would: a rank that exits early looks like a lost peer to the others.
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
    let dir = std::path::PathBuf::from(std::env::var(STORE).expect("store dir"));
    let _ = std::fs::write(dir.join(format!("done-{}", env_u32(RANK))), b"");
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && !(0..world).all(|r| dir.join(format!("done-{r}")).exists()) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Exchanges in a loop (rank-dependent batch, so every exchange takes the
/// full path) until an error; prints the error's kind, ranks and time.
fn rank_kill_loop() -> i32 {
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
            let kind = match &e {
                Error::PeerLost { .. } => "peer_lost",
                Error::Timeout { .. } => "timeout",
                other => other.kind(),
            };
            println!("ERROR {} {:?} {} {}", kind, e.missing_ranks(), now_ms(), e);
            // Survivors stay up a moment, so that each one's report is about
            // the killed rank and not about a survivor that already exited.
            std::thread::sleep(Duration::from_secs(2));
            return 0;
        }
    }
    0
}

/// One test case of the driver.
type Case = Box<dyn Fn() -> Result<(), String>>;

/// A rank started with only torchrun's environment (plus `CCOL_GLOO_STORE`
/// when the case sets it): `from_env`, then one exchange whose result every
/// rank checks.
fn rank_env_exchange() -> i32 {
    let verdict = (|| -> Result<(), String> {
        let t = compiler_collectives_gloo::from_env().map_err(|e| e.to_string())?;
        let (rank, world) = (t.rank(), t.world_size());
        let mut ch = Channel::with_options(
            Arc::new(t),
            ChannelOptions::default().with_timeout(Duration::from_secs(20)),
        )
        .map_err(|e| e.to_string())?;
        let mut s = FrameState::new();
        s.record("x", &Observation::tensor([16 + u64::from(rank), 4]));
        let g = ch.exchange("env", "", &s).map_err(|e| e.to_string())?;
        let x = g.merged().get("x").size.to_string();
        let want = if world > 1 { "(Dyn,4)" } else { "(16,4)" };
        if x != want {
            return Err(format!("merged x = {x}, want {want}"));
        }
        ch.shutdown().map_err(|e| e.to_string())
    })();
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

/// Whether a skipped case must fail (the test script installs its backend).
fn strict() -> bool {
    std::env::var("CCOL_STRICT_SKIPS").is_ok_and(|v| v == "1")
}

fn skip(why: &str) -> Result<(), String> {
    if strict() {
        Err(format!("needed but missing (CCOL_STRICT_SKIPS=1): {why}"))
    } else {
        println!("    skipped: {why}");
        Ok(())
    }
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Starts `world` ranks with torchrun's variables and `extra`, and checks
/// every verdict.
fn run_env_ranks(world: u32, extra: &[(&str, String)]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let run_id = format!("test-{}-{}", std::process::id(), now_ms());
    let children: Vec<_> = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(ROLE, "env_exchange")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("TORCHELASTIC_RUN_ID", &run_id)
                .env("MASTER_PORT", "29500")
                .env_remove("CCOL_GLOO_STORE")
                .stdout(Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let results = collect(children, Duration::from_secs(60));
    let bad: Vec<String> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.code != Some(0) || !r.lines.iter().any(|l| l == "VERDICT ok"))
        .map(|(i, r)| format!("rank {i} (exit {:?}): {}", r.code, r.lines.join(" | ")))
        .collect();
    if !bad.is_empty() {
        return Err(bad.join("\n"));
    }
    let default_dir = std::env::temp_dir().join(format!("ccol-gloo-{run_id}-29500-0"));
    if extra.is_empty() && default_dir.exists() {
        return Err(format!(
            "the default rendezvous directory {} was not removed",
            default_dir.display()
        ));
    }
    Ok(())
}

/// A real redis-server on a free loopback port, stopped on drop.
struct Redis(std::process::Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis(server: &std::path::Path) -> Result<Redis, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", server.display()))?;
    let redis = Redis(child, port);
    let until = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > until {
            return Err("redis-server did not start listening within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(redis)
}

fn redis_rendezvous() -> Result<(), String> {
    let Some(server) = which("redis-server") else {
        return skip("redis-server is not installed (apt-get install redis-server)");
    };
    let redis = start_redis(&server)?;
    run_env_ranks(
        3,
        &[("CCOL_GLOO_STORE", format!("redis://127.0.0.1:{}", redis.1))],
    )
}

fn default_file_store_under_torchrun_env() -> Result<(), String> {
    run_env_ranks(3, &[])
}

/// `torchrun --no-python` from the project's torch set-up, when present.
fn torchrun_no_python() -> Result<(), String> {
    let torchrun = std::env::var_os("CCOL_TORCHRUN")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| which("torchrun"));
    let Some(torchrun) = torchrun else {
        return skip("torchrun not found (run scripts/setup-torch.sh, or set CCOL_TORCHRUN)");
    };
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(&torchrun)
        .args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(&exe)
        .env(ROLE, "env_exchange")
        .env_remove("CCOL_GLOO_STORE")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", torchrun.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let oks = text
        .lines()
        .filter(|l| l.trim_end().ends_with("VERDICT ok"))
        .count();
    if out.status.success() && oks == 2 {
        Ok(())
    } else {
        Err(format!(
            "torchrun exited {:?} with {oks} ok verdicts:\n{text}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

struct RankResult {
    code: Option<i32>,
    lines: Vec<String>,
}

fn spawn_ranks(
    world: u32,
    role: &str,
    extra: &[(&str, &str)],
) -> (tempfile::TempDir, Vec<std::process::Child>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("own path");
    let children = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(ROLE, role)
                .env(RANK, r.to_string())
                .env(WORLD, world.to_string())
                .env(STORE, dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().expect("spawn rank")
        })
        .collect();
    (dir, children)
}

fn collect(children: Vec<std::process::Child>, limit: Duration) -> Vec<RankResult> {
    let start = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            let out = c.stdout.take().expect("piped");
            let lines: Vec<String> = BufReader::new(out).lines().map_while(Result::ok).collect();
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

fn run_behaviour(name: &str, world: u32) -> Result<(), String> {
    let (_dir, children) = spawn_ranks(world, "behaviour", &[(BEHAVIOUR, name)]);
    let results = collect(children, Duration::from_secs(60));
    let failures: Vec<String> = results
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

/// 3 ranks exchange in a loop; the last is killed with SIGKILL mid-loop.
/// Every survivor must name it (lost peer or timeout) within the deadline + 1 s.
fn kill_trial() -> Result<(), String> {
    let world = 3;
    let (_dir, mut children) = spawn_ranks(world, "kill_loop", &[]);
    // Wait until the victim reports READY, then let the loop run a little.
    let victim = children.pop().expect("victim");
    let mut victim = victim;
    let vout = victim.stdout.take().expect("piped");
    let mut reader = BufReader::new(vout);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim() != "READY" {
        return Err(format!("victim said {line:?}"));
    }
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY-free: std's kill sends SIGKILL on Unix.
    victim.kill().map_err(|e| e.to_string())?;
    let killed_at = now_ms();
    let _ = victim.wait();
    let results = collect(children, KILL_DEADLINE + Duration::from_secs(10));
    for (r, res) in results.iter().enumerate() {
        let err = res
            .lines
            .iter()
            .find(|l| l.starts_with("ERROR "))
            .ok_or_else(|| format!("rank {r} printed no error: {:?}", res.lines))?;
        let parts: Vec<&str> = err.splitn(5, ' ').collect();
        let (kind, ranks, at) = (parts[1], parts[2], parts[3].parse::<u128>().unwrap_or(0));
        if !(kind == "peer_lost" || kind == "timeout") || ranks != "[2]" {
            return Err(format!("rank {r}: {err}"));
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

fn driver() -> i32 {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let selected =
        |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()));
    let mut cases: Vec<(String, Case)> = Vec::new();
    for b in BEHAVIOURS {
        for world in [2u32, 3, 4] {
            if world >= b.min_world {
                let name = b.name;
                cases.push((
                    format!("gloo::{name}::world_{world}"),
                    Box::new(move || run_behaviour(name, world)),
                ));
            }
        }
    }
    cases.push((
        "gloo::rendezvous::redis_store".into(),
        Box::new(redis_rendezvous),
    ));
    cases.push((
        "gloo::rendezvous::default_file_store".into(),
        Box::new(default_file_store_under_torchrun_env),
    ));
    cases.push((
        "gloo::rendezvous::torchrun_no_python".into(),
        Box::new(torchrun_no_python),
    ));
    for t in 0..KILL_TRIALS {
        cases.push((
            format!("gloo::sigkill_mid_exchange::trial_{t}"),
            Box::new(kill_trial),
        ));
    }
    let cases: Vec<_> = cases.into_iter().filter(|(n, _)| selected(n)).collect();
    println!("\nrunning {} tests", cases.len());
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
    for f in &failures {
        println!("\n{f}");
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!("\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out\n");
    i32::from(failed > 0)
}
