//! Ctrl-C during a wait: SIGINT ends the exchange in progress at once, the
//! channel is aborted (peers get `PeerLost` naming this rank) and the caller
//! gets Python's `KeyboardInterrupt`.
//!
//! CPython runs its SIGINT handler (which raises `KeyboardInterrupt`) only
//! when the main thread next runs Python code, and an exchange waits in
//! Rust with the GIL released, so without this a Ctrl-C waits for the
//! exchange's deadline. [`install`] adds a SIGINT action (signal-hook, which
//! calls the handler installed before it — Python's — first) that writes a
//! byte to a socket; a watcher thread reading it interrupts the Gloo waits
//! of the exchange [`Armed`] in the main thread at that moment
//! ([`GlooInterrupt::interrupt`]). Nothing is polled, and an exchange costs
//! two uncontended lock operations more.

use compiler_collectives_gloo::GlooInterrupt;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

struct Watch {
    /// The thread whose exchanges a Ctrl-C interrupts: the one that
    /// installed the watch (Python's main thread; the package installs it
    /// only from there).
    main: ThreadId,
    /// The exchange waiting in `main`, if any.
    current: Mutex<Option<GlooInterrupt>>,
}

static WATCH: OnceLock<Result<Watch, String>> = OnceLock::new();

/// Installs the SIGINT action and its watcher thread, once per process,
/// from the calling thread, which must be Python's main thread. Later calls
/// return the first one's outcome.
///
/// # Errors
/// The reason the action or thread could not be set up, in words (the
/// package then logs it and waits uninterruptibly, as before).
pub(crate) fn install() -> Result<(), String> {
    WATCH
        .get_or_init(|| {
            let (mut read, write) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
            signal_hook::low_level::pipe::register(signal_hook::consts::SIGINT, write)
                .map_err(|e| format!("cannot add a SIGINT action: {e}"))?;
            std::thread::Builder::new()
                .name("ccol-py-sigint".into())
                .spawn(move || {
                    let mut byte = [0u8; 64];
                    // Ends only with the process (or if the socket fails).
                    while matches!(read.read(&mut byte), Ok(n) if n > 0) {
                        if let Some(Ok(watch)) = WATCH.get() {
                            let current =
                                watch.current.lock().unwrap_or_else(PoisonError::into_inner);
                            if let Some(interrupt) = current.as_ref() {
                                interrupt.interrupt();
                            }
                        }
                    }
                })
                .map_err(|e| format!("cannot start the SIGINT watcher: {e}"))?;
            Ok(Watch {
                main: std::thread::current().id(),
                current: Mutex::new(None),
            })
        })
        .as_ref()
        .map(drop)
        .map_err(Clone::clone)
}

/// An exchange that a Ctrl-C interrupts, for its lifetime (a no-op outside
/// the main thread or without [`install`]).
pub(crate) struct Armed {
    armed: bool,
}

impl Armed {
    /// Makes `interrupt` the target of a Ctrl-C until the value is dropped.
    pub(crate) fn new(interrupt: &GlooInterrupt) -> Armed {
        match WATCH.get() {
            Some(Ok(watch)) if watch.main == std::thread::current().id() => {
                *watch.current.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(interrupt.clone());
                Armed { armed: true }
            }
            _ => Armed { armed: false },
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if self.armed {
            if let Some(Ok(watch)) = WATCH.get() {
                *watch.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
        }
    }
}
