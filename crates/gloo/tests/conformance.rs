//! The shared conformance suite over Gloo with real processes, at 2, 3 and 4
//! ranks, plus SIGKILL trials, the harness's hung-rank check, a soak and
//! Redis / default-file-store / torchrun rendezvous (see
//! `compiler_collectives_conformance::process`). Arguments are libtest's
//! (filters, `--list`, `--exact`).

use compiler_collectives_conformance::process::{
    self, env_u32, trial_or_skip, Backend, Outcome, Ranks, DIR, RANK, ROLE, WORLD,
};
use compiler_collectives_conformance::skip::Missing;
use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
use compiler_collectives_core::{Capabilities, Channel, ChannelOptions, Transport};
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

const KILL_TRIALS: u32 = 20;
const KILL_DEADLINE: Duration = Duration::from_secs(3);
const SOAK_WARMUP: u64 = 1_000;
const SOAK_EXCHANGES: u64 = 10_000;

/// Gloo as this suite runs it: FileStore rendezvous in the case's
/// directory. Its capabilities, all three: every rank's connection is its
/// own, so a timeout names the ranks that did not send; a rank that shuts
/// down or aborts sends its peers a notice; point-to-point is Gloo's own.
fn backend() -> Backend {
    Backend {
        name: "gloo",
        worlds: vec![2, 3, 4],
        capabilities: Capabilities::none()
            .with_names_missing_ranks()
            .with_tells_peers_it_left()
            .with_cheap_point_to_point(),
    }
}

fn main() -> ExitCode {
    let code = match process::role().as_deref() {
        Some("behaviour") => process::rank_behaviour(connect()),
        Some("kill_loop") => process::rank_kill_loop(connect(), KILL_DEADLINE),
        Some("env_exchange") => rank_env_exchange(),
        Some("env_restart") => rank_env_restart(),
        Some("soak") => process::rank_soak(connect(), SOAK_WARMUP, SOAK_EXCHANGES),
        _ => return driver(),
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
        let g = ch.exchange("env", &s).map_err(|e| e.to_string())?;
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

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// Under `torchrun --max-restarts 1`: in attempt 0 the last rank dies right
/// after the rendezvous (the agent then restarts every worker); in attempt
/// 1 every rank exchanges as [`rank_env_exchange`], over keys of its own
/// attempt.
fn rank_env_restart() -> i32 {
    let attempt = std::env::var("TORCHELASTIC_RESTART_COUNT").unwrap_or_default();
    if attempt == "0" {
        let t = match compiler_collectives_gloo::from_env() {
            Ok(t) => t,
            Err(e) => {
                println!("VERDICT fail attempt 0: {e}");
                return 1;
            }
        };
        if t.rank() + 1 == t.world_size() {
            println!("attempt 0: rank {} dies after the rendezvous", t.rank());
            std::process::abort();
        }
        // The others wait to be stopped by the agent.
        std::thread::sleep(Duration::from_secs(60));
        return 1;
    }
    rank_env_exchange()
}

/// How long a rendezvous case may run.
const RENDEZVOUS_LIMIT: Duration = Duration::from_secs(60);

/// Starts `world` ranks with torchrun's variables and `extra`, and checks
/// every verdict.
fn run_env_ranks(world: u32, extra: &[(&str, String)]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let run_id = format!("test-{}-{}", std::process::id(), process::now_ms());
    let commands = (0..world)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(ROLE, "env_exchange")
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("TORCHELASTIC_RUN_ID", &run_id)
                .env_remove("MASTER_ADDR")
                .env_remove("MASTER_PORT")
                .env_remove("TORCHELASTIC_USE_AGENT_STORE")
                .env_remove("CCOL_GLOO_STORE");
            for (k, v) in extra {
                c.env(k, v);
            }
            c
        })
        .collect();
    let done = Ranks::start(commands)?.finish(RENDEZVOUS_LIMIT);
    done.within_limit()?;
    if !done.ranks.iter().all(|r| r.ok_with("VERDICT ok")) {
        return Err(format!("a rank failed:\n{}", done.describe()));
    }
    let default_dir = std::env::temp_dir().join(format!("ccol-gloo-{run_id}-0-0"));
    let file_store = !extra
        .iter()
        .any(|(k, _)| *k == "CCOL_GLOO_STORE" || *k == "MASTER_PORT");
    if file_store && default_dir.exists() {
        return Err(format!(
            "the default rendezvous directory {} was not removed",
            default_dir.display()
        ));
    }
    Ok(())
}

/// A real redis-server on a loopback port, stopped on drop.
struct Redis {
    _server: Ranks,
    port: u16,
}

/// Starts redis-server on a loopback port. A port can only be offered, not
/// held, across the exec: when another process took it first, the server
/// says so and exits, and the next port is tried; the server is used once
/// it says it accepts connections (so it is ours that listens).
fn start_redis(server: &std::path::Path) -> Result<Redis, String> {
    let mut last = String::new();
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let mut c = Command::new(server);
        c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"]);
        let ranks = Ranks::start(vec![c])?;
        if ranks
            .wait_line(0, Duration::from_secs(10), |l| {
                l.contains("Ready to accept connections")
            })
            .is_some()
        {
            return Ok(Redis {
                _server: ranks,
                port,
            });
        }
        last = ranks.lines(0).join("\n");
    }
    Err(format!(
        "redis-server did not start in 5 tries; its last output:\n{last}"
    ))
}

fn redis_rendezvous() -> Result<(), Outcome> {
    let Some(server) = which("redis-server") else {
        return Err(Outcome::Skip(Missing::install(
            "redis-server is not installed (apt-get install redis-server)",
        )));
    };
    let redis = start_redis(&server)?;
    Ok(run_env_ranks(
        3,
        &[(
            "CCOL_GLOO_STORE",
            format!("redis://127.0.0.1:{}", redis.port),
        )],
    )?)
}

fn default_file_store_under_torchrun_env() -> Result<(), String> {
    run_env_ranks(3, &[])
}

/// The job's TCPStore as torchrun's agent serves it: the driver serves it
/// (on a port the system picks), every rank is a client
/// (`TORCHELASTIC_USE_AGENT_STORE=True`); no store directory is made.
fn agent_tcpstore() -> Result<(), String> {
    use compiler_collectives_tcpstore::{ServerOptions, TcpStoreServer};
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default())
        .map_err(|e| format!("serving the agent's store: {e}"))?;
    run_env_ranks(
        3,
        &[
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", server.port().to_string()),
            ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        ],
    )?;
    if server.num_keys() == 0 {
        return Err("the ranks wrote nothing into the agent's store".into());
    }
    Ok(())
}

/// torchrun from the project's torch set-up (`CCOL_TORCHRUN`) or `PATH`.
fn torchrun() -> Result<std::path::PathBuf, Outcome> {
    std::env::var_os("CCOL_TORCHRUN")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
        .or_else(|| which("torchrun"))
        .ok_or_else(|| {
            Outcome::Skip(Missing::install(
                "torchrun not found (run scripts/setup-torch.sh, or set CCOL_TORCHRUN)",
            ))
        })
}

/// `torchrun --no-python` from the project's torch set-up, when present.
fn torchrun_no_python() -> Result<(), Outcome> {
    let torchrun = torchrun()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = Command::new(&torchrun);
    c.args(["--standalone", "--nproc-per-node", "2", "--no-python"])
        .arg(&exe)
        .env(ROLE, "env_exchange")
        .env_remove("CCOL_GLOO_STORE");
    let out = process::run_within(c, RENDEZVOUS_LIMIT)?;
    let text = out.lines.join("\n");
    let oks = out
        .lines
        .iter()
        .filter(|l| l.trim_end().ends_with("VERDICT ok"))
        .count();
    if out.killed_at_limit {
        return Err(Outcome::Fail(format!(
            "hung: torchrun still running after {} s was stopped:\n{text}",
            RENDEZVOUS_LIMIT.as_secs()
        )));
    }
    if out.code == Some(0) && oks == 2 {
        Ok(())
    } else {
        Err(Outcome::Fail(format!(
            "torchrun exited {:?} with {oks} ok verdicts:\n{text}",
            out.code
        )))
    }
}

/// `torchrun --max-restarts 1` with a rank killed after the rendezvous of
/// attempt 0: attempt 1 meets again (new keys, same agent store) and
/// succeeds.
fn torchrun_restart() -> Result<(), Outcome> {
    let torchrun = torchrun()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = Command::new(&torchrun);
    c.args([
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "1",
    ])
    .args(["--monitor-interval", "0.2", "--no-python"])
    .arg(&exe)
    .env(ROLE, "env_restart")
    .env_remove("CCOL_GLOO_STORE");
    let out = process::run_within(c, RENDEZVOUS_LIMIT)?;
    let text = out.lines.join("\n");
    let died = out
        .lines
        .iter()
        .any(|l| l.contains("attempt 0: rank 2 dies"));
    let oks = out
        .lines
        .iter()
        .filter(|l| l.trim_end().ends_with("VERDICT ok"))
        .count();
    if out.code == Some(0) && died && oks == 3 {
        Ok(())
    } else {
        Err(Outcome::Fail(format!(
            "torchrun exited {:?} (rank 2 died in attempt 0: {died}; {oks} ok verdicts):\n{text}",
            out.code
        )))
    }
}

fn no_env() -> Vec<(&'static str, String)> {
    Vec::new()
}

fn driver() -> ExitCode {
    let b = backend();
    let mut trials = process::behaviour_trials(&b, no_env);
    trials.extend(process::harness_trials(&b, no_env));
    trials.push(trial_or_skip(
        "gloo::rendezvous::redis_store",
        redis_rendezvous,
    ));
    trials.push(trial_or_skip(
        "gloo::rendezvous::default_file_store",
        || Ok(default_file_store_under_torchrun_env()?),
    ));
    trials.push(trial_or_skip("gloo::rendezvous::agent_tcpstore", || {
        Ok(agent_tcpstore()?)
    }));
    trials.push(trial_or_skip(
        "gloo::rendezvous::torchrun_no_python",
        torchrun_no_python,
    ));
    trials.push(trial_or_skip(
        "gloo::rendezvous::torchrun_restart",
        torchrun_restart,
    ));
    trials.push(trial_or_skip("gloo::soak::two_ranks", || {
        Ok(process::soak_case("gloo", 2, &[], SOAK_EXCHANGES)?)
    }));
    trials.extend(process::kill_trials(&b, KILL_TRIALS, KILL_DEADLINE, no_env));
    process::run(trials)
}
