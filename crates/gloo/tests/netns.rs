//! Several hosts on one machine: three network namespaces joined by veth
//! pairs, one rank per "host", rendezvous through a Redis store in the first
//! one; cutting one host's link in the middle of an exchange must end like
//! a SIGKILL: every other rank reports a typed error within the deadline
//! plus 1 s that leads to the cut-off rank (see `process::fault_trial`).
//! Needs root (CAP_NET_ADMIN), iproute2 and redis-server; otherwise the case
//! is skipped with the reason (a failure under CCOL_STRICT_SKIPS=1 when run
//! as root). The test makes and removes its namespaces itself.
//!
//! A second case runs a torchrun agent in each namespace (`--nnodes 3`,
//! `--rdzv-backend c10d`, `--local-addr`): Gloo ranks on the three "hosts"
//! rendezvous through the agents' TCPStore alone (no Redis), agree, and
//! when the rank in h2 dies every survivor names it.
//!
//! Topology (documentation addresses, nothing leaves the machine):
//!
//! ```text
//!   ns h0: bridge 10.213.N.1/24, redis-server, rank 0
//!     ├─ veth ── ns h1: 10.213.N.2/24, rank 1
//!     └─ veth ── ns h2: 10.213.N.3/24, rank 2   ← its link is cut
//! ```

use compiler_collectives_conformance::process::{self, env_u32, Ranks, RANK, ROLE, WORLD};
use compiler_collectives_conformance::skip::Missing;
use compiler_collectives_core::Transport;
use compiler_collectives_gloo::{GlooOptions, GlooStore, GlooTransport};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TRIALS: u32 = 5;
const DEADLINE: Duration = Duration::from_secs(3);
const REDIS_PORT: u16 = 6379;
/// The rank's own address (peers connect to it) and the store's.
const ADDR: &str = "CCOL_TEST_ADDR";
const STORE: &str = "CCOL_TEST_STORE";
const PREFIX: &str = "CCOL_TEST_PREFIX";

fn main() -> ExitCode {
    match process::role().as_deref() {
        Some("kill_loop") => std::process::exit(process::rank_kill_loop(connect(), DEADLINE)),
        Some("agent_rank") => std::process::exit(agent_rank()),
        _ => driver(),
    }
}

/// A rank under torchrun: `from_env` (the agents' TCPStore), one exchange
/// every rank checks (`AGREED`), then exchanges until the last rank dies
/// after the third; the survivors print whom their error names.
fn agent_rank() -> i32 {
    use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
    use compiler_collectives_core::{Channel, ChannelOptions};
    let t = match compiler_collectives_gloo::from_env() {
        Ok(t) => t,
        Err(e) => {
            println!("RANK failed to connect: {e}");
            return 1;
        }
    };
    let (rank, world) = (t.rank(), t.world_size());
    let mut ch = match Channel::with_options(
        Arc::new(t),
        ChannelOptions::default().with_timeout(DEADLINE),
    ) {
        Ok(c) => c,
        Err(e) => {
            println!("RANK {rank}: {e}");
            return 1;
        }
    };
    let mut s = FrameState::new();
    s.record("x", &Observation::tensor([16 + u64::from(rank), 4]));
    match ch.exchange("agree", &s) {
        Ok(g) => println!("AGREED rank {rank}: x = {}", g.merged().get("x").size),
        Err(e) => {
            println!("RANK {rank}: the first exchange failed: {e}");
            return 1;
        }
    }
    for i in 0..1000u32 {
        if rank + 1 == world && i == 3 {
            println!("RANK {rank} dies");
            std::process::abort();
        }
        if let Err(e) = ch.exchange("loop", &s) {
            println!(
                "SURVIVOR rank {rank}: {} naming {:?}: {e}",
                e.kind(),
                e.missing_ranks()
            );
            // A failed worker: its agent stops at once (a worker that
            // succeeds waits in the agents' exit barrier for the agent
            // whose worker died, 300 s).
            return 1;
        }
    }
    println!("RANK {rank}: no error after 1000 exchanges");
    1
}

fn connect() -> Arc<dyn Transport> {
    let (rank, world) = (env_u32(RANK), env_u32(WORLD));
    let store_host = std::env::var(STORE).expect("store address");
    let store = GlooStore::redis(&store_host, REDIS_PORT).expect("redis store");
    let opts = GlooOptions::default()
        .with_hostname(std::env::var(ADDR).expect("own address"))
        .with_prefix(std::env::var(PREFIX).expect("prefix"))
        .with_connect_timeout(Duration::from_secs(30));
    Arc::new(GlooTransport::connect(&store, rank, world, &opts).expect("rendezvous"))
}

/// Runs `ip ARGS`, failing with its output.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Three namespaces and their links; removed on drop (with what runs in them).
struct Hosts {
    names: [String; 3],
    subnet: String,
    redis: Option<Child>,
}

impl Hosts {
    /// Makes the namespaces `ccol<pid>h{0,1,2}`, a bridge in h0 and a veth
    /// pair from the bridge to each other host, under 10.213.N.0/24 with N
    /// from the process id.
    fn create() -> Result<Self, String> {
        remove_stale();
        let pid = std::process::id();
        let names = [0, 1, 2].map(|h| format!("ccol{pid}h{h}"));
        let hosts = Hosts {
            subnet: format!("10.213.{}", pid % 250 + 1),
            names,
            redis: None,
        };
        for n in &hosts.names {
            ip(&["netns", "add", n])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        let h0 = hosts.names[0].as_str();
        ip(&["-n", h0, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            h0,
            "addr",
            "add",
            &format!("{}.1/24", hosts.subnet),
            "dev",
            "br0",
        ])?;
        ip(&["-n", h0, "link", "set", "br0", "up"])?;
        for h in 1..3 {
            let (inner, outer) = (format!("v{pid}i{h}"), format!("v{pid}o{h}"));
            let ns = hosts.names[h].as_str();
            ip(&[
                "link", "add", &inner, "netns", ns, "type", "veth", "peer", "name", &outer,
                "netns", h0,
            ])?;
            ip(&["-n", h0, "link", "set", &outer, "master", "br0"])?;
            ip(&["-n", h0, "link", "set", &outer, "up"])?;
            let addr = format!("{}.{}/24", hosts.subnet, h + 1);
            ip(&["-n", ns, "addr", "add", &addr, "dev", &inner])?;
            ip(&["-n", ns, "link", "set", &inner, "up"])?;
        }
        Ok(hosts)
    }

    fn addr(&self, host: usize) -> String {
        format!("{}.{}", self.subnet, host + 1)
    }

    /// A command that runs `program` inside host `host`'s namespace.
    fn command(&self, host: usize, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[host]]).arg(program);
        c
    }

    /// redis-server in h0, bound to h0's address only.
    fn start_redis(&mut self, server: &std::path::Path) -> Result<(), String> {
        let child = self
            .command(0, server)
            .args(["--bind", &self.addr(0), "--port", &REDIS_PORT.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?;
        self.redis = Some(child);
        // Reachable from h1 (through the bridge) before ranks start.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = Command::new("ip")
                .args(["netns", "exec", &self.names[1], "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{}/{REDIS_PORT}", self.addr(0)))
                .stderr(Stdio::null())
                .status()
                .map_err(|e| e.to_string())?;
            if probe.success() {
                return Ok(());
            }
            if Instant::now() > until {
                return Err("redis-server in h0 not reachable from h1 within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes host `host`'s only link (its side of the veth pair) down, or
    /// brings it back up for the next trial.
    fn set_link(&self, host: usize, up: bool) -> Result<(), String> {
        let pid = std::process::id();
        let state = if up { "up" } else { "down" };
        ip(&[
            "-n",
            &self.names[host],
            "link",
            "set",
            &format!("v{pid}i{host}"),
            state,
        ])
    }
}

/// Removes namespaces left by an earlier run of this test that was killed
/// before it could clean up (its process id no longer exists).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let pid = name
            .strip_prefix("ccol")
            .and_then(|rest| rest.split_once('h'))
            .and_then(|(pid, host)| matches!(host, "0" | "1" | "2").then_some(pid))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Some(mut r) = self.redis.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
        for n in &self.names {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// Why this machine cannot run the case, if it cannot: a privilege it
/// lacks, or iproute2 not installed.
fn missing_privilege() -> Option<Missing> {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:").map(str::to_owned))
        })
        .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false);
    if !root {
        return Some(Missing::machine(
            "not root: network namespaces need CAP_NET_ADMIN",
        ));
    }
    // CAP_NET_ADMIN is bit 12 of the effective capabilities.
    let net_admin = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:").map(str::to_owned))
        })
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0);
    if !net_admin {
        return Some(Missing::machine(
            "root without CAP_NET_ADMIN (a restricted container)",
        ));
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some(Missing::install(
            "iproute2's ip is not installed (apt-get install iproute2)",
        ));
    }
    None
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

/// One trial: 3 ranks on 3 hosts exchange in a loop; host 2's link goes
/// down; ranks 0 and 1 must name rank 2 within the deadline + 1 s.
fn cut_trial(hosts: &Hosts, t: u32) -> Result<u128, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let prefix = format!("trial{t}-{}", process::now_ms());
    let commands = (0..3u32)
        .map(|r| {
            let h = r as usize;
            let mut c = hosts.command(h, &exe);
            c.env(ROLE, "kill_loop")
                .env(RANK, r.to_string())
                .env(WORLD, "3")
                .env(ADDR, hosts.addr(h))
                .env(STORE, hosts.addr(0))
                .env(PREFIX, &prefix);
            c
        })
        .collect();
    let ranks = Ranks::start(commands)?;
    let worst = process::fault_trial(ranks, DEADLINE, "the cut", false, |_victim| {
        hosts.set_link(2, false)
    });
    hosts.set_link(2, true)?;
    worst
}

/// One torchrun agent per host, c10d rendezvous on h0's address: the ranks
/// meet through the agents' TCPStore, agree, and the survivors name the
/// rank that died.
fn torchrun_agents(hosts: &Hosts, torchrun: &std::path::Path) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let endpoint = format!("{}:29400", hosts.addr(0));
    let run_id = format!("netns-{}", std::process::id());
    let agents = (0..3usize)
        .map(|h| {
            let mut c = hosts.command(h, torchrun);
            c.args(["--nnodes", "3", "--nproc-per-node", "1"])
                .args(["--rdzv-backend", "c10d", "--rdzv-id", &run_id])
                .args(["--rdzv-endpoint", &endpoint])
                .args(["--local-addr", &hosts.addr(h)])
                // torchrun cannot tell that a namespace's address is this
                // host's: say which agent serves the rendezvous store.
                .args([
                    "--rdzv-conf",
                    if h == 0 { "is_host=1" } else { "is_host=0" },
                ])
                .args(["--max-restarts", "0", "--no-python"])
                .arg(&exe)
                .env(ROLE, "agent_rank")
                .env_remove("CCOL_GLOO_STORE")
                .env_remove("CCOL_GLOO_HOSTNAME");
            c
        })
        .collect();
    let done = Ranks::start(agents)?.finish(Duration::from_secs(120));
    done.within_limit()?;
    let text = done.describe();
    // What each "host" said, for the record (the case's summary).
    for (h, r) in done.ranks.iter().enumerate() {
        for l in r.lines.iter().filter(|l| {
            l.starts_with("AGREED") || l.starts_with("SURVIVOR") || l.starts_with("RANK")
        }) {
            println!("    host h{h}: {l}");
        }
    }
    let lines = |h: usize| done.ranks[h].lines.join("\n");
    for h in 0..3 {
        if !lines(h).contains("x = (Dyn,4)") {
            return Err(format!("host {h}'s rank did not agree:\n{text}"));
        }
    }
    for h in 0..2 {
        if !lines(h).contains("naming [2]") {
            return Err(format!("host {h}'s rank did not name rank 2:\n{text}"));
        }
    }
    Ok(())
}

fn driver() -> ExitCode {
    let name = "gloo::netns::cut_link_mid_exchange";
    let why = match (missing_privilege(), which("redis-server")) {
        (Some(why), _) => Some(why),
        (None, None) => Some(Missing::install(
            "redis-server is not installed (apt-get install redis-server)",
        )),
        (None, Some(_)) => None,
    };
    if let Some(why) = why {
        return process::run(vec![process::skipped_trial(name, why)]);
    }
    let hosts = match Hosts::create() {
        Ok(h) => h,
        Err(e) => {
            return process::run(vec![process::trial(name, move || {
                Err(format!("cannot make the namespaces: {e}"))
            })])
        }
    };
    let hosts = Arc::new(std::sync::Mutex::new(hosts));
    let server = which("redis-server").unwrap_or_default();
    let setup = Arc::clone(&hosts);
    let mut trials = vec![process::trial("gloo::netns::redis_in_host_0", move || {
        setup
            .lock()
            .map_err(|e| e.to_string())?
            .start_redis(&server)
    })];
    let counter = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let trial_hosts = Arc::clone(&hosts);
    trials.extend(process::trial_cases(
        name,
        "link cut",
        TRIALS,
        DEADLINE,
        move || {
            let t = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let hosts = trial_hosts.lock().map_err(|e| e.to_string())?;
            cut_trial(&hosts, t)
        },
    ));
    let agent_hosts = Arc::clone(&hosts);
    trials.push(process::trial_or_skip(
        "gloo::netns::torchrun_agents",
        move || {
            let torchrun = std::env::var_os("CCOL_TORCHRUN")
                .map(std::path::PathBuf::from)
                .filter(|p| p.is_file());
            let Some(torchrun) = torchrun else {
                return Err(process::Outcome::Skip(Missing::install(
                    "CCOL_TORCHRUN is not set (run `eval \"$(scripts/setup-torch.sh)\"`)",
                )));
            };
            let hosts = agent_hosts.lock().map_err(|e| e.to_string())?;
            Ok(torchrun_agents(&hosts, &torchrun)?)
        },
    ));
    let code = process::run(trials);
    drop(hosts);
    code
}
