//! The project's cache directory: the one rule the scripts, the CLI and the
//! backends share.
//!
//! In order of precedence (the rule of `scripts/env.sh`):
//!
//! | variable | directory |
//! |---|---|
//! | `CCOL_CACHE` | its value, as it is |
//! | `XDG_CACHE_HOME` | `$XDG_CACHE_HOME/compiler-collectives` |
//! | `HOME` | `$HOME/.cache/compiler-collectives` |
//!
//! An empty variable counts as unset; values are paths, so they need not be
//! UTF-8. Nothing here creates, checks or reads a directory: [`cache_dir`]
//! is where the project's caches belong (the torch and NCCL set-ups, the
//! installed `ccol`, bench results), and [`cache_dirs`] every candidate in
//! order, for a caller that falls back when one is unusable (the Gloo
//! backend writes its adapter library only to a directory no other user can
//! write).
//!
//! ```
//! use compiler_collectives_core::persistence::paths::cache_dir_from;
//! use std::ffi::OsString;
//! use std::path::PathBuf;
//!
//! let vars = [("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/me")];
//! let lookup = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| OsString::from(v));
//! assert_eq!(cache_dir_from(lookup), Some(PathBuf::from("/xdg/compiler-collectives")));
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

/// The variable naming the cache directory itself (first in precedence).
pub const CACHE_ENV: &str = "CCOL_CACHE";

/// The directory's name under `$XDG_CACHE_HOME` or `$HOME/.cache`.
pub const CACHE_DIR_NAME: &str = "compiler-collectives";

/// The project's cache directory from this process's environment
/// ([`cache_dir_from`] over [`std::env::var_os`]); `None` when `CCOL_CACHE`,
/// `XDG_CACHE_HOME` and `HOME` are all unset or empty. The directory may not
/// exist yet.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(|name| std::env::var_os(name))
}

/// The project's cache directory, reading variables through `var` (a
/// variable's value, or `None`) so tests need not change the process's
/// environment: the first of [`cache_dirs_from`].
pub fn cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    cache_dirs_from(var).into_iter().next()
}

/// Every candidate cache directory from this process's environment, in
/// order of precedence ([`cache_dirs_from`] over [`std::env::var_os`]).
pub fn cache_dirs() -> Vec<PathBuf> {
    cache_dirs_from(|name| std::env::var_os(name))
}

/// Every candidate cache directory, in order of precedence (module docs),
/// reading variables through `var`: one per variable that is set and not
/// empty, so at most three, and none when all three are unset.
pub fn cache_dirs_from(var: impl Fn(&str) -> Option<OsString>) -> Vec<PathBuf> {
    let get = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    [
        get(CACHE_ENV),
        get("XDG_CACHE_HOME").map(|d| d.join(CACHE_DIR_NAME)),
        get("HOME").map(|h| h.join(".cache").join(CACHE_DIR_NAME)),
    ]
    .into_iter()
    .flatten()
    .collect()
}
