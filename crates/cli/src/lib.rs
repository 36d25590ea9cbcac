//! What `ccol` shares with the workspace's example programs.
//!
//! The `ccol` binary is this package's main product (see its `--help` and the
//! README); this library holds only the pieces other programs reuse:
//!
//! | module | what |
//! |---|---|
//! | [`logging`] | the `tracing` subscriber every program installs: `RUST_LOG`, `CCOL_LOG_FORMAT=json`, stderr |
//! | [`args`] | clap value parsers with the same messages everywhere (`at_least_one`) |
//! | [`cache`] | the project's cache directory and the torch the scripts install there |
//! | [`heap`] | the counting allocator behind `ccol bench`'s allocations per exchange |

pub mod args;
pub mod cache;
pub mod heap;
pub mod logging;
