//! The cache directory's precedence: `CCOL_CACHE`, `XDG_CACHE_HOME`, `HOME`.
//!
//! One table, one case per line, over `cache_dir_from`/`cache_dirs_from`
//! (no test changes the process's environment). Variables are written
//! `NAME=value;NAME=value` (the value is everything after `=` up to `;`, an
//! empty value included); the expected candidates are joined by ` | `, `-`
//! for none.

use compiler_collectives_core::persistence::paths::{cache_dir_from, cache_dirs_from};
use std::ffi::OsString;
use std::path::PathBuf;

fn vars(case: &str) -> Vec<(String, OsString)> {
    case.split(';')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .unwrap_or_else(|| panic!("bad case {p:?}"));
            (k.trim().to_owned(), OsString::from(v))
        })
        .collect()
}

fn lookup(vars: &[(String, OsString)]) -> impl Fn(&str) -> Option<OsString> + '_ {
    move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// `cache_dirs_from(case)` rendered (module docs); `cache_dir_from` must be
/// its first entry.
#[track_caller]
fn check(case: &str, expect: &str) {
    let vars = vars(case);
    let dirs = cache_dirs_from(lookup(&vars));
    assert_eq!(
        cache_dir_from(lookup(&vars)),
        dirs.first().cloned(),
        "{case}"
    );
    let got = if dirs.is_empty() {
        "-".to_owned()
    } else {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    assert_eq!(got, expect, "{case}");
}

#[test]
fn precedence() {
    check("", "-");
    check("CCOL_CACHE=/c", "/c");
    check("XDG_CACHE_HOME=/x", "/x/compiler-collectives");
    check("HOME=/h", "/h/.cache/compiler-collectives");
    check(
        "CCOL_CACHE=/c;XDG_CACHE_HOME=/x;HOME=/h",
        "/c | /x/compiler-collectives | /h/.cache/compiler-collectives",
    );
    check(
        "XDG_CACHE_HOME=/x;HOME=/h",
        "/x/compiler-collectives | /h/.cache/compiler-collectives",
    );
    check(
        "CCOL_CACHE=/c;HOME=/h",
        "/c | /h/.cache/compiler-collectives",
    );
    // CCOL_CACHE is the directory itself: nothing is appended.
    check("CCOL_CACHE=rel/dir", "rel/dir");
    check("XDG_CACHE_HOME=rel", "rel/compiler-collectives");
}

#[test]
fn empty_counts_as_unset() {
    check("CCOL_CACHE=;XDG_CACHE_HOME=;HOME=", "-");
    check("CCOL_CACHE=;XDG_CACHE_HOME=/x", "/x/compiler-collectives");
    check(
        "CCOL_CACHE=;XDG_CACHE_HOME=;HOME=/h",
        "/h/.cache/compiler-collectives",
    );
    // A value of spaces is a (strange) path, not empty.
    check("CCOL_CACHE= ", " ");
}

#[cfg(unix)]
#[test]
fn values_need_not_be_utf8() {
    use std::os::unix::ffi::OsStringExt;
    let raw = OsString::from_vec(b"/c\xff".to_vec());
    let var = |name: &str| (name == "CCOL_CACHE").then(|| raw.clone());
    assert_eq!(cache_dir_from(var), Some(PathBuf::from(raw.clone())));
}
