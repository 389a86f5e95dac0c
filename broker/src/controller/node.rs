//! This node's member of the controller's Raft group: start it (recovering
//! its log and snapshot), propose commands from any node, serve the other
//! members' messages, stop it.
//!
//! Runs on: shard 0.
//!
//! Voters are static (KRaft-style): every voter starts with the same list
//! and initialises the group with it on its first start (openraft accepts
//! the same initial membership from every voter).
//!
//! A voter that starts without a Raft log may be new or may have lost its
//! disk (KIP-853's concern): a voter that forgot its log and its vote could
//! vote twice in one term, or for a candidate that lacks entries only the
//! lost log and the others held — a committed entry lost. So before it
//! initialises, it asks the other voters (`ControllerOp::Status`): while a
//! majority (itself included) says no leader was ever elected, it is a new
//! group and it initialises; once one says the group exists, it *rejoins*:
//! it does not initialise, takes no part in elections (neither votes nor
//! campaigns) and answers no vote until it holds as much log as a
//! majority of the other voters held when it asked; meanwhile it takes
//! log entries only from a leader of at least the highest term they had
//! seen (a voter that led before starts again as leader of its old term,
//! and the lost log's acknowledgements must not let it commit). A leader
//! elected without its vote holds everything committed. It answers no
//! vote while it asks either: from the moment it opens without a log
//! until it knows the group is new. A marker file (`rejoining`) keeps it
//! so across a restart meanwhile, and while it is there the member says
//! the group exists when another voter asks (its own empty log does not
//! make a group look new). A single node is a
//! one-voter group, elected at once. A node that is not a voter (an
//! observer broker) asks the voters to add it as a learner: it receives
//! the log and applies it, and votes in nothing. A proposal made where the
//! member does not lead is forwarded to the leader (`network.rs`); the
//! caller returns once its own node has applied it, so what it created is
//! visible here at once.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{AsyncRuntime, BasicNode, Raft};
use strand_wire::{ControllerOp, ErrorCode};

use super::leases::Leases;
use super::network::{to_json, Links, Refusal, PROPOSE_TIMEOUT};
use super::proposals::ProposalId;
use super::runtime::GlommioRuntime;
use super::stm::{Command, ControllerError, MetadataStm};
use super::store::{LogStore, Publish, StateMachineStore, TypeConfig};
use super::table::NodeId;
use crate::lease::{mono_ms, OwnLease};

/// Why a proposal did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// Committed, and refused by the state machine.
    #[error(transparent)]
    Refused(#[from] ControllerError),
    /// Not committed: no leader reachable, storage failed, shutting down.
    #[error("controller unavailable: {0}")]
    Unavailable(String),
}

/// A voter of the controller's Raft group: a node id and that node's
/// advertised client address (where its controller member is reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Voter {
    pub id: u64,
    pub address: SocketAddr,
}

/// A member's answer to `ControllerOp::Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct MemberStatus {
    /// Its log goes past the initial membership: a leader was elected.
    holds_cluster: bool,
    last_log_index: Option<u64>,
    leader: Option<u64>,
    /// The highest term it has seen (absent from older members: 0).
    #[serde(default)]
    term: u64,
    /// It lost its log and catches up (its rejoining marker is there): its
    /// answer says nothing of what the group committed.
    #[serde(default)]
    rejoining: bool,
}

/// The file, in the member's directory, that says it rejoins (see the
/// module doc): made before it takes part in the group without a log,
/// removed once it caught up.
const REJOINING_FILE: &str = "rejoining";

/// A learner's request to join (`ControllerOp::AddLearner`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct LearnerRequest {
    id: u64,
    address: String,
}

/// Reads `data` as every payload a controller member decodes from a peer
/// but a command (the fuzz target `controller_payload`, `crate::fuzzing`,
/// decodes and applies those itself): none may panic. Also as the records
/// of a raft log file and as a controller response body.
#[doc(hidden)]
pub fn decode_payloads(data: &[u8]) {
    // (`Command`: decoded and applied by the caller.)
    let _ = serde_json::from_slice::<LearnerRequest>(data);
    let _ = serde_json::from_slice::<Heartbeat>(data);
    let _ = serde_json::from_slice::<openraft::raft::VoteRequest<u64>>(data);
    let _ = serde_json::from_slice::<AppendEntriesRequest<TypeConfig>>(data);
    let _ = serde_json::from_slice::<InstallSnapshotRequest<TypeConfig>>(data);
    let _ = super::network::decode_response(data);
    let (records, end) = super::store::count_records(data);
    assert!(end <= data.len() && (records == 0 || end > 0));
}

/// A broker's lease renewal (`ControllerOp::BrokerHeartbeat`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Heartbeat {
    id: u64,
    address: String,
    shards: u16,
    /// This run of the broker process (`BrokerRecord::incarnation`).
    #[serde(default)]
    incarnation: u64,
    /// Its data directory's id (`BrokerRecord::directory`; 0 from brokers
    /// that predate directory ids).
    #[serde(default)]
    directory: u64,
}

/// Where the controller leader is, as this member knows it.
enum Leader {
    Here,
    At(SocketAddr),
    Unknown,
}

/// What one call to the leader came to.
enum Forwarded {
    Answered(Vec<u8>),
    /// No answer worth keeping (it stopped leading, or did not answer):
    /// find the leader again and retry; the reason, for the final error.
    AskAgain(String),
}

/// How this node's member runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_id: u64,
    /// The address this node's peers and clients reach it at.
    pub advertised: SocketAddr,
    /// Every voter (this node alone for a single node).
    pub voters: Vec<Voter>,
    /// This node's shard count (registered with the broker).
    pub shards: u16,
    /// This node's data directory id (registered with the broker; see
    /// `BrokerRecord::directory`).
    pub directory: u64,
    pub heartbeat_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// How often this broker renews its lease with the leader.
    pub broker_heartbeat_ms: u64,
    /// How long a lease lasts unrenewed before the leader fences the broker.
    pub broker_session_ms: u64,
    /// How often the leader gives leaderships back to preferred replicas
    /// (0: never).
    pub leader_balance_interval_ms: u64,
    /// The largest frame a peer's answer may be.
    pub max_frame_bytes: u32,
    /// How links to the other members secure themselves (TLS, login).
    pub peer: crate::frame_io::PeerSecurity,
}

/// The running controller member.
pub struct Controller {
    raft: Raft<TypeConfig>,
    node_id: u64,
    /// Its state's directory.
    dir: std::path::PathBuf,
    /// A voter that lost its log catching up: it answers no vote and
    /// campaigns not (see the module doc).
    rejoining: std::cell::Cell<bool>,
    /// The rejoining marker file is there (read once at start, then kept
    /// in step with it): the group exists, this voter lost its log.
    rejoin_marked: std::cell::Cell<bool>,
    /// A rejoining voter: the highest term and log index a majority of
    /// the other voters reported (`Controller::learn_rejoin_floor`). It
    /// takes log entries only from a leader of at least that term, and
    /// votes again once its log reaches that index.
    rejoin_floor: std::cell::Cell<Option<(u64, u64)>>,
    links: Links,
    sm: StateMachineStore,
    /// Every broker's lease, while this member leads.
    leases: RefCell<Leases>,
    /// Set once this broker shuts down on purpose: it renews its lease no
    /// more (a renewal would register it alive again after its
    /// `ShutdownBroker`).
    leaving: std::cell::Cell<bool>,
    /// A lease renewal of this broker's is on its way.
    beating: std::cell::Cell<bool>,
    /// This broker's lease as it counts it (`crate::lease`): moved on by
    /// every renewal that succeeds. Its incarnation is this run's.
    own_lease: OwnLease,
    /// How long another broker's renewal may take here (two of its beats:
    /// it gives up on an answer after that).
    renewal_within: Duration,
    /// Numbers this run's proposals ([`Command::Once`]).
    proposals: Proposer,
}

/// Numbers a controller member's proposals and knows which are still in
/// flight (sent, perhaps again, until `Controller::propose` returns), so
/// that each id says below which number none will be sent again.
#[derive(Debug)]
struct Proposer {
    node: u64,
    /// Drawn when the member starts: another run's numbers are its own.
    run: u64,
    next: std::cell::Cell<u64>,
    in_flight: RefCell<std::collections::BTreeSet<u64>>,
}

impl Proposer {
    fn new(node: u64) -> Proposer {
        Proposer {
            node,
            run: rand::random(),
            next: std::cell::Cell::new(1),
            in_flight: RefCell::default(),
        }
    }

    /// `command` with the next id; in flight until the guard drops.
    fn number(&self, command: Command) -> (Command, InFlight<'_>) {
        let seq = self.next.get();
        self.next.set(seq + 1);
        let mut in_flight = self.in_flight.borrow_mut();
        in_flight.insert(seq);
        let settled_below = *in_flight.first().expect("holds seq");
        let id = ProposalId {
            node: self.node,
            run: self.run,
            seq,
            settled_below,
        };
        let once = Command::Once {
            id,
            command: Box::new(command),
        };
        (once, InFlight { proposer: self, seq })
    }
}

/// A proposal in flight; ends when dropped (returned, or the caller went).
struct InFlight<'a> {
    proposer: &'a Proposer,
    seq: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.proposer.in_flight.borrow_mut().remove(&self.seq);
    }
}

impl Controller {
    /// Opens the member with its state in `dir`. It serves the other
    /// members from now on ([`Controller::serve`]); [`Controller::join`]
    /// then initialises the group (a voter's first start) or rejoins it,
    /// and waits until it can be used.
    pub async fn open(
        dir: &Path,
        settings: &Settings,
        publish: Publish,
        own_lease: OwnLease,
    ) -> Result<Controller, ProposeError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| ProposeError::Unavailable(format!("{what}: {e}"));
        let node_id = settings.node_id;
        let log = LogStore::open(dir)
            .await
            .map_err(|e| unavailable("opening the Raft log", &e))?;
        let sm = StateMachineStore::open(dir, publish).map_err(|e| unavailable("opening the Raft snapshot", &e))?;
        // A member marked as rejoining by an earlier run campaigns not
        // from its first tick (its log may hold a membership already).
        let marked = dir.join(REJOINING_FILE).exists();
        let config = openraft::Config {
            cluster_name: "strand".into(),
            heartbeat_interval: settings.heartbeat_ms,
            election_timeout_min: settings.election_min_ms,
            election_timeout_max: settings.election_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
            enable_elect: !marked,
            ..Default::default()
        }
        .validate()
        .map_err(|e| unavailable("Raft config", &e))?;
        let links = Links::new(node_id, settings.max_frame_bytes, settings.peer.clone());
        let raft = Raft::new(node_id, Arc::new(config), links.clone(), log, sm.clone())
            .await
            .map_err(|e| unavailable("starting Raft", &e))?;
        // A voter without a log answers no vote until it knows whether the
        // group is new (`initialize_or_rejoin`): it serves the others from
        // now on, and a vote granted by a lost log could elect a candidate
        // that lacks committed entries.
        let voter = settings.voters.iter().any(|v| v.id == node_id);
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| unavailable("reading the Raft state", &e))?;
        Ok(Controller {
            raft,
            node_id,
            dir: dir.to_path_buf(),
            rejoining: std::cell::Cell::new(voter && (marked || !initialized)),
            rejoin_marked: std::cell::Cell::new(marked),
            rejoin_floor: std::cell::Cell::new(None),
            links,
            sm,
            leases: RefCell::new(Leases::new(Duration::from_millis(settings.broker_session_ms))),
            leaving: std::cell::Cell::new(false),
            beating: std::cell::Cell::new(false),
            own_lease,
            renewal_within: Duration::from_millis(2 * settings.broker_heartbeat_ms),
            proposals: Proposer::new(node_id),
        })
    }

    /// Waits until the group has a leader and this member has applied its
    /// log, then registers this broker (id, advertised address, shards) if
    /// the table does not hold it so.
    pub async fn join(&self, settings: &Settings) -> Result<(), ProposeError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| ProposeError::Unavailable(format!("{what}: {e}"));
        let (raft, node_id) = (&self.raft, self.node_id);
        if settings.voters.iter().any(|v| v.id == node_id) {
            self.initialize_or_rejoin(settings).await?;
        } else {
            self.join_as_learner(settings).await?;
        }
        if self.rejoining.get() {
            self.learn_rejoin_floor(settings).await?;
        }
        let wait = |secs| raft.wait(Some(Duration::from_secs(secs)));
        wait(60)
            .metrics(|m| m.current_leader.is_some(), "the controller elects a leader")
            .await
            .map_err(|_| {
                let voters: Vec<String> = settings
                    .voters
                    .iter()
                    .map(|v| format!("{}@{}", v.id, v.address))
                    .collect();
                ProposeError::Unavailable(format!(
                    "no controller leader within 60 s: a majority of the voters ({}) must be running and reach \
                     each other at those addresses",
                    voters.join(", ")
                ))
            })?;
        // Apply everything in the log before serving from the table: as the
        // log is now, not as it was at the start — entries this member
        // wrote as a leader that lost its majority are cut when the new
        // leader's log replaces them, and may never be reached again.
        wait(30)
            .metrics(
                |m| m.last_applied.map(|l| l.index) >= m.last_log_index,
                "the controller replays its log",
            )
            .await
            .map_err(|e| unavailable("replaying the controller log", &e))?;
        if self.rejoining.get() {
            self.catch_up(settings).await?;
        }
        self.register(settings).await
    }

    /// A voter without a Raft log: initialises the group if it is new, or
    /// rejoins it (see the module doc). A voter with a log, or marked as
    /// rejoining by an earlier run, skips the question.
    async fn initialize_or_rejoin(&self, settings: &Settings) -> Result<(), ProposeError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| ProposeError::Unavailable(format!("{what}: {e}"));
        if self.rejoin_marked.get() {
            return self.rejoin();
        }
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|e| unavailable("reading the Raft state", &e))?;
        if initialized {
            return Ok(());
        }
        let majority = settings.voters.len() / 2 + 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut said = Instant::now();
        loop {
            let mut fresh = 1;
            for (id, status) in self.ask_others(settings).await {
                let status = status.map_err(|e| unavailable(&format!("a malformed status from voter {id}"), &e))?;
                if status.holds_cluster {
                    tracing::warn!(
                        "this voter has no controller log, and voter {id} says the controller group exists: its log \
                         was lost (a wiped or new disk); it takes no part in elections until it holds the leader's log"
                    );
                    return self.rejoin();
                }
                fresh += 1;
            }
            if fresh >= majority {
                break;
            }
            if Instant::now() > deadline {
                return Err(ProposeError::Unavailable(format!(
                    "this voter has no controller log, and a majority of the voters did not say within 60 s whether \
                     the controller group exists ({fresh} of {} did)",
                    settings.voters.len()
                )));
            }
            if said.elapsed() > Duration::from_secs(5) {
                said = Instant::now();
                tracing::info!("waiting for a majority of the voters to say whether the controller group exists");
            }
            glommio::timer::sleep(Duration::from_millis(200)).await;
        }
        // A new group: this member votes from now on.
        self.rejoining.set(false);
        let members: BTreeMap<u64, BasicNode> = settings
            .voters
            .iter()
            .map(|v| (v.id, BasicNode::new(v.address.to_string())))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(unavailable("initialising the Raft group", &e)),
        }
    }

    /// Takes this member out of elections until [`Controller::catch_up`],
    /// durably (the marker file).
    fn rejoin(&self) -> Result<(), ProposeError> {
        let marker = self.dir.join(REJOINING_FILE);
        let made = std::fs::write(
            &marker,
            b"this voter lost its Raft log and catches up before it votes\n",
        )
        .and_then(|()| std::fs::File::open(&self.dir)?.sync_all());
        made.map_err(|e| ProposeError::Unavailable(format!("writing {}: {e}", marker.display())))?;
        self.raft.runtime_config().elect(false);
        self.rejoining.set(true);
        self.rejoin_marked.set(true);
        Ok(())
    }

    /// A rejoining voter learns how far it must catch up before it takes
    /// part again: the highest term and log index that n - n/2 of the n
    /// voters, itself not counted, report (`ControllerOp::Status`; voters
    /// catching up themselves do not count). Every quorum keeps that many
    /// besides this one, so they hold every committed entry and include a
    /// voter of every election held without this one, so a leader of at
    /// least that term is current, and that index covers everything
    /// committed. One leader's word is not enough: a voter that led before
    /// starts again as leader of its old term, and with this voter's lost
    /// log it could commit without the entries a later leader committed
    /// (`broker/tests/offline.rs`). With no majority of the others
    /// reachable it waits (up to a minute, then the start fails).
    async fn learn_rejoin_floor(&self, settings: &Settings) -> Result<(), ProposeError> {
        // Every quorum of n voters keeps at least n/2 of them besides this
        // one, so n - n/2 of the others always include one of each.
        let n = settings.voters.len();
        let needed = n - n / 2;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut said = Instant::now();
        loop {
            let (mut answers, mut term, mut index) = (0, 0, 0);
            for (_, status) in self.ask_others(settings).await {
                let Ok(status) = status else { continue };
                if status.rejoining {
                    continue;
                }
                answers += 1;
                term = term.max(status.term);
                index = index.max(status.last_log_index.unwrap_or(0));
            }
            if answers >= needed {
                tracing::info!(
                    term,
                    index,
                    "this voter catches up: it takes the log from a leader of term {term} or later and votes again \
                     once it holds index {index}"
                );
                self.rejoin_floor.set(Some((term, index)));
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(ProposeError::Unavailable(format!(
                    "this voter lost its controller log and needs {needed} of the other voters to say how far the \
                     log goes; {answers} answered within 60 s"
                )));
            }
            if said.elapsed() > Duration::from_secs(5) {
                said = Instant::now();
                tracing::info!(
                    "this voter lost its controller log: waiting for {needed} of the other voters to say how far \
                     the log goes ({answers} answer)"
                );
            }
            glommio::timer::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Asks every voter but this one for its status (`ControllerOp::Status`,
    /// 1 s each): the answers, each with its voter's id (a malformed one as
    /// the error); a voter that does not answer is left out.
    async fn ask_others(&self, settings: &Settings) -> Vec<(u64, Result<MemberStatus, String>)> {
        let mut answers = Vec::new();
        for v in settings.voters.iter().filter(|v| v.id != self.node_id) {
            let answer = self
                .links
                .call(v.address, ControllerOp::Status, b"{}", Duration::from_secs(1))
                .await;
            if let Ok(Ok(payload)) = answer {
                answers.push((v.id, serde_json::from_slice(&payload).map_err(|e| e.to_string())));
            }
        }
        answers
    }

    /// A rejoining voter: waits until its log holds the index of its floor
    /// ([`Controller::learn_rejoin_floor`]), and takes part in elections
    /// again.
    async fn catch_up(&self, settings: &Settings) -> Result<(), ProposeError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut asked = Instant::now();
        while Instant::now() < deadline {
            let Some((_, target)) = self.rejoin_floor.get() else {
                return Err(ProposeError::Unavailable("a rejoining voter without its floor".into()));
            };
            // The index may have been a deposed leader's uncommitted tail
            // that its successor cut: asked again every 5 s (any floor
            // learned later is as safe).
            if asked.elapsed() > Duration::from_secs(5) {
                self.learn_rejoin_floor(settings).await?;
                asked = Instant::now();
                continue;
            }
            let last = self.raft.metrics().borrow().last_log_index;
            if last.unwrap_or(0) >= target {
                if let Err(e) = std::fs::remove_file(self.dir.join(REJOINING_FILE))
                    .and_then(|()| std::fs::File::open(&self.dir)?.sync_all())
                {
                    return Err(ProposeError::Unavailable(format!("removing the rejoining marker: {e}")));
                }
                self.rejoining.set(false);
                self.rejoin_marked.set(false);
                self.rejoin_floor.set(None);
                self.raft.runtime_config().elect(true);
                tracing::info!("this voter holds the controller log again (index {target}): it votes again");
                return Ok(());
            }
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
        Err(ProposeError::Unavailable(
            "this voter lost its controller log and did not catch up with a leader within 60 s".into(),
        ))
    }

    /// A leader's request decoded from `payload`, unless this member, a
    /// rejoining voter, refuses the term of its `vote` ([`Controller::rejoin_refusal`]).
    fn leader_request<R: serde::de::DeserializeOwned>(
        &self,
        payload: &[u8],
        vote: impl Fn(&R) -> openraft::Vote<u64>,
    ) -> Result<R, Refusal> {
        let request: R = serde_json::from_slice(payload).map_err(|e| Refusal {
            code: ErrorCode::InvalidRequest,
            message: format!("a malformed controller payload: {e}"),
            leader: 0,
        })?;
        match self.rejoin_refusal(vote(&request).leader_id().term) {
            Some(refusal) => Err(refusal),
            None => Ok(request),
        }
    }

    /// Why a rejoining voter refuses log entries from a leader of `term`
    /// (see [`Controller::learn_rejoin_floor`]), if it does.
    fn rejoin_refusal(&self, term: u64) -> Option<Refusal> {
        if !self.rejoining.get() {
            return None;
        }
        let why = match self.rejoin_floor.get() {
            Some((floor, _)) if term >= floor => return None,
            Some((floor, _)) => format!("a leader of term {term}, below the term {floor} a majority has seen"),
            None => "no majority of the other voters has said yet how far the log goes".to_string(),
        };
        Some(Refusal {
            code: ErrorCode::ControllerUnavailable,
            message: format!(
                "voter {} lost its controller log and takes no entries from {why}",
                self.node_id
            ),
            leader: 0,
        })
    }

    /// This member's answer to `ControllerOp::Status` (no file read: it
    /// runs on shard 0's executor, which also runs the Raft core).
    /// `rejoining` only once marked: a voter still asking whether the
    /// group exists counts towards another's floor (at a new cluster's
    /// first start every voter asks at once, and excluding them all left
    /// none to answer).
    fn status(&self) -> MemberStatus {
        let m = self.raft.metrics().borrow().clone();
        MemberStatus {
            holds_cluster: m.last_log_index.is_some_and(|i| i >= 1) || self.rejoin_marked.get(),
            last_log_index: m.last_log_index,
            leader: m.current_leader,
            term: m.current_term,
            rejoining: self.rejoin_marked.get(),
        }
    }

    /// Registers this broker through its first lease renewal. While another
    /// broker holds this id's lease, retries for a session and a half (the
    /// holder may be this broker's previous run at another address, whose
    /// lease runs out), then gives up with the holder's address.
    async fn register(&self, settings: &Settings) -> Result<(), ProposeError> {
        let session = Duration::from_millis(settings.broker_session_ms);
        let started = Instant::now();
        let give_up = started + session * 3 / 2;
        loop {
            match self.heartbeat(settings, PROPOSE_TIMEOUT).await {
                Err(ProposeError::Refused(e @ ControllerError::BrokerIdInUse { .. })) if Instant::now() >= give_up => {
                    return Err(ProposeError::Refused(e))
                }
                Err(ProposeError::Refused(ControllerError::BrokerIdInUse { .. })) => {
                    glommio::timer::sleep(Duration::from_millis(settings.broker_heartbeat_ms)).await
                }
                // No leader could renew it: the leader this member knew
                // may be gone while the others cannot elect one yet (a
                // majority not back, a voter catching up); up to a minute,
                // as for a leader at the start.
                Err(ProposeError::Unavailable(why)) if started.elapsed() < Duration::from_secs(60) => {
                    tracing::info!("registering this broker: {why}; trying again");
                    glommio::timer::sleep(Duration::from_millis(settings.broker_heartbeat_ms)).await
                }
                Err(e) => return Err(e),
                Ok(()) => break,
            }
        }
        // Registered at the leader: wait until this node applied it too —
        // this run's registration, not the previous run's record. A broker
        // killed and started again within its session still shows alive at
        // its address in the table it replays, leading what it led; served
        // from that table it took produces as a leader the controller had
        // replaced (its registration moves those leaderships), and with a
        // follower as stale committed records the new leader lacked (a
        // 30-minute strand-chaos run: a follower found its leader's log
        // parting below its high watermark).
        let address = settings.advertised.to_string();
        let deadline = Instant::now() + PROPOSE_TIMEOUT;
        while !self.sm.with_table(|t| {
            t.brokers
                .get(&self.node_id)
                .is_some_and(|b| b.alive && b.address == address && b.incarnation == self.own_lease.incarnation())
        }) {
            if Instant::now() > deadline {
                return Err(ProposeError::Unavailable(format!(
                    "this node did not apply its own registration within {PROPOSE_TIMEOUT:?}"
                )));
            }
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Renews this broker's lease every `broker_heartbeat_ms` (each renewal
    /// bounded by two beats, the next one due a beat after the last began),
    /// and runs the fencing ([`Controller::fence_expired`]) in a task of its
    /// own so that a slow fence never delays this broker's own renewal;
    /// until the member stops. A renewal that fails is logged and tried
    /// again at the next beat (a lost leader, a refused id: the next leader
    /// or the operator sorts it out).
    pub async fn keep_alive(self: Rc<Self>, settings: Settings) {
        let beat = Duration::from_millis(settings.broker_heartbeat_ms);
        let fencer = self.clone();
        let balance_every = Duration::from_millis(settings.leader_balance_interval_ms);
        let fencing = glommio::spawn_local(async move {
            let mut balanced = Instant::now();
            loop {
                glommio::timer::sleep(beat).await;
                fencer.fence_expired(beat * 2).await;
                if !balance_every.is_zero() && balanced.elapsed() >= balance_every {
                    balanced = Instant::now();
                    fencer.balance_leaders(beat * 2, beat * 2).await;
                }
            }
        });
        let mut last_failure = String::new();
        let mut next = Instant::now() + beat;
        loop {
            glommio::timer::sleep(next.saturating_duration_since(Instant::now())).await;
            next = Instant::now() + beat;
            if self.leaving.get() {
                continue;
            }
            self.beating.set(true);
            let renewed = self.heartbeat(&settings, beat * 2).await;
            self.beating.set(false);
            match renewed {
                Ok(()) => last_failure.clear(),
                Err(e) => {
                    let why = e.to_string();
                    if why != last_failure {
                        tracing::warn!("renewing broker {}'s lease: {why}", self.node_id);
                        last_failure = why;
                    }
                }
            }
            if self.raft.metrics().borrow().state == openraft::ServerState::Shutdown {
                drop(fencing);
                return;
            }
        }
    }

    /// This broker is shutting down on purpose: it stops renewing its lease
    /// (see [`crate::controller::Command::ShutdownBroker`]), and returns once
    /// no renewal is on its way (one could otherwise register the broker
    /// alive again after its `ShutdownBroker`); at most `within`. Returns
    /// this run's incarnation, for the `ShutdownBroker`.
    pub async fn leave(&self, within: Duration) -> u64 {
        self.leaving.set(true);
        let deadline = Instant::now() + within;
        while self.beating.get() && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        self.own_lease.incarnation()
    }

    /// Where the leader is, from this member's Raft metrics.
    fn leader(&self) -> Leader {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        match m.current_leader {
            Some(id) if id == self.node_id => Leader::Here,
            Some(id) => m
                .membership_config
                .membership()
                .get_node(&id)
                .and_then(|n| n.addr.parse().ok())
                .map_or(Leader::Unknown, Leader::At),
            None => Leader::Unknown,
        }
    }

    /// This broker's lease renewal, at the leader (here, or over a peer link),
    /// within `within`. One that succeeds holds this broker's own lease
    /// from the time it was first sent (`crate::lease`).
    async fn heartbeat(&self, settings: &Settings, within: Duration) -> Result<(), ProposeError> {
        let sent_ms = mono_ms();
        let renewed = self.heartbeat_once(settings, within).await;
        if renewed.is_ok() {
            self.own_lease.renewed(sent_ms, settings.broker_session_ms);
        }
        renewed
    }

    async fn heartbeat_once(&self, settings: &Settings, within: Duration) -> Result<(), ProposeError> {
        let request = Heartbeat {
            id: self.node_id,
            address: settings.advertised.to_string(),
            shards: settings.shards,
            incarnation: self.own_lease.incarnation(),
            directory: settings.directory,
        };
        let deadline = Instant::now() + within;
        let mut last_error = String::from("no controller leader");
        let mut payload = None;
        while Instant::now() < deadline {
            match self.leader() {
                Leader::Here => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.renew_lease(&request, left).await {
                        // Not the leader after all (a member started again
                        // believes its old term for a moment), or no quorum
                        // yet: ask again, wherever the leader is then.
                        Err(ProposeError::Unavailable(why)) => last_error = why,
                        answered => return answered,
                    }
                }
                Leader::At(addr) => {
                    let payload = payload.get_or_insert_with(|| to_json(&request));
                    match self
                        .forward(addr, ControllerOp::BrokerHeartbeat, payload, deadline)
                        .await?
                    {
                        Forwarded::Answered(answer) => {
                            let renewed: Result<(), ControllerError> = leaders_answer(&answer)?;
                            return renewed.map_err(ProposeError::Refused);
                        }
                        Forwarded::AskAgain(why) => last_error = why,
                    }
                }
                Leader::Unknown => {}
            }
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
        Err(ProposeError::Unavailable(format!(
            "no controller leader renewed the lease within {within:?}: {last_error}"
        )))
    }

    /// At the leader: renews broker `request.id`'s lease and registers it
    /// (alive) when the lease is new or the table does not show it alive at
    /// that address. It answers only once a quorum has confirmed, after the
    /// lease was renewed here, that this member still leads (a round of
    /// heartbeats, within `within`; also after a registration, which a
    /// later leader may still commit from this member's log): a leader deposed
    /// without knowing it must not grant a renewal, since the broker then
    /// holds its own lease (`crate::lease`) past the session the new leader
    /// gives it.
    async fn renew_lease(&self, request: &Heartbeat, within: Duration) -> Result<(), ProposeError> {
        // Refused before it takes a lease (the state machine refuses it too).
        if request.id == 0 {
            return Err(ProposeError::Refused(ControllerError::InvalidBrokerId));
        }
        let term = self.raft.metrics().borrow().current_term;
        let known = self.sm.with_table(|table| {
            let fresh = self
                .leases
                .borrow_mut()
                .renew(term, table, request.id, &request.address, Instant::now())?;
            Ok::<bool, ControllerError>(
                !fresh
                    && table.brokers.get(&request.id).is_some_and(|b| {
                        b.alive
                            && b.address == request.address
                            && b.shards == request.shards
                            && b.incarnation == request.incarnation
                            && (request.directory == 0 || b.directory == request.directory)
                    }),
            )
        })?;
        if !known {
            // Committed here, as the leader that granted the lease, or not
            // at all: the broker asks the next leader.
            self.propose_where(
                Command::RegisterBroker {
                    id: request.id,
                    address: request.address.clone(),
                    shards: request.shards,
                    incarnation: request.incarnation,
                    directory: request.directory,
                },
                false,
            )
            .await?;
        }
        match GlommioRuntime::timeout(within, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ProposeError::Unavailable(format!(
                "renewing broker {}'s lease: this member could not confirm it leads: {e}",
                request.id
            ))),
            Err(_) => Err(ProposeError::Unavailable(format!(
                "renewing broker {}'s lease: this member could not confirm it leads within {within:?}",
                request.id
            ))),
        }
    }

    /// While this member leads: fences every broker alive in the table whose
    /// lease ran out (each looked at again just before, each committed
    /// here within `within` or not at all: a fence is never forwarded, and
    /// it applies only in this leader's term, see `Command::FenceBroker`).
    async fn fence_expired(&self, within: Duration) {
        let (term, leader) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            (m.current_term, m.current_leader)
        };
        if leader != Some(self.node_id) {
            return;
        }
        let expired = self
            .sm
            .with_table(|table| self.leases.borrow_mut().expired(term, table, Instant::now()));
        for id in expired {
            if !self.leases.borrow().has_expired(id, Instant::now()) {
                continue;
            }
            tracing::warn!("broker {id}'s lease expired: fencing it");
            let write = self.raft.client_write(Command::FenceBroker { id, term });
            match GlommioRuntime::timeout(within, write).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!("fencing broker {id}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!("fencing broker {id}: not committed within {within:?}");
                    return;
                }
            }
        }
    }

    /// While this member leads: hands leaderships back to the preferred
    /// replicas that are alive and in sync, if any partition needs it
    /// (committed here within `within`, or tried again next time). Not
    /// while one of those replicas has not renewed its lease within
    /// `recent` (it may have crashed, its lease not yet run out: its new
    /// leaderships would be offline until it is fenced); the next round
    /// looks again.
    async fn balance_leaders(&self, within: Duration, recent: Duration) {
        let leader = self.raft.metrics().borrow().current_leader;
        if leader != Some(self.node_id) {
            return;
        }
        let to = self.sm.with_table(MetadataStm::unbalanced_leaders);
        if to.is_empty() {
            return;
        }
        let now = Instant::now();
        let quiet: Vec<super::table::NodeId> = {
            let leases = self.leases.borrow();
            to.keys()
                .copied()
                .filter(|id| !leases.renewed_within(*id, recent, now))
                .collect()
        };
        if !quiet.is_empty() {
            tracing::info!("leader balancing waits: brokers {quiet:?} have not renewed their leases lately");
            return;
        }
        let unbalanced: usize = to.values().sum();
        tracing::info!("giving {unbalanced} leaderships back to their preferred replicas");
        let write = self.raft.client_write(Command::BalanceLeaders);
        match GlommioRuntime::timeout(within, write).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!("balancing leaders: {e}"),
            Err(_) => tracing::warn!("balancing leaders: not committed within {within:?}"),
        }
    }

    /// One call to the leader at `addr` (`op` with `payload`, by `deadline`).
    async fn forward(
        &self,
        addr: SocketAddr,
        op: ControllerOp,
        payload: &[u8],
        deadline: Instant,
    ) -> Result<Forwarded, ProposeError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.links.call(addr, op, payload, left).await {
            Ok(Ok(answer)) => Ok(Forwarded::Answered(answer)),
            // It stopped leading meanwhile: ask again who leads. Or its
            // member is still starting (every node restarted at once: Raft
            // elected it before its broker side serves): ask again too.
            Ok(Err(r)) if matches!(r.code, ErrorCode::NotLeader | ErrorCode::ControllerUnavailable) => {
                Ok(Forwarded::AskAgain(r.message))
            }
            Ok(Err(r)) => Err(ProposeError::Unavailable(r.message)),
            Err(e) => Ok(Forwarded::AskAgain(e.to_string())),
        }
    }

    /// A node that is not a voter: asks the voters (the leader, once one
    /// names it) to add it as a learner, unless the membership it holds
    /// already has it, and waits until it applied the membership that does.
    async fn join_as_learner(&self, settings: &Settings) -> Result<(), ProposeError> {
        let held = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .any(|id| id == self.node_id);
        if held {
            return Ok(());
        }
        let request = to_json(&LearnerRequest {
            id: self.node_id,
            address: settings.advertised.to_string(),
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let voters: Vec<SocketAddr> = settings.voters.iter().map(|v| v.address).collect();
        let (mut turn, mut named) = (0usize, None);
        let session = Duration::from_millis(settings.broker_session_ms);
        let mut refused_since: Option<Instant> = None;
        let mut last_error = String::from("no voter answered");
        while Instant::now() < deadline && !voters.is_empty() {
            // The leader a voter named, else the voters in turn.
            let addr = named.take().unwrap_or_else(|| {
                turn += 1;
                voters[(turn - 1) % voters.len()]
            });
            match self
                .links
                .call(addr, ControllerOp::AddLearner, &request, PROPOSE_TIMEOUT)
                .await
            {
                Ok(Ok(payload)) => {
                    let added: Result<u64, String> = serde_json::from_slice(&payload)
                        .map_err(|e| ProposeError::Unavailable(format!("a malformed answer from {addr}: {e}")))?;
                    match added {
                        Ok(index) => {
                            return self
                                .applied_here(index, deadline, "this learner applies its membership")
                                .await
                        }
                        // Refused (its id held by another address, which
                        // may be this node's previous run expiring): again
                        // for a session and a half, then give up.
                        Err(why) => {
                            let refused = *refused_since.get_or_insert_with(Instant::now);
                            if refused.elapsed() > session * 3 / 2 {
                                return Err(ProposeError::Unavailable(format!(
                                    "the controller leader did not add node {} as a learner: {why}",
                                    self.node_id
                                )));
                            }
                            last_error = why;
                        }
                    }
                }
                // Ask the leader it names next.
                Ok(Err(r)) if r.code == ErrorCode::NotLeader => {
                    named = settings.voters.iter().find(|v| v.id == r.leader).map(|v| v.address);
                    last_error = r.message;
                }
                Ok(Err(r)) => last_error = r.message,
                Err(e) => last_error = e.to_string(),
            }
            glommio::timer::sleep(Duration::from_millis(100)).await;
        }
        Err(ProposeError::Unavailable(format!(
            "node {} could not join the controller as a learner within 60 s: {last_error}",
            self.node_id
        )))
    }

    /// Waits until this member applied log `index` (by `deadline`).
    async fn applied_here(&self, index: u64, deadline: Instant, what: &str) -> Result<(), ProposeError> {
        self.raft
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .applied_index_at_least(Some(index), what)
            .await
            .map(|_| ())
            .map_err(|e| ProposeError::Unavailable(e.to_string()))
    }

    /// The refusal of a request only the leader serves.
    fn not_leader(&self, leader: Option<u64>) -> Refusal {
        Refusal {
            code: ErrorCode::NotLeader,
            message: format!("node {} does not lead the controller", self.node_id),
            leader: leader.unwrap_or(0),
        }
    }

    /// [`Controller::open`], then [`Controller::join`], with a lease of its
    /// own that no shard reads.
    pub async fn start(dir: &Path, settings: &Settings, publish: Publish) -> Result<Controller, ProposeError> {
        let controller = Controller::open(dir, settings, publish, OwnLease::default()).await?;
        controller.join(settings).await?;
        Ok(controller)
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Keeps `leader` at the controller leader this member knows of (0:
    /// none) until the member stops.
    pub async fn follow_leader(&self, leader: &std::sync::atomic::AtomicU64) {
        let mut metrics = self.raft.metrics();
        loop {
            let now = metrics.borrow().current_leader.unwrap_or(0);
            leader.store(now, std::sync::atomic::Ordering::Relaxed);
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Commits `command` through Raft — here if this member leads, else on
    /// the leader — and resolves once it is applied here (the new table has
    /// been published on this node). A try whose outcome it cannot know (a
    /// lost answer, a leader that stepped down) is sent again under the
    /// same id, which applies once ([`Command::Once`]).
    pub async fn propose(&self, command: Command) -> Result<(), ProposeError> {
        self.propose_where(command, true).await
    }

    /// [`Controller::propose`], forwarded to another leader only when
    /// `forward`: a proposal this member makes as the leader (a lease it
    /// grants for another broker) is not another leader's to commit, and
    /// the leader would refuse it (a broker speaks only for itself).
    async fn propose_where(&self, command: Command, forward: bool) -> Result<(), ProposeError> {
        let (command, _in_flight) = self.proposals.number(command);
        let deadline = Instant::now() + PROPOSE_TIMEOUT;
        let mut last_error = String::from("no controller leader");
        let mut forwarded = None;
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(written) = GlommioRuntime::timeout(left, self.raft.client_write(command.clone())).await else {
                break;
            };
            let leader = match written {
                Ok(resp) => return resp.data.map_err(ProposeError::Refused),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => f.leader_id.zip(f.leader_node),
                Err(e) => return Err(ProposeError::Unavailable(e.to_string())),
            };
            let Some((leader, node)) = leader else {
                glommio::timer::sleep(Duration::from_millis(50)).await;
                continue;
            };
            if !forward {
                return Err(ProposeError::Unavailable(format!(
                    "this member no longer leads the controller (node {leader} does)"
                )));
            }
            let Ok(addr) = node.addr.parse::<SocketAddr>() else {
                return Err(ProposeError::Unavailable(format!(
                    "the controller leader {leader}'s address {:?} is not HOST:PORT",
                    node.addr
                )));
            };
            let payload = forwarded.get_or_insert_with(|| to_json(&command));
            match self.forward(addr, ControllerOp::Propose, payload, deadline).await? {
                Forwarded::Answered(answer) => {
                    let applied: Result<u64, ControllerError> = leaders_answer(&answer)?;
                    return self
                        .applied_here(applied?, deadline, "a forwarded proposal is applied here")
                        .await;
                }
                Forwarded::AskAgain(why) => last_error = why,
            }
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
        Err(ProposeError::Unavailable(format!(
            "no controller leader committed the proposal within {PROPOSE_TIMEOUT:?}: {last_error}"
        )))
    }

    /// Serves another member's message (`op` with its JSON `payload`);
    /// the answer's payload is JSON too (see `network.rs`).
    ///
    /// `caller` is the logged-in broker that sent it (none: `--auth none`,
    /// nothing checked): a broker speaks only for itself — a vote asked or
    /// log entries sent as leader, a lease renewed, a learner added, and
    /// the proposals about a broker's own state ([`sent_for`]) must name
    /// it, or are refused with `NotAuthorized` and change nothing.
    pub async fn serve(&self, op: ControllerOp, payload: &[u8], caller: Option<NodeId>) -> Result<Vec<u8>, Refusal> {
        let bad = |e: serde_json::Error| Refusal {
            code: ErrorCode::InvalidRequest,
            message: format!("a malformed controller payload: {e}"),
            leader: 0,
        };
        let not_sender = |claimed: NodeId, what: &str| {
            super::network::sent_by(caller, claimed, what).map_err(|message| Refusal {
                code: ErrorCode::NotAuthorized,
                message,
                leader: 0,
            })
        };
        // A Raft message's sender is its vote's node: one naming none
        // (never sent by a member) counts as node 0, which no broker is.
        let voter = |vote: &openraft::Vote<u64>| vote.leader_id().voted_for().unwrap_or(0);
        match op {
            ControllerOp::Vote if self.rejoining.get() => Err(Refusal {
                code: ErrorCode::ControllerUnavailable,
                message: format!(
                    "voter {} has no controller log of its own yet (a new group, or a lost log it catches up \
                     on) and votes once it knows which",
                    self.node_id
                ),
                leader: 0,
            }),
            ControllerOp::Vote => {
                let request: VoteRequest<u64> = serde_json::from_slice(payload).map_err(bad)?;
                not_sender(voter(&request.vote), "a vote request")?;
                Ok(to_json(&self.raft.vote(request).await))
            }
            ControllerOp::Status => Ok(to_json(&self.status())),
            ControllerOp::AppendEntries => {
                let request = self.leader_request(payload, |r: &AppendEntriesRequest<TypeConfig>| r.vote)?;
                not_sender(voter(&request.vote), "log entries")?;
                Ok(to_json(&self.raft.append_entries(request).await))
            }
            ControllerOp::InstallSnapshot => {
                let request = self.leader_request(payload, |r: &InstallSnapshotRequest<TypeConfig>| r.vote)?;
                not_sender(voter(&request.vote), "a snapshot")?;
                Ok(to_json(&self.raft.install_snapshot(request).await))
            }
            ControllerOp::Propose => {
                let command: Command = serde_json::from_slice(payload).map_err(bad)?;
                for (claimed, what) in sent_for(&command) {
                    not_sender(claimed, what)?;
                }
                if caller.is_some() && command_is_leaders_own(&command) {
                    return Err(Refusal {
                        code: ErrorCode::NotAuthorized,
                        message: "a lease expiry is the controller leader's own proposal, never another broker's"
                            .to_string(),
                        leader: 0,
                    });
                }
                match self.raft.client_write(command).await {
                    Ok(resp) => Ok(to_json(&resp.data.map(|()| resp.log_id.index))),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(self.not_leader(f.leader_id)),
                    Err(e) => Err(Refusal {
                        code: ErrorCode::ControllerUnavailable,
                        message: e.to_string(),
                        leader: 0,
                    }),
                }
            }
            ControllerOp::AddLearner => {
                let learner: LearnerRequest = serde_json::from_slice(payload).map_err(bad)?;
                not_sender(learner.id, "a request to join as a learner")?;
                // An id another live broker holds is not for this one.
                if matches!(self.leader(), Leader::Here) {
                    let term = self.raft.metrics().borrow().current_term;
                    let taken = self.sm.with_table(|table| {
                        self.leases
                            .borrow_mut()
                            .check(term, table, learner.id, &learner.address, Instant::now())
                    });
                    if let Err(e) = taken {
                        return Ok(to_json(&Err::<u64, String>(e.to_string())));
                    }
                }
                let node = BasicNode::new(learner.address);
                match self.raft.add_learner(learner.id, node, false).await {
                    Ok(resp) => Ok(to_json(&Ok::<u64, String>(resp.log_id.index))),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(self.not_leader(f.leader_id)),
                    Err(e) => Ok(to_json(&Err::<u64, String>(e.to_string()))),
                }
            }
            ControllerOp::BrokerHeartbeat => {
                let request: Heartbeat = serde_json::from_slice(payload).map_err(bad)?;
                not_sender(request.id, "a lease renewal")?;
                if !matches!(self.leader(), Leader::Here) {
                    return Err(self.not_leader(self.raft.metrics().borrow().current_leader));
                }
                match self.renew_lease(&request, self.renewal_within).await {
                    Ok(()) => Ok(to_json(&Ok::<(), ControllerError>(()))),
                    Err(ProposeError::Refused(e)) => Ok(to_json(&Err::<(), ControllerError>(e))),
                    Err(ProposeError::Unavailable(message)) => Err(Refusal {
                        code: ErrorCode::ControllerUnavailable,
                        message,
                        leader: 0,
                    }),
                }
            }
            other => Err(Refusal {
                code: ErrorCode::InvalidRequest,
                message: format!("unknown controller op {}", other.0),
                leader: 0,
            }),
        }
    }

    /// Stops the member.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("controller shutdown: {e}");
        }
    }
}

/// The broker a forwarded proposal speaks for, where it is about the
/// sender's own state (and what it is, for the refusal): a registration,
/// a shutdown, an ISR change or lost writes as a partition's leader, a
/// damaged replica, and the proposal id's node of a numbered one. None
/// for what a broker forwards for a user (the user's rights were checked
/// where it logged in) or for the cluster.
fn sent_for(command: &Command) -> Vec<(NodeId, &'static str)> {
    match command {
        Command::Once { id, command } => {
            let mut claims = sent_for(command);
            claims.push((id.node, "a numbered proposal"));
            claims
        }
        Command::RegisterBroker { id, .. } => vec![(*id, "a broker registration")],
        Command::ShutdownBroker { id, .. } => vec![(*id, "a controlled shutdown")],
        Command::AlterIsr { leader, .. } => vec![(*leader, "an ISR change")],
        Command::LeaderLostWrites { leader, .. } => vec![(*leader, "a leader's lost writes")],
        Command::ReplicaDamaged { broker, .. } => vec![(*broker, "a damaged replica's report")],
        _ => Vec::new(),
    }
}

/// Whether only the controller leader itself proposes `command`: a lease
/// expiry (`FenceBroker`) is its own judgement, which a forwarded copy
/// from another broker must not stand in for.
fn command_is_leaders_own(command: &Command) -> bool {
    match command {
        Command::Once { command, .. } => command_is_leaders_own(command),
        Command::FenceBroker { .. } => true,
        _ => false,
    }
}

/// The leader's JSON answer to a forwarded request.
fn leaders_answer<T: serde::de::DeserializeOwned>(answer: &[u8]) -> Result<T, ProposeError> {
    serde_json::from_slice(answer)
        .map_err(|e| ProposeError::Unavailable(format!("a malformed answer from the controller leader: {e}")))
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::controller::table::{MetadataTable, QueueSettings};

    fn settings(partitions: u32) -> QueueSettings {
        QueueSettings::for_tests(partitions, 1)
    }

    fn one_node(id: u64) -> Settings {
        let advertised: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Settings {
            node_id: id,
            advertised,
            voters: vec![Voter {
                id,
                address: advertised,
            }],
            shards: 2,
            directory: 0x5eed,
            heartbeat_ms: 500,
            election_min_ms: 1500,
            election_max_ms: 3000,
            broker_heartbeat_ms: 500,
            broker_session_ms: 3000,
            leader_balance_interval_ms: 0,
            max_frame_bytes: 1 << 20,
            peer: Default::default(),
        }
    }

    fn run<F: std::future::Future<Output = ()> + 'static>(make: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::default()
            .spawn(make)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn registering_and_every_renewal_hold_this_brokers_own_lease() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let lease = OwnLease::default();
            let publish: Publish = Rc::new(|_: &MetadataTable| {});
            let c = Controller::open(&path, &one_node(7), publish, lease.clone())
                .await
                .unwrap();
            assert!(!lease.holds(), "no lease before the broker registers");
            let before = mono_ms();
            c.join(&one_node(7)).await.unwrap();
            assert!(lease.holds(), "registered: the lease holds");
            assert!(lease.until_ms() >= before + 3000 - 3000 / 16);
            assert!(lease.until_ms() <= mono_ms() + 3000);
            let registered = lease.until_ms();
            glommio::timer::sleep(Duration::from_millis(30)).await;
            // A renewal of a known broker: confirmed by a (one-member)
            // quorum, and the lease moves on.
            c.heartbeat(&one_node(7), Duration::from_secs(1)).await.unwrap();
            assert!(
                lease.until_ms() >= registered + 30,
                "renewed: {} after {registered}",
                lease.until_ms()
            );
            c.shutdown().await;
            // A member that stopped renews nothing: the lease stays as it was.
            let last = lease.until_ms();
            c.heartbeat(&one_node(7), Duration::from_millis(200)).await.unwrap_err();
            assert_eq!(lease.until_ms(), last);
        });
    }

    #[test]
    fn commands_commit_apply_and_survive_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let seen: Rc<RefCell<MetadataTable>> = Rc::default();
            let publish: Publish = {
                let seen = seen.clone();
                Rc::new(move |t: &MetadataTable| *seen.borrow_mut() = t.clone())
            };
            let c = Controller::start(&path, &one_node(7), publish.clone()).await.unwrap();
            assert!(seen.borrow().brokers.contains_key(&7), "the broker registers itself");
            c.propose(Command::CreateQueue {
                name: "orders".into(),
                settings: settings(3),
            })
            .await
            .unwrap();
            assert_eq!(seen.borrow().queue("orders").unwrap().partitions.len(), 3);
            let refused = c
                .propose(Command::CreateQueue {
                    name: "orders".into(),
                    settings: settings(1),
                })
                .await;
            assert!(matches!(
                refused,
                Err(ProposeError::Refused(ControllerError::QueueExists(_)))
            ));
            c.shutdown().await;
            let before = seen.borrow().clone();

            // Restart: the log replays into the same table; the broker
            // registers its new run (incarnation), which leaves its sole
            // replicas as they were.
            *seen.borrow_mut() = MetadataTable::default();
            let c = Controller::start(&path, &one_node(7), publish.clone()).await.unwrap();
            c.propose(Command::DeleteQueue { name: "nope".into() })
                .await
                .unwrap_err();
            let after = seen.borrow().clone();
            // Its only replicas lead on, each in a new leader epoch.
            let epochs = |t: &MetadataTable| -> Vec<(u32, u32)> {
                let parts = t.queues.values().flat_map(|q| q.partitions.iter());
                parts.map(|p| (p.leader_epoch, p.partition_epoch)).collect()
            };
            let bumped: Vec<(u32, u32)> = epochs(&before).iter().map(|(l, p)| (l + 1, p + 1)).collect();
            assert_eq!(epochs(&after), bumped);
            let mut same = after.queues.clone();
            for (q, b) in same.values_mut().zip(before.queues.values()) {
                for (p, was) in q.partitions.iter_mut().zip(&b.partitions) {
                    (p.leader_epoch, p.partition_epoch) = (was.leader_epoch, was.partition_epoch);
                }
            }
            assert_eq!(same, before.queues);
            assert_ne!(after.brokers[&7].incarnation, before.brokers[&7].incarnation);
            let same_run = |t: &MetadataTable| {
                let mut b = t.brokers[&7].clone();
                b.incarnation = 0;
                b
            };
            assert_eq!(same_run(&after), same_run(&before));
            c.shutdown().await;
        });
    }

    /// A voter that opens without a log answers no vote while it asks the
    /// others whether the group exists (a vote from a lost log could elect
    /// a candidate lacking committed entries), and says the group exists
    /// while its rejoining marker is there; a member with a log votes.
    #[test]
    fn a_voter_without_a_log_answers_no_vote_until_it_knows_the_group_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let mut three = one_node(3);
            for (id, port) in [(1, 2), (2, 3)] {
                three.voters.push(Voter {
                    id,
                    address: SocketAddr::from(([127, 0, 0, 1], port)),
                });
            }
            let publish: Publish = Rc::new(|_: &MetadataTable| {});
            let vote = serde_json::to_vec(&openraft::raft::VoteRequest::<u64>::new(
                openraft::Vote::new(5, 2),
                None,
            ))
            .unwrap();
            let asking = path.join("asking");
            let c = Controller::open(&asking, &three, publish.clone(), OwnLease::default())
                .await
                .unwrap();
            let refused = c.serve(ControllerOp::Vote, &vote, None).await.unwrap_err();
            assert_eq!(refused.code, ErrorCode::ControllerUnavailable, "{}", refused.message);
            let status: MemberStatus =
                serde_json::from_slice(&c.serve(ControllerOp::Status, b"{}", None).await.unwrap()).unwrap();
            assert!(!status.holds_cluster, "an empty log, unmarked: the group may be new");
            c.rejoin().unwrap();
            // Rejoining, it takes no entries before a majority of the
            // others said how far the log goes, nor from an older leader.
            let append = serde_json::to_vec(&openraft::raft::AppendEntriesRequest::<TypeConfig> {
                vote: openraft::Vote::new_committed(1, 2),
                prev_log_id: None,
                entries: vec![],
                leader_commit: None,
            })
            .unwrap();
            let refused = c.serve(ControllerOp::AppendEntries, &append, None).await.unwrap_err();
            assert!(refused.message.contains("no majority"), "{}", refused.message);
            c.rejoin_floor.set(Some((2, 5)));
            let refused = c.serve(ControllerOp::AppendEntries, &append, None).await.unwrap_err();
            assert!(refused.message.contains("below the term 2"), "{}", refused.message);
            c.rejoin_floor.set(Some((1, 5)));
            c.serve(ControllerOp::AppendEntries, &append, None).await.unwrap();
            let status: MemberStatus =
                serde_json::from_slice(&c.serve(ControllerOp::Status, b"{}", None).await.unwrap()).unwrap();
            assert!(status.holds_cluster, "marked as rejoining: the group exists");
            c.shutdown().await;
            // Opened again, the marker keeps it out of votes.
            let c = Controller::open(&asking, &three, publish.clone(), OwnLease::default())
                .await
                .unwrap();
            c.serve(ControllerOp::Vote, &vote, None).await.unwrap_err();
            c.shutdown().await;
            // A member with a log of its own votes.
            let kept = path.join("kept");
            Controller::start(&kept, &one_node(3), publish.clone())
                .await
                .unwrap()
                .shutdown()
                .await;
            let c = Controller::open(&kept, &one_node(3), publish, OwnLease::default())
                .await
                .unwrap();
            c.serve(ControllerOp::Vote, &vote, None).await.unwrap();
            c.shutdown().await;
        });
    }
}
