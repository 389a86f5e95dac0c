//! This node's member of the controller's Raft group: start it (recovering
//! its log and snapshot), propose commands, stop it.
//!
//! Runs on: shard 0.
//!
//! A single node initialises a one-voter group and is its leader; the code
//! path (propose → commit → apply on every member) is the one a multi-node
//! group uses. Until cluster membership lands, the Raft network has no
//! peers to reach: it reports every peer unreachable, which a one-voter
//! group never asks for.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InitializeError, InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Raft, RaftNetwork, RaftNetworkFactory};

use super::stm::{Command, ControllerError};
use super::store::{LogStore, Publish, StateMachineStore, TypeConfig};

/// Why a proposal did not apply.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// Committed, and refused by the state machine.
    #[error(transparent)]
    Refused(#[from] ControllerError),
    /// Not committed: no leader here, storage failed, shutting down.
    #[error("controller unavailable: {0}")]
    Unavailable(String),
}

/// The running controller member.
pub struct Controller {
    raft: Raft<TypeConfig>,
    node_id: u64,
}

impl Controller {
    /// Starts the member with its state in `dir`, initialising a one-voter
    /// group on first start, and registers this broker at `address`.
    pub async fn start(
        dir: &Path,
        node_id: u64,
        address: String,
        shards: u16,
        publish: Publish,
    ) -> Result<Controller, ProposeError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| ProposeError::Unavailable(format!("{what}: {e}"));
        let log = LogStore::open(dir)
            .await
            .map_err(|e| unavailable("opening the Raft log", &e))?;
        let sm = StateMachineStore::open(dir, publish).map_err(|e| unavailable("opening the Raft snapshot", &e))?;
        // One voter: nobody to send heartbeats to, and openraft elects the
        // sole voter at once when it initializes and restores it as leader
        // at once after a restart; its timer (every 1.5 heartbeat
        // intervals) only wakes the shard. A slow one keeps an idle broker
        // idle (the timings for several voters come with the cluster).
        let config = openraft::Config {
            cluster_name: "strand".into(),
            heartbeat_interval: 500,
            election_timeout_min: 1500,
            election_timeout_max: 3000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1000),
            ..Default::default()
        }
        .validate()
        .map_err(|e| unavailable("Raft config", &e))?;
        let raft = Raft::new(node_id, Arc::new(config), NoPeers, log, sm.clone())
            .await
            .map_err(|e| unavailable("starting Raft", &e))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| unavailable("reading the Raft state", &e))?;
        if !initialized {
            let members = BTreeMap::from([(node_id, BasicNode::new(address.clone()))]);
            match raft.initialize(members).await {
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(unavailable("initialising the Raft group", &e)),
            }
        }
        let wait = || raft.wait(Some(Duration::from_secs(10)));
        wait()
            .current_leader(node_id, "the single controller member becomes leader")
            .await
            .map_err(|e| unavailable("electing a controller leader", &e))?;
        // Apply everything already in the log before serving from the table.
        let last = raft.metrics().borrow().last_log_index;
        wait()
            .applied_index_at_least(last, "the controller replays its log")
            .await
            .map_err(|e| unavailable("replaying the controller log", &e))?;
        let controller = Controller { raft, node_id };
        let registered = sm
            .table()
            .brokers
            .get(&node_id)
            .is_some_and(|b| b.address == address && b.shards == shards);
        if !registered {
            controller
                .propose(Command::RegisterBroker {
                    id: node_id,
                    address,
                    shards,
                })
                .await?;
        }
        Ok(controller)
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// Commits `command` through Raft and applies it. Resolves once applied
    /// here (the new table has been published).
    pub async fn propose(&self, command: Command) -> Result<(), ProposeError> {
        match self.raft.client_write(command).await {
            Ok(resp) => resp.data.map_err(ProposeError::Refused),
            Err(e) => Err(ProposeError::Unavailable(e.to_string())),
        }
    }

    /// Stops the member.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("controller shutdown: {e}");
        }
    }
}

/// The Raft network of a group with no peers yet.
struct NoPeers;
struct NoConnection;

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoConnection;
    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoConnection {
        NoConnection
    }
}

fn unreachable() -> Unreachable {
    Unreachable::new(&std::io::Error::other(
        "controller peers are not connected on this node",
    ))
}

impl RaftNetwork<TypeConfig> for NoConnection {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(RPCError::Unreachable(unreachable()))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::controller::table::{FsyncSetting, MetadataTable, QueueSettings};

    fn settings(partitions: u32) -> QueueSettings {
        QueueSettings {
            partitions,
            replication_factor: 1,
            retention_ms: None,
            retention_bytes: None,
            fsync: FsyncSetting::Always,
            max_message_bytes: 1 << 20,
            max_delivery_attempts: 5,
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
    fn commands_commit_apply_and_survive_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let seen: Rc<RefCell<MetadataTable>> = Rc::default();
            let publish: Publish = {
                let seen = seen.clone();
                Rc::new(move |t: &MetadataTable| *seen.borrow_mut() = t.clone())
            };
            let c = Controller::start(&path, 7, "127.0.0.1:1".into(), 2, publish.clone())
                .await
                .unwrap();
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

            // Restart: the log replays into the same table; no new registration.
            *seen.borrow_mut() = MetadataTable::default();
            let c = Controller::start(&path, 7, "127.0.0.1:1".into(), 2, publish.clone())
                .await
                .unwrap();
            c.propose(Command::DeleteQueue { name: "nope".into() })
                .await
                .unwrap_err();
            let after = seen.borrow().clone();
            assert_eq!(after.queues, before.queues);
            assert_eq!(after.brokers, before.brokers);
            c.shutdown().await;
        });
    }
}
