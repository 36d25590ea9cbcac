//! The store post-mortem (`toolkit::PostMortem`): a failed rank names every
//! rank not in the operation, grouped by how each went missing, the same set
//! whatever the order in which they went (docs/failures.md).

use compiler_collectives_core::transport::toolkit::{Absent, PostMortem};
use compiler_collectives_core::{Error, InProcessStore, PeerLoss, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rank(store: &Arc<InProcessStore>, rank: u32, world: u32) -> PostMortem {
    PostMortem::new(Arc::clone(store) as Arc<dyn Store>, "g", rank, world)
}

/// Ranks `failed` fail at operation `op` together and each accounts for the
/// others for up to `window`; returns each one's result.
fn fail_together(
    store: &Arc<InProcessStore>,
    world: u32,
    failed: &[u32],
    op: u64,
    window: Duration,
) -> Vec<Absent> {
    let handles: Vec<_> = failed
        .iter()
        .map(|&r| {
            let pm = rank(store, r, world);
            std::thread::spawn(move || pm.account(op, Instant::now() + window, None))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn names_the_rank_that_never_arrived_as_silent() {
    let store = Arc::new(InProcessStore::new());
    for absent in fail_together(&store, 3, &[0, 1], 7, Duration::from_millis(300)) {
        assert_eq!(absent.silent, vec![2]);
        assert!(absent.left.is_empty());
    }
}

#[test]
fn stops_as_soon_as_every_rank_is_accounted_for() {
    let store = Arc::new(InProcessStore::new());
    rank(&store, 1, 4).leave(PeerLoss::Shutdown, 6);
    rank(&store, 3, 4).leave(PeerLoss::Aborted, 2);
    let start = Instant::now();
    let results = fail_together(&store, 4, &[0, 2], 7, Duration::from_secs(20));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    for absent in results {
        assert!(absent.silent.is_empty(), "{absent:?}");
        assert_eq!(
            absent.left,
            vec![(1, PeerLoss::Shutdown), (3, PeerLoss::Aborted)]
        );
    }
}

#[test]
fn a_rank_that_leaves_late_is_still_named() {
    // Rank 2 fails first; rank 1 leaves 200 ms later, rank 3 400 ms later:
    // the report names both, not only the first to go.
    let store = Arc::new(InProcessStore::new());
    let late = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            rank(&store, 1, 4).leave(PeerLoss::Shutdown, 3);
            std::thread::sleep(Duration::from_millis(200));
            rank(&store, 3, 4).leave(PeerLoss::Shutdown, 3);
        })
    };
    rank(&store, 0, 4).leave(PeerLoss::Shutdown, 3);
    let absent = rank(&store, 2, 4).account(4, Instant::now() + Duration::from_secs(10), None);
    late.join().unwrap();
    assert_eq!(
        absent.left,
        vec![
            (0, PeerLoss::Shutdown),
            (1, PeerLoss::Shutdown),
            (3, PeerLoss::Shutdown)
        ]
    );
    let err = absent
        .into_error(false, Duration::from_secs(1), "")
        .unwrap();
    assert!(
        matches!(&err, Error::PeerLost { ranks, reason: PeerLoss::Shutdown, .. } if ranks == &[0, 1, 3]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "lost ranks [0,1,3]: shut their channels down (they have no more exchanges)"
    );
}

#[test]
fn a_rank_held_up_by_another_counts_as_present() {
    // Rank 1 is stuck at operation 8 (rank 0 at 7): both in, only 2 named.
    let store = Arc::new(InProcessStore::new());
    rank(&store, 1, 3).check_in(8);
    let absent = rank(&store, 0, 3).account(7, Instant::now() + Duration::from_millis(300), None);
    assert_eq!(absent.silent, vec![2]);
}

#[test]
fn left_before_counts_only_ranks_that_did_not_complete_the_operation() {
    let store = Arc::new(InProcessStore::new());
    let me = rank(&store, 0, 4);
    assert!(me.left_before(5, &[1, 2, 3]).is_empty());
    rank(&store, 1, 4).leave(PeerLoss::Aborted, 5);
    rank(&store, 3, 4).leave(PeerLoss::Shutdown, 2);
    // Rank 1 completed operation 5 before it left: not the cause there.
    assert_eq!(me.left_before(5, &[1, 2, 3]), vec![(3, PeerLoss::Shutdown)]);
    assert_eq!(
        me.left_before(6, &[1, 2, 3]),
        vec![(1, PeerLoss::Aborted), (3, PeerLoss::Shutdown)]
    );
    // During the set-up any departure counts.
    assert_eq!(me.left_before(0, &[1]), vec![(1, PeerLoss::Aborted)]);
    assert_eq!(me.others(), vec![1, 2, 3]);
}

#[test]
fn after_a_dropped_connection_one_quiet_rank_is_named_dead() {
    let store = Arc::new(InProcessStore::new());
    rank(&store, 1, 3).check_in(4);
    let start = Instant::now();
    let absent = rank(&store, 0, 3).account(
        4,
        Instant::now() + Duration::from_secs(20),
        Some(Duration::from_millis(250)),
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let err = absent
        .into_error(true, start.elapsed(), "Connection reset by peer")
        .unwrap();
    assert!(
        matches!(&err, Error::PeerLost { ranks, reason: PeerLoss::Disconnected, detail, .. }
            if ranks == &[2] && detail == "Connection reset by peer"),
        "{err:?}"
    );
}

#[test]
fn silent_and_departed_ranks_are_grouped_in_a_timeout() {
    let absent = Absent {
        silent: vec![3],
        left: vec![(1, PeerLoss::Shutdown), (2, PeerLoss::Disconnected)],
    };
    let err = absent
        .into_error(false, Duration::from_millis(1500), "")
        .unwrap();
    assert_eq!(err.missing_ranks(), &[1, 2, 3]);
    assert_eq!(
        err.departures(),
        &[(1, PeerLoss::Shutdown), (2, PeerLoss::Disconnected)]
    );
    assert_eq!(
        err.to_string(),
        "timed out after 1500 ms waiting for ranks [1,2,3] (of them rank [1] shut its channel \
         down (it has no more exchanges); rank [2] disconnected)"
    );
    assert!(Absent::default()
        .into_error(false, Duration::ZERO, "")
        .is_none());
}

#[test]
fn mixed_departures_are_grouped_in_a_lost_peer() {
    let err = Error::peer_lost(
        vec![
            (3, PeerLoss::Disconnected),
            (0, PeerLoss::Shutdown),
            (2, PeerLoss::Shutdown),
        ],
        "",
    );
    assert!(
        matches!(&err, Error::PeerLost { ranks, reason: PeerLoss::Shutdown, .. } if ranks == &[0, 2, 3])
    );
    assert_eq!(
        err.to_string(),
        "lost ranks [0,2,3]: ranks [0,2] shut their channels down (they have no more exchanges); \
         rank [3] disconnected"
    );
}

#[test]
fn while_ranks_leave_a_quiet_rank_is_waited_for_not_named_dead() {
    // A dropped connection (quiet window 250 ms); rank 1 has left, rank 3
    // leaves 600 ms later: both are named as shut down, rank 3 not as dead.
    let store = Arc::new(InProcessStore::new());
    rank(&store, 1, 4).leave(PeerLoss::Shutdown, 3);
    rank(&store, 2, 4).check_in(4);
    let late = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            rank(&store, 3, 4).leave(PeerLoss::Shutdown, 3);
        })
    };
    let absent = rank(&store, 0, 4).account(
        4,
        Instant::now() + Duration::from_secs(10),
        Some(Duration::from_millis(250)),
    );
    late.join().unwrap();
    assert!(absent.silent.is_empty(), "{absent:?}");
    assert_eq!(
        absent.left,
        vec![(1, PeerLoss::Shutdown), (3, PeerLoss::Shutdown)]
    );
}

#[test]
fn policy_text_only_in_an_exchange_and_the_poisoned_channel_keeps_the_first_kind() {
    use compiler_collectives_core::ExchangeInfo;
    let bare = Error::timeout(vec![], vec![], Duration::from_millis(1500));
    assert_eq!(
        bare.to_string(),
        "timed out after 1500 ms waiting for peers (the engine cannot tell which)"
    );
    let in_exchange =
        Error::timeout(vec![2], vec![], Duration::from_millis(1500)).during(ExchangeInfo {
            seq: 4,
            key: "step".into(),
            last_completed: Some(3),
        });
    assert_eq!(
        in_exchange.to_string(),
        "timed out after 1500 ms waiting for rank [2] in exchange #4 'step' (last exchange \
         completed with every rank: #3); the channel is unusable: abort it"
    );
    let poisoned = Error::unusable_after(&in_exchange);
    assert!(
        matches!(&poisoned, Error::ChannelUnusable { first, cause } if *first == "timeout" && cause == &in_exchange.to_string()),
        "{poisoned:?}"
    );
    assert!(poisoned
        .to_string()
        .starts_with("the channel is unusable after timeout (timed out"));
}

#[test]
fn an_error_prints_its_cause_once_even_through_a_source_chain() {
    use compiler_collectives_core::DecodeError;
    use std::error::Error as _;
    let e = Error::message_too_large(2, 10_000, 4096);
    assert!(
        e.source().is_none(),
        "the reason is in the message, not also a source"
    );
    let mut chain = e.to_string();
    let mut s = e.source();
    while let Some(c) = s {
        chain.push_str(&format!(": {c}"));
        s = c.source();
    }
    assert_eq!(
        chain.matches("over the limit of 4096 bytes").count(),
        1,
        "{chain}"
    );
    assert!(matches!(
        e,
        Error::Decode {
            reason: DecodeError::TooLarge { limit: 4096, .. },
            ..
        }
    ));
    let io = Error::backend("file-store", std::io::Error::other("disk full"));
    assert!(io.source().is_none());
    assert_eq!(io.to_string(), "file-store error: disk full");
    assert!(
        matches!(&io, Error::Backend { engine: Some(e), .. } if e.downcast_ref::<std::io::Error>().is_some())
    );
}

#[test]
fn an_operation_on_one_peer_names_only_that_peer() {
    let store = Arc::new(InProcessStore::new());
    rank(&store, 1, 4).leave(PeerLoss::Shutdown, 3);
    // Ranks 2 and 3 are silent, but a receive from rank 1 waited on it alone.
    let start = Instant::now();
    let absent =
        rank(&store, 0, 4).account_among(4, &[1], Instant::now() + Duration::from_secs(20), None);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(absent.left, vec![(1, PeerLoss::Shutdown)]);
    assert!(absent.silent.is_empty(), "{absent:?}");
    // The peer silent: it alone is named, at the wait's end.
    let absent = rank(&store, 0, 4).account_among(
        4,
        &[2, 0],
        Instant::now() + Duration::from_millis(200),
        None,
    );
    assert_eq!(absent.silent, vec![2]);
    assert!(absent.left.is_empty());
}

#[test]
fn departure_records_round_trip_and_read_leniently() {
    use compiler_collectives_core::transport::toolkit::{departure_record, parse_departure};
    assert_eq!(departure_record(PeerLoss::Shutdown, 12), "shutdown 12");
    assert_eq!(departure_record(PeerLoss::Aborted, 0), "aborted 0");
    assert_eq!(departure_record(PeerLoss::Disconnected, 3), "aborted 3");
    assert_eq!(parse_departure(b"shutdown 12"), (PeerLoss::Shutdown, 12));
    assert_eq!(parse_departure(b"aborted 7"), (PeerLoss::Aborted, 7));
    assert_eq!(parse_departure(b"shutdown"), (PeerLoss::Shutdown, 0));
    assert_eq!(parse_departure(b"junk x"), (PeerLoss::Aborted, 0));
    assert_eq!(parse_departure(&[0xff, b' ', b'9']), (PeerLoss::Aborted, 9));
}
