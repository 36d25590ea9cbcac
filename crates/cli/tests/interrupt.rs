//! Ctrl-C and SIGTERM to a running `ccol demo`: it stops its ranks, removes
//! its temporary directories (results, launcher, rendezvous) and exits 130.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[cfg(not(feature = "gloo"))]
use compiler_collectives_conformance::process::OutputWithin;

/// How long a stopped demo may take to exit.
const STOP_LIMIT: Duration = Duration::from_secs(20);

/// A corpus of 2 documents of 1 MiB (the most the corpus reads of one),
/// about 65,000 steps of 2 ranks in batches of 1: a minute's run, far more
/// than the test waits.
fn corpus(dir: &Path) {
    let mut text = String::new();
    for i in 0..70_000u32 {
        for w in 0..(3 + i % 5) {
            text.push_str(&format!("w{w} "));
        }
        text.push_str("\n\n");
    }
    for name in ["a.txt", "b.txt"] {
        std::fs::write(dir.join(name), &text).expect("write the corpus");
    }
}

/// The processes whose command line mentions `needle` (this test's
/// temporary directory: the demo's ranks are started with paths in it).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle) && c.contains("demo-worker"))
        .collect()
}

/// Waits for `child` for at most `limit`; kills it after that.
fn wait_bounded(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a long demo of 2 ranks, waits until both ranks run, sends
/// `signal` (to the demo's process group when `group`, as a terminal's
/// Ctrl-C does), and checks what is left.
fn interrupt_demo(signal: &str, group: bool) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = tmp.path().join("tmp");
    let data = tmp.path().join("corpus");
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::create_dir_all(&data).expect("mkdir");
    corpus(&data);
    let stderr_path = tmp.path().join("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ccol"));
    cmd.args(["demo", "--nproc", "2", "--batch-size", "1"])
        .arg("--corpus")
        .arg(&data)
        .env("TMPDIR", &work)
        .env_remove("CCOL_TIMEOUT_S")
        .env_remove("CCOL_GLOO_STORE")
        .env_remove("CCOL_PROFILE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    {
        use std::os::unix::process::CommandExt as _;
        cmd.process_group(0);
    }
    let mut demo = cmd.spawn().expect("ccol demo starts");
    let needle = work.to_string_lossy().into_owned();
    let start = Instant::now();
    while processes_mentioning(&needle).len() < 2 {
        if start.elapsed() > Duration::from_secs(30) || demo.try_wait().expect("wait").is_some() {
            let _ = demo.kill();
            let _ = demo.wait();
            panic!(
                "the demo's 2 ranks never ran: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the ranks get past the rendezvous and into their steps.
    std::thread::sleep(Duration::from_millis(500));
    let target = if group {
        format!("-{}", demo.id())
    } else {
        demo.id().to_string()
    };
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), "--", &target])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill -{signal} {target}");
    let stopped_at = Instant::now();
    let code = wait_bounded(&mut demo, STOP_LIMIT);
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert_eq!(code, Some(130), "SIG{signal} to ccol demo: {stderr}");
    assert!(
        stopped_at.elapsed() < Duration::from_secs(10),
        "took {:?}",
        stopped_at.elapsed()
    );
    assert!(
        stderr.contains("ccol demo: interrupted; the ranks were stopped"),
        "{stderr}"
    );
    let alive = processes_mentioning(&needle);
    assert!(alive.is_empty(), "ranks still running: {alive:?}");
    let left: Vec<String> = std::fs::read_dir(&work)
        .expect("list TMPDIR")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}\n{stderr}");
}

#[cfg(feature = "gloo")]
#[test]
fn sigterm_to_the_demo_stops_its_ranks_and_leaves_nothing() {
    interrupt_demo("TERM", false);
}

#[cfg(feature = "gloo")]
#[test]
fn ctrl_c_to_the_demo_stops_its_ranks_and_leaves_nothing() {
    interrupt_demo("INT", true);
}

/// Without Gloo there are no ranks to interrupt: `ccol demo` refuses at once
/// (exit 2) and leaves nothing in the temporary directory either.
#[cfg(not(feature = "gloo"))]
#[test]
fn a_demo_without_gloo_exits_2_and_leaves_nothing() {
    let _ = interrupt_demo;
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(["demo", "--nproc", "2"])
        .env("TMPDIR", tmp.path())
        .output_within(STOP_LIMIT)
        .expect("ccol runs");
    assert_eq!(out.status.code(), Some(2));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).expect("list").collect();
    assert!(left.is_empty(), "{left:?}");
}
