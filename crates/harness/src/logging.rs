//! Logs a user can turn on: one `tracing` subscriber on stderr, installed by
//! `ccol` and by the workspace's example programs with [`init`].
//!
//! The library reports through `tracing` (warnings such as "NCCL work still
//! running after abort", an `exchange` span and a `ccol::exchange` event per
//! exchange); nothing is shown until a program installs a subscriber.
//!
//! - `RUST_LOG` ([`FILTER_ENV`]) chooses what is shown, in
//!   `tracing-subscriber`'s `EnvFilter` syntax: `RUST_LOG=debug`,
//!   `RUST_LOG=warn,ccol::exchange=debug` (one event per exchange),
//!   `RUST_LOG=warn,compiler_collectives_gloo=trace`. Unset or empty:
//!   [`DEFAULT_FILTER`], warnings and errors — except the `ccol::exchange`
//!   "exchange failed" warning, which repeats the error the exchange returns
//!   and the program reports itself (`RUST_LOG=warn` shows it too). As
//!   everywhere `RUST_LOG` is read, a list without a bare level shows only
//!   the targets it names.
//! - `CCOL_LOG_FORMAT` ([`FORMAT_ENV`]): `text` (the default; one line per
//!   event, ANSI colours only when stderr is a terminal and `NO_COLOR` is
//!   unset) or `json` (one JSON object per line: `timestamp`, `level`,
//!   `target`, `fields`, the current span).
//! - Logs go to stderr, so a program's stdout (tables, `--json` output) stays
//!   clean; under `ccol run` each line gets its rank's `[rank R] ` prefix
//!   like the rest of the rank's stderr.
//!
//! A malformed value is not fatal: [`init`] prints one warning naming it and
//! uses the default, so a typo in `RUST_LOG` never stops a training job.
//!
//! First thing in a program's `main`:
//!
//! ```no_run
//! compiler_collectives_harness::logging::init();
//! // … the program; `tracing` events at or above the filter reach stderr.
//! ```

use std::fmt;
use std::io::IsTerminal as _;
use tracing_subscriber::filter::EnvFilter;

/// The variable that chooses what is logged (`EnvFilter` directives).
pub const FILTER_ENV: &str = "RUST_LOG";
/// The variable that chooses the format: `text` or `json`.
pub const FORMAT_ENV: &str = "CCOL_LOG_FORMAT";
/// What is shown when [`FILTER_ENV`] is unset or empty (or malformed):
/// warnings, but not the per-exchange "exchange failed" (the error itself
/// reaches the program, which reports it).
pub const DEFAULT_FILTER: &str = "warn,ccol::exchange=error";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Parses a [`FORMAT_ENV`] value (`text` or `json`, any case, surrounding
    /// blanks ignored; empty means [`LogFormat::Text`]).
    ///
    /// # Errors
    /// [`LogConfigError`] naming the variable and the value.
    pub fn parse(value: &str) -> Result<LogFormat, LogConfigError> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(LogConfigError {
                variable: FORMAT_ENV,
                value: value.to_owned(),
                reason: "expected text or json".into(),
            }),
        }
    }
}

/// A malformed logging variable: which, its value and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfigError {
    /// The variable ([`FILTER_ENV`] or [`FORMAT_ENV`]).
    pub variable: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for LogConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}: {}", self.variable, self.value, self.reason)
    }
}

impl std::error::Error for LogConfigError {}

/// What [`init`] installs: the filter and the format.
#[derive(Debug)]
pub struct LogConfig {
    /// What is shown.
    pub filter: EnvFilter,
    /// How it is written.
    pub format: LogFormat,
}

impl LogConfig {
    /// The configuration of these variable values (`None`: unset), and the
    /// malformed ones, each replaced by its default.
    pub fn parse(filter: Option<&str>, format: Option<&str>) -> (LogConfig, Vec<LogConfigError>) {
        let mut problems = Vec::new();
        let builder = EnvFilter::builder();
        let default = || builder.parse_lossy(DEFAULT_FILTER);
        let filter = match filter.map(str::trim).filter(|f| !f.is_empty()) {
            None => default(),
            Some(text) => builder.parse(text).unwrap_or_else(|e| {
                problems.push(LogConfigError {
                    variable: FILTER_ENV,
                    value: text.to_owned(),
                    reason: format!("{e}; showing warnings only"),
                });
                default()
            }),
        };
        let format = LogFormat::parse(format.unwrap_or("")).unwrap_or_else(|e| {
            problems.push(LogConfigError {
                reason: format!("{}; writing text", e.reason),
                ..e
            });
            LogFormat::Text
        });
        (LogConfig { filter, format }, problems)
    }

    /// The configuration of [`FILTER_ENV`] and [`FORMAT_ENV`] (see
    /// [`LogConfig::parse`]). A value that is not UTF-8 counts as malformed.
    pub fn from_env() -> (LogConfig, Vec<LogConfigError>) {
        let read =
            |name: &'static str, problems: &mut Vec<LogConfigError>| match std::env::var(name) {
                Ok(v) => Some(v),
                Err(std::env::VarError::NotPresent) => None,
                Err(std::env::VarError::NotUnicode(v)) => {
                    problems.push(LogConfigError {
                        variable: name,
                        value: v.to_string_lossy().into_owned(),
                        reason: "not UTF-8; using the default".into(),
                    });
                    None
                }
            };
        let mut problems = Vec::new();
        let filter = read(FILTER_ENV, &mut problems);
        let format = read(FORMAT_ENV, &mut problems);
        let (config, more) = LogConfig::parse(filter.as_deref(), format.as_deref());
        problems.extend(more);
        (config, problems)
    }
}

/// Installs the process-wide subscriber of [`LogConfig::from_env`] (module
/// docs): logs on stderr, warnings by default. Prints one line on stderr per
/// malformed variable (`<program>: warning: RUST_LOG="…": …`), whatever the
/// filter. Does nothing when a global subscriber is already set.
/// Call it first thing in `main`.
pub fn init() {
    let (config, problems) = LogConfig::from_env();
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(config.filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // Err only when another subscriber was installed first: keep that one.
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if !problems.is_empty() {
        let program = std::env::args_os()
            .next()
            .map(std::path::PathBuf::from)
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "ccol".into());
        for p in problems {
            eprintln!("{program}: warning: {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(filter: Option<&str>, format: Option<&str>, want: &str, problems: &[&str]) {
        let (config, got) = LogConfig::parse(filter, format);
        assert_eq!(
            format!("{} {:?}", config.filter, config.format),
            want,
            "{filter:?} {format:?}"
        );
        let got: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(got, problems, "{filter:?} {format:?}");
    }

    #[test]
    fn variables_choose_filter_and_format() {
        check(None, None, "ccol::exchange=error,warn Text", &[]);
        check(Some(""), Some(""), "ccol::exchange=error,warn Text", &[]);
        check(
            Some("  "),
            Some(" JSON "),
            "ccol::exchange=error,warn Json",
            &[],
        );
        check(Some("debug"), Some("text"), "debug Text", &[]);
        check(
            Some("ccol::exchange=debug"),
            Some("json"),
            "ccol::exchange=debug Json",
            &[],
        );
        check(
            Some("info,compiler_collectives_gloo=trace"),
            None,
            "compiler_collectives_gloo=trace,info Text",
            &[],
        );
    }

    #[test]
    fn malformed_values_fall_back_and_are_named() {
        check(
            None,
            Some("xml"),
            "ccol::exchange=error,warn Text",
            &[r#"CCOL_LOG_FORMAT="xml": expected text or json; writing text"#],
        );
        let (config, problems) = LogConfig::parse(Some("ccol=loud"), None);
        assert_eq!(config.filter.to_string(), "ccol::exchange=error,warn");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].variable, "RUST_LOG");
        assert_eq!(problems[0].value, "ccol=loud");
        assert!(
            problems[0].reason.ends_with("; showing warnings only"),
            "{}",
            problems[0]
        );
    }
}
