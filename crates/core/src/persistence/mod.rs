//! What outlives a run: decisions persisted per job ([`profile`], PyTorch's
//! PGO), compiled artifacts and cache-hit agreement ([`artifacts`]), and the
//! one cache-directory rule ([`paths`]). Traces are the channel's record of
//! each exchange and live with it ([`crate::protocol::trace`]).
//!
//! | module | what |
//! |---|---|
//! | [`profile`] | profiles: decisions persisted per job across runs, crash-safe store |
//! | [`artifacts`] | a persistent artifact cache and cache-hit agreement |
//! | [`paths`] | the project's cache directory |
//!
//! Depends on: [`crate::decisions`], [`crate::protocol`] (profiles and cache
//! hits are exchanged) and [`crate::cache`] (artifacts are compiled frames).

pub mod artifacts;
pub mod paths;
pub mod profile;
