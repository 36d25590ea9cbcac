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

/// A small `ccol bench` into `out`: its stdout and its bench.json.
fn run(engine: &str, out: &Path, extra: &[&str]) -> (String, Value) {
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
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "ccol bench failed: {}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("ours/flr"), "no table:\n{stdout}");
    let svg = std::fs::read_to_string(out.join("latency.svg")).expect("latency.svg");
    assert!(svg.contains("<svg") && svg.contains("sources per state"));
    let report =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).expect("bench.json"))
            .expect("bench.json is JSON");
    (stdout, report)
}

/// `ccol bench --from FILE` and `extra`: its stdout, asserting success.
fn redraw(file: &Path, extra: &[&str]) -> String {
    let o = ccol()
        .args(["bench", "--from"])
        .arg(file)
        .args(extra)
        .output_within(LIMIT)
        .expect("ccol runs");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "ccol bench --from failed: {}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

/// The tables of a live run are the tables drawn again from its
/// bench.json: the file holds everything they show.
fn check_redrawn(stdout: &str, out: &Path) {
    let tables = stdout
        .rsplit_once("\nwrote ")
        .map_or(stdout, |(tables, _)| tables);
    let again = redraw(&out.join("bench.json"), &[]);
    let (said, redrawn) = again
        .split_once("\n\n")
        .expect("a line on the run, then the tables");
    assert!(
        said.starts_with("measured by `ccol bench --engine ") && said.contains(" CPU"),
        "{said}"
    );
    assert_eq!(redrawn, tables);
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
    let (stdout, report) = run(
        "in-process",
        out.path(),
        &["--flat-max", "16", "--scale-max", "64"],
    );
    check_exchange(&report, "in-process");
    check_redrawn(&stdout, out.path());
    assert_eq!(report["run"]["ccol_version"], env!("CARGO_PKG_VERSION"));
    assert!(report["run"]["seconds"].as_f64() > Some(0.0));
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
    let (stdout, report) = run("gloo", out.path(), &["--no-scale"]);
    check_exchange(&report, "gloo");
    check_redrawn(&stdout, out.path());
    assert!(report["scale"].as_array().unwrap().is_empty());
}

/// A bench.json as `ccol bench` writes it, cut to two rows; the values are
/// those of a Gloo run on the project's machine (2026-12-02). Derived
/// fields (ratios, targets) are left out: `--from` computes them again.
const FIXTURE: &str = r#"{
  "engine": "gloo", "rounds": 200, "warmup": 30,
  "run": {
    "command": "ccol bench --ranks 2 --sources 20,200 --out bench-out",
    "ccol_version": "0.1.0", "started_utc": "2026-12-02 14:05 UTC", "seconds": 292.4,
    "platform": "linux x86_64", "cpus": 2,
    "load_average_before": 1.17, "load_average_after": 7.52
  },
  "exchange": [
    {"engine": "gloo", "world_size": 2, "sources": 20, "envelope_bytes": 345, "pickle_bytes": 1675,
     "ours_ms": {"p50": 0.184, "p90": 0.286}, "owned_ms": {"p50": 0.192, "p90": 0.292},
     "floor_ms": {"p50": 0.321, "p90": 0.458}, "fast_ms": {"p50": 0.176, "p90": 0.25},
     "floor16_ms": {"p50": 0.189, "p90": 0.277}, "pytorch_ms": {"p50": 3.578, "p90": 7.298},
     "torch_gloo16_ms": {"p50": 0.639, "p90": 3.099},
     "heap_per_exchange": {"allocated_bytes": 22870, "allocations": 33, "peak_live_bytes": 16432}},
    {"engine": "gloo", "world_size": 2, "sources": 200, "envelope_bytes": 3146, "pickle_bytes": 14915,
     "ours_ms": {"p50": 0.213, "p90": 0.311}, "owned_ms": {"p50": 0.254, "p90": 0.474},
     "floor_ms": {"p50": 0.345, "p90": 1.515}, "fast_ms": {"p50": 0.186, "p90": 0.309},
     "floor16_ms": {"p50": 0.607, "p90": 0.818}, "pytorch_ms": {"p50": 11.398, "p90": 15.822},
     "torch_gloo16_ms": {"p50": 0.98, "p90": 4.001},
     "heap_per_exchange": {"allocated_bytes": 31350, "allocations": 33, "peak_live_bytes": 21820}}
  ],
  "heap_note": null,
  "join": {"ranks": 64, "sources": 1000, "ours_ms": 1.69, "ours_folded_ms": 1.706, "pytorch_ms": 357.8},
  "wire": [
    {"sources": 20, "ours_bytes": 345, "pickle_bytes": 1675},
    {"sources": 200, "ours_bytes": 3146, "pickle_bytes": 14915}
  ],
  "scale": [
    {"world_size": 16, "hierarchical": false, "exchange_ms": 1.52, "max_received_bytes": 61440, "payload_bytes": 291},
    {"world_size": 16, "hierarchical": true, "exchange_ms": 1.97, "max_received_bytes": 1664, "payload_bytes": 291}
  ]
}"#;

/// Whole Markdown lines `--from FIXTURE --markdown` must print, in order.
const MARKDOWN: &[&str] = &[
    "measured by `ccol bench --ranks 2 --sources 20,200 --out bench-out` (ccol 0.1.0), started 2026-12-02 14:05 UTC, 292 s: linux x86_64, 2 CPUs, one-minute load average 1.17 before and 7.52 after",
    "exchange + merge latency, ms (p50 / p90 over rounds; a round = the slowest rank)",
    "| engine | ranks | sources | bytes | ours | floor | pytorch | ours/flr | torch/ours | fast path | 16B gather | fast/16B | torch 16B |",
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    "| gloo | 2 | 20 | 345 | 0.184 / 0.286 | 0.321 / 0.458 | 3.578 / 7.298 | 0.57 | 19.45 | 0.176 / 0.250 | 0.189 / 0.277 | 0.93 | 0.639 / 3.099 |",
    "| gloo | 2 | 200 | 3146 | 0.213 / 0.311 | 0.345 / 1.515 | 11.398 / 15.822 | 0.62 | 53.51 | 0.186 / 0.309 | 0.607 / 0.818 | 0.31 | 0.980 / 4.001 |",
    "| engine | ranks | sources | new value | new/flr | new/ours |",
    "| gloo | 2 | 200 | 0.254 / 0.474 | 0.74 | 1.19 |",
    "| engine | ranks | sources | bytes alloc'd | allocations | peak live bytes |",
    "| gloo | 2 | 20 | 22870 | 33 | 16432 |",
    "join, 64 ranks × 1000 sources: ours 1.690 ms (join_all; Join::join folded 1.706 ms), PyTorch 357.8 ms, PyTorch/ours 211.72",
    "| sources | ours | pickle | ours/pickle |",
    "| 200 | 3146 | 14915 | 0.21 |",
    "| ranks | exchange | ms | max bytes/rank | 2·payload·log2 N |",
    "| 16 | flat | 1.52 | 61440 | 2328 |",
    "| 16 | hierarchical | 1.97 | 1664 | 2328 |",
    "| met | target | measured |",
    "| :--- | :--- | :--- |",
    "| met | gloo: ours / raw floor <= 1.2 (every row) | 0.57, 0.62 |",
    "| met | gloo: PyTorch / ours >= 10 (2 ranks, 200 sources) | 53.51 |",
    "| - | gloo: PyTorch / ours >= 3 (4 ranks, 200 sources) | - |",
    "| met | gloo: fast path / 16-byte all_gather <= 1.1 (every row) | 0.93, 0.31 |",
    "| met | join: PyTorch / ours >= 100 (64 ranks x 1000 sources) | 211.72 |",
    "| met | wire: ours / pickle <= 0.25 (every state size) | 0.21, 0.21 |",
    "| met | scale: hierarchical max bytes / (2 payload log2 N) <= 1 | 0.71 |",
    "| - | scale: 4096 simulated ranks complete | - |",
];

#[test]
fn a_bench_json_is_drawn_again_as_markdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bench.json");
    std::fs::write(&file, FIXTURE).expect("write the fixture");
    let got = redraw(&file, &["--markdown"]);
    let lines: Vec<&str> = got.lines().collect();
    let mut at = 0;
    for want in MARKDOWN {
        match lines[at..].iter().position(|l| l == want) {
            Some(i) => at += i + 1,
            None => panic!("no line {want:?} after line {at} of:\n{got}"),
        }
    }
    // Markdown needs a blank line between a paragraph and a table.
    assert!(got.contains("the slowest rank)\n\n| engine |"), "{got}");
    // No aligned text: no text table's header.
    assert!(!got.contains("engine ranks sources"), "{got}");
}

#[test]
fn a_file_that_is_not_a_whole_bench_json_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bench.json");
    let cut = FIXTURE.replace(r#""floor_ms": {"p50": 0.345, "p90": 1.515}, "#, "");
    std::fs::write(&file, cut).expect("write");
    let (_, err) = usage_error(ccol().args(["bench", "--from"]).arg(&file), LIMIT);
    assert!(err.contains("exchange[1]: no `floor_ms`"), "{err}");
    let (_, err) = usage_error(ccol().args(["bench", "--from", "nowhere.json"]), LIMIT);
    assert!(err.contains("nowhere.json: cannot read"), "{err}");
    // --from measures nothing, so it takes no measuring option.
    let (_, err) = usage_error(
        ccol().args(["bench", "--ranks", "2", "--from"]).arg(&file),
        LIMIT,
    );
    assert!(err.contains("cannot be used with"), "{err}");
}
