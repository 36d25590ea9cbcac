//! `ccol demo` restarted with its profile (CCOL_PROFILE_DIR + CCOL_JOB_ID):
//! rank processes over Gloo load what the first run decided and compile
//! fewer times, dynamic from step 0.

#[cfg(feature = "gloo")]
#[test]
fn a_restarted_demo_job_compiles_fewer_times_from_its_profile() {
    use compiler_collectives_conformance::process::OutputWithin;
    use serde_json::Value;
    /// The most one run may take before it is stopped and the test fails
    /// with its output (no test waits on a process without a bound).
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(300);
    let root = tempfile::tempdir().expect("tempdir");
    let run = || -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccol"))
            .args(["demo", "--nproc", "2", "--json"])
            .env_remove("CCOL_TIMEOUT_S")
            .env_remove("CCOL_GLOO_STORE")
            .env("CCOL_PROFILE_DIR", root.path())
            .env("CCOL_JOB_ID", "demo-job")
            .output_within(LIMIT)
            .expect("ccol runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON")
    };
    let steps = |v: &Value, r: usize| -> Vec<u64> {
        v["ranks"][r]["compile_steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|s| s.as_u64().expect("step"))
            .collect()
    };
    let first = run();
    let second = run();
    for r in 0..2 {
        let (a, b) = (steps(&first, r), steps(&second, r));
        assert!(a.len() >= 2 && a[..2] == [0, 1], "first run: {a:?}");
        assert!(b.len() < a.len(), "restart compiled {b:?}, first run {a:?}");
        assert_eq!(b[0], 0);
        assert!(!b.contains(&1), "the step-1 recompile is gone: {b:?}");
    }
    assert_eq!(steps(&second, 0), steps(&second, 1));
    assert!(root.path().join("demo-job").join("profile.ccol").is_file());
}

#[cfg(not(feature = "gloo"))]
#[test]
fn a_restarted_demo_job_compiles_fewer_times_from_its_profile() {
    // The default members build ccol without Gloo; scripts/test.sh runs
    // this file again with the feature (its step "ccol demo over Gloo").
    compiler_collectives_conformance::skip::skip_test(
        "a_restarted_demo_job_compiles_fewer_times_from_its_profile",
        compiler_collectives_conformance::skip::Missing::machine(
            "this build of the test has no Gloo (the crate's `gloo` feature is off in a plain \
             `cargo test`); it runs with `cargo test -p compiler-collectives-cli --features gloo \
             --test demo_profile`, as scripts/test.sh does",
        ),
    );
}
