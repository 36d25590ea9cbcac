//! The reaper: a thread that waits for sends to be taken by their receivers
//! and then frees their buffers, so that no operation blocks on a receiver.

use super::pool::Pool;
use crate::sys;
use compiler_collectives_core::{Deadline, ErrorKind, FirstFailure, Poison};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The first fatal error (its kind and message), shared with the reaper
/// thread.
pub(super) type Failure = Arc<Mutex<Option<Poison>>>;

/// Send buffers of one operation, each posted once to every receiver.
pub(super) struct Outgoing {
    pub(super) pool: Pool,
    pub(super) receivers: Vec<u32>,
    pub(super) deadline: Deadline,
}

/// Waits, on its own thread, for point-to-point sends to be taken by their
/// receivers, then frees their buffers; `send` itself never blocks on the
/// receiver (a ring of sends followed by receives must not deadlock).
#[derive(Debug)]
pub(super) struct Reaper {
    tx: Option<mpsc::Sender<Outgoing>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Reaper {
    pub(super) fn start(rank: u32, failed: Failure) -> Reaper {
        let (tx, rx) = mpsc::channel::<Outgoing>();
        let handle = std::thread::Builder::new()
            .name(format!("ccol-gloo-sends-{rank}"))
            .spawn(move || {
                for out in rx {
                    let mut ok = true;
                    'wait: for b in out.pool.buffers() {
                        for _ in &out.receivers {
                            if let Err(e) = b.wait_send(out.deadline.instant()) {
                                // A broken pair is found, and its rank named,
                                // by the next operation (the inbox watches
                                // every pair); only a send that was never
                                // taken by its deadline fails the transport here.
                                let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                                if f.is_none() && e.status() == Some(sys::TIMEOUT) {
                                    *f = Some(Poison::new(
                                        FirstFailure::Error(ErrorKind::Timeout),
                                        format!(
                                            "a message to {} {:?} was not taken by its deadline: {e}",
                                            if out.receivers.len() == 1 { "rank" } else { "ranks" },
                                            out.receivers
                                        ),
                                    ));
                                }
                                ok = false;
                                break 'wait;
                            }
                        }
                    }
                    if ok {
                        out.pool.release();
                    }
                }
            })
            .ok();
        Reaper {
            tx: handle.as_ref().map(|_| tx),
            handle,
        }
    }

    /// Queues `out` for the thread; `false` once the reaper stopped (the
    /// transport left).
    pub(super) fn hand(&self, out: Outgoing) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(out).is_ok())
    }

    /// Stops accepting sends and waits up to `limit` for the thread to finish
    /// the sends already queued; a thread still blocked after that is left
    /// to end at its send's deadline or when the connections close (its
    /// buffers keep Gloo's context alive).
    pub(super) fn stop(&mut self, limit: Duration) {
        self.tx = None;
        if let Some(h) = self.handle.take() {
            let until = Instant::now() + limit;
            while !h.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(2));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}
