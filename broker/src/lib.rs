//! `strand-broker`: the broker. So far the parts that are plain code:
//!
//! - [`routing`]: which shard of a node owns a partition (pure function,
//!   known to every shard).
//! - [`controller`]: the cluster metadata as a replicated state machine —
//!   commands, the table they build, snapshots (sans-I/O; the openraft glue
//!   comes with the controller's runtime).

pub mod controller;
pub mod routing;
