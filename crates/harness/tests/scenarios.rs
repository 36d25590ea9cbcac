//! The scenario corpus (`tests/scenarios/*.json`, docs/scenarios.md) run over
//! in-process ranks in every mode each file has an expectation for, and
//! data-driven checks that malformed scenario files are rejected with the
//! right field named.

use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_harness::scenario::{
    check_expectation, run_in_process, Mode, Scenario, ScenarioLimits, RUNNER_TIMEOUT,
};
use std::path::{Path, PathBuf};

/// Scenarios docs/scenarios.md lists (eight PyTorch scenarios, three issue-derived
/// cases) and issue 9's four (cache-hit agreement with and without, mark-dynamic,
/// overrides) and issue 13's two exact-report files (a rank misses alone while
/// two or three others finish).
const MIN_SCENARIOS: usize = 17;

fn scenario_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scenarios");
    dir.canonicalize().unwrap_or(dir)
}

/// Every scenario file of the corpus, sorted (the JSON Schema is not one).
fn scenario_files() -> Vec<PathBuf> {
    let dir = scenario_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: cannot list: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter(|p| !p.to_string_lossy().ends_with(".schema.json"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_scenario_matches_its_expectations() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for path in scenario_files() {
        let scenario = match Scenario::from_file(&path, &ScenarioLimits::default()) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("MALFORMED {e}"));
                continue;
            }
        };
        for &mode in scenario.expect.keys() {
            let report = match run_in_process(&scenario, mode, RUNNER_TIMEOUT) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(format!(
                        "FAIL {} ({}) {mode}: {e}",
                        scenario.name,
                        path.display()
                    ));
                    continue;
                }
            };
            let diffs =
                check_expectation(&scenario, &report).expect("an expectation exists for this mode");
            checked += 1;
            if !diffs.is_empty() {
                failures.push(format!(
                    "FAIL {} ({}) {mode}\n       {}\n       got: {}",
                    scenario.name,
                    path.display(),
                    diffs.join("\n       "),
                    report.to_json()
                ));
            }
        }
    }
    assert!(checked > 0, "no scenario expectation was checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} scenario expectations failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn corpus_is_complete() {
    let files = scenario_files();
    assert!(
        files.len() >= MIN_SCENARIOS,
        "{} holds {} scenario files, docs/scenarios.md needs at least {MIN_SCENARIOS}",
        scenario_dir().display(),
        files.len()
    );
    for path in &files {
        let scenario =
            Scenario::from_file(path, &ScenarioLimits::default()).unwrap_or_else(|e| panic!("{e}"));
        for mode in [Mode::Collectives, Mode::NoCollectives] {
            assert!(
                scenario.expect.contains_key(&mode),
                "{}: no `expect.{mode}`",
                path.display()
            );
        }
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for (mode, expected) in &scenario.expect {
            assert_eq!(
                expected.get("name").and_then(|n| n.as_str()),
                Some(scenario.name.as_str()),
                "{file_name}: `expect.{mode}.name` differs from the scenario's name"
            );
        }
    }
}

/// Parses `json` as a scenario and asserts that it is rejected naming `field`
/// (the exact field path; empty for the whole file).
#[track_caller]
fn check(json: &str, field: &str) {
    match Scenario::from_slice(json.as_bytes(), "<test>", &ScenarioLimits::default()) {
        Ok(s) => panic!("accepted a malformed scenario: {json}\nparsed as {s:?}"),
        Err(e) => {
            assert_eq!(e.field, field, "wrong field for {json}\nerror: {e}");
            assert_eq!(e.file, "<test>");
            assert!(!e.message.is_empty(), "empty message for {json}");
        }
    }
}

/// Parses `json` and asserts that it is accepted.
#[track_caller]
fn check_ok(json: &str) -> Scenario {
    Scenario::from_slice(json.as_bytes(), "<test>", &ScenarioLimits::default())
        .unwrap_or_else(|e| panic!("rejected {json}: {e}"))
}

#[test]
#[rustfmt::skip] // one case per line
fn malformed_files_name_the_field() {
    // Bad JSON; a file cut off inside the top-level object names no field.
    check(r#"{"name": "t", "world_size": 1, "steps": [[{}]]"#, "");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [1,]}}]]}"#, "steps[0][0].x.size");
    check("", "");
    check("[]", "");
    check(r#"{"name": "t", "world_size": 1, "steps": []} xyz"#, "");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"int": 1}, "x": {"int": 2}}]]}"#, "steps[0][0]");
    check(r#"{"name": "t", "world_size": 1, "options": {"overrides": {"z": "force_static"}}, "steps": [[{"x": {"int": 1}}]]}"#, "options.overrides.z");
    check(r#"{"name": "", "world_size": 1, "steps": []}"#, "name");
    check(r#"["t", null, 1, {}, [[{}]], {}]"#, ""); // serde would take a struct as an array
    // Missing and mistyped fields.
    check(r#"{"world_size": 1, "steps": []}"#, "");
    check(r#"{"name": "t", "steps": []}"#, "");
    check(r#"{"name": 3, "world_size": 1, "steps": []}"#, "name");
    check(r#"{"name": "t", "world_size": "2", "steps": []}"#, "world_size");
    check(r#"{"name": "t", "world_size": 1.5, "steps": []}"#, "world_size");
    check(r#"{"name": "t", "world_size": 1, "steps": {}}"#, "steps");
    check(r#"{"name": "t", "world_size": 1, "steps": [{}]}"#, "steps[0]");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": 3}]]}"#, "steps[0][0].x");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": 3}}]]}"#, "steps[0][0].x.size");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": ["4"]}}]]}"#, "steps[0][0].x.size[0]");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"int": 2.5}}]]}"#, "steps[0][0].x.int");
    check(r#"{"name": "t", "world_size": 1, "options": {"collectives": "yes"}, "steps": []}"#, "options.collectives");
    check(r#"{"name": "t", "world_size": 1, "options": {"recompile_limit": -1}, "steps": []}"#, "options.recompile_limit");
    check(r#"{"name": "t", "world_size": 1, "options": {"overrides": {"x": "dynamic"}}, "steps": []}"#, "options.overrides.x");
    check(r#"{"name": "t", "world_size": 1, "steps": [], "expect": {"collectives": []}}"#, "expect.collectives");
    check(r#"{"name": "t", "world_size": 1, "steps": [], "expect": {"sometimes": {}}}"#, "expect.sometimes");
    // Negative sizes, strides and ints.
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [-1]}}]]}"#, "steps[0][0].x.size[0]");
    check(r#"{"name": "t", "world_size": 2, "steps": [[{}, {"x": {"size": [4, -3]}}]]}"#, "steps[0][1].x.size[1]");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [4], "stride": [-1]}}]]}"#, "steps[0][0].x.stride[0]");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"int": -1}}]]}"#, "steps[0][0].x.int");
    check(r#"{"name": "t", "world_size": 2, "steps": [[{}, {}], [{}, {"n": {"int": -7}}]]}"#, "steps[1][1].n.int");
    // Stride and size of different lengths; tensor and int mixed up.
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [4, 2], "stride": [1]}}]]}"#, "steps[0][0].x.stride");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [4], "stride": [2, 1]}}]]}"#, "steps[0][0].x.stride");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"int": 3, "stride": [1]}}]]}"#, "steps[0][0].x.stride");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [3], "int": 3}}]]}"#, "steps[0][0].x");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {}}]]}"#, "steps[0][0].x");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"stride": [1]}}]]}"#, "steps[0][0].x");
    // Step lists that do not match world_size.
    check(r#"{"name": "t", "world_size": 2, "steps": [[{}]]}"#, "steps[0]");
    check(r#"{"name": "t", "world_size": 2, "steps": [[{}, {}], [{}, {}, {}]]}"#, "steps[1]");
    check(r#"{"name": "t", "world_size": 1, "steps": [[]]}"#, "steps[0]");
    // world_size and ndim limits.
    check(r#"{"name": "t", "world_size": 0, "steps": []}"#, "world_size");
    check(r#"{"name": "t", "world_size": -1, "steps": []}"#, "world_size");
    check(r#"{"name": "t", "world_size": 65537, "steps": []}"#, "world_size");
    check(r#"{"name": "t", "world_size": 4294967296, "steps": []}"#, "world_size");
    let dims65 = vec!["2"; 65].join(",");
    check(&format!(r#"{{"name": "t", "world_size": 1, "steps": [[{{"x": {{"size": [{dims65}]}}}}]]}}"#), "steps[0][0].x.size");
    // Unknown fields, at every level that denies them.
    check(r#"{"name": "t", "world_size": 1, "steps": [], "seed": 1}"#, "seed");
    check(r#"{"name": "t", "world_size": 1, "options": {"colectives": true}, "steps": []}"#, "options.colectives");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"x": {"size": [2], "dtype": "f32"}}]]}"#, "steps[0][0].x.dtype");
    // Source names are identifiers.
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"1x": {"size": [2]}}]]}"#, "steps[0][0].1x");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"L['x']": {"size": [2]}}]]}"#, "steps[0][0].L['x']");
    check(r#"{"name": "t", "world_size": 2, "steps": [[{}, {"": {"int": 2}}]]}"#, "steps[0][1].");
    check(r#"{"name": "t", "world_size": 1, "options": {"overrides": {"x-y": "force_static"}}, "steps": []}"#, "options.overrides.x-y");
    // Per-rank setup (issue 9): warm artifact caches and mark-dynamic hints.
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {"2": [0]}, "steps": [[{}, {}]]}"#, "warm_cache.2");
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {"01": [0]}, "steps": [[{}, {}]]}"#, "warm_cache.01");
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {"+1": [0]}, "steps": [[{}, {}]]}"#, "warm_cache.+1");
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {"1": [0, 1]}, "steps": [[{}, {}]]}"#, "warm_cache.1[1]");
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {"1": [-1]}, "steps": [[{}, {}]]}"#, "warm_cache.1[0]");
    check(r#"{"name": "t", "world_size": 2, "warm_cache": {}, "options": {"artifact_cache": false}, "steps": []}"#, "options.artifact_cache");
    check(r#"{"name": "t", "world_size": 1, "options": {"cache_hit_agreement": 1}, "steps": []}"#, "options.cache_hit_agreement");
    check(r#"{"name": "t", "world_size": 2, "mark_dynamic": {"1": {"x": [0]}}, "steps": [[{"x": {"size": [4]}}, {"x": {"int": 4}}]]}"#, "mark_dynamic.1.x");
    check(r#"{"name": "t", "world_size": 2, "mark_dynamic": {"0": {"x": [0, 2]}}, "steps": [[{"x": {"size": [4, 2]}}, {}]]}"#, "mark_dynamic.0.x[1]");
    check(r#"{"name": "t", "world_size": 2, "mark_dynamic": {"5": {"x": [0]}}, "steps": [[{"x": {"size": [4]}}, {}]]}"#, "mark_dynamic.5");
    check(r#"{"name": "t", "world_size": 1, "mark_dynamic": {"0": {"x": 0}}, "steps": [[{"x": {"size": [4]}}]]}"#, "mark_dynamic.0.x");
    // Floats and bools: a non-finite float is the text "nan", "inf" or
    // "-inf"; anything else is refused where it stands.
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": "NaN"}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": "infinity"}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": "2.5"}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": true}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": null}}]]}"#, "steps[0][0].s");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 9007199254740993}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 1e999}}]]}"#, "steps[0][0].s.float");
    // Integers beyond 64 bits are checked as written, not as the float they
    // would round to (18446744073709551617 is not 2^64).
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 18446744073709551617}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": -9223372036854775809}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 1000000000000000000000000000001}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": [1.5]}}]]}"#, "steps[0][0].s.float");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"bool": 1}}]]}"#, "steps[0][0].s.bool");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"bool": "true"}}]]}"#, "steps[0][0].s.bool");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"int": 3, "float": 3.0}}]]}"#, "steps[0][0].s");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 3.0, "bool": true}}]]}"#, "steps[0][0].s");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"size": [3], "bool": true}}]]}"#, "steps[0][0].s");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"float": 3.0, "stride": [1]}}]]}"#, "steps[0][0].s.stride");
    check(r#"{"name": "t", "world_size": 1, "steps": [[{"s": {"floats": 3.0}}]]}"#, "steps[0][0].s.floats");
    // The two Dynamo settings are booleans; a misspelt option is unknown.
    check(r#"{"name": "t", "world_size": 1, "options": {"automatic_dynamic_shapes": 0}, "steps": []}"#, "options.automatic_dynamic_shapes");
    check(r#"{"name": "t", "world_size": 1, "options": {"automatic_dynamic_exclusion_guard": "on"}, "steps": []}"#, "options.automatic_dynamic_exclusion_guard");
    check(r#"{"name": "t", "world_size": 1, "options": {"exclusion_guard": true}, "steps": []}"#, "options.exclusion_guard");
}

#[test]
fn floats_and_bools_read_as_written() {
    let s = check_ok(
        r#"{"name": "t", "world_size": 1, "steps": [[{"a": {"float": 2.5}, "b": {"float": -0.0},
            "c": {"float": "nan"}, "d": {"float": "inf"}, "e": {"float": "-inf"},
            "f": {"float": 3}, "g": {"float": 0.1}, "h": {"bool": true}, "i": {"bool": false},
            "j": {"float": -9007199254740992}, "k": {"float": -0}, "l": {"float": 1e20},
            "m": {"float": 5e-324}}]]}"#,
    );
    let got: Vec<String> = s.steps[0][0]
        .values()
        .map(|o| match o {
            Observation::Float(bits) => format!("{:?}", f64::from_bits(*bits)),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            "2.5",
            "-0.0",
            "NaN",
            "inf",
            "-inf",
            "3.0",
            "0.1",
            "Bool(true)",
            "Bool(false)",
            "-9007199254740992.0",
            "-0.0",
            "1e20",
            "5e-324"
        ]
    );
    // -0.0 (and -0) keep the sign bit, 0.1 its exact bits.
    assert_eq!(s.steps[0][0]["b"], Observation::Float((-0.0f64).to_bits()));
    assert_eq!(s.steps[0][0]["g"], Observation::float(0.1));
    let o = &s.options;
    assert!(o.automatic_dynamic_shapes && !o.automatic_dynamic_exclusion_guard);
    let s = check_ok(
        r#"{"name": "t", "world_size": 1, "options": {"automatic_dynamic_shapes": false,
            "automatic_dynamic_exclusion_guard": true}, "steps": []}"#,
    );
    assert!(!s.options.automatic_dynamic_shapes && s.options.automatic_dynamic_exclusion_guard);
}

#[test]
fn well_formed_edge_cases_are_accepted() {
    // Limits are inclusive; a 0-dim tensor, a None source and empty steps are fine.
    check_ok(r#"{"name": "t", "world_size": 65536, "steps": []}"#);
    let dims64 = vec!["2"; 64].join(",");
    check_ok(&format!(
        r#"{{"name": "t", "world_size": 1, "steps": [[{{"x": {{"size": [{dims64}]}}}}]]}}"#
    ));
    let s = check_ok(
        r#"{"name": "t", "world_size": 2, "options": {"overrides": {"_y0": "force_dynamic"}},
            "steps": [[{"x": {"size": []}, "_y0": {"int": 0}}, {"x": null}]]}"#,
    );
    assert_eq!(
        s.sources.iter().map(String::as_str).collect::<Vec<_>>(),
        ["_y0", "x"]
    );
    assert_eq!(s.default_mode(), Mode::Collectives);
    // A warm cache turns the artifact cache on; a rank may be warm for no step.
    let s = check_ok(r#"{"name": "t", "world_size": 2, "warm_cache": {"1": []}, "steps": []}"#);
    assert!(s.setup.artifact_cache && s.options.cache_hit_agreement);
    let s = check_ok(
        r#"{"name": "t", "world_size": 2, "mark_dynamic": {"1": {"x": [1]}},
            "steps": [[{}, {"x": null}], [{}, {"x": {"size": [3, 5, 7]}}]]}"#,
    );
    assert_eq!(s.setup.mark_dynamic[&1]["x"], (3, vec![1]));
    assert!(!s.setup.artifact_cache);
}

#[test]
fn files_that_are_not_regular_files_are_refused_without_reading_them() {
    let limits = ScenarioLimits::default();
    for path in ["/dev/zero", "/dev/urandom", "/"] {
        let p = std::path::Path::new(path);
        if !p.exists() {
            continue;
        }
        let err = Scenario::from_file(p, &limits).expect_err(path);
        assert!(err.message.contains("not a regular file"), "{path}: {err}");
    }
}

#[test]
fn a_name_longer_than_the_limit_is_refused() {
    let name = "n".repeat(compiler_collectives_harness::scenario::MAX_NAME_BYTES + 1);
    let json = format!(r#"{{"name": "{name}", "world_size": 1, "steps": []}}"#);
    let err = Scenario::from_slice(json.as_bytes(), "<test>", &ScenarioLimits::default())
        .expect_err("too long");
    assert_eq!(err.field, "name");
}

/// Issue 9's must-show: one rank warm, one cold — with cache-hit agreement
/// every rank runs the same number of backend compiles in every mode that has
/// a channel; without it the cold rank fails naming the warm one.
#[test]
fn cache_hit_agreement_keeps_backend_compile_counts_equal() {
    let limits = ScenarioLimits::default();
    let agree = Scenario::from_file(&scenario_dir().join("14_cache_hit_agreement.json"), &limits)
        .unwrap_or_else(|e| panic!("{e}"));
    for mode in [
        Mode::Collectives,
        Mode::GuardCollectives,
        Mode::CollectivesAndGuardCollectives,
    ] {
        let report = run_in_process(&agree, mode, RUNNER_TIMEOUT).expect("runs");
        assert!(!report.failed(), "{mode}: {}", report.to_json());
        let a: Vec<_> = report
            .ranks
            .iter()
            .map(|r| r.artifacts.clone().expect("artifact cache on"))
            .collect();
        assert_eq!(a[0].compiled_steps, [0], "{mode}");
        assert_eq!(a[1].compiled_steps, [0], "{mode}");
        assert_eq!(a[0].disk_hit_steps, [0, 2], "{mode}: rank 0's dropped hit");
        assert_eq!(a[0].loaded_steps, a[1].loaded_steps, "{mode}");
    }
    let alone = Scenario::from_file(
        &scenario_dir().join("15_cache_hit_without_agreement.json"),
        &limits,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let report = run_in_process(&alone, Mode::Collectives, RUNNER_TIMEOUT).expect("runs");
    let err = report.ranks[1].error.as_ref().expect("the cold rank fails");
    assert_eq!(err.missing_ranks, [0]);
    assert!(report.ranks[0].error.is_none());
}

/// A step with too few rank maps is refused with the count in words.
#[test]
fn a_step_with_too_few_ranks_says_how_many() {
    let text = br#"{"name": "t", "world_size": 2, "steps": [[{"x": {"int": 1}}]], "expect": {}}"#;
    let err = Scenario::from_slice(text, "t.json", &ScenarioLimits::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("field `steps[0]`: 1 rank entry, world_size is 2"),
        "{err}"
    );
}

/// A rank whose profile cannot be read reports it as a `profile` error,
/// naming no rank and no exchange (the profile's error is its own type,
/// not core's `Error`).
#[test]
fn a_corrupt_profile_is_a_profile_error_of_the_rank() {
    use compiler_collectives_core::persistence::profile::ProfileStore;
    use compiler_collectives_harness::scenario::run_rank_with;
    let text =
        br#"{"name": "p", "world_size": 1, "steps": [[{"x": {"size": [2, 3]}}]], "expect": {}}"#;
    let scenario = Scenario::from_slice(text, "p.json", &ScenarioLimits::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = ProfileStore::open(dir.path()).unwrap();
    std::fs::write(store.path(), b"not a profile at all, longer than a header").unwrap();
    let report = run_rank_with(&scenario, Mode::Collectives, 0, None, Some(&store));
    let err = report.error.expect("the profile cannot be loaded");
    assert_eq!(err.kind, "profile", "{}", err.message);
    assert!(err.missing_ranks.is_empty() && err.exchange.is_none());
    assert!(err.message.contains("move it aside"), "{}", err.message);
}
