//! Our client against our server, and against hostile or silent peers.

use compiler_collectives_core::{Deadline, Error, Store};
use compiler_collectives_tcpstore::wire::{Limits, Request, MAX_VALUE_BYTES, VALIDATION_MAGIC};
use compiler_collectives_tcpstore::{
    ServerOptions, TcpStoreClient, TcpStoreError, TcpStoreServer, RECONNECT_LIMIT,
};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn secs(n: u64) -> Deadline {
    Deadline::after(Duration::from_secs(n))
}

fn server() -> TcpStoreServer {
    TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).expect("bind")
}

fn client(server: &TcpStoreServer) -> TcpStoreClient {
    TcpStoreClient::connect("127.0.0.1", server.port(), secs(10)).expect("connect")
}

fn engine(e: &Error) -> Option<&TcpStoreError> {
    match e {
        Error::Backend {
            engine: Some(engine),
            ..
        } => engine.downcast_ref::<TcpStoreError>(),
        _ => None,
    }
}

#[test]
fn every_query_our_store_needs_round_trips() {
    let s = server();
    let (a, b) = (client(&s), client(&s));
    let d = secs(10);
    let binary: Vec<u8> = (0..=255u8).collect();
    a.set("bin", &binary, d).unwrap();
    a.set("empty", b"", d).unwrap();
    assert_eq!(b.get("bin", d).unwrap(), binary);
    assert_eq!(b.get("empty", d).unwrap(), b"");
    assert_eq!(a.add("n", 5, d).unwrap(), 5);
    assert_eq!(b.add("n", -7, d).unwrap(), -2);
    assert_eq!(
        a.get("n", d).unwrap(),
        b"-2",
        "counters are decimal text, as torch's"
    );
    assert!(b.check(&["bin", "n"], d).unwrap());
    assert!(!b.check(&["bin", "nope"], d).unwrap());
    assert_eq!(b.try_get("nope", d).unwrap(), None);
    assert_eq!(b.try_get("bin", d).unwrap(), Some(binary.clone()));
    assert_eq!(
        a.multi_get(&["empty", "bin"], d).unwrap(),
        vec![Vec::new(), binary]
    );
    assert_eq!(a.num_keys(d).unwrap(), 3);
    assert!(a.delete("n", d).unwrap());
    assert!(!a.delete("n", d).unwrap());
    assert!(!b.check(&["n"], d).unwrap());
    // compare_set: torch's three cases.
    assert_eq!(a.compare_set("cas", b"", b"one", d).unwrap(), b"one");
    assert_eq!(a.compare_set("cas", b"two", b"three", d).unwrap(), b"one");
    assert_eq!(a.compare_set("cas", b"one", b"two", d).unwrap(), b"two");
    assert_eq!(a.compare_set("unset", b"x", b"y", d).unwrap(), b"x");
    assert!(!a.check(&["unset"], d).unwrap());
    a.ping(d).unwrap();
    // The server holds the keys with torch's "/" prefix.
    assert_eq!(s.num_keys(), 3);
}

#[test]
fn a_wait_ends_when_another_client_sets_the_key() {
    let s = server();
    let (a, b) = (client(&s), client(&s));
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        b.set("late", b"v", secs(10)).unwrap();
    });
    let start = Instant::now();
    assert_eq!(a.get("late", secs(10)).unwrap(), b"v");
    assert!(start.elapsed() >= Duration::from_millis(150));
    t.join().unwrap();
}

#[test]
fn a_wait_that_times_out_is_cancelled_and_the_client_goes_on() {
    let s = server();
    let (a, b) = (client(&s), client(&s));
    let start = Instant::now();
    let err = a
        .wait(&["never"], Deadline::after(Duration::from_millis(300)))
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(
        err.missing_ranks().is_empty(),
        "a store timeout names no rank"
    );
    assert!(took < Duration::from_millis(300 + 500), "{took:?}");
    // The next call cancels the wait first; setting the key later wakes no
    // one, and the connection is still in step.
    b.set("never", b"now", secs(5)).unwrap();
    assert_eq!(a.get("never", secs(5)).unwrap(), b"now");
    assert_eq!(a.add("c", 1, secs(5)).unwrap(), 1);
    a.ping(secs(5)).unwrap();
}

#[test]
fn a_server_that_dies_mid_wait_is_an_error_by_the_deadline() {
    let s = server();
    let a = client(&s);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(s);
    });
    let start = Instant::now();
    let deadline = Duration::from_secs(5);
    let err = a.get("never", Deadline::after(deadline)).unwrap_err();
    let took = start.elapsed();
    killer.join().unwrap();
    // The break is reported after one reconnect window, not at the deadline.
    assert!(
        took < Duration::from_millis(300) + RECONNECT_LIMIT + Duration::from_secs(1),
        "{took:?}: {err}"
    );
    assert!(
        matches!(
            engine(&err),
            Some(TcpStoreError::Lost { query: "WAIT", .. })
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("the server closed the connection"), "{text}");
    assert!(text.contains("reconnecting failed"), "{text}");
}

#[test]
fn an_unreachable_server_names_host_port_and_how_long_it_tried() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = Instant::now();
    let err = TcpStoreClient::connect(
        "127.0.0.1",
        port,
        Deadline::after(Duration::from_millis(400)),
    )
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(400 + 600));
    let text = err.to_string();
    assert!(
        matches!(engine(&err), Some(TcpStoreError::Unreachable { attempts, .. }) if *attempts >= 2),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("tried for"), "{text}");
}

#[test]
fn a_peer_that_is_not_a_tcpstore_is_named_as_such() {
    // One that hangs up, one that answers the ping wrongly, one that says nothing.
    for behaviour in ["close", "wrong", "silent"] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 10];
            let _ = s.read_exact(&mut hello);
            match behaviour {
                "close" => drop(s),
                "wrong" => {
                    let _ = s.write_all(b"HTTP");
                    std::thread::sleep(Duration::from_millis(500));
                }
                _ => std::thread::sleep(Duration::from_millis(1500)),
            }
        });
        let err =
            TcpStoreClient::connect("127.0.0.1", port, Deadline::after(Duration::from_secs(1)))
                .unwrap_err();
        assert!(
            matches!(engine(&err), Some(TcpStoreError::NotATcpStore { .. })),
            "{behaviour}: {err}"
        );
        assert!(err.to_string().contains("is not a TCPStore"), "{err}");
        t.join().unwrap();
    }
}

/// A server that answers the handshake, then sends `reply` to the first
/// query after it.
fn hostile(reply: Vec<u8>) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let limits = Limits::default();
        assert_eq!(
            Request::read(&mut s, &limits).unwrap(),
            Request::Validate {
                magic: VALIDATION_MAGIC
            }
        );
        let Request::Ping { nonce } = Request::read(&mut s, &limits).unwrap() else {
            panic!("no ping")
        };
        s.write_all(&nonce.to_le_bytes()).unwrap();
        let _ = Request::read(&mut s, &limits);
        let _ = s.write_all(&reply);
        std::thread::sleep(Duration::from_millis(300));
    });
    (port, t)
}

#[test]
fn a_hostile_length_is_an_error_not_an_allocation() {
    let (port, t) = hostile((1u64 << 60).to_le_bytes().to_vec());
    let c = TcpStoreClient::connect("127.0.0.1", port, secs(5)).unwrap();
    let err = c.compare_set("k", b"", b"v", secs(5)).unwrap_err();
    assert!(err.to_string().contains("over the limit"), "{err}");
    t.join().unwrap();
}

#[test]
fn a_late_stop_waiting_before_the_cancel_reply_is_read() {
    // The server answers CANCEL_WAIT with STOP_WAITING then WAIT_CANCELED,
    // as torch's does when the key arrived as the wait timed out.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let limits = Limits::default();
        let _ = Request::read(&mut s, &limits).unwrap();
        let Request::Ping { nonce } = Request::read(&mut s, &limits).unwrap() else {
            panic!("no ping")
        };
        s.write_all(&nonce.to_le_bytes()).unwrap();
        assert!(matches!(
            Request::read(&mut s, &limits).unwrap(),
            Request::Wait { .. }
        ));
        assert_eq!(Request::read(&mut s, &limits).unwrap(), Request::CancelWait);
        s.write_all(&[0, 1]).unwrap();
        let Request::Ping { nonce } = Request::read(&mut s, &limits).unwrap() else {
            panic!("no ping after the cancel")
        };
        s.write_all(&nonce.to_le_bytes()).unwrap();
    });
    let c = TcpStoreClient::connect("127.0.0.1", port, secs(5)).unwrap();
    let err = c
        .wait(&["k"], Deadline::after(Duration::from_millis(200)))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    c.ping(secs(5)).unwrap();
    t.join().unwrap();
}

#[test]
fn a_value_over_the_libuv_limit_is_refused_before_it_is_sent() {
    let s = server();
    let a = client(&s);
    let err = a
        .set("big", &vec![7u8; MAX_VALUE_BYTES + 1], secs(5))
        .unwrap_err();
    assert!(
        matches!(engine(&err), Some(TcpStoreError::ValueTooLarge { max, .. }) if *max == MAX_VALUE_BYTES),
        "{err}"
    );
    assert!(err.to_string().contains("8388608"), "{err}");
    a.set("big", &vec![7u8; MAX_VALUE_BYTES], secs(5)).unwrap();
    assert_eq!(a.get("big", secs(5)).unwrap().len(), MAX_VALUE_BYTES);
}

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn closed(mut s: TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn the_server_closes_a_connection_that_breaks_the_rules_and_serves_the_rest() {
    let s = server();
    let good = client(&s);
    // No VALIDATE first: closed, nothing stored.
    let mut c = raw(s.port());
    c.write_all(
        &Request::Set {
            key: b"/x".to_vec(),
            value: b"y".to_vec(),
        }
        .encode(),
    )
    .unwrap();
    assert!(closed(c));
    // A key over 8 KiB.
    let mut c = raw(s.port());
    let mut bytes = Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode();
    bytes.extend(
        Request::Get {
            key: vec![b'k'; 8 * 1024 + 1],
        }
        .encode(),
    );
    c.write_all(&bytes).unwrap();
    assert!(closed(c));
    // An unknown command byte.
    let mut c = raw(s.port());
    let mut bytes = Request::Validate {
        magic: VALIDATION_MAGIC,
    }
    .encode();
    bytes.push(200);
    c.write_all(&bytes).unwrap();
    assert!(closed(c));
    assert!(!good.check(&["x"], secs(5)).unwrap());
    good.set("x", b"1", secs(5)).unwrap();
    assert_eq!(good.get("x", secs(5)).unwrap(), b"1");
}

#[test]
fn the_server_bounds_what_it_stores() {
    let s = TcpStoreServer::bind(
        "127.0.0.1:0",
        ServerOptions::default().with_max_stored_bytes(1000),
    )
    .unwrap();
    let a = client(&s);
    a.set("small", &[1u8; 500], secs(5)).unwrap();
    // The refusal closes the connection (as the libuv server does over its
    // limits); the client's SET notices through its PING, and the key is
    // not stored.
    let err = a.set("large", &[1u8; 600], secs(5)).unwrap_err();
    assert!(
        matches!(engine(&err), Some(TcpStoreError::Query { .. })),
        "{err}"
    );
    let b = client(&s);
    assert!(!b.check(&["large"], secs(5)).unwrap());
    assert!(b.check(&["small"], secs(5)).unwrap());
    // Replacing a value counts only the difference.
    b.set("small", &[2u8; 900], secs(5)).unwrap();
    assert_eq!(b.get("small", secs(5)).unwrap(), vec![2u8; 900]);
}

#[test]
fn a_broken_connection_is_reopened_once_for_a_query_that_can_repeat() {
    let s = server();
    let a = client(&s);
    a.set("k", b"v", secs(5)).unwrap();
    // Break the client's connection: restart the server on the same port.
    let port = s.port();
    drop(s);
    let s = TcpStoreServer::bind(("127.0.0.1", port), ServerOptions::default()).unwrap();
    // SET repeats over a new connection; ADD does not repeat and names the break.
    a.set("k", b"w", secs(5)).unwrap();
    assert_eq!(a.get("k", secs(5)).unwrap(), b"w");
    drop(s);
    let _s = TcpStoreServer::bind(("127.0.0.1", port), ServerOptions::default()).unwrap();
    let err = a.add("n", 1, secs(5)).unwrap_err();
    assert!(
        matches!(
            engine(&err),
            Some(TcpStoreError::Query { query: "ADD", .. })
        ),
        "{err}"
    );
    assert_eq!(
        a.add("n", 1, secs(5)).unwrap(),
        1,
        "the next call reconnects"
    );
}

/// A connection that never says it is a client is closed at the limit.
#[test]
fn a_silent_connection_is_closed_at_the_validate_limit() {
    let s = TcpStoreServer::bind(
        "127.0.0.1:0",
        ServerOptions::default().with_validate_limit(Duration::from_millis(200)),
    )
    .unwrap();
    let start = Instant::now();
    let c = raw(s.port());
    assert!(closed(c));
    assert!(start.elapsed() < Duration::from_secs(3));
    // A client that validates stays as long as it likes.
    let a = client(&s);
    std::thread::sleep(Duration::from_millis(400));
    a.ping(secs(5)).unwrap();
}
