//! Proposals that apply once however often they are committed.
//!
//! A controller member that proposes a command (`Controller::propose`)
//! cannot always tell whether a try was committed: the answer to a
//! proposal it forwarded to the leader can be lost with the connection,
//! and a leader can step down with the entry in its log, which its
//! successor then commits. It sends the command again, so the log can hold
//! it twice. Each proposal therefore carries an id ([`ProposalId`]: node,
//! run, number) inside [`super::Command::Once`], and the table keeps, per
//! proposer run, what each proposal it may still send again answered
//! ([`ProposalSession`]): a second copy answers the same and changes
//! nothing (the client sessions of the Raft thesis, §6.3). The sessions are
//! part of the table, so every member and every snapshot decide a copy the
//! same way.
//!
//! Runs on: shard 0 (the state machine applies them; the proposer numbers
//! them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::ControllerError;
use super::table::NodeId;

/// What applying a command answers.
pub type CommandAnswer = Result<(), ControllerError>;

/// The id of a proposal that applies once ([`super::Command::Once`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalId {
    /// The node whose controller member proposed it.
    pub node: NodeId,
    /// That member's run (drawn at random when it starts).
    pub run: u64,
    /// The proposal's number within the run, from 1.
    pub seq: u64,
    /// Every proposal of the run numbered below this has ended at the
    /// proposer, which sends none of them again: their answers are
    /// forgotten, and a copy committed late is refused.
    pub settled_below: u64,
}

/// Proposer runs kept per node (a node's restarts each start one; the one
/// proposing least recently goes first). A copy from a run dropped so is
/// taken as new and applies again: that needs this many newer runs of the
/// node, each proposing, while the copy is still on its way — restarts
/// within the proposer's 10 s of retries, which a start (seconds) makes
/// implausible. (Runs are random, not ordered: a wiped disk must not
/// leave a node unable to propose.)
pub(crate) const MAX_SESSIONS_PER_NODE: usize = 8;
/// Answers kept per run, should a proposer never settle its proposals: far
/// above what a broker has in flight (it settles each within 10 s), so it
/// never settles a live one; only a broker, which is trusted, proposes.
pub(crate) const MAX_ANSWERS_PER_SESSION: usize = 65_536;

/// One proposer run's proposals that may still be sent again, with what
/// each answered (part of the table so every member, and one restored
/// from a snapshot, decides a copy the same way).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalSession {
    pub node: NodeId,
    pub run: u64,
    /// [`ProposalId::settled_below`], the highest seen.
    pub settled_below: u64,
    /// Applied proposals numbered from `settled_below`, by number.
    pub answered: BTreeMap<u64, CommandAnswer>,
    /// The log index of the run's last proposal.
    pub last_index: u64,
}
