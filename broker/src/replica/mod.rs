//! Partition replication's decisions, sans I/O: what a partition leader
//! knows of its followers (their positions, the ISR it wants, the high
//! watermark, when an acks=all produce is committed), how it answers a
//! follower's fetch, and where a follower whose log diverged truncates.
//!
//! Runs on: the shard that owns the partition (the replication issue wires
//! it to the peer links and the log). Nothing here does I/O or reads a
//! clock: positions and times are passed in, so a seeded simulation drives
//! the same code through crashes, pauses and lost messages (`sim.rs`,
//! a few hundred seeds in `cargo test`).
//!
//! The rules (Kafka's, DESIGN.md §6):
//! - [`leader::LeaderState`]: the high watermark is the lowest offset every
//!   ISR member holds — fdatasync'd (`Holds::Flushed`, `fsync=always`
//!   queues) or written (`Holds::Written`) — counting the members of an ISR
//!   change still in flight too, and never moves back. A follower leaves
//!   the ISR once it has not caught up with the leader's log end for
//!   `lag_max_ms`; it comes back once it holds the high watermark and the
//!   start of the leader's epoch (any ISR member may lead next). An
//!   acks=all batch is committed once the high watermark passes it, and
//!   refused while the ISR is smaller than `min_insync`.
//! - [`fetch::answer_fetch`]: a follower states the epoch of its last batch;
//!   if the leader's log has that epoch ending earlier (or not at all), the
//!   answer is where it ends instead of records.
//! - [`fetch::truncation_point`]: the follower cuts its log there (and at
//!   its own end of the epoch the leader named), never below its high
//!   watermark.

pub mod fetch;
pub mod leader;

#[cfg(test)]
mod sim;
