//! The watchdog: a thread per transport that interrupts a wait at its
//! deadline (`abortWait*` through [`Interrupter`]) instead of letting Gloo's
//! own timeout end it, since a Gloo timeout closes every pair of the
//! context. Also [`GlooInterrupt`], which brings every deadline forward to
//! now from another thread.

use crate::sys::{Buffer, Interrupter};
use crate::GlooError;
use compiler_collectives_core::Deadline;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long after its deadline Gloo's own timeout ends a watched wait, should
/// the watchdog not have interrupted it.
const BACKSTOP: Duration = Duration::from_secs(5);

#[derive(Default)]
struct WatchState {
    armed: Option<Instant>,
    /// When the watchdog thread will next look at `armed` on its own (`None`:
    /// only when notified). Arming a deadline at or after it needs no wake-up,
    /// so an operation does not wake the thread: on a loaded machine each
    /// needless wake-up competed with the waiting thread for a core and cost
    /// a scheduler tick (about 4 ms) on many operations.
    wakes_at: Option<Instant>,
    stop: bool,
    /// Set by [`GlooInterrupt::interrupt`]: every wait, in progress or to
    /// come, is interrupted at once, as if its deadline had passed.
    interrupted: bool,
}

/// Interrupts waits at their deadline with `abortWait*`, so that this rank's
/// timeout does not close its connections (a Gloo timeout closes every pair,
/// and peers would then see this rank as lost instead of timing out on the
/// rank that is really missing).
pub(super) struct Watchdog {
    shared: Arc<(Mutex<WatchState>, Condvar)>,
    /// The buffer whose wait is armed (set for the span of the wait).
    interrupter: Arc<Interrupter>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog").finish_non_exhaustive()
    }
}

impl Watchdog {
    pub(super) fn start(rank: u32) -> Watchdog {
        let shared: Arc<(Mutex<WatchState>, Condvar)> = Arc::default();
        let interrupter: Arc<Interrupter> = Arc::default();
        let s = Arc::clone(&shared);
        let target = Arc::clone(&interrupter);
        let thread = std::thread::Builder::new()
            .name(format!("ccol-gloo-deadline-{rank}"))
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !st.stop {
                    match st.armed {
                        None => {
                            st.wakes_at = None;
                            st = cv.wait(st).unwrap_or_else(|e| e.into_inner());
                        }
                        Some(deadline) => {
                            let now = Instant::now();
                            if now >= deadline || st.interrupted {
                                // Armed (under this lock) only while the
                                // interrupter targets the waiting buffer.
                                target.interrupt();
                                st.armed = None;
                            } else {
                                // Disarming does not wake this thread: it sleeps
                                // on to this deadline, then looks again.
                                st.wakes_at = Some(deadline);
                                st = cv
                                    .wait_timeout(st, deadline - now)
                                    .unwrap_or_else(|e| e.into_inner())
                                    .0;
                            }
                        }
                    }
                }
            })
            .ok();
        Watchdog {
            shared,
            interrupter,
            thread,
        }
    }

    /// Waits for one receive on `buf`, interrupted at `deadline` (no
    /// connection closes); Gloo's own timeout is only a backstop.
    pub(super) fn wait_recv(&self, buf: &Buffer, deadline: Deadline) -> Result<i32, GlooError> {
        self.guard(buf, true, deadline, || {
            buf.wait_recv(deadline.instant() + BACKSTOP)
        })
    }

    /// A handle that interrupts this watchdog's waits from any thread.
    pub(super) fn interrupt_handle(&self) -> GlooInterrupt {
        GlooInterrupt {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Runs `wait` on `buf` with an interrupt armed for `deadline`. The
    /// interrupter targets `buf` before the deadline is armed and until after
    /// it is disarmed, so whenever the thread sees an armed deadline, the
    /// target is this wait's buffer.
    fn guard<R>(
        &self,
        buf: &Buffer,
        recv: bool,
        deadline: Deadline,
        wait: impl FnOnce() -> R,
    ) -> R {
        self.interrupter.with_target(buf, recv, || {
            let (lock, cv) = &*self.shared;
            {
                let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                let at = deadline.instant();
                st.armed = Some(at);
                // The thread already looks at `armed` by `wakes_at`; it only needs
                // waking for an earlier deadline (or an interrupted transport's).
                if st.interrupted || st.wakes_at.is_none_or(|w| at < w) {
                    cv.notify_all();
                }
            }
            let r = wait();
            lock.lock().unwrap_or_else(|e| e.into_inner()).armed = None;
            r
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Interrupts a [`GlooTransport`](super::GlooTransport)'s waits from another
/// thread (a Ctrl-C watcher, say): see
/// [`GlooTransport::interrupter`](super::GlooTransport::interrupter). Cheap to clone; `Send`
/// and `Sync`.
#[derive(Clone)]
pub struct GlooInterrupt {
    shared: Arc<(Mutex<WatchState>, Condvar)>,
}

impl std::fmt::Debug for GlooInterrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlooInterrupt").finish_non_exhaustive()
    }
}

impl GlooInterrupt {
    /// Brings every deadline of the transport forward to now, for good: the
    /// operation waiting (if any) and every later one fail at once with
    /// [`Error::Timeout`](compiler_collectives_core::Error::Timeout) naming the ranks not heard from, its `waited`
    /// being the time actually waited. The transport is then of no further
    /// use; abort it ([`Transport::abort`](compiler_collectives_core::Transport::abort)) so that peers see this rank as
    /// aborted. Idempotent; never blocks on the operation in progress.
    pub fn interrupt(&self) {
        let (lock, cv) = &*self.shared;
        lock.lock().unwrap_or_else(|e| e.into_inner()).interrupted = true;
        cv.notify_all();
    }

    /// Whether [`interrupt`](GlooInterrupt::interrupt) was called.
    pub fn is_interrupted(&self) -> bool {
        self.shared
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .interrupted
    }
}
