//! A one-rank c10d group in this process: the safe API end to end.

use compiler_collectives_core::decisions::shapes::Observation;
use compiler_collectives_core::{Deadline, Store};
use compiler_collectives_tch::{observe, C10dProcessGroup, C10dStore, ReduceOp, TcpStoreOptions};
use std::time::Duration;
use tch::Tensor;

#[test]
fn one_rank_group_store_and_tensor_ops() {
    let t = Duration::from_secs(20);
    let store = C10dStore::tcp(
        &TcpStoreOptions::server("127.0.0.1", 0, 1)
            .with_wait_workers(true)
            .with_timeout(t),
    )
    .expect("TCPStore server");
    let soon = Deadline::after(t);
    store.set("k", b"v", soon).expect("set");
    assert_eq!(store.get("k", soon).expect("get"), b"v");
    assert_eq!(store.add("n", 5, soon).expect("add"), 5);
    assert_eq!(store.add("n", -2, soon).expect("add"), 3);
    store.wait(&["k", "n"], soon).expect("wait");
    assert!(store.delete("k", soon).expect("delete"));
    let err = store
        .get("never", Deadline::after(Duration::from_millis(300)))
        .expect_err("missing key");
    assert!(
        matches!(err, compiler_collectives_core::Error::Timeout { .. }),
        "{err}"
    );

    let scoped = store.prefixed("group").expect("prefix");
    let pg = C10dProcessGroup::gloo(&scoped, 0, 1, "127.0.0.1", t).expect("ProcessGroupGloo");
    assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    let mut x = Tensor::from_slice(&[1.0f64, 2.0, 3.0]);
    pg.all_reduce(&mut x, ReduceOp::Sum, t).expect("allreduce");
    assert_eq!(Vec::<f64>::try_from(&x).expect("f64"), vec![1.0, 2.0, 3.0]);
    let parts = pg
        .all_gather(&Tensor::from_slice(&[7i64, 8]), t)
        .expect("allgather");
    assert_eq!(parts.len(), 1);
    assert_eq!(Vec::<i64>::try_from(&parts[0]).expect("i64"), vec![7, 8]);
    pg.barrier(t).expect("barrier");
    let mut b = Tensor::from_slice(&[4i64]);
    pg.broadcast(&mut b, 0, t).expect("broadcast");
    assert_eq!(b.int64_value(&[0]), 4);
}

#[test]
fn observations_follow_sizes_and_strides() {
    let x = Tensor::zeros([4, 6], (tch::Kind::Float, tch::Device::Cpu));
    assert_eq!(observe(&x), Observation::strided(vec![4, 6], vec![6, 1]));
    assert_eq!(
        observe(&x.transpose(0, 1)),
        Observation::strided(vec![6, 4], vec![1, 6])
    );
}

#[test]
fn a_client_without_a_server_times_out_with_torch_text() {
    // A port this test holds bound but not listening: nothing else can take
    // it, and connections to it are refused (a listener that accepts and
    // never answers would leave libtorch's client waiting past its timeout
    // in its validation read).
    let held =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    held.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let port = held
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("its address")
        .port();
    let err = C10dStore::tcp(
        &TcpStoreOptions::client("127.0.0.1", port, 2).with_timeout(Duration::from_millis(500)),
    )
    .expect_err("no server");
    assert!(!err.to_string().is_empty());
    drop(held);
}
