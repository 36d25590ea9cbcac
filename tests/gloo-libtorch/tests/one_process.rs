//! Debian's Gloo and libtorch's c10d Gloo in one process, in both orders.

use compiler_collectives_gloo_libtorch::c10d_gloo_allreduce;

mod common;

/// Two ranks of our Gloo transport as threads, on a Gloo HashStore; each
/// exchanges a rank-dependent shape and must see dim 0 dynamic.
fn debian_gloo_exchange(prefix: &str) {
    let sizes = common::debian_gloo_exchange(2, Some(prefix), "one-process", |r| [8 + r, 3]);
    assert_eq!(sizes, ["(Dyn,3)"; 2]);
}

fn c10d_allreduce() {
    let sums = c10d_gloo_allreduce(2).expect("c10d allreduce");
    // Ranks contribute 1s and 2s over 4 elements: 4 * (1 + 2) = 12 on each.
    assert_eq!(sums, vec![12.0, 12.0]);
}

#[test]
fn c10d_then_debian_gloo_then_c10d_again() {
    c10d_allreduce();
    debian_gloo_exchange("order-a");
    c10d_allreduce();
    debian_gloo_exchange("order-a2");
}
