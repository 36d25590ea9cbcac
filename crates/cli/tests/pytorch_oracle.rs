//! The PyTorch oracle (`tests/pytorch-oracle/`): every scenario file, in every
//! mode it has an expectation for, gives the same output on real PyTorch
//! Dynamo (CPU ranks over Gloo) as on ccol's runner, on PyTorch's exchange and
//! on the package's; the package's traces (FX graphs, guards, code state) are
//! PyTorch's; the randomized lattice differential finds no difference; a
//! wrong expectation fails the comparison.
//!
//! Needs a Python with one of [`TORCH_SERIES`]: `CCOL_TORCH_PYTHON`, else
//! `python3` when it imports one. `scripts/test.sh` runs these tests on torch
//! 2.13.0 (in its `cargo test` of the default members) and again on 2.14.1. Without one these tests print why and pass, unless
//! `CCOL_STRICT_SKIPS=1` (set by `scripts/test.sh`, which installs torch):
//! then they fail.

use compiler_collectives_conformance::process::OutputWithin;
use compiler_collectives_conformance::skip::{skip_test, Missing};
use serde_json::Value;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::assert_summary;

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(1200);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn oracle_dir() -> PathBuf {
    repo().join("tests/pytorch-oracle")
}

/// The torch release series the oracle's harness was checked on (the
/// versions `scripts/setup-torch.sh` installs: `run_compiler_collective`,
/// which its device patch rewrites, has the same source in each).
const TORCH_SERIES: &[&str] = &["2.13.", "2.14.", "2.15."];

/// [`TORCH_SERIES`] in words: `2.13.x, 2.14.x, 2.15.x`.
fn series() -> String {
    format!("{}x", TORCH_SERIES.join("x, "))
}

/// The Python with a torch of [`TORCH_SERIES`], or `None` after the skip
/// rule (a failure under `CCOL_STRICT_SKIPS=1`).
fn torch_python() -> Option<PathBuf> {
    let candidate = std::env::var_os("CCOL_TORCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let check = format!(
        "import sys, torch, numpy; sys.exit(0 if torch.__version__.startswith({:?}) else 3)",
        TORCH_SERIES
    )
    .replace('[', "(")
    .replace(']', ")");
    let why = match Command::new(&candidate)
        .args(["-c", &check])
        .output_within(LIMIT)
    {
        Ok(o) if o.status.success() => return Some(candidate),
        Ok(o) => format!(
            "{} cannot import torch ({}) and numpy (exit {:?}): {}",
            candidate.display(),
            series(),
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run {}: {e}", candidate.display()),
    };
    skip_test(
        "pytorch_oracle",
        Missing::install(format!(
            "the PyTorch oracle needs torch {} (run scripts/setup-torch.sh, set CCOL_TORCH_PYTHON): {why}",
            series()
        )),
    );
    None
}

/// Prints past libtest's output capture, so the counts show in CI logs.
fn report(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{}", text.trim_end());
}

/// `ccol scenario compare --exchange <exchange>` (`pytorch`: Dynamo's own
/// exchange; `package`: the compiler_collectives Python package), the
/// harness recording each job's detail under `details/<exchange>/`.
fn compare_with(python: &Path, exchange: &str, details: &Path, args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(["scenario", "compare", "--json", "--timeout", "5"])
        .args(["--exchange", exchange])
        .args(args)
        .env("CCOL_TORCH_PYTHON", python)
        .env("CCOL_PYTORCH_ORACLE", oracle_dir().join("harness.py"))
        .env("CCOL_ORACLE_DETAIL_DIR", details)
        .env_remove("CCOL_TIMEOUT_S")
        .output_within(LIMIT)
        .expect("ccol runs")
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Scenario files the harness's README lists as not expressible in PyTorch
/// (lines "- `FILE`: reason" under "## Unsupported scenario files").
fn listed_unsupported() -> Vec<String> {
    let readme =
        std::fs::read_to_string(oracle_dir().join("README.md")).expect("the oracle's README");
    let mut in_section = false;
    let mut files = Vec::new();
    for line in readme.lines() {
        if line.starts_with("## ") {
            in_section = line.starts_with("## Unsupported scenario files");
            continue;
        }
        if in_section {
            if let Some(rest) = line.strip_prefix("- `") {
                if let Some(end) = rest.find('`') {
                    files.push(rest[..end].to_string());
                }
            }
        }
    }
    files
}

/// The corpus on PyTorch's own exchange (the CPU device patch) and, at the
/// same time, with the collective modes on the compiler_collectives package
/// (`enable()` in each rank, no device patch); then the package's traces
/// against PyTorch's, job by job (`harness.py --compare-detail`): each
/// rank's compile steps, FX graph code, and after each step its guards and
/// the code state Dynamo wrote, equal in every job both finished, with the
/// package skipping Dynamo's restart where it cannot change anything. The
/// harness also fails a package job in which a rank ran a torch collective
/// or Dynamo made a group of its own during the steps.
#[test]
fn every_scenario_matches_pytorch_on_both_exchanges_and_traces_as_pytorch() {
    let Some(python) = torch_python() else { return };
    let probe = Command::new(&python)
        .args(["-c", "import compiler_collectives.torch"])
        .output_within(LIMIT);
    let package = match probe {
        Ok(o) if o.status.success() => true,
        other => {
            let why = match other {
                Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                Err(e) => e.to_string(),
            };
            skip_test(
                "pytorch_oracle",
                Missing::install(format!(
                    "the package runs need compiler_collectives installed in {} \
                     (scripts/setup-python.sh builds and installs it): {why}",
                    python.display()
                )),
            );
            false
        }
    };
    let details = tempfile::tempdir().expect("temp dir");
    std::thread::scope(|s| {
        let theirs = s.spawn(|| every_scenario_matches(&python, "pytorch", details.path()));
        if package {
            every_scenario_matches(&python, "package", details.path());
        }
        if let Err(panic) = theirs.join() {
            std::panic::resume_unwind(panic);
        }
    });
    if !package {
        return;
    }
    let out = Command::new(&python)
        .arg(oracle_dir().join("harness.py"))
        .arg("--compare-detail")
        .arg(details.path())
        .output_within(LIMIT)
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary: Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary from --compare-detail:\n{stdout}"));
    report(&format!(
        "pytorch oracle: the package's traces against PyTorch's: {} jobs compared, {} differences; \
         the package skipped the restart in {} compiles and restarted in {}",
        summary["compared"], summary["differ"], summary["restart_skipped"], summary["restarted"]
    ));
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(summary["differ"], 0, "{stdout}");
    assert!(summary["compared"].as_u64().unwrap_or(0) > 0, "{stdout}");
    assert!(
        summary["restart_skipped"].as_u64().unwrap_or(0) > 0,
        "the skip never fired:\n{stdout}"
    );
}

fn every_scenario_matches(python: &Path, exchange: &str, details: &Path) {
    let dir = repo().join("tests/scenarios");
    let out = compare_with(python, exchange, details, &[&dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = json_lines(&out);
    let summary = lines
        .iter()
        .find_map(|v| v.get("summary"))
        .unwrap_or_else(|| {
            panic!(
                "no summary from ccol scenario compare (exit {:?})\n{stdout}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let jobs: Vec<&Value> = lines.iter().filter(|v| v.get("mode").is_some()).collect();
    for j in &jobs {
        if j["status"] == "differ" {
            eprintln!(
                "DIFF {} {}:\n  ccol    {}\n  pytorch {}\n  expect  {}\n  {}",
                j["file"], j["mode"], j["ccol"], j["pytorch"], j["expect"], j["reason"]
            );
        }
    }
    // Every file × every mode it has an expectation for was compared.
    let mut expected_jobs = 0;
    for entry in std::fs::read_dir(&dir).expect("scenario dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(name) = name.filter(|n| n.ends_with(".json") && !n.ends_with(".schema.json"))
        else {
            continue;
        };
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("readable"))
            .expect("valid JSON");
        let modes: Vec<String> = v["expect"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for mode in &modes {
            expected_jobs += 1;
            let found = jobs.iter().any(|j| {
                j["mode"] == mode.as_str() && j["file"].as_str().is_some_and(|f| f.ends_with(&name))
            });
            assert!(found, "{name} {mode}: not compared\n{stdout}");
        }
    }
    let unsupported: Vec<String> = jobs
        .iter()
        .filter(|j| j["status"] == "unsupported")
        .filter_map(|j| j["file"].as_str())
        .map(|f| {
            Path::new(f)
                .file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into_owned())
        })
        .collect();
    let listed = listed_unsupported();
    for f in &unsupported {
        assert!(
            listed.contains(f),
            "{f}: PyTorch cannot express it, but tests/pytorch-oracle/README.md does not list it"
        );
    }
    let compared = summary["compared"].as_u64().unwrap_or(0);
    let differ = summary["differ"].as_u64().unwrap_or(u64::MAX);
    report(&format!(
        "pytorch oracle ({exchange} exchange): compared {compared} scenario-modes with real PyTorch: {} equal, {differ} differ, {} not expressible in PyTorch",
        summary["equal"],
        unsupported.len()
    ));
    assert_eq!(differ, 0, "ccol and PyTorch differ:\n{stdout}");
    assert_eq!(
        compared + unsupported.len() as u64,
        expected_jobs,
        "every expected mode of every file is compared or listed as unsupported"
    );
    assert!(compared > 0, "nothing was compared");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}

#[test]
fn randomized_lattice_differential_finds_no_difference() {
    let Some(python) = torch_python() else { return };
    let out = Command::new(&python)
        .arg(oracle_dir().join("differential.py"))
        .args(["--cases", "10000", "--ccol", env!("CARGO_BIN_EXE_ccol")])
        .output_within(LIMIT)
        .expect("the differential runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    report(&stdout);
    assert!(
        out.status.success(),
        "differential failed (exit {:?}):\n{stdout}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_summary(
        &stdout,
        |l| l.split(": ").nth(2).and_then(|s| s.split(' ').next()),
        10_000,
        " 0 differences",
    );
}

#[test]
fn a_wrong_expectation_fails_the_comparison() {
    let Some(python) = torch_python() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(repo().join("tests/scenarios/01_tensor.json"))
        .expect("01_tensor.json");
    let mut v: Value = serde_json::from_str(&text).expect("valid JSON");
    // Rank 1 really compiles once with collectives; claim twice.
    v["expect"]["collectives"]["ranks"][1]["compiles"] = 2.into();
    v["expect"]["collectives"]["ranks"][1]["compile_steps"] = serde_json::json!([0, 2]);
    let file = dir.path().join("wrong.json");
    std::fs::write(&file, v.to_string()).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_ccol"))
        .args(["scenario", "compare", "--mode", "collectives"])
        .arg(&file)
        .env("CCOL_TORCH_PYTHON", &python)
        .env("CCOL_PYTORCH_ORACLE", oracle_dir())
        .output_within(LIMIT)
        .expect("ccol runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("rank 1 compiles: ccol 1  pytorch 1  expect 2"),
        "{stdout}"
    );
    assert!(stdout.contains("1 differ"), "{stdout}");
}
