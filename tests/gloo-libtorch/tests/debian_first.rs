//! Debian's Gloo first in a fresh process, then libtorch's c10d Gloo.

use compiler_collectives_gloo_libtorch::c10d_gloo_allreduce;

mod common;

#[test]
fn debian_gloo_then_c10d() {
    let sizes = common::debian_gloo_exchange(3, None, "debian-first", |r| [4, 2 + r]);
    assert_eq!(sizes, ["(4,Dyn)"; 3]);
    let sums = c10d_gloo_allreduce(3).expect("c10d allreduce");
    // 4 elements × (1 + 2 + 3).
    assert_eq!(sums, vec![24.0, 24.0, 24.0]);
}
