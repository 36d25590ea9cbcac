//! TorchElastic error files: how a rank tells its launcher why it failed.
//!
//! `torchrun` (and `ccol run`) give every rank a path in
//! `TORCHELASTIC_ERROR_FILE`. A rank that fails writes its error there as JSON;
//! when the rank exits non-zero the launcher reads the file and shows the
//! message as the root cause instead of a bare exit code (docs/failures.md,
//! Under torchrun).
//!
//! The shape is the one PyTorch's `ErrorHandler.record_exception` writes
//! (`torch/distributed/elastic/multiprocessing/errors/error_handler.py`) and
//! `ProcessFailure` reads (`errors/__init__.py`):
//!
//! ```json
//! {"message": {"message": "<ErrorType>: <text>",
//!              "extraInfo": {"py_callstack": "<text>", "timestamp": "<unix seconds>"}}}
//! ```
//!
//! torchrun shows `py_callstack` when present (else `message`) and takes the
//! rank with the smallest `timestamp` as the first failure. Rust has no Python
//! call stack, so `py_callstack` holds the message followed by the error's
//! `source()` chain.
//!
//! ```
//! use compiler_collectives_core::launch::torchelastic::{read_error_file, ErrorReport};
//!
//! let dir = std::env::temp_dir().join(format!("ccol-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let path = dir.join("error.json");
//! ErrorReport::new("RuntimeError", "rank 1 ran out of memory").write_to(&path)?;
//! let back = read_error_file(&path)?.expect("the file exists");
//! assert_eq!(back.message, "RuntimeError: rank 1 ran out of memory");
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), std::io::Error>(())
//! ```

use serde_json::{json, Value};
use std::error::Error as StdError;
use std::fs::{self, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that names a rank's error file.
pub const ERROR_FILE_ENV: &str = "TORCHELASTIC_ERROR_FILE";

/// The largest error file [`read_error_file`] accepts, in bytes (1 MiB).
///
/// The file is written by a rank, i.e. by a process the reader does not
/// control; anything larger is refused rather than read.
pub const MAX_ERROR_FILE_BYTES: u64 = 1 << 20;

/// The error type [`ErrorReport::from_core_error`] writes before the kind,
/// e.g. `CompilerCollectivesError(timeout): ...`.
pub const CORE_ERROR_TYPE: &str = "CompilerCollectivesError";

/// One error as a TorchElastic error file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReport {
    /// The error's type, written before the text (`RuntimeError`, `Error`, …).
    pub error_type: String,
    /// The error's text (its `Display`).
    pub text: String,
    /// What goes in `extraInfo.py_callstack`: the message and the error's
    /// `source()` chain. torchrun shows this in preference to the message.
    pub callstack: String,
    /// When the error happened, in whole seconds since the Unix epoch.
    pub timestamp: u64,
}

impl ErrorReport {
    /// A report of `text` under `error_type`, stamped now, whose call stack is
    /// just the message.
    pub fn new(error_type: impl Into<String>, text: impl Into<String>) -> Self {
        let error_type = error_type.into();
        let text = text.into();
        let callstack = format!("{error_type}: {text}");
        ErrorReport {
            error_type,
            text,
            callstack,
            timestamp: unix_now(),
        }
    }

    /// A report of any error, stamped now.
    ///
    /// The type is the last path segment of `E`'s type name (`Error` for
    /// `&dyn Error` and `std::io::Error`, `MyError` for `my_crate::MyError`);
    /// the call stack lists the `source()` chain, anyhow-style:
    /// `Caused by:` then one numbered line per cause.
    pub fn from_error<E: StdError + ?Sized>(err: &E) -> Self {
        let mut report = ErrorReport::new(short_type_name::<E>(), err.to_string());
        append_causes(&mut report.callstack, err.source());
        report
    }

    /// A report of a compiler-collectives error: the type is
    /// `CompilerCollectivesError(<kind>)` with [`crate::Error::kind`], e.g.
    /// `CompilerCollectivesError(timeout): ...`, so a reader can tell a
    /// timeout from a desync without parsing the text.
    pub fn from_core_error(err: &crate::Error) -> Self {
        let mut report = ErrorReport::new(
            format!("{CORE_ERROR_TYPE}({})", err.kind()),
            err.to_string(),
        );
        append_causes(&mut report.callstack, err.source());
        report
    }

    /// The top-level message torchrun reads: `"<ErrorType>: <text>"`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.error_type, self.text)
    }

    /// The file's JSON value (see the module docs for the shape).
    pub fn to_json_value(&self) -> Value {
        json!({
            "message": {
                "message": self.message(),
                "extraInfo": {
                    "py_callstack": self.callstack,
                    "timestamp": self.timestamp.to_string(),
                },
            }
        })
    }

    /// The file's text: one line of JSON.
    pub fn to_json(&self) -> String {
        self.to_json_value().to_string()
    }

    /// Writes the report to `path`, atomically: the JSON goes to a fresh
    /// temporary file in the same directory, which is then renamed over
    /// `path`, so a reader sees either no file or the whole one. An existing
    /// file at `path` is replaced.
    ///
    /// # Errors
    /// The I/O error of creating, writing or renaming the file (the directory
    /// must exist). The temporary file is removed on failure.
    pub fn write_to(&self, path: &Path) -> io::Result<()> {
        write_atomically(path, self.to_json().as_bytes())
    }

    /// Writes the report to the file `TORCHELASTIC_ERROR_FILE` names, if the
    /// variable is set and not empty (as PyTorch's error handler does).
    ///
    /// Returns the path written, or `None` when the variable is unset.
    ///
    /// # Errors
    /// As [`ErrorReport::write_to`].
    pub fn write_to_env(&self) -> io::Result<Option<PathBuf>> {
        let Some(path) = error_file_from_env() else {
            return Ok(None);
        };
        self.write_to(&path)?;
        Ok(Some(path))
    }
}

/// The path in `TORCHELASTIC_ERROR_FILE`, when it is set and not empty.
pub fn error_file_from_env() -> Option<PathBuf> {
    std::env::var_os(ERROR_FILE_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// Writes `err` to `TORCHELASTIC_ERROR_FILE` when that is set, as torchrun's
/// `@record` does for a Python exception ([`ErrorReport::from_error`] says what
/// goes in). Call it just before the process exits with the error.
///
/// Returns the path written, or `None` when the variable is unset (not running
/// under torchrun or `ccol run`). Never panics.
///
/// # Errors
/// The I/O error of writing the file ([`ErrorReport::write_to`]).
pub fn write_error_file<E: StdError + ?Sized>(err: &E) -> io::Result<Option<PathBuf>> {
    ErrorReport::from_error(err).write_to_env()
}

/// Like [`write_error_file`] for a compiler-collectives [`crate::Error`]: the
/// message starts with `CompilerCollectivesError(<kind>)`
/// ([`ErrorReport::from_core_error`]).
///
/// # Errors
/// The I/O error of writing the file ([`ErrorReport::write_to`]).
pub fn write_core_error_file(err: &crate::Error) -> io::Result<Option<PathBuf>> {
    ErrorReport::from_core_error(err).write_to_env()
}

/// What a launcher reads back from a rank's error file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedError {
    /// The top-level message, e.g. `RuntimeError: boom`.
    pub message: String,
    /// `extraInfo.py_callstack`, when the file has one.
    pub callstack: Option<String>,
    /// When the error happened (Unix seconds), when the file says.
    pub timestamp: Option<u64>,
}

/// Reads a rank's error file in either shape torchrun accepts: the one this
/// module writes (`message` an object with `extraInfo`), or the older flat one
/// (`{"message": "<text>", "timestamp": <secs>}`).
///
/// Returns `None` when there is no file (the rank wrote none).
///
/// # Errors
/// `InvalidData` for a file over [`MAX_ERROR_FILE_BYTES`], or one that is not
/// JSON of either shape; other I/O errors as they come.
pub fn read_error_file(path: &Path) -> io::Result<Option<ReportedError>> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.take(MAX_ERROR_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > MAX_ERROR_FILE_BYTES) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: error file larger than {MAX_ERROR_FILE_BYTES} bytes",
                path.display()
            ),
        ));
    }
    parse_error_file(&bytes).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Parses the text of an error file (see [`read_error_file`]).
///
/// # Errors
/// A description of what is wrong with the text.
pub fn parse_error_file(bytes: &[u8]) -> Result<ReportedError, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("error file is not JSON: {e}"))?;
    match value.get("message") {
        Some(Value::String(message)) => Ok(ReportedError {
            message: message.clone(),
            callstack: None,
            timestamp: value.get("timestamp").and_then(as_secs),
        }),
        Some(Value::Object(inner)) => {
            let extra = inner.get("extraInfo");
            Ok(ReportedError {
                message: inner
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("<N/A>")
                    .to_string(),
                callstack: extra
                    .and_then(|x| x.get("py_callstack"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                timestamp: extra.and_then(|x| x.get("timestamp")).and_then(as_secs),
            })
        }
        Some(_) => Err("error file's \"message\" is neither a string nor an object".into()),
        None => Err("error file has no \"message\"".into()),
    }
}

/// A timestamp as torchrun writes it (a string of digits) or as a number.
fn as_secs(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The last path segment of `E`'s name, without generics or `dyn`.
fn short_type_name<E: ?Sized>() -> String {
    let full = std::any::type_name::<E>();
    let full = full.strip_prefix("dyn ").unwrap_or(full);
    let end = full.find(['<', ' ']).unwrap_or(full.len());
    let path = &full[..end];
    let last = path.rsplit("::").next().unwrap_or(path);
    if last.is_empty() {
        "Error".to_string()
    } else {
        last.to_string()
    }
}

/// Appends `Caused by:` and the numbered `source()` chain (at most 64 deep).
fn append_causes(out: &mut String, mut source: Option<&(dyn StdError + 'static)>) {
    let mut n = 0usize;
    while let Some(cause) = source {
        if n == 0 {
            out.push_str("\nCaused by:");
        }
        if n == 64 {
            out.push_str("\n    ...");
            break;
        }
        out.push_str(&format!("\n    {n}: {cause}"));
        n += 1;
        source = cause.source();
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename, so readers never see a partial file.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: error file path has no file name", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut last_err = None;
    for _ in 0..16 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}.{n}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let mut file = match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                last_err = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let written = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .and_then(|()| {
                drop(file);
                fs::rename(&tmp, path)
            });
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        return written;
    }
    Err(last_err.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::AlreadyExists,
            "no free temporary file name for the error file",
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "exchange failed")
        }
    }
    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    fn read_json(path: &Path) -> Value {
        serde_json::from_slice(&fs::read(path).expect("file written")).expect("valid JSON")
    }

    #[test]
    fn writes_the_shape_torchrun_reads() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("error.json");
        let report = ErrorReport::new("RuntimeError", "boom");
        report.write_to(&path).expect("written");
        let v = read_json(&path);
        assert_eq!(v["message"]["message"], "RuntimeError: boom");
        assert_eq!(
            v["message"]["extraInfo"]["py_callstack"],
            "RuntimeError: boom"
        );
        let ts = v["message"]["extraInfo"]["timestamp"]
            .as_str()
            .expect("timestamp is a string");
        let ts: u64 = ts.parse().expect("digits");
        assert!(ts.abs_diff(unix_now()) < 60);
        // Nothing else at the top, nothing left behind in the directory.
        assert_eq!(v.as_object().map(serde_json::Map::len), Some(1));
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("error.json")]);
    }

    #[test]
    fn dyn_errors_carry_their_source_chain() {
        let err = Outer(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "peer went away",
        ));
        let as_dyn: &dyn StdError = &err;
        let r = ErrorReport::from_error(as_dyn);
        assert_eq!(r.message(), "Error: exchange failed");
        assert_eq!(
            r.callstack,
            "Error: exchange failed\nCaused by:\n    0: peer went away"
        );
        let r = ErrorReport::from_error(&err);
        assert_eq!(r.error_type, "Outer");
    }

    #[test]
    fn core_errors_name_their_kind() {
        let err = Error::InvalidArgument("world size 0".into());
        let r = ErrorReport::from_core_error(&err);
        assert_eq!(r.error_type, "CompilerCollectivesError(invalid_argument)");
        assert!(r
            .message()
            .starts_with("CompilerCollectivesError(invalid_argument): "));
        assert!(r.message().contains("world size 0"), "{}", r.message());
    }

    #[test]
    fn replaces_an_existing_file_and_round_trips() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("error.json");
        fs::write(&path, "stale").expect("seed");
        let report = ErrorReport::new("ValueError", "bad \"shape\"\nsecond line");
        report.write_to(&path).expect("written");
        let back = read_error_file(&path).expect("readable").expect("present");
        assert_eq!(back.message, report.message());
        assert_eq!(back.callstack.as_deref(), Some(report.callstack.as_str()));
        assert_eq!(back.timestamp, Some(report.timestamp));
    }

    #[test]
    fn writing_into_a_missing_directory_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("no/such/dir/error.json");
        assert!(ErrorReport::new("E", "x").write_to(&path).is_err());
        assert!(ErrorReport::new("E", "x").write_to(Path::new("/")).is_err());
    }

    #[test]
    fn reads_both_shapes_and_refuses_garbage() {
        let check = |text: &str, expect: Result<(&str, Option<&str>, Option<u64>), ()>| {
            let got = parse_error_file(text.as_bytes());
            match expect {
                Ok((m, c, t)) => {
                    let got = got.expect(text);
                    assert_eq!(got.message, m, "{text}");
                    assert_eq!(got.callstack.as_deref(), c, "{text}");
                    assert_eq!(got.timestamp, t, "{text}");
                }
                Err(()) => assert!(got.is_err(), "{text} parsed as {got:?}"),
            }
        };
        check(
            r#"{"message":{"message":"E: x","extraInfo":{"py_callstack":"tb","timestamp":"17"}}}"#,
            Ok(("E: x", Some("tb"), Some(17))),
        );
        check(
            r#"{"message":"flat","timestamp":5}"#,
            Ok(("flat", None, Some(5))),
        );
        check(r#"{"message":"flat"}"#, Ok(("flat", None, None)));
        check(r#"{"message":{}}"#, Ok(("<N/A>", None, None)));
        check(r#"{"message":3}"#, Err(()));
        check(r#"{"other":1}"#, Err(()));
        check("not json", Err(()));
        check(&"[".repeat(10_000), Err(()));
    }

    #[test]
    fn reading_a_missing_or_oversized_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("error.json");
        assert_eq!(read_error_file(&path).expect("no error"), None);
        let big = usize::try_from(MAX_ERROR_FILE_BYTES).expect("fits") + 1;
        fs::write(&path, vec![b' '; big]).expect("write");
        let err = read_error_file(&path).expect_err("too big");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn env_variable_decides_whether_and_where() {
        // The only test that touches TORCHELASTIC_ERROR_FILE (std serialises
        // environment access, and no other test reads this variable).
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("error.json");
        std::env::set_var(ERROR_FILE_ENV, "");
        assert_eq!(
            write_error_file(&Outer(io::Error::other("x"))).ok(),
            Some(None)
        );
        std::env::set_var(ERROR_FILE_ENV, &path);
        let err = Error::InvalidArgument("bad".into());
        let written = write_core_error_file(&err);
        std::env::remove_var(ERROR_FILE_ENV);
        assert_eq!(written.expect("written"), Some(path.clone()));
        let back = read_error_file(&path).expect("readable").expect("present");
        assert!(back
            .message
            .starts_with("CompilerCollectivesError(invalid_argument): "));
        assert_eq!(write_error_file(&err).expect("unset is fine"), None);
    }

    #[test]
    fn short_type_names() {
        assert_eq!(short_type_name::<dyn StdError>(), "Error");
        assert_eq!(short_type_name::<dyn StdError + Send + Sync>(), "Error");
        assert_eq!(short_type_name::<std::io::Error>(), "Error");
        assert_eq!(short_type_name::<Outer>(), "Outer");
        assert_eq!(short_type_name::<Vec<u8>>(), "Vec");
    }
}
