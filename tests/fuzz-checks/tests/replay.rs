//! Replays the committed fuzz corpus and every regression input through the
//! same checks as the cargo-fuzz targets, on the stable toolchain.

use compiler_collectives_fuzz_checks::TARGETS;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir` (none when it does not exist), sorted.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.is_file());
    files.sort();
    files
}

fn replay(sub: &str) -> usize {
    let mut total = 0;
    for (name, check) in TARGETS {
        for file in inputs(&fuzz_dir().join(sub).join(name)) {
            let data = std::fs::read(&file).expect("readable corpus file");
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(
                outcome.is_ok(),
                "{name}: {} fails its check",
                file.display()
            );
            total += 1;
        }
    }
    total
}

#[test]
fn every_target_has_a_committed_corpus() {
    for (name, _) in TARGETS {
        let n = inputs(&fuzz_dir().join("corpus").join(name)).len();
        assert!(
            n >= 5,
            "fuzz/corpus/{name} holds {n} inputs; run the fuzzer (fuzz/README.md)"
        );
    }
}

#[test]
fn corpus_replays_cleanly() {
    let n = replay("corpus");
    println!("replayed {n} corpus inputs");
    assert!(n > 0);
}

#[test]
fn regressions_replay_cleanly() {
    let n = replay("regressions");
    println!("replayed {n} regression inputs");
}

#[test]
fn targets_match_the_fuzz_crate() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for (name, _) in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] for target {name}"
        );
        assert!(
            fuzz_dir()
                .join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file(),
            "no fuzz/fuzz_targets/{name}.rs"
        );
    }
}
