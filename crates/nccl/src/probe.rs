//! Is NCCL usable here? A probe that never panics.
//!
//! cudarc panics when a library it needs is missing, so nothing in this
//! crate calls into cudarc before the probe has checked the library it would
//! open. Three things are checked, each with its own error:
//!
//! 1. the NCCL library ([`find_library`], [`NcclSearch`]): `CCOL_NCCL_LIB`
//!    (a file or a directory), then the dynamic linker's search path
//!    (`libnccl.so.2`, `libnccl.so`), then Python packages: the pip wheel
//!    `nvidia-nccl-cu13` puts `nvidia/nccl/lib/libnccl.so.2` under
//!    site-packages (of `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the project's torch
//!    set-up in the cache, the user's site, and whatever `python3` reports);
//! 2. the CUDA driver (`libcuda.so.1`, through cudarc's
//!    `driver::sys::is_culib_present`);
//! 3. a device: `cuInit` succeeds and the device count covers the wanted
//!    ordinal.

use crate::sys::NcclLib;
use crate::NcclError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The variable naming the NCCL library: a file (`…/libnccl.so.2`) or a
/// directory holding `libnccl.so.2` or `libnccl.so`.
pub const NCCL_LIB_ENV: &str = "CCOL_NCCL_LIB";

/// The file names looked for in directories, in order.
const FILE_NAMES: &[&str] = &["libnccl.so.2", "libnccl.so"];

/// Where [`find_library`] looks, in order. [`NcclSearch::from_env`] gives
/// the default; tests build their own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclSearch {
    /// A file or directory named explicitly (`CCOL_NCCL_LIB`). When set, it
    /// is the only place looked at: a wrong value is an error, not a
    /// silent fall-back.
    pub explicit: Option<PathBuf>,
    /// Names handed to the dynamic linker as they are (its search path:
    /// `LD_LIBRARY_PATH` at start-up, the ld cache, system directories).
    pub linker_names: Vec<String>,
    /// Directories that may hold `libnccl.so.2` or `libnccl.so`.
    pub dirs: Vec<PathBuf>,
    /// A Python interpreter to ask for its site-packages directories (each
    /// then searched for `nvidia/nccl/lib`).
    pub python: Option<PathBuf>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `lib/python3*/site-packages` directories under a Python prefix.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        names.sort();
        for p in names {
            out.push(p.join("site-packages"));
            out.push(p.join("dist-packages"));
        }
    }
    out
}

/// The wheel's library directory under one site-packages directory.
fn wheel_dir(site: &Path) -> PathBuf {
    site.join("nvidia").join("nccl").join("lib")
}

// The project's cache directory (`CCOL_CACHE`, else
// `$XDG_CACHE_HOME/compiler-collectives`, else `~/.cache/compiler-collectives`):
// core's one rule, re-exported where this crate always had it.
pub use compiler_collectives_core::persistence::paths::cache_dir;

impl NcclSearch {
    /// The default search, from the environment (module docs).
    pub fn from_env() -> Self {
        let mut prefixes: Vec<PathBuf> = Vec::new();
        for v in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
            if let Some(p) = var(v) {
                prefixes.push(PathBuf::from(p));
            }
        }
        if let Some(py) = var("CCOL_TORCH_PYTHON") {
            // <venv>/bin/python -> <venv>
            if let Some(prefix) = Path::new(&py).parent().and_then(Path::parent) {
                prefixes.push(prefix.to_path_buf());
            }
        }
        if let Some(cache) = cache_dir() {
            if let Ok(entries) = std::fs::read_dir(&cache) {
                let mut torch: Vec<PathBuf> = entries
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("torch-") || n.starts_with("nccl-"))
                    })
                    .collect();
                torch.sort();
                prefixes.extend(torch);
            }
        }
        let mut dirs: Vec<PathBuf> = Vec::new();
        for prefix in &prefixes {
            dirs.extend(site_packages(prefix).iter().map(|s| wheel_dir(s)));
        }
        if let Some(home) = var("HOME") {
            dirs.extend(
                site_packages(&PathBuf::from(home).join(".local"))
                    .iter()
                    .map(|s| wheel_dir(s)),
            );
        }
        NcclSearch {
            explicit: var(NCCL_LIB_ENV).map(PathBuf::from),
            linker_names: FILE_NAMES.iter().map(|s| (*s).to_owned()).collect(),
            dirs,
            python: var("CCOL_PYTHON")
                .map(PathBuf::from)
                .or_else(|| Some(PathBuf::from("python3"))),
        }
    }

    /// Asks the interpreter for its site-packages directories; empty when
    /// it cannot run.
    fn python_dirs(&self) -> Vec<PathBuf> {
        let Some(py) = &self.python else {
            return Vec::new();
        };
        let script = "import site,sys\n\
                      p=[]\n\
                      try: p+=site.getsitepackages()\n\
                      except Exception: pass\n\
                      try: p.append(site.getusersitepackages())\n\
                      except Exception: pass\n\
                      print('\\n'.join(p+sys.path))";
        match std::process::Command::new(py)
            .args(["-c", script])
            .stderr(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| wheel_dir(Path::new(l)))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// What [`find_library`] found.
#[derive(Debug)]
pub struct Found {
    /// The opened library.
    pub lib: NcclLib,
    /// Every place tried before it, in order (for diagnostics).
    pub tried: Vec<String>,
}

/// Finds and opens NCCL following `search`.
///
/// # Errors
/// [`NcclError::LibraryNotFound`] listing every place tried (and what to
/// install or set); [`NcclError::LibraryLoad`] or [`NcclError::Version`]
/// when the explicitly named library does not open. A file found by the
/// search that does not open is skipped (and listed with its error).
pub fn find_library(search: &NcclSearch) -> Result<Found, NcclError> {
    let mut tried = Vec::new();
    if let Some(p) = &search.explicit {
        let file = if p.is_dir() {
            FILE_NAMES.iter().map(|n| p.join(n)).find(|f| f.exists())
        } else if p.exists() {
            Some(p.clone())
        } else {
            None
        };
        let Some(file) = file else {
            return Err(NcclError::LibraryNotFound {
                tried: vec![format!(
                    "{NCCL_LIB_ENV}={} (no such file, or a directory without libnccl.so.2)",
                    p.display()
                )],
            });
        };
        let lib = NcclLib::open(&file)?;
        return Ok(Found { lib, tried });
    }
    for name in &search.linker_names {
        match NcclLib::open(Path::new(name)) {
            Ok(lib) => return Ok(Found { lib, tried }),
            Err(e) => tried.push(format!("{name} (dynamic linker): {e}")),
        }
    }
    let try_dirs = |dirs: &[PathBuf], tried: &mut Vec<String>| -> Option<NcclLib> {
        for dir in dirs {
            for n in FILE_NAMES {
                let f = dir.join(n);
                if !f.exists() {
                    continue;
                }
                match NcclLib::open(&f) {
                    Ok(lib) => return Some(lib),
                    Err(e) => tried.push(format!("{}: {e}", f.display())),
                }
            }
            tried.push(format!("{} (absent)", dir.display()));
        }
        None
    };
    if let Some(lib) = try_dirs(&search.dirs, &mut tried) {
        return Ok(Found { lib, tried });
    }
    let py = search.python_dirs();
    if let Some(lib) = try_dirs(&py, &mut tried) {
        return Ok(Found { lib, tried });
    }
    if let Some(p) = &search.python {
        tried.push(format!("site-packages reported by {}", p.display()));
    }
    Err(NcclError::LibraryNotFound { tried })
}

/// The NCCL library of the default search, opened once per process and
/// shared. A failed search is cached too (the environment that decides it
/// does not change).
///
/// # Errors
/// As [`find_library`].
pub fn library() -> Result<Arc<NcclLib>, NcclError> {
    static LIB: OnceLock<Result<Arc<NcclLib>, NcclError>> = OnceLock::new();
    LIB.get_or_init(|| {
        let found = find_library(&NcclSearch::from_env())?;
        tracing::debug!(path = %found.lib.path().display(), version = %found.lib.version_string(), "NCCL found");
        Ok(Arc::new(found.lib))
    })
    .clone()
}

/// Checks the CUDA driver and returns the number of devices.
///
/// # Errors
/// [`NcclError::DriverNotFound`] when `libcuda.so.1` cannot be opened;
/// [`NcclError::NoDevice`] when `cuInit` fails (no GPU, or
/// `CUDA_VISIBLE_DEVICES` hides them all) or no device is visible.
pub fn device_count() -> Result<usize, NcclError> {
    if !crate::sys::driver_present() {
        return Err(NcclError::DriverNotFound);
    }
    cudarc::driver::result::init().map_err(|e| NcclError::NoDevice {
        detail: format!("cuInit failed: {}", crate::driver_text(&e)),
    })?;
    let n = cudarc::driver::result::device::get_count().map_err(|e| NcclError::NoDevice {
        detail: format!("cuDeviceGetCount failed: {}", crate::driver_text(&e)),
    })?;
    let n = usize::try_from(n).unwrap_or(0);
    if n == 0 {
        return Err(NcclError::NoDevice {
            detail: "the driver reports 0 devices".into(),
        });
    }
    Ok(n)
}

/// What [`probe`] found usable.
#[derive(Debug, Clone)]
pub struct Availability {
    /// The NCCL library.
    pub lib: Arc<NcclLib>,
    /// Number of CUDA devices visible.
    pub devices: usize,
}

/// Whether NCCL can run here: library, driver, at least one device. Never
/// panics.
///
/// # Errors
/// The first missing piece: [`NcclError::LibraryNotFound`] (or
/// `LibraryLoad`/`Version`), [`NcclError::DriverNotFound`],
/// [`NcclError::NoDevice`]; each message says what to install or set.
pub fn probe() -> Result<Availability, NcclError> {
    let lib = library()?;
    let devices = device_count()?;
    Ok(Availability { lib, devices })
}
