//! `ccol` as a user runs it: outputs and exit codes.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios")
}

fn ccol(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(args)
        .env_remove("CCOL_TIMEOUT_S")
        .output()
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
    let last = text.lines().last().unwrap_or_default();
    let passed: u32 = last
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 22, "{last}");
    assert!(last.ends_with(", 0 failed"), "{last}");
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
    let out = child.wait_with_output().expect("ccol ends");
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
