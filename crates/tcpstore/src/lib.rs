//! # compiler-collectives-tcpstore
//!
//! c10d's TCPStore, spoken in pure Rust: the store torchrun's agent serves
//! on `MASTER_ADDR:MASTER_PORT` (and `init_process_group` starts on rank
//! 0), so ranks of any backend rendezvous through the store every PyTorch
//! job already has, on one node or many.
//!
//! | item | what |
//! |---|---|
//! | [`TcpStoreClient`] | a client implementing core's [`Store`](compiler_collectives_core::Store), with real deadlines |
//! | [`TcpStoreServer`] | a server torch 2.13's clients talk to (what `ccol run` hosts) |
//! | [`JobStore`] | the store torchrun's environment names (`MASTER_ADDR`, `MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE`), as the backends' `from_env` use it |
//! | [`wire`] | the wire format, encoded and decoded with bounds |
//!
//! The protocol is torch 2.13's (`torch/csrc/distributed/c10d/TCPStore.cpp`,
//! `TCPStoreLibUvBackend.cpp`): a `VALIDATE` with a magic number opens every
//! connection, then one-byte queries with little-endian fields; the tests
//! run this client against torch's libuv and legacy servers and torch's
//! client against this server.
//!
//! A TCPStore has no authentication (neither has PyTorch's): whoever
//! reaches the port reads and writes every key. Bind the server to a
//! private interface.
//!
//! ```
//! use compiler_collectives_core::{Deadline, Store};
//! use compiler_collectives_tcpstore::{ServerOptions, TcpStoreClient, TcpStoreServer};
//! use std::time::Duration;
//!
//! let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default())?;
//! let deadline = Deadline::after(Duration::from_secs(10));
//! let a = TcpStoreClient::connect("127.0.0.1", server.port(), deadline)?;
//! let b = TcpStoreClient::connect("127.0.0.1", server.port(), deadline)?;
//! a.set("addr/0", b"10.0.0.1:4000", deadline)?;
//! assert_eq!(b.get("addr/0", deadline)?, b"10.0.0.1:4000");
//! assert_eq!(b.add("joined", 1, deadline)?, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod client;
mod job;
mod server;
pub mod wire;

pub use client::{TcpStoreClient, TcpStoreError, DEFAULT_PREFIX, HANDSHAKE_LIMIT, RECONNECT_LIMIT};
pub use job::JobStore;
pub use server::{ServerOptions, TcpStoreServer, VALIDATE_LIMIT, WRITE_LIMIT};
