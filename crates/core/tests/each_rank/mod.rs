//! The ranks of an in-process group as threads (`mod each_rank;`).

use compiler_collectives_core::{InProcessGroup, InProcessTransport};

/// Runs `f` on one thread per rank of a fresh in-process group of `world`
/// ranks (each thread with its own clone of `f`); the results in rank order.
pub(crate) fn on_threads<T: Send + 'static>(
    world: u32,
    f: impl Fn(InProcessTransport) -> T + Clone + Send + 'static,
) -> Vec<T> {
    let handles: Vec<_> = InProcessGroup::create(world)
        .expect("group")
        .into_iter()
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || f(t))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect()
}
