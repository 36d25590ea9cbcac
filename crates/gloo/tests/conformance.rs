//! The shared conformance suite over Gloo with real processes, at 2, 3 and 4
//! ranks, plus SIGKILL trials and Redis / default-file-store / torchrun
//! rendezvous (see `compiler_collectives_conformance::process`). Arguments
//! filter cases.

use compiler_collectives_conformance::process::{self, env_u32, DIR, RANK, ROLE, WORLD};
use compiler_collectives_conformance::Capability;
use compiler_collectives_core::shapes::{FrameState, Observation};
use compiler_collectives_core::{Channel, ChannelOptions, Transport};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);
const SOAK_WARMUP: u64 = 1_000;
const SOAK_EXCHANGES: u64 = 10_000;

fn main() {
    let code = match process::role().as_deref() {
        Some("behaviour") => process::rank_behaviour(connect()),
        Some("kill_loop") => process::rank_kill_loop(connect(), KILL_DEADLINE),
        Some("env_exchange") => rank_env_exchange(),
        Some("soak") => process::rank_soak(connect(), SOAK_WARMUP, SOAK_EXCHANGES),
        _ => driver(),
    };
    std::process::exit(code);
}

/// Rendezvous through a FileStore in the case's directory.
fn connect() -> Arc<dyn Transport> {
    let rank = env_u32(RANK);
    let world = env_u32(WORLD);
    let store = GlooStore::file(std::env::var(DIR).expect("dir")).expect("file store");
    let opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(30));
    Arc::new(GlooTransport::connect(&store, rank, world, &opts).expect("rendezvous"))
}

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
    let run_id = format!("test-{}-{}", std::process::id(), process::now_ms());
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
    let results = process::collect(children, Duration::from_secs(60));
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

fn no_env() -> Vec<(&'static str, String)> {
    Vec::new()
}

fn driver() -> i32 {
    let (mut cases, skipped) =
        process::behaviour_cases("gloo", &[2, 3, 4], Capability::ALL, no_env);
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
    cases.push((
        "gloo::soak::two_ranks".into(),
        Box::new(|| process::soak_case("gloo", 2, &[], SOAK_EXCHANGES)),
    ));
    cases.extend(process::kill_cases(
        "gloo",
        KILL_TRIALS,
        KILL_DEADLINE,
        no_env,
    ));
    process::run_cases(cases, skipped)
}
