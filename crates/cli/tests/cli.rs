//! `ccol` as a user runs it: outputs and exit codes.

use compiler_collectives_conformance::process::OutputWithin;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

mod common;
use common::assert_summary;

/// The most one `ccol` command of these tests may run before it is stopped
/// and the test fails with its output (no test waits on a process without
/// a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios")
}

fn ccol(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(args)
        .env_remove("CCOL_TIMEOUT_S")
        .output_within(LIMIT)
        .expect("ccol runs")
}

fn run_json(file: &str, flags: &[&str]) -> (Value, i32) {
    let path = scenarios().join(file);
    let mut args = vec![
        "scenario",
        "run",
        path.to_str().expect("utf-8 path"),
        "--json",
    ];
    args.extend_from_slice(flags);
    let out = ccol(&args);
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "--json prints one line: {stdout}");
    (
        serde_json::from_str(lines[0]).expect("valid JSON"),
        out.status.code().unwrap_or(-1),
    )
}

fn rank_field(v: &Value, rank: usize, field: &str) -> Value {
    v["ranks"][rank][field].clone()
}

#[test]
fn tensor_with_collectives_compiles_once_per_rank() {
    let (v, code) = run_json("01_tensor.json", &[]);
    assert_eq!(code, 0);
    assert_eq!(v["name"], "tensor");
    for r in 0..2 {
        assert_eq!(rank_field(&v, r, "compiles"), 1);
        assert_eq!(rank_field(&v, r, "compile_steps"), serde_json::json!([0]));
        assert_eq!(rank_field(&v, r, "dynamic"), serde_json::json!({"x": [0]}));
    }
}

#[test]
fn tensor_without_collectives_recompiles_at_different_steps() {
    let (v, code) = run_json("01_tensor.json", &["--no-collectives"]);
    assert_eq!(code, 0);
    assert_eq!(rank_field(&v, 0, "compiles"), 2);
    assert_eq!(
        rank_field(&v, 0, "compile_steps"),
        serde_json::json!([0, 1])
    );
    assert_eq!(rank_field(&v, 1, "compiles"), 2);
    assert_eq!(
        rank_field(&v, 1, "compile_steps"),
        serde_json::json!([0, 2])
    );
}

#[test]
fn json_keys_are_sorted() {
    let path = scenarios().join("02_scalar.json");
    let out = ccol(&["scenario", "run", path.to_str().expect("utf-8"), "--json"]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let rank0 = text.find("\"compile_steps\"").expect("compile_steps");
    let compiles = text.find("\"compiles\"").expect("compiles");
    let dynamic = text.find("\"dynamic\"").expect("dynamic");
    let rank = text.find("\"rank\"").expect("rank");
    assert!(
        rank0 < compiles && compiles < dynamic && dynamic < rank,
        "{text}"
    );
}

#[test]
fn rank_that_misses_alone_fails_at_once_naming_the_other() {
    // Scenario 8 with collectives on and votes off: rank 1 misses alone at step 1.
    let start = std::time::Instant::now();
    let (v, code) = run_json(
        "08_guard_collectives.json",
        &["--collectives", "--no-guard-collectives", "--timeout", "30"],
    );
    assert_eq!(code, 3);
    assert!(start.elapsed().as_secs() < 10, "took {:?}", start.elapsed());
    let err = rank_field(&v, 1, "error");
    assert_eq!(err["kind"], "peer_lost");
    assert_eq!(err["missing_ranks"], serde_json::json!([0]));
    assert_eq!(err["exchange"], 1);
    assert!(rank_field(&v, 0, "error").is_null());
}

#[test]
fn table_output_names_every_rank() {
    let path = scenarios().join("01_tensor.json");
    let out = ccol(&["scenario", "run", path.to_str().expect("utf-8")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(
        text.contains("scenario 'tensor': 2 ranks, 3 steps, mode collectives"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.contains("x[0]")).count(),
        2,
        "{text}"
    );
}

fn malformed(json: &str, field: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.json");
    std::fs::write(&file, json).expect("write");
    let out = ccol(&["scenario", "run", file.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "{json}");
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert!(err.contains("bad.json"), "names the file: {err}");
    assert!(err.contains(field), "names `{field}`: {err}");
}

#[test]
fn malformed_files_exit_2_naming_file_and_field() {
    malformed("{", "EOF");
    malformed(
        r#"{"name":"a","world_size":2,"steps":[[{"x":{"size":[-1]}},{}]]}"#,
        "steps[0][0].x.size[0]",
    );
    malformed(
        r#"{"name":"a","world_size":2,"steps":[[{"x":{"int":-4}},{}]]}"#,
        "steps[0][0].x.int",
    );
    malformed(r#"{"name":"a","world_size":2,"steps":[[{}]]}"#, "steps[0]");
    malformed(
        r#"{"name":"a","world_size":1,"steps":[[{"x":{"size":[2],"stride":[1,1]}}]]}"#,
        "steps[0][0].x.stride",
    );
    malformed(
        r#"{"name":"a","world_size":"two","steps":[]}"#,
        "world_size",
    );
    malformed(
        r#"{"name":"a","world_size":70000,"steps":[]}"#,
        "world_size",
    );
}

#[test]
fn missing_file_and_bad_timeout_exit_2() {
    let out = ccol(&["scenario", "run", "/nonexistent/scenario.json"]);
    assert_eq!(out.status.code(), Some(2));
    let path = scenarios().join("01_tensor.json");
    let out = ccol(&[
        "scenario",
        "run",
        path.to_str().expect("utf-8"),
        "--timeout",
        "-1",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn check_runs_the_built_in_corpus() {
    let out = ccol(&["scenario", "check"]);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert!(out.status.success(), "{text}");
    assert_summary(&text, |l| l.split_whitespace().next(), 22, ", 0 failed");
}

#[test]
fn schema_is_json() {
    let out = ccol(&["scenario", "schema"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("schema parses");
    assert!(v["properties"]["steps"].is_object(), "{v}");
}

#[test]
fn a_closed_output_pipe_ends_ccol_without_a_panic() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(["scenario", "check"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("ccol runs");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("one line");
    // The reader is gone now: ccol's next write meets a closed pipe.
    let start = std::time::Instant::now();
    while child.try_wait().expect("try_wait").is_none() && start.elapsed() < LIMIT {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if start.elapsed() >= LIMIT {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("ccol ends");
    assert!(
        start.elapsed() < LIMIT,
        "hung: ccol did not end within {LIMIT:?} after its reader left"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(101), "ccol panicked: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(first.starts_with("ok"), "{first}");
}

#[test]
fn check_without_any_scenario_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = ccol(&["scenario", "check", dir.path().to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn compare_without_torch_is_one_clear_error() {
    let file = scenarios().join("01_tensor.json");
    let out = ccol(&[
        "scenario",
        "compare",
        "--python",
        "/bin/false",
        file.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/bin/false cannot import torch: set CCOL_TORCH_PYTHON"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no comparison rows without PyTorch");
}

/// Without `--python` or `CCOL_TORCH_PYTHON`, `ccol scenario compare` uses
/// the torch the scripts installed in the cache (`<cache>/torch-2.13.0`):
/// here a stand-in that cannot import torch, named in the error.
#[test]
fn compare_finds_the_torch_of_the_cache() {
    let cache = tempfile::tempdir().expect("tempdir");
    let bin = cache.path().join("torch-2.13.0").join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let python = bin.join("python");
    std::fs::write(&python, "#!/bin/sh\nexit 1\n").expect("write");
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let file = scenarios().join("01_tensor.json");
    let out = ccol_command()
        .args(["scenario", "compare", file.to_str().expect("utf-8 path")])
        .env("CCOL_CACHE", cache.path())
        .output_within(LIMIT)
        .expect("ccol runs");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{} cannot import torch", python.display())),
        "{err}"
    );
}

/// `ccol` as `ccol()` starts it, for tests that set the environment or the
/// working directory.
fn ccol_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.env_remove("CCOL_TIMEOUT_S")
        .env_remove("RUST_LOG")
        .env_remove("CCOL_LOG_FORMAT")
        .env_remove("CCOL_TORCH_PYTHON")
        .env_remove("CCOL_GLOO_STORE");
    c
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `ccol trace` of a file `name` holding `content`: its output and path
/// (and the directory, removed on drop).
fn trace_of(name: &str, content: &str) -> (Output, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    std::fs::write(&file, content).expect("write");
    let out = ccol(&["trace", file.to_str().expect("utf-8")]);
    (out, file, dir)
}

#[test]
fn trace_of_a_file_that_is_not_a_trace_exits_2_naming_it() {
    // One line without its newline: read alone it could pass for a trace cut short.
    let (out, file, _dir) = trace_of("notes.txt", "hello");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "ccol: trace {}: line 1: not a trace record: expected value",
            file.display()
        )),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    // The same after blank lines: the first line with text is named.
    let (out, _, _dir) = trace_of("notes.txt", "\n\n{\"seq\": 0}");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains(": line 3: not a trace record: missing field"),
        "{err}"
    );
}

#[test]
fn trace_of_an_empty_file_is_one_trace_without_exchanges() {
    // What a channel that never exchanged leaves.
    let (out, _, _dir) = trace_of("rank-0.jsonl", "");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "1 trace, no exchanges\n");
}

#[test]
fn counts_of_one_are_singular() {
    // Scenario 15 has 2 ranks and 1 step.
    let path = scenarios().join("15_cache_hit_without_agreement.json");
    let out = ccol(&["scenario", "run", path.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(3));
    let first = text(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        first,
        "scenario 'cache_hit_without_agreement': 2 ranks, 1 step, mode collectives"
    );
    // A trace of one rank's run: "1 trace", not "1 traces".
    let dir = tempfile::tempdir().expect("tempdir");
    let one = scenarios().join("01_tensor.json");
    let traces = dir.path().join("traces");
    let out = ccol(&[
        "scenario",
        "run",
        one.to_str().expect("utf-8"),
        "--trace",
        traces.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let rank0 = traces.join("rank-0.jsonl");
    let out = ccol(&["trace", rank0.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let last = text(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        last,
        "1 trace (#0..#0): no other rank's trace to compare it with"
    );
}

#[test]
fn numbers_that_must_be_positive_say_so() {
    for (args, flag) in [
        (&["bench", "--rounds", "0"][..], "--rounds <ROUNDS>"),
        (&["bench", "--timeout", "0"][..], "--timeout <TIMEOUT>"),
        (&["demo", "--steps", "0"][..], "--steps <STEPS>"),
        (
            &["demo", "--batch-size", "0"][..],
            "--batch-size <BATCH_SIZE>",
        ),
    ] {
        let out = ccol(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!(
                "error: invalid value '0' for '{flag}': must be at least 1\n"
            )),
            "{args:?}: {err}"
        );
        assert!(!err.contains("18446744073709551615"), "{err}");
    }
    let err = text(&ccol(&["bench", "--rounds", "many"]).stderr);
    assert!(
        err.contains(
            "invalid value 'many' for '--rounds <ROUNDS>': not a whole number of at least 1"
        ),
        "{err}"
    );
}

/// A tiny in-process `ccol bench` run with `extra` arguments, in `cwd`.
fn small_bench(cwd: &std::path::Path, env: &[(&str, &std::path::Path)], extra: &[&str]) -> Output {
    let mut c = ccol_command();
    c.current_dir(cwd)
        .env_remove("CCOL_CACHE")
        .env_remove("XDG_CACHE_HOME")
        .args([
            "bench",
            "--engine",
            "in-process",
            "--ranks",
            "2",
            "--sources",
            "20",
        ])
        .args(["--rounds", "2", "--warmup", "1", "--no-c10d", "--no-scale"])
        .args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output_within(LIMIT).expect("ccol runs")
}

/// [`small_bench`] in a fresh working directory with a fresh `CCOL_CACHE`:
/// the two directories and the output.
fn small_bench_in_temp_dirs(extra: &[&str]) -> (tempfile::TempDir, tempfile::TempDir, Output) {
    let cwd = tempfile::tempdir().expect("tempdir");
    let cache = tempfile::tempdir().expect("tempdir");
    let out = small_bench(cwd.path(), &[("CCOL_CACHE", cache.path())], extra);
    (cwd, cache, out)
}

#[test]
fn bench_writes_into_the_cache_directory_by_default_and_says_where() {
    let (cwd, cache, out) = small_bench_in_temp_dirs(&["--no-pytorch"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dir = cache.path().join("bench");
    assert!(dir.join("bench.json").is_file() && dir.join("latency.svg").is_file());
    assert_eq!(
        text(&out.stdout).lines().last().unwrap_or_default(),
        format!(
            "wrote {} and {}",
            dir.join("bench.json").display(),
            dir.join("latency.svg").display()
        )
    );
    // Nothing lands in the working directory (a checkout, usually).
    let left: Vec<_> = std::fs::read_dir(cwd.path()).expect("list").collect();
    assert!(left.is_empty(), "{left:?}");
    // Without CCOL_CACHE: XDG_CACHE_HOME, then HOME.
    let xdg = tempfile::tempdir().expect("tempdir");
    let out = small_bench(
        cwd.path(),
        &[("XDG_CACHE_HOME", xdg.path())],
        &["--no-pytorch"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(xdg
        .path()
        .join("compiler-collectives/bench/bench.json")
        .is_file());
}

#[test]
fn bench_with_a_python_without_torch_is_one_clear_error() {
    let (cwd, cache, out) = small_bench_in_temp_dirs(&["--python", "/bin/false"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("ccol bench: /bin/false cannot import torch: set CCOL_TORCH_PYTHON"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    // Unset: the PyTorch rows are left out, with a note saying how to get them.
    let out = small_bench(cwd.path(), &[("CCOL_CACHE", cache.path())], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("ccol bench: no PyTorch rows: no torch 2.13 found"),
        "{}",
        text(&out.stderr)
    );
}

/// `ccol scenario run` of scenario 15 (rank 1's exchange fails) with these
/// logging variables: (exit code, stdout, stderr).
fn logged_run(vars: &[(&str, &str)], json: bool) -> (i32, String, String) {
    let path = scenarios().join("15_cache_hit_without_agreement.json");
    let mut c = ccol_command();
    c.args(["scenario", "run", path.to_str().expect("utf-8")]);
    if json {
        c.arg("--json");
    }
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c.output_within(LIMIT).expect("ccol runs");
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn rust_log_chooses_what_is_logged_on_stderr() {
    // By default warnings, but not "exchange failed": rank 1's error is in
    // the output already.
    let (code, stdout, stderr) = logged_run(&[], true);
    assert_eq!(code, 3);
    serde_json::from_str::<Value>(stdout.trim()).expect("stdout is one JSON line");
    assert_eq!(stderr, "", "nothing logged twice");
    let (code, stdout, stderr) = logged_run(&[("RUST_LOG", "warn")], true);
    assert_eq!(code, 3);
    serde_json::from_str::<Value>(stdout.trim()).expect("stdout is still one JSON line");
    let warned: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" WARN ccol::exchange: exchange failed"))
        .collect();
    assert_eq!(warned.len(), 1, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(warned[0].contains("outcome=\"peer_lost\""), "{stderr}");
    // No colours when stderr is not a terminal.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    let (_, _, quiet) = logged_run(&[("RUST_LOG", "error")], false);
    assert_eq!(quiet, "");
    let (_, _, verbose) = logged_run(&[("RUST_LOG", "warn,ccol::exchange=debug")], false);
    assert!(verbose.contains(" DEBUG "), "{verbose}");
    assert!(verbose.contains("exchange done"), "{verbose}");
    assert!(verbose.contains("exchange failed"), "{verbose}");
}

#[test]
fn ccol_log_format_json_writes_one_object_per_line() {
    let (code, _, stderr) = logged_run(&[("CCOL_LOG_FORMAT", "json"), ("RUST_LOG", "warn")], false);
    assert_eq!(code, 3);
    let events: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), 1, "{stderr}");
    assert_eq!(events[0]["level"], "WARN");
    assert_eq!(events[0]["target"], "ccol::exchange");
    assert_eq!(events[0]["fields"]["message"], "exchange failed");
    assert_eq!(events[0]["fields"]["outcome"], "peer_lost");
}

#[test]
fn malformed_logging_variables_are_one_warning_each() {
    let (code, _, stderr) = logged_run(&[("RUST_LOG", "x=y=z"), ("CCOL_LOG_FORMAT", "xml")], false);
    assert_eq!(code, 3, "the run goes on");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].starts_with("ccol: warning: RUST_LOG=\"x=y=z\": "),
        "{stderr}"
    );
    assert!(lines[0].ends_with("; showing warnings only"), "{stderr}");
    assert_eq!(
        lines[1],
        "ccol: warning: CCOL_LOG_FORMAT=\"xml\": expected text or json; writing text"
    );
}

#[test]
fn under_ccol_run_every_log_line_has_its_rank_prefix() {
    let path = scenarios().join("15_cache_hit_without_agreement.json");
    let out = ccol_command()
        .env("RUST_LOG", "warn")
        // Rank 0 exits 3: let rank 1 finish too rather than be stopped.
        .args(["run", "--stop-delay", "30", "--nproc-per-node", "2", "--"])
        .arg(env!("CARGO_BIN_EXE_ccol"))
        .args(["scenario", "run", path.to_str().expect("utf-8"), "--json"])
        .output_within(LIMIT)
        .expect("ccol runs");
    let stderr = text(&out.stderr);
    let logged: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("exchange failed"))
        .collect();
    // Each of the 2 processes runs the 2-rank scenario: one warning each.
    assert_eq!(logged.len(), 2, "{stderr}");
    let mut prefixes: Vec<&str> = logged.iter().map(|l| &l[..9]).collect();
    prefixes.sort_unstable();
    assert_eq!(prefixes, ["[rank 0] ", "[rank 1] "], "{stderr}");
}
