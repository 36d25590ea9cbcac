//! Runs the `train_ddp` example as a 2-rank job (torchrun's environment, set
//! here by hand) and checks that it trains and that both ranks agree on every
//! loss and every compile decision.
//!
//! The example binary is not built here: `cargo test -p
//! compiler-collectives-tch` builds examples (`--test train_ddp` alone does
//! not: run `cargo build -p compiler-collectives-tch --example train_ddp`
//! first), and it is found at `<target>/debug/examples/train_ddp` next to this
//! test's `deps` folder. When it (or the corpus) is missing the test prints why and
//! passes, unless `CCOL_STRICT_SKIPS=1`.

use anyhow::{bail, ensure, Context, Result};
use compiler_collectives_conformance::process::OutputWithin;
use compiler_collectives_conformance::skip::{skip_test, Missing};
use compiler_collectives_tch::{C10dStore, TcpStoreOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WORLD: u32 = 2;
const STEPS: u32 = 200;
const LIMIT: Duration = Duration::from_secs(300);
const CORPUS: &str = "/usr/share/common-licenses";

/// The skip rule: prints why the test does not run, or fails under
/// `CCOL_STRICT_SKIPS=1` (the test command builds the example and the
/// corpus is Debian's base-files).
fn skip(why: &str) {
    skip_test("two_ranks_train_and_agree", Missing::install(why));
}

fn example_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    let bin = dir
        .join("examples")
        .join(format!("train_ddp{}", std::env::consts::EXE_SUFFIX));
    bin.is_file().then_some(bin)
}

/// One rank's finished run.
struct RankRun {
    ok: bool,
    output: String,
}

/// Waits for every child, killing all of them at `LIMIT`.
fn wait_all(mut children: Vec<(Child, tempfile::NamedTempFile)>) -> Result<Vec<RankRun>> {
    let start = Instant::now();
    let mut status = vec![None; children.len()];
    while status.iter().any(Option::is_none) {
        for (i, (child, _)) in children.iter_mut().enumerate() {
            if status[i].is_none() {
                status[i] = child.try_wait()?;
            }
        }
        if start.elapsed() > LIMIT {
            for (child, _) in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            bail!("the ranks did not finish within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    children
        .into_iter()
        .zip(status)
        .map(|((_, out), st)| {
            Ok(RankRun {
                ok: st.is_some_and(|s| s.success()),
                output: std::fs::read_to_string(out.path())?,
            })
        })
        .collect()
}

/// The `key=value` fields of the `RESULT` line.
fn result_fields(output: &str) -> Result<BTreeMap<String, String>> {
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .context("no RESULT line")?;
    line.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').context("a field without `=`")?;
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// The `step N loss X` lines, without the rank prefix.
fn loss_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter_map(|l| l.split_once(": step ").map(|(_, rest)| rest))
        .filter(|rest| rest.contains(" loss "))
        .collect()
}

fn num(fields: &BTreeMap<String, String>, key: &str) -> Result<f64> {
    fields
        .get(key)
        .with_context(|| format!("no {key}"))?
        .parse()
        .with_context(|| format!("{key} is not a number"))
}

#[test]
fn two_ranks_train_and_agree() -> Result<()> {
    let Some(bin) = example_binary() else {
        skip("the train_ddp example is not built (cargo build --examples)");
        return Ok(());
    };
    if !std::path::Path::new(CORPUS).is_dir() {
        skip(&format!("{CORPUS} is missing"));
        return Ok(());
    }
    // The test serves the TCPStore as torchrun's agent does, on a port the
    // system picks (no race for a "free" port); the ranks connect to it.
    let server =
        C10dStore::tcp(&TcpStoreOptions::server("127.0.0.1", 0, WORLD).with_timeout(LIMIT))?;
    let port = server.port()?.to_string();
    let run_id = format!("train-ddp-test-{}", std::process::id());
    let mut children = Vec::new();
    for rank in 0..WORLD {
        let out = tempfile::NamedTempFile::new()?;
        let child = Command::new(&bin)
            .args(["--steps", &STEPS.to_string()])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", WORLD.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("TORCHELASTIC_RUN_ID", &run_id)
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .stdin(Stdio::null())
            .stdout(out.reopen()?)
            .stderr(out.reopen()?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        children.push((child, out));
    }
    let runs = wait_all(children)?;
    for (rank, run) in runs.iter().enumerate() {
        ensure!(run.ok, "rank {rank} failed:\n{}", run.output);
    }

    let fields: Vec<_> = runs
        .iter()
        .map(|r| result_fields(&r.output))
        .collect::<Result<_>>()?;
    let (first, last) = (
        num(&fields[0], "first_loss")?,
        num(&fields[0], "final_loss")?,
    );
    eprintln!("rank 0: {:?}", fields[0]);
    ensure!(
        fields[0].get("steps").map(String::as_str) == Some("200"),
        "steps: {:?}",
        fields[0].get("steps")
    );
    ensure!(
        first.is_finite() && last <= 0.8 * first,
        "did not learn: first loss {first}, final loss {last}"
    );
    ensure!(num(&fields[0], "compiles")? >= 1.0, "no compile");
    for (rank, f) in fields.iter().enumerate() {
        ensure!(
            f.get("rank").map(String::as_str) == Some(rank.to_string().as_str()),
            "rank field of rank {rank}: {f:?}"
        );
        for key in [
            "world",
            "steps",
            "first_loss",
            "final_loss",
            "compiles",
            "compile_steps",
            "loss_digest",
        ] {
            ensure!(
                f.get(key) == fields[0].get(key),
                "rank {rank} differs from rank 0 in {key}: {:?} vs {:?}",
                f.get(key),
                fields[0].get(key)
            );
        }
    }
    let losses0 = loss_lines(&runs[0].output);
    ensure!(losses0.len() >= 20, "too few loss lines: {losses0:?}");
    for (rank, run) in runs.iter().enumerate().skip(1) {
        ensure!(
            loss_lines(&run.output) == losses0,
            "rank {rank} printed other losses than rank 0"
        );
    }
    Ok(())
}

#[test]
fn usage_errors_exit_2_naming_the_value() -> Result<()> {
    let Some(bin) = example_binary() else {
        skip("the train_ddp example is not built (cargo build --examples)");
        return Ok(());
    };
    for (args, want) in [
        (
            &["--bogus"][..],
            "error: unexpected argument '--bogus' found",
        ),
        (
            &["--steps", "0"][..],
            "error: invalid value '0' for '--steps <N>': must be at least 1",
        ),
        (
            &["--lr", "x"][..],
            "error: invalid value 'x' for '--lr <X>'",
        ),
    ] {
        let out = Command::new(&bin)
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .output_within(Duration::from_secs(60))?;
        ensure!(out.status.code() == Some(2), "{args:?}: {:?}", out.status);
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(err.starts_with(want), "{args:?}: {err}");
        ensure!(!err.contains("backtrace"), "{args:?}: {err}");
    }
    Ok(())
}
