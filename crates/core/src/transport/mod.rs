//! The two traits a backend implements: [`Transport`] (moves bytes between
//! the ranks of one process group) and [`Store`] (the rendezvous key–value
//! store).
//!
//! Backends only move bytes: all encoding, checking and merging happens in
//! [`crate::protocol`], so every backend gives bit-identical decisions.
//!
//! Every operation takes a [`Deadline`]. An operation that cannot finish by
//! then returns [`Error::Timeout`](crate::Error::Timeout) naming the ranks
//! that did not arrive (when the engine can tell), never blocks past the
//! deadline by more than a small engine-dependent margin, and leaves the
//! transport unusable (the protocol treats it as fatal).
//!
//! # One error per situation, on every backend
//!
//! The conformance suite (`tests/conformance`) asserts each row on the
//! in-process, Gloo, c10d and NCCL transports (the behaviour named):
//!
//! | situation | [`Error`](crate::Error) | behaviour |
//! |---|---|---|
//! | an operation on a transport this rank shut down | `ChannelUnusable`, at once, nothing sent ([`toolkit::shut_down`]) | `use_after_shutdown_is_unusable` |
//! | a peer's buffer over this rank's `max_bytes` | `Decode { rank: Some(peer), TooLarge }` on every rank ([`Error::message_too_large`](crate::Error::message_too_large)) | `oversized_message_named` |
//! | this rank's own buffer over `max_bytes` | `InvalidArgument`, nothing sent ([`toolkit::check_size`]) | `all_gather_varlen` |
//! | a peer or root that is not a rank | `InvalidArgument` ([`toolkit::check_peer`], [`toolkit::check_root`]) | `send_recv_ring` |
//! | a live rank silent past the deadline | `Timeout` naming it (those that left among the missing are grouped by how), by deadline + 1 s | `missing_rank_times_out` |
//! | every missing rank shut down, aborted or died | `PeerLost` naming all of them, grouped by how each went; at once where the engine tells peers it left (`Capabilities::tells_peers_it_left`), else when this rank's own wait fails | `shutdown_fails_peers_fast`, `abort_is_not_a_shutdown`, `two_ranks_leave_at_different_times`, `late_rank_after_the_others_closed` (they closed their connections long before) |
//! | a receive from a rank that left | `PeerLost` naming that rank alone (the operation's only peer), with how it left | `recv_after_the_sender_closed` |
//! | a store key not set by the deadline | `Timeout` naming no rank | the store's own tests (`FileStore`, `InProcessStore`, `C10dStore`) |
//!
//! The ranks an error names are the exact set not in the operation: a rank
//! reports once every peer is accounted for (arrived, left or dead) or at
//! its deadline, never the first departure it noticed (docs/failures.md). A rank
//! that failed in the same operation because of another (it was held up)
//! counts as present.
//!
//! Submodules: [`toolkit`] (what every backend shares: argument checks, the
//! variable-length all_gather, the store post-mortem), [`inprocess`] (ranks
//! as threads: tests and the template for a backend), [`counting`] (a
//! wrapper counting bytes), [`filestore`] (a [`Store`] over a shared
//! directory). Depends on: the error type only.

pub mod counting;
pub mod filestore;
pub mod inprocess;
pub mod toolkit;
mod traits;

pub use traits::{Capabilities, Deadline, Store, Transport};
