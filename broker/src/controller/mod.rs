//! The controller: cluster metadata kept by a Raft group (openraft) whose
//! members are the nodes. Shard 0 of each node hosts the node's member;
//! every change becomes a [`Command`] in the Raft log, and applying the
//! committed commands in order builds the [`MetadataTable`] on every node.
//! Each shard gets an immutable copy of the table whenever it changes.
//!
//! Runs on: shard 0 (the Raft member); the table is read on every shard.
//!
//! - [`stm`] and [`table`]: the sans-I/O core — commands, the table, how
//!   commands apply, snapshots. Deterministic: the same commands in the same
//!   order give the same table on every node, so all validation needs only
//!   the table and the command. [`error`]: why a command is refused;
//!   [`proposals`]: a proposal sent again applies once. [`users`]: SASL
//!   users' SCRAM keys; [`acls`]: what each may do.
//! - [`leases`]: broker leases as the controller leader keeps them (sans
//!   I/O): who is alive, whose lease ran out, which id is taken.
//! - [`store`]: the Raft log, vote and snapshots on disk (byte layout there)
//!   and the openraft state-machine store around [`stm`].
//! - [`runtime`]: openraft's async runtime on glommio.
//! - [`node`]: starting this node's member, proposing commands (forwarded
//!   to the leader from other nodes), serving the other members.
//! - [`network`]: the Raft messages and forwarded proposals on peer links.

pub mod acls;
pub mod error;
pub mod leases;
pub mod network;
pub mod node;
pub mod proposals;
pub mod runtime;
pub mod stm;
pub mod store;
pub mod table;
pub mod users;

pub use node::{decode_payloads, Controller, ProposeError, Settings, Voter};
pub use proposals::ProposalId;
pub use stm::{Command, ControllerError, MetadataStm, QueueChanges, MESSAGE_BYTES_MAX, PARTITIONS_MAX};
pub use store::Publish;
pub use table::{
    default_min_insync_replicas, BrokerRecord, FsyncSetting, MetadataTable, NodeId, PartitionRecord, QueueRecord,
    QueueSettings, DEFAULT_MAX_DELIVERY_ATTEMPTS, NO_LEADER,
};
