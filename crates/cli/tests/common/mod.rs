//! What several of the `ccol` test files share (`mod common;`).
// Each test file uses only some of these.
#![allow(dead_code)]

use compiler_collectives_conformance::process::OutputWithin;
use std::process::{Command, Output};
use std::time::Duration;

/// Runs `ccol` as `cmd` says (stopped at `limit`) and asserts that it exits
/// 2, a usage error; its output and its stderr as text.
pub(crate) fn usage_error(cmd: &mut Command, limit: Duration) -> (Output, String) {
    let out = cmd.output_within(limit).expect("ccol runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

/// Asserts that the last line of `output`, a run's summary, counts at least
/// `at_least` (the number `count` picks out of the line) and ends with
/// `ending`.
pub(crate) fn assert_summary(
    output: &str,
    count: impl Fn(&str) -> Option<&str>,
    at_least: u64,
    ending: &str,
) {
    let last = output.lines().last().unwrap_or_default();
    let n: u64 = count(last).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(n >= at_least, "at least {at_least}: {last}");
    assert!(last.ends_with(ending), "{last}");
}
