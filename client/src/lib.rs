//! `strand-client`: talking to Strand brokers from any Rust program.
//!
//! No async runtime is required: each broker connection has its own I/O
//! thread (std sockets; an io_uring core measured no better: see
//! [`connection`]), requests are pipelined on it, and every call
//! returns a plain future (resolved from that thread) that tokio, glommio,
//! or a blocking wrapper ([`block_on`]) can await.
//!
//! - [`Producer`]: records in, (partition, offset) out; batching with
//!   batch bytes + linger, the key partitioner, a bounded buffer, retries.
//! - [`Consumer`]: assign partitions, seek, long-poll with pipelined fetches.
//! - [`GroupConsumer`]: a member of a consumer group — the broker assigns
//!   partitions, positions are committed, rebalances are cooperative.
//! - [`Admin`]: create, delete, alter, describe and list queues; list,
//!   describe, reset and delete groups.
//! - [`Cluster`]: bootstrap brokers, connections per broker, queue metadata.
//! - [`Connection`]: one broker connection, pipelined requests matched to
//!   responses by correlation id.
//! - [`requests`]: request bodies and response readers for the data APIs.
//! - [`retry`]: which errors are retried, backoff, an executor-free sleep.
//! - [`tls`] and [`sasl`]: TLS, and logging in with SCRAM, for every
//!   connection the process opens.
//!
//! Errors are one enum, [`ClientError`], carrying the broker's error codes
//! and messages. `examples/` shows use from a plain thread, tokio and
//! glommio.

mod admin;
mod cluster;
pub mod connection;
mod consumer;
mod error;
mod group;
mod producer;
pub mod requests;
pub mod retry;
pub mod sasl;
pub mod tls;

pub use admin::{
    AclSpec, Admin, BrokerDescription, BrokerDisk, ClusterDescription, FsyncSpec, PartitionDescription,
    PartitionPlacement, QueueDescription, QueueSpec, UserDescription,
};
pub use cluster::{parse_brokers, Cluster, QueueInfo, Timeouts, METADATA_MAX_AGE};
pub use connection::Connection;
pub use consumer::{ConsumedRecord, Consumer, ConsumerConfig, OutOfRangeReset, Seek};
pub use error::{ClientError, ErrorCodeName, LeaderHint};
pub use group::{
    is_fenced, GroupConfig, GroupConsumer, GroupDescription, GroupListing, GroupMemberInfo, GroupPartitionInfo,
    GroupStart, QueuePartition, Received, ResetTarget, Strategy,
};
pub use producer::{
    Acks, Delivered, Delivery, Producer, ProducerConfig, ProducerStats, WhenFull, DEFAULT_MAX_REQUESTS_PER_CONNECTION,
    IDEMPOTENT_MAX_IN_FLIGHT,
};

/// 64 random bits for ids and starting points that must differ between
/// producers and connections (not for cryptography): std's hasher keys are
/// random per process and per call, salted here with the wall clock.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Runs a future to completion on the current thread (the blocking API).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    futures_lite::future::block_on(future)
}
