//! Peer links: this broker's connections to the other brokers of its
//! cluster, for what crosses nodes (controller RPCs, replica fetches,
//! requests forwarded to a partition's leader).
//!
//! Runs on: the shard that owns the link. A call completes on that shard:
//! a reader task on the same executor hands each response to its waiter,
//! never through another thread. (Not `strand-client`: its futures
//! complete from its own I/O threads, and glommio 0.9's cross-thread wake
//! path has deadlocked a shard here.)
//!
//! - [`link::PeerLink`]: one pipelined connection to one peer, the same
//!   frames as clients speak (`net/src/frame.rs`), every call bounded by a
//!   deadline.

pub mod link;

pub use link::{PeerError, PeerLink};
