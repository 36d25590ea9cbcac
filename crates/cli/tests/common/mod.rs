//! What several of the `ccol` test files share (`mod common;`).

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
