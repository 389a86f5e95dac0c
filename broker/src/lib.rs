//! `strand-broker`: the broker and the `strand` binary.
//!
//! - [`server`]: the process — one glommio shard per core, start-up,
//!   shutdown, the client listener and connections, the mesh receivers,
//!   the metrics endpoint. It accepts and dispatches; it serves nothing
//!   itself.
//! - `handlers`: one file per API.
//! - [`router`]: reaching the owner of a partition (this shard, another
//!   shard of this node, another node) or the controller.
//! - `leaders`: a partition's offsets, batches or an append, from its
//!   leader wherever it runs (the group coordinator's reads and dead
//!   letters).
//! - [`replica`]: replication's decisions, sans I/O (a leader's view of
//!   its followers, the ISR, the high watermark, acks=all; fetch answers
//!   and a diverged follower's truncation), with a seeded simulation.
//! - [`replication`]: replication's I/O on each shard — followers'
//!   fetchers, the leaders' ISR upkeep, high-watermark checkpoints.
//! - [`shard`]: one shard's state — its partitions and their roles, the
//!   produce path, serving a partition request, the link to the
//!   controller, the messages between shards.
//! - [`routing`]: which shard of a node owns a partition (pure function,
//!   known to every shard).
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
//! - [`lease`]: this broker's own lease with the controller (while it
//!   does not hold, its leaders acknowledge nothing), and the monotonic
//!   clock.
//! - [`limits`]: the node's connection counts and rates (checked as a
//!   connection is accepted; its place travels with it between shards).
//! - [`fuzzing`]: the entry points of the broker's fuzz targets
//!   (`broker/fuzz/`: replica-fetch bodies, controller payloads).
//! - [`cli`]: the client subcommands of `strand` (`strand queue …`).
//!
//! Dependencies point one way (no module imports one that imports it):
//! config, routing, lease, limits, controller, metrics, frame_io (leaves;
//! replica uses only the controller's ids)
//! ← shard (which uses replica) ← router ← leaders, replication ← groups
//! ← auth ← handlers
//! ← server; peer uses frame_io
//! alone; cli uses the client library and groups' naming rules.

pub mod auth;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod controller;
mod frame_io;
pub mod fuzzing;
pub mod groups;
mod handlers;
mod leaders;
pub mod lease;
pub mod limits;
pub mod metrics;
pub mod peer;
pub mod replica;
pub mod replication;
pub mod router;
pub mod routing;
pub mod server;
pub mod shard;
