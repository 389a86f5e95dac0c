//! `strand-client`: talking to Strand brokers from any Rust program.
//!
//! No async runtime is required: each broker connection has its own I/O
//! thread (std sockets), requests are pipelined on it, and every call
//! returns a plain future (resolved from that thread) that tokio, glommio,
//! or a blocking wrapper can await. So far:
//!
//! - [`Connection`]: one broker connection, pipelined requests matched to
//!   responses by correlation id.
//! - [`Admin`]: create, delete, alter, describe and list queues.
//! - [`requests`]: request bodies and response readers for the data APIs.
//!
//! The producer and consumer come next (issue 4).

mod admin;
mod connection;
mod error;
pub mod requests;

pub use admin::{Admin, FsyncSpec, PartitionDescription, QueueDescription, QueueSpec};
pub use connection::Connection;
pub use error::ClientError;

/// Runs a future to completion on the current thread (the blocking API).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    futures_lite::future::block_on(future)
}
