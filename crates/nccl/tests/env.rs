//! `EnvConfig::read` under torchrun's variables. Each case runs in a child
//! process (this test binary again), so no test changes its own environment.

use compiler_collectives_conformance::process::OutputWithin;
use compiler_collectives_nccl::{EnvConfig, NcclError, NcclStore};
use std::process::Command;

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

const CHILD: &str = "CCOL_NCCL_ENV_CHILD";

/// `EnvConfig::read()` in a child with exactly these torchrun variables:
/// `Ok(store dir)` or `Err(message)`.
fn read_in_child(vars: &[(&str, &str)]) -> Result<String, String> {
    let mut c = Command::new(std::env::current_exe().expect("test binary"));
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"]);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
        "CCOL_NCCL_STORE",
    ] {
        c.env_remove(v);
    }
    let out = c
        .env(CHILD, "1")
        .envs(vars.iter().copied())
        .output_within(LIMIT)
        .expect("child runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no result: {text}"));
    match line.split_once(' ') {
        Some(("ok", dir)) => Ok(dir.to_owned()),
        Some(("err", msg)) => Err(msg.to_owned()),
        _ => panic!("{line}"),
    }
}

#[test]
fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match EnvConfig::read() {
        Ok(c) => match c.store {
            NcclStore::Dir(d) => println!("RESULT ok {}", d.display()),
            NcclStore::Tcp { host, port, serve } => {
                println!(
                    "RESULT ok tcp {host}:{port} serve={serve} prefix={}",
                    c.prefix
                )
            }
        },
        Err(NcclError::Env(m)) => println!("RESULT err {m}"),
        Err(e) => println!("RESULT err {e}"),
    }
}

#[test]
fn torchruns_default_run_id_derives_no_store_directory() {
    let base = [("RANK", "1"), ("WORLD_SIZE", "2")];
    // `torchrun --nproc-per-node 2` without --standalone or --rdzv-id: run
    // id "none" at every launch, so a derived directory would be shared.
    let err = read_in_child(&[base.as_slice(), &[("TORCHELASTIC_RUN_ID", "none")]].concat())
        .expect_err("not unique per launch");
    assert!(err.contains("CCOL_NCCL_STORE"), "{err}");
    // A real run id (--standalone makes a fresh one) derives one.
    let dir = read_in_child(&[base.as_slice(), &[("TORCHELASTIC_RUN_ID", "4f2a-9c")]].concat())
        .expect("derived");
    assert!(dir.ends_with("ccol-nccl-4f2a-9c-0-0"), "{dir}");
    // An explicit directory is used as given.
    let dir = read_in_child(
        &[
            base.as_slice(),
            &[("TORCHELASTIC_RUN_ID", "none"), ("CCOL_NCCL_STORE", "/x/y")],
        ]
        .concat(),
    )
    .expect("explicit");
    assert_eq!(dir, "/x/y");
}

/// MASTER_ADDR:MASTER_PORT name the job's TCPStore: the agent's under
/// torchrun, else rank 0's; CCOL_NCCL_STORE still comes first.
#[test]
fn the_job_tcpstore_comes_after_a_named_store() {
    let job = [
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.7"),
        ("MASTER_PORT", "29511"),
        ("TORCHELASTIC_RUN_ID", "r1"),
        ("TORCHELASTIC_RESTART_COUNT", "3"),
    ];
    let agent = [("TORCHELASTIC_USE_AGENT_STORE", "True")];
    let got = |extra: &[(&str, &str)]| read_in_child(&[job.as_slice(), extra].concat());
    assert_eq!(
        got(&[("RANK", "0")]).unwrap(),
        "tcp 10.0.0.7:29511 serve=true prefix=ccol/r1/3/nccl"
    );
    assert_eq!(
        got(&[("RANK", "1")]).unwrap(),
        "tcp 10.0.0.7:29511 serve=false prefix=ccol/r1/3/nccl"
    );
    assert_eq!(
        got(&[&[("RANK", "0")], agent.as_slice()].concat()).unwrap(),
        "tcp 10.0.0.7:29511 serve=false prefix=ccol/r1/3/nccl"
    );
    assert_eq!(
        got(&[("RANK", "0"), ("CCOL_NCCL_STORE", "/d")]).unwrap(),
        "/d"
    );
}
