//! `strand-broker`: the broker and the `strand` binary.
//!
//! - [`server`]: the process — one glommio shard per core, start-up,
//!   shutdown; per shard its partitions, connections and the mesh to the
//!   other shards.
//! - `handlers`: one file per API.
//! - [`routing`]: which shard of a node owns a partition (pure function,
//!   known to every shard).
//! - [`idempotence`]: per partition, the last batches of each idempotent
//!   producer (pipelined and retried batches stored once, in order).
//! - [`controller`]: the cluster metadata kept by openraft — commands, the
//!   table they build, the Raft storage, the glommio runtime shim.
//! - [`groups`]: consumer groups — the coordinator on the shard that owns
//!   the group's `__groups` partition, assignment strategies, the records
//!   that keep group state across restarts.
//! - [`metrics`]: per-shard counters, the `/metrics` and `/health`
//!   endpoint on shard 0.
//! - `frame_io`: writing frames on glommio sockets (client connections
//!   and peer links alike).
//! - [`peer`]: links to the other brokers of a cluster (pipelined, every
//!   call with a deadline, completed on the calling shard).
//! - [`config`]: defaults < TOML file < flags.
//! - [`cli`]: the client subcommands of `strand` (`strand queue …`).

pub mod cli;
pub mod config;
pub mod controller;
mod frame_io;
pub mod groups;
mod handlers;
pub mod idempotence;
pub mod metrics;
pub mod peer;
pub mod routing;
pub mod server;
