//! `ccol run` as a user runs it: the real binary launching `sh -c` ranks.
#![cfg(unix)]

use compiler_collectives_conformance::process::{OutputWithin, Ranks};
use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

fn ccol_run(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ccol"))
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output_within(LIMIT)
        .expect("ccol runs");
    (out, start.elapsed())
}

/// `ccol run --nproc-per-node NPROC OPTIONS... sh -c SCRIPT`.
fn ccol_sh(nproc: &str, options: &[&str], script: &str) -> (Output, Duration) {
    let mut args = vec!["--nproc-per-node", nproc];
    args.extend_from_slice(options);
    args.extend(["sh", "-c", script]);
    ccol_run(&args)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `script` on `nproc` ranks as [`ccol_sh`] does; asserts that the
/// launcher exited with `code` within 5 s and that its stderr says each of
/// `says`; how long it took.
fn fails_within_5s(
    nproc: &str,
    options: &[&str],
    script: &str,
    code: i32,
    says: &[&str],
) -> Duration {
    let (out, took) = ccol_sh(nproc, options, script);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {stderr}");
    for said in says {
        assert!(stderr.contains(said), "{stderr}");
    }
    took
}

/// `rank -> fields` of every stdout line `[rank R] env F1 F2 ...`.
fn env_lines(stdout: &str) -> BTreeMap<u32, Vec<String>> {
    let mut by_rank = BTreeMap::new();
    for line in stdout.lines() {
        let rest = line.strip_prefix("[rank ").expect("prefixed line");
        let (rank, rest) = rest.split_once("] ").expect("closing bracket");
        if let Some(fields) = rest.strip_prefix("env ") {
            let fields = fields.split(' ').map(str::to_string).collect();
            by_rank.insert(rank.parse().expect("rank number"), fields);
        }
    }
    by_rank
}

const PRINT_ENV: &str = "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK \
     $ROLE_RANK $ROLE_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RUN_ID \
     $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_USE_AGENT_STORE $TORCHELASTIC_ERROR_FILE";

#[test]
fn every_rank_gets_torchruns_environment() {
    let (out, _) = ccol_sh("3", &["--run-id", "job42", "--"], PRINT_ENV);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let ranks = env_lines(&stdout);
    assert_eq!(
        ranks.keys().copied().collect::<Vec<_>>(),
        [0, 1, 2],
        "{stdout}"
    );
    let port = &ranks[&0][8];
    assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "port {port}");
    let mut error_files = Vec::new();
    for (rank, f) in &ranks {
        let r = rank.to_string();
        let expect = [
            &r,
            "3",
            &r,
            "3",
            "0",
            &r,
            "3",
            "127.0.0.1",
            port,
            "job42",
            "0",
            "True",
        ];
        assert_eq!(f[..12], expect, "rank {rank}: {f:?}");
        error_files.push(f[12].clone());
    }
    error_files.sort();
    error_files.dedup();
    assert_eq!(
        error_files.len(),
        3,
        "one error file per rank: {error_files:?}"
    );
}

#[test]
fn default_run_id_is_shared_and_master_port_is_honoured() {
    let (out, _) = ccol_sh("2", &["--master-port", "29611"], PRINT_ENV);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let ranks = env_lines(&text(&out.stdout));
    assert_eq!(ranks.len(), 2);
    assert_eq!(ranks[&0][8], "29611");
    assert_eq!(ranks[&1][8], "29611");
    assert!(!ranks[&0][9].is_empty());
    assert_eq!(ranks[&0][9], ranks[&1][9], "one run id for the job");
}

/// As torchrun's agent, the launcher serves a TCPStore on
/// MASTER_ADDR:MASTER_PORT for as long as its ranks run.
#[test]
fn the_launcher_serves_a_tcpstore_on_master_port() {
    use compiler_collectives::tcpstore::TcpStoreClient;
    use compiler_collectives::{Deadline, Store};
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ccol"));
    cmd.args([
        "run",
        "--nproc-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        "sh",
        "-c",
    ])
    .arg("echo at $MASTER_ADDR $MASTER_PORT; sleep 3");
    let ranks = Ranks::start(vec![cmd]).expect("ccol starts");
    let line = ranks
        .wait_line(0, Duration::from_secs(30), |l| {
            l.starts_with("[rank 0] at ")
        })
        .expect("the rank prints its store");
    let port: u16 = line.rsplit(' ').next().unwrap().parse().expect("a port");
    assert!(line.starts_with("[rank 0] at 127.0.0.1 "), "{line}");
    let d = Deadline::after(Duration::from_secs(10));
    let store = TcpStoreClient::connect("127.0.0.1", port, d).expect("a TCPStore");
    store.set("k", b"v", d).unwrap();
    assert_eq!(store.get("k", d).unwrap(), b"v");
    let finished = ranks.finish(LIMIT);
    assert!(finished.ranks[0].code == Some(0), "{}", finished.describe());
}

#[test]
fn a_master_port_in_use_is_a_clear_error() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let (out, _) = ccol_sh("1", &["--master-port", &port], "true");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot serve the job's TCPStore on 127.0.0.1:{port}"
        )),
        "{stderr}"
    );
}

#[test]
fn output_lines_are_prefixed_per_stream() {
    let (out, _) = ccol_sh(
        "2",
        &[],
        "echo one; echo two; echo oops >&2; printf 'no newline'",
    );
    assert_eq!(out.status.code(), Some(0));
    let mut stdout: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    stdout.sort();
    assert_eq!(
        stdout,
        [
            "[rank 0] no newline",
            "[rank 0] one",
            "[rank 0] two",
            "[rank 1] no newline",
            "[rank 1] one",
            "[rank 1] two"
        ]
    );
    // Per rank, lines keep their order.
    let stdout = text(&out.stdout);
    let r0: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("[rank 0]"))
        .collect();
    assert_eq!(r0, ["[rank 0] one", "[rank 0] two", "[rank 0] no newline"]);
    let mut stderr: Vec<String> = text(&out.stderr).lines().map(str::to_string).collect();
    stderr.sort();
    assert_eq!(stderr, ["[rank 0] oops", "[rank 1] oops"]);
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    fails_within_5s(
        "3",
        &[],
        r#"if [ "$RANK" = 1 ]; then sleep 0.2; exit 7; fi; sleep 30"#,
        7,
        &[
            "rank 1 failed first: it exited with code 7",
            "stopped ranks [0, 2]",
        ],
    );
}

#[test]
fn a_rank_killed_by_a_signal_exits_1_and_names_the_signal() {
    fails_within_5s(
        "2",
        &[],
        r#"if [ "$RANK" = 0 ]; then kill -KILL $$; fi; sleep 30"#,
        1,
        &["rank 0 failed first: it was killed by signal 9 (SIGKILL)"],
    );
}

#[test]
fn a_rank_that_ignores_sigterm_gets_sigkill_after_the_grace_period() {
    let took = fails_within_5s(
        "2",
        &["--grace-period", "0.5"],
        r#"if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; trap '' TERM; sleep 30"#,
        3,
        &[],
    );
    assert!(took >= Duration::from_millis(500), "took {took:?}");
}

#[test]
fn the_failed_ranks_error_file_is_printed() {
    let script = r#"if [ "$RANK" = 1 ]; then
  printf '%s' '{"message": {"message": "RuntimeError: shapes disagree", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: shapes disagree", "timestamp": "1700000000"}}}' > "$TORCHELASTIC_ERROR_FILE"
  exit 1
fi
sleep 30"#;
    fails_within_5s(
        "2",
        &[],
        script,
        1,
        &[
            "rank 1 error: RuntimeError: shapes disagree",
            "    File \"train.py\", line 3",
        ],
    );
}

#[test]
fn a_missing_command_exits_2() {
    let (out, _) = ccol_run(&["--nproc-per-node", "2", "ccol-no-such-command"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot start 'ccol-no-such-command'"),
        "{stderr}"
    );
    let (out, _) = ccol_run(&["--nproc-per-node", "2"]);
    assert_eq!(out.status.code(), Some(2), "no command at all");
    let (out, _) = ccol_run(&["--nproc-per-node", "0", "true"]);
    assert_eq!(out.status.code(), Some(2), "zero ranks");
}

#[test]
fn sigterm_to_the_launcher_stops_the_ranks() {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.args([
        "run",
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        "echo ready; sleep 30",
    ]);
    let mut launcher = Ranks::start(vec![c]).expect("ccol starts");
    let ready = |launcher: &Ranks| {
        let lines = launcher.lines(0);
        (lines.iter().filter(|l| l.ends_with("ready")).count(), lines)
    };
    let until = Instant::now() + Duration::from_secs(10);
    while ready(&launcher).0 < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (n, lines) = ready(&launcher);
    assert_eq!(n, 2, "both ranks say ready within 10 s: {lines:?}");
    let start = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &launcher.child_mut(0).id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let done = launcher.finish(Duration::from_secs(15));
    let out = &done.ranks[0];
    let text = out.lines.join("\n");
    assert_eq!(out.code, Some(130), "{text}");
    assert!(start.elapsed() < Duration::from_secs(5), "{text}");
    assert!(text.contains("interrupted"), "{text}");
}

#[test]
fn a_background_process_holding_the_output_does_not_hang_the_launcher() {
    let (out, took) = ccol_sh("1", &[], "sleep 30 & echo started");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(text(&out.stdout), "[rank 0] started\n");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(stderr.contains("rank 0's output is still open"), "{stderr}");
}
