//! The store side of a group: naming absent and departed ranks, which NCCL
//! itself cannot do (crate docs, "Deadlines").
//!
//! Keys, under the group's prefix: `timed-out/<rank>` (this rank was
//! blocked in NCCL until its deadline; value: the operation number) and
//! `left/<rank>` (`shutdown <done>` or `aborted <done>`: how it left and
//! how many operations it had completed).

use compiler_collectives_core::{Deadline, Error, PeerLoss, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One rank's view of its group's keys in the store.
#[derive(Debug)]
pub(crate) struct GroupStore {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) prefix: String,
    pub(crate) rank: u32,
    pub(crate) world: u32,
    /// How long after its own mark a timed-out rank waits for the others'.
    pub(crate) post_mortem: Duration,
}

impl GroupStore {
    pub(crate) fn key(&self, what: &str) -> String {
        format!("{}/{what}", self.prefix)
    }

    /// Peers that left the group (their `left/<rank>` key) without having
    /// completed operation `op` (1-based; 0 = the bootstrap), and how the
    /// first of them left. A key holds `shutdown <done>` or `aborted <done>`.
    pub(crate) fn left_before(&self, op: u64, ranks: &[u32]) -> Option<(Vec<u32>, PeerLoss)> {
        let mut lost = Vec::new();
        let mut how = None;
        for &r in ranks {
            let key = self.key(&format!("left/{r}"));
            let Ok(v) = self
                .store
                .get(&key, Deadline::after(Duration::from_millis(1)))
            else {
                continue;
            };
            let text = String::from_utf8_lossy(&v);
            let (what, done) = text.split_once(' ').unwrap_or((&text, "0"));
            let done: u64 = done.trim().parse().unwrap_or(0);
            if op == 0 || done < op {
                lost.push(r);
                how.get_or_insert(if what == "shutdown" {
                    PeerLoss::Shutdown
                } else {
                    PeerLoss::Aborted
                });
            }
        }
        how.map(|h| (lost, h))
    }

    pub(crate) fn others(&self) -> Vec<u32> {
        (0..self.world).filter(|r| *r != self.rank).collect()
    }

    /// Tells the other ranks' post-mortems that this rank was blocked in
    /// NCCL until its deadline (it did arrive).
    pub(crate) fn mark_timed_out(&self, op: u64) {
        let key = self.key(&format!("timed-out/{}", self.rank));
        let value = op.to_string();
        if let Err(e) = self
            .store
            .set(&key, value.as_bytes(), Deadline::after(self.post_mortem))
        {
            tracing::debug!(error = %e, "post-mortem: cannot mark this rank");
        }
    }

    /// After a timeout at operation `op` (this rank's mark set at
    /// `marked`): waits up to the post-mortem window for the other ranks'
    /// marks and names those without one — as lost when they left the
    /// group, else as missing. A rank counts as present when it was blocked
    /// in any NCCL operation until its own deadline: NCCL cannot tell which
    /// operation a peer is in, and a peer held up by a third rank is not
    /// the one to blame.
    pub(crate) fn post_mortem(&self, op: u64, marked: Instant, start: Instant) -> Error {
        let window = Deadline::at(marked + self.post_mortem);
        let absent: Vec<u32> = self
            .others()
            .into_iter()
            .filter(|r| {
                let key = self.key(&format!("timed-out/{r}"));
                self.store.wait(&[key.as_str()], window).is_err()
            })
            .collect();
        if let Some((ranks, reason)) = self.left_before(op, &absent) {
            return Error::PeerLost {
                ranks,
                reason,
                detail: format!("it left before NCCL operation #{op}"),
                during: None,
            };
        }
        Error::Timeout {
            missing_ranks: absent,
            waited: start.elapsed(),
            during: None,
        }
    }

    /// Records in the store that this rank left after `done` operations.
    pub(crate) fn leave(&self, how: &str, done: u64) {
        let value = format!("{how} {done}");
        if let Err(e) = self.store.set(
            &self.key(&format!("left/{}", self.rank)),
            value.as_bytes(),
            Deadline::after(Duration::from_secs(5)),
        ) {
            tracing::debug!(error = %e, "cannot record leaving in the store");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compiler_collectives_core::InProcessStore;

    fn group(store: &Arc<InProcessStore>, rank: u32, world: u32) -> GroupStore {
        GroupStore {
            store: Arc::clone(store) as Arc<dyn Store>,
            prefix: "g".into(),
            rank,
            world,
            post_mortem: Duration::from_millis(300),
        }
    }

    /// Ranks `blocked` time out at operation `op` together; returns each one's error.
    fn time_out_together(
        store: &Arc<InProcessStore>,
        world: u32,
        blocked: &[u32],
        op: u64,
    ) -> Vec<Error> {
        let handles: Vec<_> = blocked
            .iter()
            .map(|&r| {
                let g = group(store, r, world);
                std::thread::spawn(move || {
                    let start = Instant::now();
                    g.mark_timed_out(op);
                    let err = g.post_mortem(op, Instant::now(), start);
                    assert!(
                        start.elapsed() < Duration::from_millis(900),
                        "{:?}",
                        start.elapsed()
                    );
                    err
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn post_mortem_names_the_rank_that_never_blocked() {
        let store = Arc::new(InProcessStore::new());
        for err in time_out_together(&store, 3, &[0, 1], 7) {
            assert!(
                matches!(&err, Error::Timeout { missing_ranks, .. } if missing_ranks == &[2]),
                "{err:?}"
            );
        }
    }

    #[test]
    fn post_mortem_reports_a_departed_rank_as_lost() {
        let store = Arc::new(InProcessStore::new());
        group(&store, 2, 3).leave("shutdown", 6);
        for err in time_out_together(&store, 3, &[0, 1], 7) {
            assert!(
                matches!(&err, Error::PeerLost { ranks, reason: PeerLoss::Shutdown, .. } if ranks == &[2]),
                "{err:?}"
            );
        }
    }

    #[test]
    fn a_rank_held_up_by_another_counts_as_present() {
        // Rank 1 is stuck at operation 8 (rank 0 at 7): both blocked, so only 2 is named.
        let store = Arc::new(InProcessStore::new());
        group(&store, 1, 3).mark_timed_out(8);
        for err in time_out_together(&store, 3, &[0], 7) {
            assert!(
                matches!(&err, Error::Timeout { missing_ranks, .. } if missing_ranks == &[2]),
                "{err:?}"
            );
        }
    }

    #[test]
    fn left_before_counts_only_ranks_that_did_not_complete_the_operation() {
        let store = Arc::new(InProcessStore::new());
        let me = group(&store, 0, 4);
        assert_eq!(me.left_before(5, &[1, 2, 3]), None);
        group(&store, 1, 4).leave("aborted", 5);
        group(&store, 3, 4).leave("shutdown", 2);
        // Rank 1 completed operation 5 before it left: not the cause there.
        assert_eq!(
            me.left_before(5, &[1, 2, 3]),
            Some((vec![3], PeerLoss::Shutdown))
        );
        assert_eq!(
            me.left_before(6, &[1, 2, 3]),
            Some((vec![1, 3], PeerLoss::Aborted))
        );
        // During the bootstrap any departure counts.
        assert_eq!(me.left_before(0, &[1]), Some((vec![1], PeerLoss::Aborted)));
        assert_eq!(me.others(), vec![1, 2, 3]);
    }
}
