//! The one skip rule of the workspace's tests.
//!
//! A test that cannot run on this machine says why, in one of two ways:
//! - [`Missing::Install`]: something the README's test command installs (a
//!   Debian package, the pinned torch, the NCCL wheel, a built example) is
//!   not there. Under `CCOL_STRICT_SKIPS=1` — set by `scripts/test.sh`,
//!   which installs all of them — that is a **failure**: a skip there would
//!   hide a broken set-up.
//! - [`Missing::Machine`]: the machine lacks hardware or a privilege the
//!   test needs (a GPU, root with `CAP_NET_ADMIN`), the engine lacks a
//!   [`Capability`](crate::Capability), or this build lacks a feature that
//!   the test command enables in another run of the same file. Nothing a
//!   script can install fixes that here, so it is skipped with its reason
//!   even under strict skips.
//!
//! [`skip_test`] is the form for plain `#[test]` functions (panics or
//! prints, then the caller returns); [`skip_trial`] the form for the
//! multi-process harness ([`crate::process`]), where a skip is reported as
//! an ignored case with its reason. Both apply [`verdict`].

use std::io::Write as _;

/// The variable that turns skips of installable things into failures.
pub const STRICT_SKIPS: &str = "CCOL_STRICT_SKIPS";

/// Why a test cannot run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Something the test command installs is missing (a failure under
    /// `CCOL_STRICT_SKIPS=1`). The text says what, and how to get it.
    Install(String),
    /// Hardware, a privilege or an engine capability this machine or backend
    /// lacks (skipped even under `CCOL_STRICT_SKIPS=1`).
    Machine(String),
}

impl Missing {
    /// A missing installable thing: `what` and how to install it.
    pub fn install(what: impl Into<String>) -> Self {
        Missing::Install(what.into())
    }

    /// Missing hardware, privilege or capability.
    pub fn machine(what: impl Into<String>) -> Self {
        Missing::Machine(what.into())
    }

    /// The reason as printed.
    pub fn reason(&self) -> &str {
        match self {
            Missing::Install(w) | Missing::Machine(w) => w,
        }
    }
}

/// Whether `CCOL_STRICT_SKIPS=1` is set.
pub fn strict() -> bool {
    std::env::var(STRICT_SKIPS).is_ok_and(|v| v == "1")
}

/// The rule: `Ok(reason)` when the test may be skipped with that reason,
/// `Err(text)` when the skip must fail (strict skips and an installable
/// thing missing).
///
/// # Errors
/// The failure text, naming the variable that made it one.
pub fn verdict(missing: &Missing) -> Result<String, String> {
    match missing {
        Missing::Install(why) if strict() => Err(format!(
            "needed but missing ({STRICT_SKIPS}=1, set by scripts/test.sh, which installs it): {why}"
        )),
        m => Ok(m.reason().to_owned()),
    }
}

/// For a plain `#[test]`: prints `skipped: <reason>` past libtest's output
/// capture (so it shows in CI logs), or panics when the rule says the skip
/// is a failure. The caller returns after it.
///
/// # Panics
/// Under `CCOL_STRICT_SKIPS=1` when something installable is missing.
pub fn skip_test(test: &str, missing: Missing) {
    match verdict(&missing) {
        Ok(why) => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{test}: skipped: {why}");
        }
        Err(fail) => panic!("{test}: {fail}"),
    }
}

/// For a harness case called `name`: an ignored case with its reason, or a
/// failure when the rule says so. The reason is also printed to stderr as
/// `<name>: skipped: <reason>`, so it shows under `--quiet` too (where
/// libtest prints only `i`).
///
/// # Errors
/// Under `CCOL_STRICT_SKIPS=1` when something installable is missing.
pub fn skip_trial(
    name: &str,
    missing: Missing,
) -> Result<libtest_mimic::Completion, libtest_mimic::Failed> {
    let why = verdict(&missing).map_err(libtest_mimic::Failed::from)?;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{name}: skipped: {why}");
    Ok(libtest_mimic::Completion::ignored_with(why))
}
