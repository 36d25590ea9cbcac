//! Profiles and traces through `ccol`, as a user runs them:
//! - a restarted job with a saved profile compiles once, dynamic from step 0,
//!   where the first run compiled twice;
//! - `ccol trace` names the first exchange where a desynced run's ranks diverge;
//! - 8 concurrent writer processes never lose an entry;
//! - SIGKILL during a save, 100 trials, never leaves a corrupt or partial file.

use compiler_collectives::persistence::profile::{Profile, ProfileLimits, ProfileStore};
use compiler_collectives_conformance::process::OutputWithin;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

fn scenario(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/scenarios")
        .join(file)
}

fn ccol(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(args)
        .env_remove("CCOL_TIMEOUT_S")
        .env_remove("CCOL_TRACE_DIR")
        .output_within(LIMIT)
        .expect("ccol runs")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8")
}

fn run_with_profile(dir: &Path) -> Value {
    let out = ccol(&[
        "scenario",
        "run",
        s(&scenario("09_issue_seq_len.json")),
        "--profile",
        s(dir),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout(&out).trim()).expect("JSON")
}

#[test]
fn a_restarted_job_with_its_profile_compiles_once_dynamic_from_step_0() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("job-1");
    // First run: x = (2, L), L = 16, 18, 20, 22: static at step 0, dynamic at step 1.
    let first = run_with_profile(&dir);
    for r in 0..2 {
        assert_eq!(first["ranks"][r]["compiles"], 2);
        assert_eq!(first["ranks"][r]["compile_steps"], json!([0, 1]));
        assert_eq!(first["ranks"][r]["dynamic"], json!({"x": [1]}));
    }
    // Restart: the profile makes dim 1 dynamic from the first compile.
    let second = run_with_profile(&dir);
    for r in 0..2 {
        assert_eq!(second["ranks"][r]["compiles"], 1);
        assert_eq!(second["ranks"][r]["compile_steps"], json!([0]));
        assert_eq!(second["ranks"][r]["dynamic"], json!({"x": [1]}));
    }
    // What was saved, as `ccol profile show` prints it.
    let out = ccol(&["profile", "show", s(&dir), "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let shown: Value = serde_json::from_str(stdout(&out).trim()).expect("JSON");
    assert_eq!(
        shown,
        json!({"entries": [{"key": "scenario:issue_seq_len", "kind": "shape.frame_state",
            "sources": [{"source": "x", "size": "(2,Dyn)", "stride": "(S(1),1)",
                         "scalar": "Dyn", "dynamic": [1]}]}]})
    );
    let table = stdout(&ccol(&["profile", "show", s(&dir)]));
    assert!(table.contains(": 1 entry\n"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("scenario:issue_seq_len"))
        .expect("a row for the key");
    assert!(
        row.contains("(2,Dyn)") && row.ends_with("dims [1]"),
        "{row}"
    );
}

#[test]
fn profile_merge_and_diff() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    run_with_profile(&a);
    // B: a profile from the tensor scenario, a different compile key.
    let out = ccol(&[
        "scenario",
        "run",
        s(&scenario("01_tensor.json")),
        "--profile",
        s(&b),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let same = ccol(&["profile", "diff", s(&a), s(&a)]);
    assert_eq!(same.status.code(), Some(0));
    assert_eq!(stdout(&same), "");
    let differ = ccol(&["profile", "diff", s(&a), s(&b)]);
    assert_eq!(differ.status.code(), Some(1));
    let text = stdout(&differ);
    assert!(
        text.contains("- 'scenario:issue_seq_len' (shape.frame_state): only in A"),
        "{text}"
    );
    assert!(
        text.contains("+ 'scenario:tensor' (shape.frame_state): only in B"),
        "{text}"
    );
    let merged = tmp.path().join("merged.ccol");
    let out = ccol(&["profile", "merge", s(&a), s(&b), "-o", s(&merged)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = compiler_collectives::persistence::profile::read_profile(
        &merged,
        &ProfileLimits::default(),
    )
    .expect("merged profile");
    assert_eq!(p.len(), 2);
    assert_eq!(
        p.shapes("scenario:tensor")
            .expect("tensor")
            .get("x")
            .size
            .to_string(),
        "(Dyn,10)"
    );
    // Into a directory (a store): its profile.ccol, replaced under its lock.
    let into_dir = tmp.path().join("c");
    std::fs::create_dir(&into_dir).expect("mkdir");
    let out = ccol(&["profile", "merge", s(&b), s(&a), "-o", s(&into_dir)]);
    assert_eq!(out.status.code(), Some(0));
    let same = ccol(&["profile", "diff", s(&merged), s(&into_dir)]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    // Missing and corrupt inputs exit 2 naming the file.
    let missing = ccol(&["profile", "show", s(&tmp.path().join("nope"))]);
    assert_eq!(missing.status.code(), Some(2));
    let bad = tmp.path().join("bad.ccol");
    std::fs::write(
        &bad,
        b"CCOLPGO\0garbage that is long enough to hold a header",
    )
    .expect("write");
    let corrupt = ccol(&["profile", "show", s(&bad)]);
    assert_eq!(corrupt.status.code(), Some(2));
    let err = String::from_utf8_lossy(&corrupt.stderr);
    assert!(err.contains("bad.ccol") && err.contains("corrupt"), "{err}");
}

/// Scenario 8 with collectives on and each rank's trace written under
/// `traces`, plus `flags` (guard votes on or off, `--json`).
fn traced_guard_collectives(traces: &Path, flags: &[&str]) -> Output {
    let file = scenario("08_guard_collectives.json");
    let mut args = vec![
        "scenario",
        "run",
        s(&file),
        "--collectives",
        "--trace",
        s(traces),
    ];
    args.extend_from_slice(flags);
    ccol(&args)
}

#[test]
fn ccol_trace_names_the_first_diverging_exchange_of_a_desynced_run() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let traces = tmp.path().join("traces");
    // Scenario 8 with collectives on and votes off: rank 1 misses alone at
    // step 1 and enters exchange #1, which rank 0 never does.
    let out = traced_guard_collectives(&traces, &["--no-guard-collectives", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let out = ccol(&[
        "trace",
        s(&traces.join("rank-0.jsonl")),
        s(&traces.join("rank-1.jsonl")),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    let verdict = text.lines().last().expect("a verdict");
    assert!(
        verdict.starts_with(
            "first divergence at exchange #1: rank [0]: no exchange #1 (trace ends at #0); \
             rank [1]: #1 'scenario:guard_collectives' (shape.frame_state)"
        ),
        "{text}"
    );
    assert!(verdict.ends_with("→ peer_lost"), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("#1"))
        .expect("row #1");
    assert!(row.ends_with("<== first divergence"), "{text}");
    // The same run with guard votes on stays in step: the traces agree.
    let agree = tmp.path().join("agree");
    let out = traced_guard_collectives(&agree, &["--guard-collectives"]);
    assert_eq!(out.status.code(), Some(0));
    let out = ccol(&["trace", s(&agree)]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("2 traces agree on every exchange (#0..#"),
        "{}",
        stdout(&out)
    );
}

fn writer(dir: &Path, prefix: &str, count: u32, filler: u32) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.args([
        "profile-writer",
        "--dir",
        s(dir),
        "--prefix",
        prefix,
        "--count",
        &count.to_string(),
        "--filler",
        &filler.to_string(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    c
}

/// Waits for `child` to exit within `limit`, killing it and failing the
/// test at the limit (no test waits on a process without a bound).
fn finish_within(mut child: std::process::Child, limit: Duration) -> Output {
    let start = std::time::Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reaped");
            panic!(
                "hung: still running after {} s: {}",
                limit.as_secs(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("reaped")
}

#[test]
fn eight_concurrent_writer_processes_never_lose_an_entry() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("job");
    const WRITERS: u32 = 8;
    const SAVES: u32 = 25;
    let children: Vec<_> = (0..WRITERS)
        .map(|w| {
            writer(&dir, &format!("w{w}"), SAVES, 0)
                .spawn()
                .expect("spawn writer")
        })
        .collect();
    for c in children {
        let out = finish_within(c, LIMIT);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let p = ProfileStore::open(&dir)
        .expect("store")
        .load()
        .expect("decodes");
    assert_eq!(p.len(), (WRITERS * SAVES) as usize);
    for w in 0..WRITERS {
        for i in 0..SAVES {
            let e = p
                .shapes(&format!("w{w}-{i}"))
                .unwrap_or_else(|| panic!("entry w{w}-{i} lost"));
            assert_eq!(e.get("x").size.to_string(), format!("({},10)", i + 2));
        }
    }
}

/// A splitmix64 step: the delays of the kill trials, reproducible.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn sigkill_during_saves_never_leaves_a_corrupt_or_partial_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("job");
    // A large profile (2,000 entries, ~100 KB) makes each save take long enough to be
    // killed in the middle of writing.
    let seed = writer(&dir, "seed", 1, 2_000)
        .output_within(LIMIT)
        .expect("seed");
    assert!(
        seed.status.success(),
        "{}",
        String::from_utf8_lossy(&seed.stderr)
    );
    let path = ProfileStore::open(&dir).expect("store").path();
    let mut rng = 0x5eed_u64;
    let mut saved_before_kill = 0usize;
    let mut killed_mid_write = 0u32;
    for trial in 0..100 {
        let prefix = format!("t{trial}");
        let mut child = writer(&dir, &prefix, 1000, 0).spawn().expect("spawn");
        if trial % 10 == 9 {
            // Every tenth trial waits for the first save to land, then kills
            // at once (inside the next save): a loaded machine cannot make
            // every kill fall before the first save.
            let first_saved = || {
                std::fs::read(&path)
                    .ok()
                    .and_then(|b| Profile::decode(&b, &ProfileLimits::default()).ok())
                    .is_some_and(|p| p.shapes(&format!("{prefix}-0")).is_some())
            };
            let start = std::time::Instant::now();
            while !first_saved() && start.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            std::thread::sleep(Duration::from_micros(5_000 + next(&mut rng) % 150_000));
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
        let temp_left = std::fs::read_dir(&dir).expect("list").any(|e| {
            e.expect("entry")
                .file_name()
                .to_string_lossy()
                .contains(".tmp-")
        });
        killed_mid_write += u32::from(temp_left);
        // Always a whole file: it decodes, and holds every earlier entry.
        let bytes = std::fs::read(&path).expect("the profile file exists");
        let p = Profile::decode(&bytes, &ProfileLimits::default())
            .unwrap_or_else(|e| panic!("trial {trial}: corrupt profile: {e}"));
        assert!(
            p.shapes("filler-1999").is_some(),
            "trial {trial}: lost the seed"
        );
        // This trial's entries are a prefix 0..k: saves are whole or absent.
        let k = (0..1000)
            .take_while(|i| p.shapes(&format!("{prefix}-{i}")).is_some())
            .count();
        assert!(
            p.shapes(&format!("{prefix}-{k}")).is_none()
                && (k..1000).all(|i| p.shapes(&format!("{prefix}-{i}")).is_none()),
            "trial {trial}: entries saved out of order"
        );
        saved_before_kill += k;
    }
    // The kills landed while saving, not only before the first save.
    assert!(
        saved_before_kill > 0,
        "no trial saved anything before its kill"
    );
    eprintln!(
        "100 kill trials: {saved_before_kill} saves completed, {killed_mid_write} kills left a temp file (killed mid-write)"
    );
    // Temp files left by killed writers are removed by the next save.
    ProfileStore::open(&dir)
        .expect("store")
        .save(&Profile::new())
        .expect("save");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `ccol scenario run` of scenario 9 with `--json`, without this process's
/// timeout and job id variables.
fn seq_len_json_run() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.args([
        "scenario",
        "run",
        s(&scenario("09_issue_seq_len.json")),
        "--json",
    ])
    .env_remove("CCOL_TIMEOUT_S")
    .env_remove("CCOL_JOB_ID")
    .env_remove("TORCHELASTIC_RUN_ID");
    c
}

#[test]
fn the_environment_names_the_profile_per_job_and_the_trace_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("profiles");
    let traces = tmp.path().join("traces");
    let run = |job: Option<&str>| {
        let mut c = seq_len_json_run();
        c.env("CCOL_PROFILE_DIR", &root)
            .env("CCOL_TRACE_DIR", &traces);
        if let Some(j) = job {
            c.env("TORCHELASTIC_RUN_ID", j);
        }
        c.output_within(LIMIT).expect("ccol runs")
    };
    let compiles = |o: &Output| -> Value {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: Value = serde_json::from_str(stdout(o).trim()).expect("JSON");
        v["ranks"][0]["compiles"].clone()
    };
    assert_eq!(compiles(&run(Some("run-7"))), 2);
    assert!(root.join("run-7").join("profile.ccol").is_file());
    assert_eq!(compiles(&run(Some("run-7"))), 1);
    // Another job id starts from nothing.
    assert_eq!(compiles(&run(Some("run-8"))), 2);
    // Each rank traced the last run (job run-8: two compiles, two exchanges).
    for r in 0..2 {
        let t = std::fs::read_to_string(traces.join(format!("rank-{r}.jsonl"))).expect("trace");
        assert_eq!(t.lines().count(), 2, "{t}");
    }
    // A profile directory without a job id is an error naming both variables.
    let out = run(None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CCOL_JOB_ID") && err.contains("TORCHELASTIC_RUN_ID"),
        "{err}"
    );
}

/// One trace line of rank `rank` at exchange `seq` under `key`.
fn trace_line(rank: u32, seq: u64, key: &str) -> String {
    trace_line_in(2, rank, seq, key)
}

/// One trace record of `rank` in a world of `world` ranks.
fn trace_line_in(world: u32, rank: u32, seq: u64, key: &str) -> String {
    json!({"rank": rank, "world_size": world, "seq": seq, "key": key, "kind": "x",
        "config_digest": "0", "payload_digest": "0", "merged_digest": null,
        "bytes_sent": 0, "bytes_received": 0, "duration_us": 0, "fast_path": null,
        "outcome": "ok", "error": null})
    .to_string()
        + "\n"
}

#[test]
fn ccol_trace_names_a_divergence_at_the_largest_sequence_number() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (
        tmp.path().join("rank-0.jsonl"),
        tmp.path().join("rank-1.jsonl"),
    );
    std::fs::write(&a, trace_line(0, u64::MAX, "a")).expect("write");
    std::fs::write(&b, trace_line(1, u64::MAX, "b")).expect("write");
    let out = ccol(&["trace", s(&a), s(&b)]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).contains("first divergence at exchange #18446744073709551615"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn empty_profile_variables_count_as_unset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = |vars: &[(&str, &str)]| {
        let mut c = seq_len_json_run();
        c.current_dir(tmp.path())
            .env_remove("CCOL_TRACE_DIR")
            .envs(vars.iter().copied());
        let out = c.output_within(LIMIT).expect("ccol runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // CCOL_PROFILE_DIR="" is off: no profile in the working directory.
    run(&[("CCOL_PROFILE_DIR", ""), ("CCOL_JOB_ID", "job-1")]);
    assert!(!tmp.path().join("job-1").exists());
    // CCOL_JOB_ID="" falls back to torchrun's run id.
    let root = tmp.path().join("profiles");
    run(&[
        ("CCOL_PROFILE_DIR", s(&root)),
        ("CCOL_JOB_ID", ""),
        ("TORCHELASTIC_RUN_ID", "run-3"),
    ]);
    assert!(root.join("run-3").join("profile.ccol").is_file());
}

#[test]
fn a_corrupt_profile_is_reported_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("short.ccol");
    std::fs::write(&file, b"CCOLPGO\0").expect("write");
    let out = ccol(&["profile", "show", s(&file)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim_end(),
        format!(
            "ccol: profile {}: corrupt: truncated: 32 bytes needed, 8 present; \
             move it aside to start a new profile",
            file.display()
        ),
    );
}

#[test]
fn ccol_trace_of_a_directory_orders_ranks_by_number() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for r in 0..12 {
        let f = tmp.path().join(format!("rank-{r}.jsonl"));
        std::fs::write(f, trace_line_in(12, r, 0, "k")).expect("write");
    }
    let out = ccol(&["trace", s(tmp.path())]);
    assert_eq!(out.status.code(), Some(0));
    let header: Vec<String> = stdout(&out)
        .lines()
        .next()
        .expect("a header")
        .split("rank ")
        .skip(1)
        .map(|r| r.trim().to_owned())
        .collect();
    let want: Vec<String> = (0..12).map(|r| r.to_string()).collect();
    assert_eq!(header, want);
}

#[test]
fn merging_into_a_stores_profile_file_waits_for_its_lock() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for (dir, key) in [(&a, "a"), (&b, "b")] {
        let mut p = Profile::new();
        p.record_shapes(
            key,
            &compiler_collectives::decisions::shapes::FrameState::new(),
        );
        ProfileStore::open(dir)
            .expect("store")
            .save(&p)
            .expect("save");
    }
    let store = tmp.path().join("job");
    std::fs::create_dir(&store).expect("mkdir");
    // A job's rank holds the store's lock (in the middle of a save).
    let lock = std::fs::File::create(store.join("profile.ccol.lock")).expect("lock file");
    fs4::FileExt::lock(&lock).expect("lock");
    let target = store.join("profile.ccol");
    let merge = Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(["profile", "merge", s(&a), s(&b), "-o", s(&target)])
        .stdout(Stdio::null())
        .spawn()
        .expect("ccol runs");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!target.exists(), "merge wrote while the lock was held");
    fs4::FileExt::unlock(&lock).expect("unlock");
    assert!(finish_within(merge, LIMIT).status.success());
    let merged = ProfileStore::open(&store)
        .expect("store")
        .load()
        .expect("load");
    assert_eq!(merged.len(), 2);
}

#[test]
fn ccol_trace_ignores_files_of_ranks_outside_rank_0s_world() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // An earlier run of 3 ranks left rank-2.jsonl; this run has 2 ranks.
    std::fs::write(
        tmp.path().join("rank-2.jsonl"),
        trace_line_in(3, 2, 0, "old"),
    )
    .expect("write");
    for r in 0..2 {
        let f = tmp.path().join(format!("rank-{r}.jsonl"));
        std::fs::write(f, trace_line(r, 0, "k")).expect("write");
    }
    let out = ccol(&["trace", s(tmp.path())]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("ignoring the trace of rank 2: rank 0's trace is of a world of 2"),
        "{}",
        stdout(&out)
    );
}
