//! A send's deadline is honoured: two ranks (threads of this process, each
//! with its own TCPStore client and ProcessGroupGloo) where rank 0 sends to
//! rank 1, which never receives. Rank 0's next call after the send's
//! deadline fails with a timeout naming rank 1, by the deadline plus the
//! post-mortem's wait for a late check-in plus [`SLACK`], and every call
//! after that finds the transport unusable.

use compiler_collectives_core::transport::toolkit::LATE_CHECK_IN;
use compiler_collectives_core::{Deadline, Error, ErrorKind, FirstFailure, Transport};
use compiler_collectives_tch::{C10dProcessGroup, C10dStore, C10dTransport, TcpStoreOptions};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const WORLD: u32 = 2;
/// The send's deadline.
const DEADLINE: Duration = Duration::from_secs(1);
/// When rank 0 makes its next call, after the send.
const NEXT_CALL: Duration = Duration::from_millis(1100);
/// The deadline of that next call (a barrier rank 1 never enters): what it
/// would wait if the send's deadline were ignored.
const BARRIER: Duration = Duration::from_secs(30);
/// Allowance for store round trips and a loaded machine on top of the
/// post-mortem's own wait (measured: 16 ms over it).
const SLACK: Duration = Duration::from_secs(2);
/// The whole test's limit: rank threads that hang fail it here.
const LIMIT: Duration = Duration::from_secs(90);

fn transport(port: u16, rank: u32) -> C10dTransport {
    let t = Duration::from_secs(30);
    let store = C10dStore::tcp(&TcpStoreOptions::client("127.0.0.1", port, WORLD).with_timeout(t))
        .expect("TCPStore client");
    let scoped = store.prefixed("send-deadline").expect("prefix");
    let pg =
        C10dProcessGroup::gloo(&scoped, rank, WORLD, "127.0.0.1", t).expect("ProcessGroupGloo");
    C10dTransport::new(pg, scoped)
}

/// What rank 0 saw: how long the send took, and the next call's error and
/// when it came (both from just before the send).
struct Seen {
    send_took: Duration,
    failed_after: Duration,
    error: Error,
    after: Error,
}

fn rank0(port: u16) -> Seen {
    let t = transport(port, 0);
    let start = Instant::now();
    t.send(1, 7, b"never taken", Deadline::after(DEADLINE))
        .expect("the send is put in flight");
    let send_took = start.elapsed();
    std::thread::sleep(NEXT_CALL.saturating_sub(start.elapsed()));
    let error = t
        .barrier(Deadline::after(BARRIER))
        .expect_err("the send missed its deadline");
    let failed_after = start.elapsed();
    let after = t
        .all_gather_fixed(b"x", Deadline::after(BARRIER))
        .expect_err("the transport is unusable");
    Seen {
        send_took,
        failed_after,
        error,
        after,
    }
}

#[test]
fn a_send_not_taken_by_its_deadline_fails_the_next_call() {
    let server = C10dStore::tcp(
        &TcpStoreOptions::server("127.0.0.1", 0, WORLD).with_timeout(Duration::from_secs(30)),
    )
    .expect("TCPStore server");
    let port = server.port().expect("its port");
    let (seen_tx, seen_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let _ = seen_tx.send(rank0(port));
    });
    // Rank 1 joins the group and never receives; it stays (neither shuts
    // down nor drops its transport) until rank 0 is done, so that rank 0's
    // post-mortem finds it alive and silent.
    std::thread::spawn(move || {
        let t = transport(port, 1);
        let _ = done_rx.recv_timeout(LIMIT);
        drop(t);
    });
    let seen = seen_rx.recv_timeout(LIMIT).expect("rank 0 ends");
    drop(done_tx);
    eprintln!(
        "send took {:?}; the next call, made at {NEXT_CALL:?}, failed at {:?}: {}",
        seen.send_took, seen.failed_after, seen.error
    );
    assert!(
        seen.send_took < DEADLINE,
        "send waited {:?}",
        seen.send_took
    );
    let Error::Timeout {
        missing_ranks,
        left,
        waited,
        ..
    } = &seen.error
    else {
        panic!("not a timeout: {:?}", seen.error);
    };
    assert_eq!(missing_ranks, &[1], "{}", seen.error);
    assert!(left.is_empty(), "{}", seen.error);
    assert!(*waited >= DEADLINE, "waited {waited:?}");
    let bound = NEXT_CALL + LATE_CHECK_IN + SLACK;
    assert!(
        seen.failed_after <= bound,
        "failed {:?} after the send, over {bound:?}",
        seen.failed_after
    );
    assert!(
        matches!(
            &seen.after,
            Error::ChannelUnusable {
                first: FirstFailure::Error(ErrorKind::Timeout),
                ..
            }
        ),
        "{:?}",
        seen.after
    );
    drop(server);
}
