//! `ccol bench`: tiny runs that check the output's shape and sanity (no
//! timing assertions: speed is what the command measures, not what tests check).

use compiler_collectives_conformance::process::OutputWithin;
use serde_json::Value;
use std::path::Path;
use std::process::Command;

mod common;
use common::usage_error;

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

fn ccol() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.env_remove("CCOL_TIMEOUT_S")
        .env_remove("CCOL_GLOO_STORE")
        .env_remove("CCOL_TORCH_PYTHON");
    c
}

fn run(engine: &str, out: &Path, extra: &[&str]) -> Value {
    let o = ccol()
        .args([
            "bench",
            "--engine",
            engine,
            "--ranks",
            "2",
            "--sources",
            "20,200",
        ])
        .args([
            "--rounds",
            "3",
            "--warmup",
            "1",
            "--no-pytorch",
            "--no-c10d",
            "--out",
        ])
        .arg(out)
        .args(extra)
        .output_within(LIMIT)
        .expect("ccol runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "ccol bench failed: {}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("ours/flr"), "no table:\n{stdout}");
    let svg = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    assert!(svg.contains("<svg") && svg.contains("sources per state"));
    serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).expect("bench.json"))
        .expect("bench.json is JSON")
}

fn positive(v: &Value) -> bool {
    v.as_f64().is_some_and(|x| x > 0.0 && x.is_finite())
}

fn check_exchange(report: &Value, engine: &str) {
    assert_eq!(report["engine"], engine);
    let rows = report["exchange"].as_array().expect("exchange rows");
    assert_eq!(rows.len(), 2);
    for (row, sources) in rows.iter().zip([20, 200]) {
        assert_eq!(row["world_size"], 2);
        assert_eq!(row["sources"], sources);
        for field in ["ours_ms", "floor_ms", "fast_ms", "floor16_ms"] {
            assert!(positive(&row[field]["p50"]), "{field}: {row}");
            assert!(row[field]["p90"].as_f64() >= row[field]["p50"].as_f64());
        }
        assert!(positive(&row["ours_over_floor"]));
        assert!(row["pytorch_ms"].is_null(), "--no-pytorch ran PyTorch");
    }
    // Every target of the issue is listed, measured or not.
    let targets = report["targets"].as_array().expect("targets");
    assert!(targets.len() >= 7, "{targets:?}");
    assert!(targets
        .iter()
        .all(|t| t["target"].is_string() && (t["met"].is_boolean() || t["met"].is_null())));
    // A state of 200 sources is about ten times one of 20.
    let bytes = |i: usize| rows[i]["envelope_bytes"].as_u64().unwrap();
    assert!(bytes(1) > 5 * bytes(0) && bytes(0) > 20 * 10, "{rows:?}");
}

#[test]
fn in_process_bench_writes_table_json_and_chart() {
    let out = tempfile::tempdir().expect("tempdir");
    let report = run(
        "in-process",
        out.path(),
        &["--flat-max", "16", "--scale-max", "64"],
    );
    check_exchange(&report, "in-process");
    assert!(positive(&report["join"]["ours_ms"]));
    assert_eq!(report["join"]["ranks"], 64);
    let wire = report["wire"].as_array().unwrap();
    assert_eq!(wire.len(), 2);
    assert!(wire[0]["pickle_bytes"].is_null());
    // Scale: flat at 16, hierarchical at 16 and 64, bytes within the bound.
    let scale = report["scale"].as_array().unwrap();
    let shape: Vec<(u64, bool)> = scale
        .iter()
        .map(|s| (s["world_size"].as_u64().unwrap(), s["hierarchical"] == true))
        .collect();
    assert_eq!(shape, vec![(16, false), (16, true), (64, true)]);
    for s in scale {
        let got = s["max_received_bytes"].as_u64().unwrap();
        assert!(got > 0 && positive(&s["exchange_ms"]), "{s}");
        if s["hierarchical"] == true {
            assert!(got <= s["bound_bytes"].as_u64().unwrap(), "{s}");
        } else {
            // Flat: every other rank's payload.
            assert!(got >= 15 * s["payload_bytes"].as_u64().unwrap(), "{s}");
        }
    }
}

#[test]
fn bad_lists_are_usage_errors() {
    let (_, err) = usage_error(ccol().args(["bench", "--ranks", "2,x"]), LIMIT);
    assert!(err.contains("comma-separated"));
}

#[cfg(feature = "gloo")]
#[test]
fn gloo_bench_runs_rank_processes() {
    let out = tempfile::tempdir().expect("tempdir");
    let report = run("gloo", out.path(), &["--no-scale"]);
    check_exchange(&report, "gloo");
    assert!(report["scale"].as_array().unwrap().is_empty());
}
