//! The conformance suite over the in-process engine (ranks as threads),
//! world sizes 1 to 4, on libtest-mimic: cases are made from `BEHAVIOURS`,
//! so none can be forgotten. Arguments are libtest's.

fn main() -> std::process::ExitCode {
    let trials = compiler_collectives_conformance::in_process_trials(&[1, 2, 3, 4]);
    compiler_collectives_conformance::process::run_concurrently(trials)
}
