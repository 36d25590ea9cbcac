//! `ccol demo`: rank processes over Gloo agreeing on a real corpus.

#[cfg(feature = "gloo")]
use compiler_collectives_conformance::process::OutputWithin;
#[cfg(feature = "gloo")]
use serde_json::Value;
use std::process::Command;

mod common;
use common::usage_error;

/// The most any one command of these tests may run before it is stopped and
/// the test fails with its output (no test waits on a process without a bound).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

fn ccol() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ccol"));
    c.env_remove("CCOL_TIMEOUT_S").env_remove("CCOL_GLOO_STORE");
    c
}

/// A corpus of paragraphs of two lengths (5 and 9 words): a rank often sees
/// the same length twice in a row while another does not.
fn corpus() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut text = String::new();
    for i in 0..40u32 {
        let words = if i % 4 == 0 { 9 } else { 5 };
        for w in 0..words {
            text.push_str(&format!("w{w} "));
        }
        text.push_str("\n\n");
    }
    std::fs::write(dir.path().join("a.txt"), &text).expect("write");
    std::fs::write(dir.path().join("b.txt"), text.replace('w', "v")).expect("write");
    dir
}

#[cfg(feature = "gloo")]
fn run(args: &[&str]) -> (Value, i32) {
    let out = ccol()
        .arg("demo")
        .args(args)
        .arg("--json")
        .output_within(LIMIT)
        .expect("ccol runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code().unwrap_or(-1))
}

#[cfg(feature = "gloo")]
fn decisions(v: &Value) -> Vec<(Value, Value)> {
    v["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| (r["compile_steps"].clone(), r["dynamic"].clone()))
        .collect()
}

#[cfg(feature = "gloo")]
#[test]
fn ranks_agree_with_collectives_and_diverge_without() {
    let dir = corpus();
    let path = dir.path().to_str().expect("utf-8");
    let mut diverged = Vec::new();
    for seed in 0..4u32 {
        let seed = seed.to_string();
        let base = [
            "--nproc",
            "3",
            "--corpus",
            path,
            "--batch-size",
            "1",
            "--seed",
            seed.as_str(),
        ];
        let (with, code) = run(&base);
        assert_eq!(code, 0, "{with}");
        let d = decisions(&with);
        assert_eq!(d.len(), 3);
        assert!(
            d.iter().all(|x| *x == d[0]),
            "ranks disagree with collectives: {with}"
        );
        // Every rank compiles at step 0, and the entry compiled last has dim 1
        // (sequence length) dynamic: lengths differ across ranks and steps.
        assert_eq!(with["ranks"][0]["compile_steps"][0], 0);
        let tokens = &with["ranks"][0]["dynamic"]["tokens"];
        assert!(
            tokens
                .as_array()
                .is_some_and(|a| a.contains(&Value::from(1))),
            "{with}"
        );

        let mut off = base.to_vec();
        off.push("--no-collectives");
        let (without, code) = run(&off);
        assert_eq!(code, 0, "{without}");
        let d = decisions(&without);
        if d.iter().any(|x| *x != d[0]) {
            diverged.push(seed);
        }
    }
    assert!(
        !diverged.is_empty(),
        "without collectives the ranks never diverged"
    );
}

#[cfg(feature = "gloo")]
#[test]
fn default_corpus_runs_four_ranks_that_agree() {
    if !std::path::Path::new("/usr/share/common-licenses").is_dir() {
        return compiler_collectives_conformance::skip::skip_test(
            "default_corpus_runs_four_ranks_that_agree",
            compiler_collectives_conformance::skip::Missing::install(
                "/usr/share/common-licenses does not exist (Debian's base-files)",
            ),
        );
    }
    let (v, code) = run(&["--steps", "12"]);
    assert_eq!(code, 0, "{v}");
    let d = decisions(&v);
    assert_eq!(d.len(), 4);
    assert!(d.iter().all(|x| *x == d[0]), "{v}");
}

#[cfg(feature = "gloo")]
#[test]
fn a_bad_corpus_exits_2_naming_it() {
    let (_, err) = usage_error(
        ccol().args(["demo", "--corpus", "/nonexistent/corpus"]),
        LIMIT,
    );
    assert!(
        err.contains("/nonexistent/corpus") && err.contains("--corpus"),
        "{err}"
    );
}

#[cfg(feature = "gloo")]
#[test]
fn a_bad_timeout_variable_exits_2_before_any_rank_starts() {
    let (out, err) = usage_error(
        ccol().args(["demo", "--json"]).env("CCOL_TIMEOUT_S", "abc"),
        LIMIT,
    );
    assert!(
        err.contains("CCOL_TIMEOUT_S") && err.contains("abc"),
        "{err}"
    );
    assert!(!err.contains("rank 0"), "a rank was started: {err}");
    assert!(out.stdout.is_empty());
}

#[cfg(not(feature = "gloo"))]
#[test]
fn demo_without_gloo_says_how_to_get_it() {
    let _ = corpus;
    let (_, err) = usage_error(ccol().arg("demo"), LIMIT);
    assert!(err.contains("scripts/demo.sh"), "{err}");
}

/// torchrun's c10d rendezvous across two agents on this host (a two-node
/// job simulated on one machine, `--nnodes 2 --nproc-per-node 1`), each
/// starting one `ccol demo-worker`: the ranks meet through the store
/// torchrun's agent serves (`TORCHELASTIC_USE_AGENT_STORE=True`) with no
/// Redis and no store directory, and agree. The agents' own rendezvous
/// endpoint is a TCPStore this test serves (the agents find it taken and
/// join it as clients), so no port is probed and given up.
#[cfg(feature = "gloo")]
#[test]
fn two_torchrun_agents_rendezvous_through_the_agent_store() {
    use compiler_collectives::tcpstore::{ServerOptions, TcpStoreServer};
    use compiler_collectives_conformance::process::Ranks;
    use compiler_collectives_conformance::skip::{skip_test, Missing};
    let Some(torchrun) = std::env::var_os("CCOL_TORCHRUN")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_file())
    else {
        return skip_test(
            "two_torchrun_agents_rendezvous_through_the_agent_store",
            Missing::install("CCOL_TORCHRUN is not set (run `eval \"$(scripts/setup-torch.sh)\"`)"),
        );
    };
    let endpoint = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let dir = corpus();
    let results = tempfile::tempdir().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let run_id = format!("two-agents-{}", std::process::id());
    let agents = (0..2)
        .map(|_| {
            let mut c = Command::new(&torchrun);
            c.args(["--nnodes", "2", "--nproc-per-node", "1"])
                .args(["--rdzv-backend", "c10d", "--rdzv-id", &run_id])
                .arg(format!("--rdzv-endpoint=127.0.0.1:{}", endpoint.port()))
                .arg("--no-python")
                .arg(env!("CARGO_BIN_EXE_ccol"))
                .args(["demo-worker", "--results"])
                .arg(results.path())
                .args(["--corpus", dir.path().to_str().unwrap()])
                .args(["--batch-size", "1", "--seed", "1", "--steps", "8"])
                .env_remove("CCOL_GLOO_STORE")
                .env_remove("CCOL_TIMEOUT_S")
                // Every store directory the ranks could make would be here.
                .env("TMPDIR", tmp.path());
            c
        })
        .collect();
    let finished = Ranks::start(agents).expect("torchrun starts").finish(LIMIT);
    for r in 0..2 {
        assert_eq!(finished.ranks[r].code, Some(0), "{}", finished.describe());
    }
    let report = |rank: u32| -> Value {
        let path = results.path().join(format!("rank-{rank}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), finished.describe()));
        serde_json::from_str(&text).expect("a report")
    };
    let (a, b) = (report(0), report(1));
    assert!(
        a.get("error").is_none() && b.get("error").is_none(),
        "{a}\n{b}"
    );
    for field in ["compile_steps", "dynamic", "decided"] {
        assert_eq!(a[field], b[field], "{field}: {a}\n{b}");
    }
    assert!(
        a["compile_steps"].as_array().is_some_and(|s| !s.is_empty()),
        "{a}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("ccol-"))
        .collect();
    assert!(left.is_empty(), "store directories were made: {left:?}");
}
