//! [`C10dError`], how a shim status becomes one, and its conversion into
//! core's [`Error`].

use crate::sys::Status;
use compiler_collectives_core::Error;
use std::ffi::CString;
use std::time::{Duration, Instant};

/// Errors of the c10d backend, with libtorch's original text. Converted into
/// core's [`Error`] (timeouts into `Timeout`, the rest into `Backend`).
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum C10dError {
    /// libtorch raised an exception (`c10::DistError` and friends), or a
    /// bounded store call got no answer in time (`timeout`).
    #[error("c10d {operation} failed{}: {message}", if *timeout { " (timeout)" } else { "" })]
    Torch {
        /// What was being done.
        operation: String,
        /// Whether libtorch reported a timeout.
        timeout: bool,
        /// Whether it was a network error (a peer's connection broke).
        network: bool,
        /// libtorch's message, without its C++ backtrace.
        message: String,
    },
    /// The operation is not available in this build.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// An argument was rejected before reaching libtorch.
    #[error("{0}")]
    Invalid(String),
    /// The shim reported a failure with a status this build does not know
    /// (or with `OK`): a shim and crate out of step.
    #[error("c10d {operation} failed with unknown shim status {code}: {message}")]
    UnknownStatus {
        /// What was being done.
        operation: String,
        /// The status the shim returned.
        code: i32,
        /// The shim's text, if any.
        message: String,
    },
}

/// The error of a failed shim call of `operation` that returned `code` with
/// `message`. Exhaustive over the shim's statuses (generated from its
/// header), so a new status fails to compile until it is mapped here.
pub(crate) fn from_status(code: i32, message: String, operation: &str) -> C10dError {
    let torch = |timeout: bool, network: bool, message: String| C10dError::Torch {
        operation: operation.to_owned(),
        timeout,
        network,
        message,
    };
    let Some(status) = Status::from_code(code) else {
        return C10dError::UnknownStatus {
            operation: operation.to_owned(),
            code,
            message,
        };
    };
    match status {
        // A failure reported as success: the shim broke its contract.
        Status::Ok => C10dError::UnknownStatus {
            operation: operation.to_owned(),
            code,
            message,
        },
        Status::Timeout => torch(true, false, message),
        Status::Network => torch(false, true, message),
        Status::Dist | Status::Other => torch(false, false, message),
        Status::Invalid => C10dError::Invalid(message),
        Status::Unsupported => C10dError::Unsupported(message),
    }
}

/// `s` as a C string; [`C10dError::Invalid`] naming `what` if it holds a NUL.
pub(crate) fn c_string(s: &str, what: &str) -> Result<CString, C10dError> {
    CString::new(s).map_err(|_| C10dError::Invalid(format!("{what} contains a NUL byte")))
}

/// `n` as the shim's `int32_t`; [`C10dError::Invalid`] naming `what` if it
/// does not fit.
pub(crate) fn c_int(n: u32, what: &str) -> Result<i32, C10dError> {
    i32::try_from(n).map_err(|_| C10dError::Invalid(format!("{what} {n} is too large")))
}

impl C10dError {
    /// Core's [`Error`] for this error of a call that ran for `waited` (take
    /// it from an [`Instant`] at the start of the call): a timeout becomes
    /// [`Error::Timeout`] carrying `waited` (c10d cannot tell which ranks it
    /// waited for, so none are named; libtorch's text goes to a
    /// `tracing::debug!` line), [`C10dError::Invalid`] becomes
    /// [`Error::InvalidArgument`], [`C10dError::Unsupported`] becomes
    /// [`Error::Unsupported`], anything else [`Error::Backend`] (backend
    /// `"c10d"`, this error as its source).
    pub fn into_core(self, waited: Duration) -> Error {
        match self {
            C10dError::Torch { timeout: true, .. } => {
                tracing::debug!(error = %self, waited_ms = waited.as_millis(), "c10d timeout");
                Error::timeout(Vec::new(), Vec::new(), waited)
            }
            C10dError::Invalid(m) => Error::InvalidArgument(m),
            C10dError::Unsupported(m) => Error::Unsupported(m),
            other => Error::Backend {
                backend: "c10d",
                message: other.to_string(),
                engine: Some(Box::new(other)),
            },
        }
    }
}

/// Runs `call` (one c10d call), converting its error into core's with how
/// long the call ran ([`C10dError::into_core`]).
pub(crate) fn timed<T>(call: impl FnOnce() -> Result<T, C10dError>) -> Result<T, Error> {
    let started = Instant::now();
    call().map_err(|e| e.into_core(started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(code: i32, expect: &str) {
        let e = from_status(code, "text".into(), "op");
        let got = match &e {
            C10dError::Torch {
                timeout: true,
                network: false,
                ..
            } => "timeout",
            C10dError::Torch {
                timeout: false,
                network: true,
                ..
            } => "network",
            C10dError::Torch { .. } => "torch",
            C10dError::Invalid(_) => "invalid",
            C10dError::Unsupported(_) => "unsupported",
            C10dError::UnknownStatus { .. } => "unknown",
        };
        assert_eq!(got, expect, "status {code}: {e}");
    }

    #[test]
    fn every_status_maps_to_its_error() {
        check(Status::Ok as i32, "unknown");
        check(Status::Timeout as i32, "timeout");
        check(Status::Dist as i32, "torch");
        check(Status::Invalid as i32, "invalid");
        check(Status::Other as i32, "torch");
        check(Status::Unsupported as i32, "unsupported");
        check(Status::Network as i32, "network");
        check(-7, "unknown");
        check(1000, "unknown");
    }
}
