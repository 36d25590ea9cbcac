//! Interop with real torch 2.13 (`CCOL_TORCH_PYTHON`, set by
//! `scripts/setup-torch.sh`): our client against torch's TCPStore server
//! (libuv and legacy), torch's client against our server, and a gloo
//! process group of two Python ranks whose store is our server.

use compiler_collectives_conformance::process::{OutputWithin, Ranks};
use compiler_collectives_conformance::skip::{skip_test, Missing};
use compiler_collectives_core::{Deadline, Error, Store};
use compiler_collectives_tcpstore::{ServerOptions, TcpStoreClient, TcpStoreServer};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn python(test: &str) -> Option<PathBuf> {
    let py = std::env::var_os("CCOL_TORCH_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if py.is_none() {
        skip_test(
            test,
            Missing::install(
                "CCOL_TORCH_PYTHON is not set (run `eval \"$(scripts/setup-torch.sh)\"`)",
            ),
        );
    }
    py
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}

fn secs(n: u64) -> Deadline {
    Deadline::after(Duration::from_secs(n))
}

/// Starts torch's server (`backend`: libuv or legacy) and returns it with
/// its port.
fn torch_server(py: &PathBuf, backend: &str, hold: bool) -> (Ranks, u16) {
    let mut cmd = Command::new(py);
    cmd.arg(script("torch_server.py")).arg(backend);
    if hold {
        cmd.arg("hold");
    }
    let ranks = Ranks::start(vec![cmd]).expect("python starts");
    let line = ranks
        .wait_line(0, Duration::from_secs(60), |l| l.starts_with("port "))
        .unwrap_or_else(|| panic!("torch's server did not start: {:?}", ranks.lines(0)));
    let port = line["port ".len()..].parse().expect("a port");
    (ranks, port)
}

#[test]
fn our_client_against_torchs_servers() {
    let Some(py) = python("our_client_against_torchs_servers") else {
        return;
    };
    for backend in ["libuv", "legacy"] {
        let (ranks, port) = torch_server(&py, backend, false);
        let c = TcpStoreClient::connect("127.0.0.1", port, secs(30)).expect("connect");
        let mut binary: Vec<u8> = (0..=255u8).collect();
        binary.push(0);
        c.set("from_rust", &binary, secs(30)).unwrap();
        assert_eq!(
            c.get("from_torch", secs(30)).unwrap(),
            b"\xff\x00torch",
            "{backend}"
        );
        // Torch added 10 before setting from_torch.
        assert_eq!(c.add("counter", 5, secs(10)).unwrap(), 15, "{backend}");
        assert!(c.check(&["from_rust", "counter"], secs(10)).unwrap());
        let start = Instant::now();
        let err = c
            .wait(&["never"], Deadline::after(Duration::from_millis(300)))
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{backend}: {err}");
        assert!(start.elapsed() < Duration::from_millis(1300));
        assert!(c.delete("counter", secs(10)).unwrap(), "{backend}");
        assert!(!c.check(&["counter"], secs(10)).unwrap(), "{backend}");
        assert_eq!(
            c.compare_set("cas", b"", b"one", secs(10)).unwrap(),
            b"one",
            "{backend}"
        );
        assert_eq!(
            c.multi_get(&["from_torch", "cas"], secs(10)).unwrap(),
            vec![b"\xff\x00torch".to_vec(), b"one".to_vec()]
        );
        // from_rust, from_torch, cas (counter deleted).
        assert_eq!(c.num_keys(secs(10)).unwrap(), 3, "{backend}");
        c.set("done", b"", secs(10)).unwrap();
        let finished = ranks.finish(Duration::from_secs(60));
        assert!(
            finished.ranks[0].ok_with("torch side ok"),
            "{backend}: {}",
            finished.describe()
        );
    }
}

#[test]
fn torchs_server_killed_mid_wait_is_an_error_by_the_deadline() {
    let Some(py) = python("torchs_server_killed_mid_wait_is_an_error_by_the_deadline") else {
        return;
    };
    let (mut ranks, port) = torch_server(&py, "libuv", true);
    let c = TcpStoreClient::connect("127.0.0.1", port, secs(30)).expect("connect");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        ranks.child_mut(0).kill().expect("kill");
        ranks
    });
    let deadline = Duration::from_secs(3);
    let start = Instant::now();
    let err = c.get("never", Deadline::after(deadline)).unwrap_err();
    let took = start.elapsed();
    let _ = killer.join().unwrap().finish(Duration::from_secs(5));
    eprintln!("server killed mid-wait: after {took:?}: {err}");
    assert!(took < deadline + Duration::from_secs(1), "{took:?}: {err}");
    assert!(
        err.to_string()
            .contains("broke during WAIT (the server closed the connection)"),
        "{err}"
    );
}

#[test]
fn torchs_client_against_our_server() {
    let Some(py) = python("torchs_client_against_our_server") else {
        return;
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let ours = TcpStoreClient::connect("127.0.0.1", server.port(), secs(10)).unwrap();
    ours.set("from_rust", b"\x00rust\xff", secs(10)).unwrap();
    let out = Command::new(&py)
        .arg(script("torch_client.py"))
        .arg(server.port().to_string())
        .output_within(Duration::from_secs(90))
        .expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said_ok = String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == "ok");
    assert!(out.status.success() && said_ok, "{text}");
    // What torch's client stored is what ours reads.
    assert_eq!(ours.get("ap", secs(10)).unwrap(), b"xy");
    assert_eq!(
        ours.get("bin", secs(10)).unwrap(),
        (0..=255u8).collect::<Vec<_>>()
    );
}

#[test]
fn a_gloo_process_group_rendezvous_through_our_server() {
    let Some(py) = python("a_gloo_process_group_rendezvous_through_our_server") else {
        return;
    };
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let port = server.port().to_string();
    let cmds = (0..2)
        .map(|r| {
            let mut c = Command::new(&py);
            c.arg(script("torch_pg.py")).arg(r.to_string()).arg(&port);
            c
        })
        .collect();
    let finished = Ranks::start(cmds)
        .expect("python ranks start")
        .finish(Duration::from_secs(120));
    for r in 0..2 {
        assert!(
            finished.ranks[r].ok_with("ok 3"),
            "rank {r}: {}",
            finished.describe()
        );
    }
    assert!(
        server.num_keys() > 0,
        "the group kept its keys in our store"
    );
}
