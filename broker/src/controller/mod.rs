//! The controller: cluster metadata kept by a Raft group (openraft) whose
//! members are the nodes. Shard 0 of each node hosts the node's member;
//! every change becomes a [`Command`] in the Raft log, and applying the
//! committed commands in order builds the [`MetadataTable`] on every node.
//! Each shard gets an immutable copy of the table whenever it changes.
//!
//! Runs on: shard 0 (the Raft member); the table is read on every shard.
//!
//! This module is the sans-I/O core: [`stm`] applies commands and takes and
//! restores snapshots; [`table`] is the state. Deterministic: the same
//! commands in the same order give the same table on every node, so all
//! validation needs only the table and the command.

pub mod stm;
pub mod table;

pub use stm::{Command, ControllerError, MetadataStm};
pub use table::{BrokerRecord, FsyncSetting, MetadataTable, NodeId, PartitionRecord, QueueRecord, QueueSettings};
