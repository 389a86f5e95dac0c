//! Why the controller refuses a command.
//!
//! Runs on: wherever the controller's state machine applies commands
//! (shard 0), and in the answers forwarded between its members.

use serde::{Deserialize, Serialize};

use super::table::NodeId;

/// Why a command was refused. Refusing changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ControllerError {
    #[error("queue {0:?} already exists")]
    QueueExists(String),
    #[error("queue {0:?} does not exist")]
    UnknownQueue(String),
    #[error("invalid queue name: {0}")]
    InvalidName(String),
    #[error("invalid queue settings: {0}")]
    InvalidSettings(String),
    #[error("replication factor {wanted} needs {wanted} live brokers, the cluster has {brokers}")]
    NotEnoughBrokers { wanted: u16, brokers: usize },
    #[error(
        "broker id {id} is alive at {address}: another broker holds its lease (stop it, or give this one \
         another node id)"
    )]
    BrokerIdInUse { id: NodeId, address: String },
    #[error("{what}: the partition moved on (now leader {leader}, leader epoch {leader_epoch}, partition epoch {partition_epoch})")]
    StaleIsrChange {
        what: String,
        leader: NodeId,
        leader_epoch: u32,
        partition_epoch: u32,
    },
    #[error("invalid ISR: {0}")]
    InvalidIsr(String),
    #[error("broker ids start at 1")]
    InvalidBrokerId,
    #[error("no broker {0} in the cluster (strand node list shows the brokers)")]
    UnknownBroker(NodeId),
    #[error("invalid reassignment: {0}")]
    InvalidReassignment(String),
    #[error("no unclean election: {0}")]
    ElectionRefused(String),
    #[error("invalid proposal: {0}")]
    InvalidProposal(String),
    #[error("no user {0:?}")]
    UnknownUser(String),
    #[error("invalid user: {0}")]
    InvalidUser(String),
    #[error("invalid ACL: {0}")]
    InvalidAcl(String),
    #[error("no such ACL: {0}")]
    UnknownAcl(String),
    #[error(
        "cannot decommission broker {id}: {queue}/{partition} needs {wanted} replicas and no other alive broker \
         that is not leaving can take broker {id}'s place (start a new broker first)"
    )]
    CannotDecommission {
        id: NodeId,
        queue: String,
        partition: u32,
        wanted: usize,
    },
}

impl ControllerError {
    /// The wire error code for a client.
    pub fn code(&self) -> strand_wire::ErrorCode {
        use strand_wire::ErrorCode;
        match self {
            ControllerError::QueueExists(_) => ErrorCode::QueueAlreadyExists,
            ControllerError::UnknownQueue(_) => ErrorCode::UnknownQueue,
            ControllerError::InvalidName(_) => ErrorCode::InvalidQueueName,
            ControllerError::InvalidSettings(_) | ControllerError::NotEnoughBrokers { .. } => ErrorCode::InvalidConfig,
            ControllerError::BrokerIdInUse { .. }
            | ControllerError::InvalidIsr(_)
            | ControllerError::InvalidBrokerId
            | ControllerError::UnknownBroker(_)
            | ControllerError::InvalidReassignment(_)
            | ControllerError::ElectionRefused(_)
            | ControllerError::InvalidProposal(_)
            | ControllerError::UnknownUser(_)
            | ControllerError::InvalidUser(_)
            | ControllerError::InvalidAcl(_)
            | ControllerError::UnknownAcl(_) => ErrorCode::InvalidRequest,
            ControllerError::CannotDecommission { .. } => ErrorCode::InvalidConfig,
            ControllerError::StaleIsrChange { .. } => ErrorCode::NotLeader,
        }
    }
}
