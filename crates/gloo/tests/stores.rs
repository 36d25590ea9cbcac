//! Gloo's rendezvous stores through the adapter: FileStore, HashStore, and a
//! core `Store` written in Rust seen by Gloo through C function pointers.

use compiler_collectives_core::{InProcessStore, Store};
use compiler_collectives_gloo::{
    EnvConfig, GlooOptions, GlooStore, GlooTransport, StoreKind, StoreSpec,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::exchange_x;

fn round_trip(store: &GlooStore, empty_values: bool) {
    store.set("k", b"value").expect("set");
    assert_eq!(
        store.get("k", Duration::from_secs(5)).expect("get"),
        b"value"
    );
    if empty_values {
        store.set("empty", b"").expect("set empty");
        assert_eq!(
            store
                .get("empty", Duration::from_secs(5))
                .expect("get empty"),
            b""
        );
        store
            .wait(&["k", "empty"], Duration::from_secs(5))
            .expect("wait");
    }
    let start = Instant::now();
    let err = store
        .get("never-set", Duration::from_millis(200))
        .expect_err("missing key");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(!err.to_string().is_empty());
    let scoped = store.prefixed("group-a").expect("prefix");
    scoped.set("k", b"scoped").expect("set scoped");
    assert_eq!(
        scoped.get("k", Duration::from_secs(5)).expect("get scoped"),
        b"scoped"
    );
    assert_eq!(
        store.get("k", Duration::from_secs(5)).expect("unscoped"),
        b"value"
    );
}

#[test]
fn file_store_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = GlooStore::file(dir.path()).expect("file store");
    assert_eq!(store.kind(), &StoreKind::File(dir.path().to_path_buf()));
    // Gloo's FileStore refuses empty values.
    round_trip(&store, false);
    assert!(store.set("empty", b"").is_ok());
    assert!(store.get("empty", Duration::from_secs(1)).is_err());
}

#[test]
fn hash_store_round_trip() {
    round_trip(&GlooStore::hash().expect("hash store"), true);
}

#[test]
fn rust_store_round_trip_and_values_land_in_the_rust_store() {
    let rust = InProcessStore::new();
    let store =
        GlooStore::from_store(Arc::new(rust.clone()), Duration::from_secs(5)).expect("rust store");
    round_trip(&store, true);
    let soon = compiler_collectives_core::Deadline::after(Duration::from_secs(1));
    assert_eq!(rust.get("k", soon).expect("in the Rust store"), b"value");
    assert_eq!(rust.get("group-a/k", soon).expect("prefixed"), b"scoped");
}

/// Two ranks (threads) rendezvous through a Rust store and exchange.
fn exchange_over(store: GlooStore, world: u32) {
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let store = store.clone();
            std::thread::spawn(move || {
                let opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(30));
                exchange_x(
                    &store,
                    (rank, world),
                    &opts,
                    "stores",
                    [3 + u64::from(rank), 7],
                )
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("rank"), "(Dyn,7)");
    }
}

#[test]
fn ranks_rendezvous_through_a_rust_store() {
    let store = GlooStore::from_store(Arc::new(InProcessStore::new()), Duration::from_secs(30))
        .expect("store");
    exchange_over(store, 3);
}

#[test]
fn ranks_rendezvous_through_a_hash_store() {
    exchange_over(GlooStore::hash().expect("hash store"), 2);
}

#[test]
fn rendezvous_with_a_missing_rank_times_out() {
    let store = GlooStore::hash().expect("hash store");
    let opts = GlooOptions::default().with_connect_timeout(Duration::from_millis(500));
    let start = Instant::now();
    let err = GlooTransport::connect(&store, 0, 2, &opts).expect_err("rank 1 never comes");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(err, compiler_collectives_core::Error::Timeout { .. }),
        "{err}"
    );
}

#[test]
fn bad_arguments_are_invalid_arguments() {
    let store = GlooStore::hash().expect("hash store");
    let err = GlooTransport::connect(&store, 2, 2, &GlooOptions::default())
        .expect_err("rank out of range");
    assert!(
        matches!(err, compiler_collectives_core::Error::InvalidArgument(_)),
        "{err}"
    );
    assert!(GlooStore::file("/proc/no/such/dir").is_err());
    let err = store.set("nul\0key", b"").expect_err("NUL in key");
    assert!(err.to_string().contains("NUL"), "{err}");
}

#[test]
fn a_rust_store_that_fails_reports_through_gloo() {
    #[derive(Debug)]
    struct Broken;
    impl Store for Broken {
        fn set(
            &self,
            _: &str,
            _: &[u8],
            _: compiler_collectives_core::Deadline,
        ) -> compiler_collectives_core::Result<()> {
            Err(compiler_collectives_core::Error::InvalidArgument(
                "the store is broken".into(),
            ))
        }
        fn get(
            &self,
            _: &str,
            _: compiler_collectives_core::Deadline,
        ) -> compiler_collectives_core::Result<Vec<u8>> {
            panic!("a panicking store must not unwind into C++")
        }
        fn add(
            &self,
            _: &str,
            _: i64,
            _: compiler_collectives_core::Deadline,
        ) -> compiler_collectives_core::Result<i64> {
            Ok(0)
        }
        fn wait(
            &self,
            _: &[&str],
            _: compiler_collectives_core::Deadline,
        ) -> compiler_collectives_core::Result<()> {
            Ok(())
        }
        fn delete(
            &self,
            _: &str,
            _: compiler_collectives_core::Deadline,
        ) -> compiler_collectives_core::Result<bool> {
            Ok(false)
        }
    }
    let store = GlooStore::from_store(Arc::new(Broken), Duration::from_secs(1)).expect("store");
    let err = store.set("k", b"v").expect_err("set fails");
    assert!(err.to_string().contains("the store is broken"), "{err}");
    let err = store
        .get("k", Duration::from_secs(1))
        .expect_err("get panics, caught");
    assert!(err.to_string().contains("panicked"), "{err}");
}

/// What `from_env` derives under torchrun on one node (`default_store`: the
/// FileStore directory of the run id), with the store in `dir`.
fn env_config(rank: u32, world_size: u32, dir: &std::path::Path, default_store: bool) -> EnvConfig {
    EnvConfig {
        rank,
        world_size,
        store: if default_store {
            StoreSpec::DefaultDir(dir.to_path_buf())
        } else {
            StoreSpec::Named(dir.to_string_lossy().into_owned())
        },
        hostname: Some("127.0.0.1".into()),
        prefix: "ccol/stores-test/0".into(),
    }
}

#[test]
fn a_failed_rendezvous_removes_the_default_store_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("ccol-gloo-failed-0-0");
    let start = Instant::now();
    let err = env_config(0, 2, &dir, true)
        .connect(Duration::from_millis(500))
        .expect_err("rank 1 never comes");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(err.kind(), "timeout", "{err}");
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

#[test]
fn a_failed_rendezvous_keeps_a_store_directory_the_user_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mine");
    let err = env_config(1, 2, &dir, false)
        .connect(Duration::from_millis(300))
        .expect_err("rank 0 never comes");
    assert_eq!(err.kind(), "timeout", "{err}");
    assert!(dir.is_dir(), "{} was removed", dir.display());
}

#[test]
fn a_rendezvous_removes_the_default_store_directory_once_connected() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("ccol-gloo-ok-0-0");
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let cfg = env_config(rank, 2, &dir, true);
            std::thread::spawn(move || cfg.connect(Duration::from_secs(30)))
        })
        .collect();
    let transports: Vec<GlooTransport> = ranks
        .into_iter()
        .map(|h| h.join().expect("rank thread").expect("connect"))
        .collect();
    assert_eq!(transports.len(), 2);
    assert!(!dir.exists(), "{} is left behind", dir.display());
}

/// A rank that never comes, over the job's TCPStore: the error names the
/// key and the rank that should have written it.
#[test]
fn a_missing_rank_over_the_tcpstore_is_named_with_its_key() {
    use compiler_collectives_tcpstore::{ServerOptions, TcpStoreServer};
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let cfg = EnvConfig {
        rank: 0,
        world_size: 2,
        store: StoreSpec::Tcp {
            host: "127.0.0.1".into(),
            port: server.port(),
            serve: false,
        },
        hostname: None,
        prefix: "ccol/missing/0".into(),
    };
    let err = cfg
        .connect(Duration::from_millis(800))
        .expect_err("rank 1 never comes");
    assert_eq!(err.kind(), "timeout", "{err}");
    assert_eq!(err.missing_ranks(), [1], "{err}");
    let text = err.to_string();
    let want = format!(
        "waiting for rank [1] (Gloo's rendezvous in the TCPStore at 127.0.0.1:{}; its key \
         'ccol/missing/0/arrived/1' never appeared)",
        server.port()
    );
    assert!(text.contains(&want), "{text}");
}

/// After a peer's connection closed under an exchange, dropping a
/// survivor's transport (what a program that caught the error and exits
/// does) ends within the drain bound.
#[test]
fn a_survivor_drops_its_transport_within_the_drain_bound() {
    use compiler_collectives_core::decisions::shapes::{FrameState, Observation};
    use compiler_collectives_core::{Channel, ChannelOptions};
    let store = GlooStore::hash().expect("hash store");
    let ranks: Vec<_> = (0..3u32)
        .map(|rank| {
            let store = store.clone();
            std::thread::spawn(move || {
                let opts = GlooOptions::default()
                    .with_hostname("127.0.0.1")
                    .with_prefix("survivor-drop")
                    .with_connect_timeout(Duration::from_secs(30));
                let t = GlooTransport::connect(&store, rank, 3, &opts).expect("connect");
                let mut ch = Channel::with_options(
                    Arc::new(t),
                    ChannelOptions::default().with_timeout(Duration::from_secs(5)),
                )
                .expect("channel");
                let mut s = FrameState::new();
                s.record("x", &Observation::tensor([u64::from(rank) + 2, 8]));
                ch.exchange("f", &s).expect("first exchange");
                if rank == 2 {
                    // Gone without a word: its connections close.
                    drop(ch);
                    return Duration::ZERO;
                }
                let err = ch.exchange("f", &s).expect_err("rank 2 left");
                assert!(err.missing_ranks().contains(&2), "{err}");
                let start = Instant::now();
                drop(ch);
                start.elapsed()
            })
        })
        .collect();
    for h in ranks {
        let took = h.join().expect("rank thread");
        assert!(
            took < compiler_collectives_core::transport::toolkit::DRAIN_LIMIT
                + Duration::from_secs(1),
            "dropping took {took:?}"
        );
    }
}

/// A store that answers the handshake and then nothing (a hung agent):
/// the rendezvous ends by its timeout, naming the store and the query, not
/// after Gloo's own 300 s.
#[test]
fn a_hung_tcpstore_ends_the_rendezvous_by_its_timeout() {
    use compiler_collectives_tcpstore::wire::{Limits, Request};
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let limits = Limits::default();
                while let Ok(r) = Request::read(&mut s, &limits) {
                    if let Request::Ping { nonce } = r {
                        let _ = s.write_all(&nonce.to_le_bytes());
                        break;
                    }
                }
                // Then silence: read what comes, answer nothing.
                while Request::read(&mut s, &limits).is_ok() {}
            });
        }
    });
    let cfg = EnvConfig {
        rank: 1,
        world_size: 2,
        store: StoreSpec::Tcp {
            host: "127.0.0.1".into(),
            port,
            serve: false,
        },
        hostname: None,
        prefix: "ccol/hung/0".into(),
    };
    let start = Instant::now();
    let err = cfg
        .connect(Duration::from_secs(1))
        .expect_err("the store never answers");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}: {err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("the TCPStore at 127.0.0.1:{port} to answer")),
        "{text}"
    );
}

/// On a Rust store, `set_within` and `try_get_within` call it directly and
/// agree with what Gloo's PrefixStores write and read: the same keys.
#[test]
fn calls_with_deadlines_reach_the_rust_store_under_the_same_keys() {
    use compiler_collectives_core::Deadline;
    let rust = InProcessStore::new();
    let store = GlooStore::from_store(Arc::new(rust.clone()), Duration::from_secs(5))
        .expect("rust store")
        .prefixed("outer")
        .expect("prefix")
        .prefixed("inner")
        .expect("prefix");
    assert!(store.takes_deadlines());
    let soon = || Deadline::after(Duration::from_secs(1));
    store
        .set_within("left/3", b"shutdown 7", soon())
        .expect("set");
    assert_eq!(
        rust.get("outer/inner/left/3", soon())
            .expect("in the Rust store"),
        b"shutdown 7"
    );
    assert_eq!(
        store
            .get("left/3", Duration::from_secs(1))
            .expect("through Gloo"),
        b"shutdown 7"
    );
    store.set("left/4", b"aborted 1").expect("Gloo set");
    assert_eq!(
        store.try_get_within("left/4", soon()).expect("read"),
        Some(b"aborted 1".to_vec())
    );
    let start = std::time::Instant::now();
    assert_eq!(store.try_get_within("left/5", soon()).expect("read"), None);
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
    // Gloo's own stores take no deadline on set.
    assert!(!GlooStore::hash().expect("hash").takes_deadlines());
    let hash = GlooStore::hash().expect("hash");
    hash.set_within("a", b"1", soon()).expect("set");
    assert_eq!(
        hash.try_get_within("a", soon()).expect("read"),
        Some(b"1".to_vec())
    );
    assert_eq!(hash.try_get_within("b", soon()).expect("read"), None);
}

/// A Rust store whose `wait` for a missing key takes at least a second
/// whatever its deadline, as torch's FileStore does; `try_get` answers at
/// once.
#[derive(Debug)]
struct SlowWaits(InProcessStore);

impl Store for SlowWaits {
    fn set(
        &self,
        k: &str,
        v: &[u8],
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        self.0.set(k, v, d)
    }
    fn get(
        &self,
        k: &str,
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Vec<u8>> {
        self.0.get(k, d)
    }
    fn add(
        &self,
        k: &str,
        n: i64,
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<i64> {
        self.0.add(k, n, d)
    }
    fn wait(
        &self,
        keys: &[&str],
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<()> {
        let start = Instant::now();
        let r = self.0.wait(keys, d);
        if r.is_err() {
            std::thread::sleep(Duration::from_secs(1).saturating_sub(start.elapsed()));
        }
        r
    }
    fn delete(
        &self,
        k: &str,
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<bool> {
        self.0.delete(k, d)
    }
    fn try_get(
        &self,
        k: &str,
        d: compiler_collectives_core::Deadline,
    ) -> compiler_collectives_core::Result<Option<Vec<u8>>> {
        self.0.try_get(k, d)
    }
}

#[test]
fn a_rendezvous_timeout_over_slow_waits_comes_at_its_deadline() {
    // Rank 0 alone of 4: naming the three missing ranks must not cost a
    // slow wait each (it took the deadline + 3 s).
    let store = GlooStore::from_store(
        Arc::new(SlowWaits(InProcessStore::new())),
        Duration::from_secs(1),
    )
    .expect("store");
    let opts = GlooOptions::default().with_connect_timeout(Duration::from_secs(1));
    let start = Instant::now();
    let err = GlooTransport::connect(&store, 0, 4, &opts).expect_err("ranks 1-3 never come");
    let took = start.elapsed();
    match &err {
        compiler_collectives_core::Error::Timeout { missing_ranks, .. } => {
            assert_eq!(missing_ranks, &[1, 2, 3], "{err}");
        }
        other => panic!("expected a timeout, got {other}"),
    }
    assert!(took < Duration::from_millis(2000), "took {took:?}: {err}");
}
