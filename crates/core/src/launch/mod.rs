//! What a launcher (`torchrun`, `ccol run`) gives a rank and expects back.
//!
//! | module | what |
//! |---|---|
//! | [`runenv`] | torchrun's environment ([`RunEnv`](crate::RunEnv)), parsed once for every backend |
//! | [`torchelastic`] | TorchElastic error files: why a rank failed, for its launcher |
//!
//! Depends on: the error type only.

pub mod runenv;
pub mod torchelastic;
