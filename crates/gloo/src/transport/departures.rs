//! Departure records: a leaving rank writes how it left under
//! [`left_key`] in the store ([`GlooTransport::record_departure`]), and a
//! rank that finds a pair broken reads them ([`Records`]) before calling
//! the peer dead.

use super::framing::FLAG_SHUTDOWN;
use super::GlooTransport;
use crate::store::GlooStore;
use compiler_collectives_core::{transport::toolkit, Deadline, PeerLoss};
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The key under the group's prefix where `rank` records that it left, with
/// how and after how many collectives (`toolkit::departure_record`; the
/// store post-mortem's scheme). It outlives the rank's connections: a peer
/// that reaches the next collective after they closed reads it there.
pub(super) fn left_key(rank: u32) -> String {
    compiler_collectives_core::transport::toolkit::departure_key(rank)
}

impl GlooTransport {
    /// Records in the store that this rank left (`flag`: shutdown or abort)
    /// after `done` collectives, waiting at most [`toolkit::STORE_CALL_LIMIT`]:
    /// a store that does not answer (its host gone) must not hold a rank's
    /// exit. A Rust store is called on this thread with that deadline;
    /// Gloo's own stores (no deadline on `set`) on a thread that is waited
    /// for that long. A failure is logged, not returned: leaving goes on.
    pub(super) fn record_departure(&self, flag: u32, done: u64) {
        let how = if flag == FLAG_SHUTDOWN {
            PeerLoss::Shutdown
        } else {
            PeerLoss::Aborted
        };
        let value = toolkit::departure_record(how, done);
        let key = left_key(self.rank);
        let direct = {
            let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            store.takes_deadlines().then(|| store.clone())
        };
        if let Some(store) = direct {
            // On this thread: a store that calls into an interpreter must
            // not be left running on a thread of its own at exit.
            let deadline = Deadline::after(toolkit::STORE_CALL_LIMIT);
            if let Err(e) = store.set_within(&key, value.as_bytes(), deadline) {
                tracing::debug!(error = %e, "gloo: cannot record leaving");
            }
            return;
        }
        let store = Arc::clone(&self.store);
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("ccol-gloo-leave".into())
            .spawn(move || {
                let store = store.lock().unwrap_or_else(|e| e.into_inner());
                let _ = tx.send(store.set(&key, value.as_bytes()));
            });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "gloo: no thread to record leaving");
            return;
        }
        match rx.recv_timeout(toolkit::STORE_CALL_LIMIT) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "gloo: cannot record leaving"),
            Err(_) => tracing::debug!("gloo: the store did not take the departure in time"),
        }
    }
}

/// How long an accounting waits for the store to say whether ranks whose
/// pairs broke left a departure record. Short: a rank killed outright left
/// none, and its death is reported once this passes (Gloo's FileStore
/// takes a second to say a key is missing; a present key, a few
/// microseconds).
const RECORD_LOOKUP_LIMIT: Duration = Duration::from_millis(100);

/// Departure records read during one accounting, each rank's at most once.
#[derive(Default)]
pub(super) struct Records {
    /// `None`: no record (or none in time), or one from a later collective.
    read: HashMap<u32, Option<PeerLoss>>,
}

impl Records {
    pub(super) fn has(&self, peer: u32) -> bool {
        self.read.contains_key(&peer)
    }

    /// How `peer` left, if [`Records::fetch`] found its record.
    pub(super) fn departed(&self, peer: u32) -> Option<PeerLoss> {
        self.read.get(&peer).copied().flatten()
    }

    /// Reads the departure records of `peers` that left before collective
    /// `k` (they had completed at most `k`), waiting at most
    /// [`RECORD_LOOKUP_LIMIT`]. A Rust store is asked on this thread. Gloo's
    /// own stores are asked on a thread of its own, all keys at once first
    /// (the common case: every one of them left cleanly), then one by one;
    /// what has not come by the limit counts as no record, and the thread
    /// finishes on its own.
    pub(super) fn fetch(&mut self, store: &Arc<Mutex<GlooStore>>, peers: &[u32], k: u64) {
        if peers.is_empty() {
            return;
        }
        for &p in peers {
            self.read.insert(p, None);
        }
        let direct = {
            let store = store.lock().unwrap_or_else(|e| e.into_inner());
            store.takes_deadlines().then(|| store.clone())
        };
        let found = |value: Option<Vec<u8>>| {
            value
                .map(|v| toolkit::parse_departure(&v))
                .and_then(|(how, done)| (done <= k).then_some(how))
        };
        if let Some(store) = direct {
            // A Rust store answers a missing key at once: ask on this thread.
            let deadline = Deadline::after(RECORD_LOOKUP_LIMIT);
            for &p in peers {
                if deadline.expired() {
                    break;
                }
                let value = store.try_get_within(&left_key(p), deadline).ok().flatten();
                self.read.insert(p, found(value));
            }
            return;
        }
        let (tx, rx) = mpsc::channel();
        let (store, peers) = (Arc::clone(store), peers.to_vec());
        let spawned = std::thread::Builder::new()
            .name("ccol-gloo-records".into())
            .spawn(move || {
                let store = store.lock().unwrap_or_else(|e| e.into_inner());
                let keys: Vec<String> = peers.iter().map(|&p| left_key(p)).collect();
                let all: Vec<&str> = keys.iter().map(String::as_str).collect();
                let quick = Duration::from_millis(1);
                let every = store.wait(&all, quick).is_ok();
                for (&p, key) in peers.iter().zip(&keys) {
                    let limit = Deadline::after(RECORD_LOOKUP_LIMIT);
                    let value = if every {
                        store.get(key, RECORD_LOOKUP_LIMIT).ok()
                    } else {
                        store.try_get_within(key, limit).ok().flatten()
                    };
                    if tx.send((p, value)).is_err() {
                        return;
                    }
                }
            });
        if spawned.is_err() {
            return;
        }
        let until = Instant::now() + RECORD_LOOKUP_LIMIT;
        while let Ok((p, value)) = rx.recv_timeout(until.saturating_duration_since(Instant::now()))
        {
            self.read.insert(p, found(value));
        }
    }
}
