//! The project's cache directory, and what the scripts install into it.
//!
//! The same resolution as `scripts/env.sh` (and the backends), core's
//! [`compiler_collectives::persistence::paths`]: `$CCOL_CACHE`, else
//! `$XDG_CACHE_HOME/compiler-collectives`, else `~/.cache/compiler-collectives`.

use std::path::PathBuf;

/// The torch version `scripts/setup-torch.sh` installs (tch 0.26's).
pub(crate) const TORCH_VERSION: &str = "2.13.0";

// The project's cache directory; `None` when `CCOL_CACHE`, `XDG_CACHE_HOME`
// and `HOME` are all unset: core's one rule, re-exported where it always was.
pub(crate) use compiler_collectives::persistence::paths::cache_dir;

/// The Python with torch: `$CCOL_TORCH_PYTHON`, else the virtual
/// environment `scripts/setup-torch.sh` made in the cache
/// (`<cache>/torch-2.13.0/bin/python`) when it exists — so commands that need
/// torch work after the README's test command without any variable —, else
/// `None`.
pub(crate) fn torch_python() -> Option<PathBuf> {
    std::env::var_os("CCOL_TORCH_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            cache_dir()
                .map(|c| {
                    c.join(format!("torch-{TORCH_VERSION}"))
                        .join("bin")
                        .join("python")
                })
                .filter(|p| p.is_file())
        })
}
