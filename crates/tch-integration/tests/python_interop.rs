//! A Python `torch.distributed` rank (torch 2.13, gloo, `init_process_group`)
//! and Rust ranks join one TCPStore and one gloo process group — with the
//! store prefixes Python's `init_process_group` uses — and exchange
//! variable-length byte payloads through compiler-collectives' c10d
//! transport; each side checks every payload byte for byte. This proves the
//! transport hooks into libtorch's real process group.

use compiler_collectives_conformance::process::Ranks;
use compiler_collectives_conformance::skip::{skip_test, Missing};
use compiler_collectives_core::{Deadline, Transport};
use compiler_collectives_tch::{C10dProcessGroup, C10dStore, C10dTransport, TcpStoreOptions};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn payload(rank: u32) -> Vec<u8> {
    let mut p = format!("rank-{rank}:").into_bytes();
    p.extend((0..rank * 13 + 5).map(|i| u8::try_from((rank * 31 + i) % 251).unwrap_or(0)));
    p
}

fn python() -> Option<PathBuf> {
    std::env::var_os("CCOL_TORCH_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
}

/// The store chain `init_process_group` builds: the TCPStore, then
/// `PrefixStore("default_pg")`, `PrefixStore("0/")` (the default group's
/// name), `PrefixStore("cpu/")` (the device of the gloo backend).
fn python_default_group_store(port: u16, world: u32) -> C10dStore {
    let t = Duration::from_secs(60);
    let store = C10dStore::tcp(
        &TcpStoreOptions::client("127.0.0.1", port, world)
            .with_wait_workers(true)
            .with_timeout(t),
    )
    .expect("TCPStore client");
    store
        .prefixed("default_pg")
        .and_then(|s| s.prefixed("0/"))
        .and_then(|s| s.prefixed("cpu/"))
        .expect("prefixes")
}

#[test]
fn python_and_rust_ranks_share_one_gloo_group() {
    let Some(py) = python() else {
        return skip_test(
            "python_and_rust_ranks_share_one_gloo_group",
            Missing::install(
                "CCOL_TORCH_PYTHON is not set (run `eval \"$(scripts/setup-torch.sh)\"`)",
            ),
        );
    };
    let world = 3u32;
    // The test serves the TCPStore as torchrun's agent does, on a port the
    // system picks (no race for a "free" port); every rank, the Python one
    // included (`TORCHELASTIC_USE_AGENT_STORE=True`), connects as a client.
    let server = C10dStore::tcp(
        &TcpStoreOptions::server("127.0.0.1", 0, world).with_timeout(Duration::from_secs(60)),
    )
    .expect("TCPStore server");
    let port = server.port().expect("its port");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/python_rank.py");
    let mut python_rank = Command::new(py);
    python_rank
        .arg(&script)
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RANK", "0")
        .env("WORLD_SIZE", world.to_string())
        .env("TORCHELASTIC_USE_AGENT_STORE", "True");
    let child = Ranks::start(vec![python_rank]).expect("python rank starts");
    let ranks: Vec<_> = (1..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let store = python_default_group_store(port, world);
                let pg = C10dProcessGroup::gloo(
                    &store,
                    rank,
                    world,
                    "127.0.0.1",
                    Duration::from_secs(60),
                )
                .expect("join Python's gloo group");
                let t = C10dTransport::new(pg, store);
                let got = t
                    .all_gather(
                        &payload(rank),
                        1 << 20,
                        Deadline::after(Duration::from_secs(60)),
                    )
                    .expect("all_gather with Python");
                for (r, bytes) in (0u32..).zip(&got) {
                    assert_eq!(
                        *bytes,
                        payload(r),
                        "rank {rank} got rank {r}'s payload wrong"
                    );
                }
                got.len()
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().expect("rust rank"), world as usize);
    }
    let done = child.finish(Duration::from_secs(120));
    done.within_limit().expect("the python rank ended");
    let rank0 = &done.ranks[0];
    assert!(
        rank0.ok_with("PYTHON OK 3 payloads"),
        "python rank:\n{}",
        done.describe()
    );
    drop(server);
}
