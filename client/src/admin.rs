//! Queue administration: create, delete, alter, describe, list.

use std::sync::Arc;
use std::time::Duration;

use strand_net::message::{read_body, TailBuilder};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use crate::cluster::{Cluster, Timeouts};
use crate::connection::Connection;
use crate::error::ClientError;
use crate::group::{self, GroupDescription, GroupListing, ResetTarget};

/// When a queue's data is fdatasync'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncSpec {
    Always,
    Interval { ms: u32, bytes: u64 },
}

impl std::str::FromStr for FsyncSpec {
    type Err = String;

    /// `always`, or `interval` (every 100 ms), as the CLI and the bench take it.
    fn from_str(text: &str) -> Result<FsyncSpec, String> {
        match text {
            "always" => Ok(FsyncSpec::Always),
            "interval" => Ok(FsyncSpec::Interval { ms: 100, bytes: 0 }),
            other => Err(format!("--fsync must be always or interval, not {other:?}")),
        }
    }
}

impl FsyncSpec {
    /// The wire's (mode, interval ms, interval bytes).
    fn wire(self) -> (FsyncMode, u32, u64) {
        match self {
            FsyncSpec::Always => (FsyncMode::Always, 0, 0),
            FsyncSpec::Interval { ms, bytes } => (FsyncMode::Interval, ms, bytes),
        }
    }
}

/// Settings for a new queue; `None` takes the broker's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSpec {
    pub partitions: Option<u32>,
    pub replication_factor: Option<u16>,
    /// `Some(None)`: keep forever.
    pub retention_ms: Option<Option<u64>>,
    pub retention_bytes: Option<Option<u64>>,
    pub fsync: Option<FsyncSpec>,
    pub max_message_bytes: Option<u32>,
    /// Ack-mode deliveries of a record before it goes to `<queue>.dlq`.
    pub max_delivery_attempts: Option<u32>,
    /// In-sync replicas an acks=all produce needs (1 to the replication
    /// factor; at create, absent: 2 from three replicas, else 1).
    pub min_insync_replicas: Option<u16>,
}

/// One partition of a described queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: u32,
    pub leader: u32,
    pub log_start: u64,
    pub log_end: u64,
    pub high_watermark: u64,
    pub stored_bytes: u64,
    pub segments: u32,
    /// The brokers holding a replica (the first the preferred leader).
    pub replicas: Vec<u32>,
    /// The replicas in sync with the leader.
    pub isr: Vec<u32>,
    /// Bumped on every change of leader.
    pub leader_epoch: u32,
    /// Offline because this broker, its last in-sync replica, came back
    /// with another data directory (a wiped or replaced disk; the
    /// partition waits for it with its old one) or found its log damaged
    /// (nothing comes back by itself), or an unclean election
    /// ([`Admin::elect_unclean`]).
    pub lost_replica: Option<u32>,
}

impl PartitionDescription {
    /// Why the partition has no leader, for people; `None` while it has one.
    pub fn offline_reason(&self) -> Option<String> {
        offline_reason(self.leader, &self.isr, self.lost_replica)
    }
}

/// The words `queue describe` and `cluster status` use for a partition
/// without a leader.
pub fn offline_reason(leader: u32, isr: &[u32], lost_replica: Option<u32>) -> Option<String> {
    if leader != 0 {
        return None;
    }
    let elect = "or `strand queue elect --unclean` to accept loss";
    Some(match lost_replica {
        Some(b) => format!(
            "offline: waiting for a replica with the data (broker {b}, the last in sync, came back without it: an \
             empty or replaced data directory, or a damaged log), {elect}"
        ),
        None => format!("offline: waiting for a replica with the data (in-sync replicas {isr:?}, all down), {elect}"),
    })
}

/// A queue's settings and partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDescription {
    pub name: String,
    pub partitions: Vec<PartitionDescription>,
    /// -1: no limit.
    pub retention_ms: i64,
    pub retention_bytes: i64,
    pub replication_factor: u16,
    pub fsync: FsyncSpec,
    pub max_message_bytes: u32,
    pub max_delivery_attempts: u32,
    /// In-sync replicas an acks=all produce needs (0: not reported).
    pub min_insync_replicas: u16,
}

/// One broker of the cluster, as the metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerDescription {
    pub id: u32,
    /// Its advertised client address, `HOST:PORT`.
    pub address: String,
    /// False once the controller fenced it (its lease expired).
    pub alive: bool,
    /// In maintenance (`Admin::drain_broker`).
    pub draining: bool,
    /// Being decommissioned (`Admin::decommission_broker`).
    pub decommissioning: bool,
    /// Partitions it leads, of every queue.
    pub leaders: usize,
    /// Partition replicas it holds (led or followed), of every queue.
    pub replicas: usize,
    /// Partitions it leads with fewer in-sync replicas than replicas.
    pub under_replicated: usize,
    /// Replicas it holds that a reassignment in progress removes.
    pub moving_off: usize,
}

/// Where one partition's replicas are, from the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionPlacement {
    pub queue: String,
    pub partition: u32,
    /// 0: offline.
    pub leader: u32,
    /// The first is the preferred leader; during a reassignment, the
    /// target's replicas first, then those it removes.
    pub replicas: Vec<u32>,
    pub isr: Vec<u32>,
    /// A reassignment in progress: the replicas it ends with. It completes
    /// once all of them are in the ISR.
    pub target: Option<Vec<u32>>,
    /// As [`PartitionDescription::lost_replica`].
    pub lost_replica: Option<u32>,
}

impl PartitionPlacement {
    /// Whether fewer replicas are in sync than it should have: a move in
    /// progress counts only below its target's size (the replicas it adds
    /// are not missing ones).
    pub fn under_replicated(&self) -> bool {
        let wanted = self.target.as_ref().map_or(self.replicas.len(), Vec::len);
        self.isr.len() < wanted
    }

    /// Why the partition has no leader, for people; `None` while it has one.
    pub fn offline_reason(&self) -> Option<String> {
        offline_reason(self.leader, &self.isr, self.lost_replica)
    }
}

/// A broker's data directory's file system, as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerDisk {
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Below this much free space it refuses produce (`StorageFull`).
    pub threshold_bytes: u64,
}

/// The cluster: its controller leader and every broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDescription {
    /// The controller leader's node id (0: none known to the answering node).
    pub controller: u32,
    /// By id.
    pub brokers: Vec<BrokerDescription>,
    /// Partitions without a leader (every in-sync replica fenced).
    pub offline: usize,
    /// Every partition of every queue, by queue and partition.
    pub partitions: Vec<PartitionPlacement>,
}

/// The admin client.
/// An ACL entry: `user` may do `operation` (produce, consume, describe,
/// create, alter, delete, admin) on a resource: `resource_type` queue,
/// queue-prefix, group or cluster, `resource_name` its name or prefix
/// (empty for the cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclSpec {
    pub user: String,
    pub operation: String,
    pub resource_type: String,
    pub resource_name: String,
}

/// A user as `Admin::list_users` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDescription {
    pub name: String,
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512`.
    pub mechanisms: Vec<String>,
    /// Named in the brokers' `--superusers`.
    pub superuser: bool,
}

#[derive(Clone)]
pub struct Admin {
    cluster: Arc<Cluster>,
    conn: Connection,
}

fn limit(v: Option<Option<u64>>) -> Option<i64> {
    v.map(|l| l.map_or(-1, |n| n.min(i64::MAX as u64) as i64))
}

fn response<'a, T>(frame: &'a strand_net::Frame) -> Result<T::Inner, ClientError>
where
    T: strand_wire::flatbuffers::Follow<'a> + strand_wire::flatbuffers::Verifiable + 'a,
{
    read_body::<T>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))
}

impl Admin {
    /// Sends a finished request body and waits for its response.
    async fn call(&self, api: Api, fbb: &FlatBufferBuilder<'_>) -> Result<strand_net::Frame, ClientError> {
        self.conn
            .request(api, fbb.finished_data(), TailBuilder::default())
            .await
    }

    /// Connects to the first broker of `brokers` (`HOST:PORT[,HOST:PORT...]`)
    /// that answers (within [`Timeouts`]' metadata timeout: a paused broker
    /// listed first costs that long, not a call's whole deadline).
    pub fn connect(brokers: &str) -> Result<Admin, ClientError> {
        Self::connect_with(brokers, Timeouts::default())
    }

    /// [`Admin::connect`] with other timeouts.
    pub fn connect_with(brokers: &str, timeouts: Timeouts) -> Result<Admin, ClientError> {
        let cluster = Cluster::with_settings(brokers, Duration::ZERO, timeouts)?;
        let addr = crate::block_on(cluster.live_broker())?;
        Ok(Admin {
            conn: cluster.connection_to(&addr)?,
            cluster,
        })
    }

    /// Every consumer group, by name.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>, ClientError> {
        group::list_groups(&self.cluster).await
    }

    /// A group's members, and per partition its member, position, log end
    /// and lag.
    pub async fn describe_group(&self, group: &str) -> Result<GroupDescription, ClientError> {
        group::describe_group(&self.cluster, group).await
    }

    /// Moves the group's positions on `queue` (every partition if
    /// `partitions` is empty): replay or skip. Refused (GroupNotEmpty) while
    /// the group has members. Returns the new positions.
    pub async fn reset_group(
        &self,
        group: &str,
        queue: &str,
        partitions: &[u32],
        to: ResetTarget,
    ) -> Result<Vec<(u32, u64)>, ClientError> {
        group::reset_group(&self.cluster, group, queue, partitions, to).await
    }

    /// Deletes a group and its positions. Refused while it has members.
    pub async fn delete_group(&self, group: &str) -> Result<(), ClientError> {
        group::delete_group(&self.cluster, group).await
    }

    pub async fn create_queue(&self, name: &str, spec: &QueueSpec) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let (fsync, fsync_interval_ms, fsync_interval_bytes) = spec.fsync.unwrap_or(FsyncSpec::Always).wire();
        let config = QueueConfig::create(
            &mut fbb,
            &QueueConfigArgs {
                partitions: spec.partitions.unwrap_or(0),
                replication_factor: spec.replication_factor.unwrap_or(1),
                retention_ms: limit(spec.retention_ms),
                retention_bytes: limit(spec.retention_bytes),
                fsync,
                fsync_interval_ms,
                fsync_interval_bytes,
                max_message_bytes: spec.max_message_bytes,
                max_delivery_attempts: spec.max_delivery_attempts,
                min_insync_replicas: spec.min_insync_replicas,
            },
        );
        let root = CreateQueueRequest::create(
            &mut fbb,
            &CreateQueueRequestArgs {
                name: Some(n),
                config: Some(config),
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::CreateQueue, &fbb).await?;
        ClientError::check(response::<CreateQueueResponse>(&f)?.error())
    }

    pub async fn delete_queue(&self, name: &str) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let root = DeleteQueueRequest::create(&mut fbb, &DeleteQueueRequestArgs { name: Some(n) });
        fbb.finish_minimal(root);
        let f = self.call(Api::DeleteQueue, &fbb).await?;
        ClientError::check(response::<DeleteQueueResponse>(&f)?.error())
    }

    /// Creates user `name` (or replaces its password) with `password`:
    /// the salted SCRAM keys for both mechanisms are derived here, and only
    /// they are sent (`strand_net::scram`).
    pub async fn put_user(&self, name: &str, password: &str) -> Result<(), ClientError> {
        use strand_net::scram::{Credential, Mechanism, DEFAULT_ITERATIONS};
        if password.is_empty() {
            return Err(ClientError::Invalid("an empty password".into()));
        }
        let mut fbb = FlatBufferBuilder::new();
        let mut credentials = Vec::new();
        for mechanism in Mechanism::ALL {
            let c = Credential::generate(mechanism, password.as_bytes(), DEFAULT_ITERATIONS)
                .map_err(|e| ClientError::Invalid(e.to_string()))?;
            let args = ScramCredentialArgs {
                mechanism: Some(fbb.create_string(mechanism.name())),
                salt: Some(fbb.create_vector(&c.salt)),
                iterations: c.iterations,
                stored_key: Some(fbb.create_vector(&c.stored_key)),
                server_key: Some(fbb.create_vector(&c.server_key)),
            };
            credentials.push(ScramCredential::create(&mut fbb, &args));
        }
        let credentials = Some(fbb.create_vector(&credentials));
        let n = fbb.create_string(name);
        let root = PutUserRequest::create(
            &mut fbb,
            &PutUserRequestArgs {
                name: Some(n),
                credentials,
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::PutUser, &fbb).await?;
        ClientError::check(response::<PutUserResponse>(&f)?.error())
    }

    pub async fn delete_user(&self, name: &str) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let root = DeleteUserRequest::create(&mut fbb, &DeleteUserRequestArgs { name: Some(n) });
        fbb.finish_minimal(root);
        let f = self.call(Api::DeleteUser, &fbb).await?;
        ClientError::check(response::<DeleteUserResponse>(&f)?.error())
    }

    /// Every user: name, mechanisms, superuser.
    pub async fn list_users(&self) -> Result<Vec<UserDescription>, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let root = ListUsersRequest::create(&mut fbb, &ListUsersRequestArgs {});
        fbb.finish_minimal(root);
        let f = self.call(Api::ListUsers, &fbb).await?;
        let r = response::<ListUsersResponse>(&f)?;
        ClientError::check(r.error())?;
        Ok(r.users()
            .iter()
            .flatten()
            .map(|u| UserDescription {
                name: u.name().unwrap_or_default().to_string(),
                mechanisms: u.mechanisms().iter().flatten().map(str::to_string).collect(),
                superuser: u.superuser(),
            })
            .collect())
    }

    /// Adds an ACL entry (or, with `remove`, removes it).
    pub async fn alter_acl(&self, acl: &AclSpec, remove: bool) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let args = AclBindingArgs {
            user: Some(fbb.create_string(&acl.user)),
            operation: Some(fbb.create_string(&acl.operation)),
            resource_type: Some(fbb.create_string(&acl.resource_type)),
            resource_name: Some(fbb.create_string(&acl.resource_name)),
        };
        let binding = AclBinding::create(&mut fbb, &args);
        let root = AlterAclsRequest::create(
            &mut fbb,
            &AlterAclsRequestArgs {
                remove,
                acl: Some(binding),
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::AlterAcls, &fbb).await?;
        ClientError::check(response::<AlterAclsResponse>(&f)?.error())
    }

    /// Every ACL entry, or only `user`'s.
    pub async fn list_acls(&self, user: Option<&str>) -> Result<Vec<AclSpec>, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let user = user.map(|u| fbb.create_string(u));
        let root = ListAclsRequest::create(&mut fbb, &ListAclsRequestArgs { user });
        fbb.finish_minimal(root);
        let f = self.call(Api::ListAcls, &fbb).await?;
        let r = response::<ListAclsResponse>(&f)?;
        ClientError::check(r.error())?;
        Ok(r.acls()
            .iter()
            .flatten()
            .map(|a| AclSpec {
                user: a.user().unwrap_or_default().to_string(),
                operation: a.operation().unwrap_or_default().to_string(),
                resource_type: a.resource_type().unwrap_or_default().to_string(),
                resource_name: a.resource_name().unwrap_or_default().to_string(),
            })
            .collect())
    }

    /// Changes what `spec` sets (partitions can only grow).
    pub async fn alter_queue(&self, name: &str, spec: &QueueSpec) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let (fsync, fsync_interval_ms, fsync_interval_bytes) = match spec.fsync.map(FsyncSpec::wire) {
            None => (None, None, None),
            Some((mode, ms, bytes)) => (Some(mode), Some(ms), Some(bytes)),
        };
        let root = AlterQueueRequest::create(
            &mut fbb,
            &AlterQueueRequestArgs {
                name: Some(n),
                partitions: spec.partitions,
                retention_ms: limit(spec.retention_ms),
                retention_bytes: limit(spec.retention_bytes),
                fsync,
                fsync_interval_ms,
                fsync_interval_bytes,
                max_message_bytes: spec.max_message_bytes,
                max_delivery_attempts: spec.max_delivery_attempts,
                min_insync_replicas: spec.min_insync_replicas,
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::AlterQueue, &fbb).await?;
        ClientError::check(response::<AlterQueueResponse>(&f)?.error())
    }

    pub async fn describe_queue(&self, name: &str) -> Result<QueueDescription, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let root = DescribeQueueRequest::create(
            &mut fbb,
            &DescribeQueueRequestArgs {
                name: Some(n),
                only_led_here: false,
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::DescribeQueue, &fbb).await?;
        let resp = response::<DescribeQueueResponse>(&f)?;
        ClientError::check(resp.error())?;
        let config = resp
            .config()
            .ok_or_else(|| ClientError::Protocol("describe without a config".into()))?;
        Ok(QueueDescription {
            name: resp.name().unwrap_or(name).to_string(),
            partitions: resp
                .partitions()
                .iter()
                .flatten()
                .map(|p| PartitionDescription {
                    partition: p.partition(),
                    leader: p.leader(),
                    log_start: p.log_start(),
                    log_end: p.log_end(),
                    high_watermark: p.high_watermark(),
                    stored_bytes: p.stored_bytes(),
                    segments: p.segments(),
                    replicas: p.replicas().iter().flatten().collect(),
                    isr: p.isr().iter().flatten().collect(),
                    leader_epoch: p.leader_epoch(),
                    lost_replica: p.lost_replica(),
                })
                .collect(),
            retention_ms: config.retention_ms().unwrap_or(-1),
            retention_bytes: config.retention_bytes().unwrap_or(-1),
            replication_factor: config.replication_factor(),
            fsync: if config.fsync() == FsyncMode::Interval {
                FsyncSpec::Interval {
                    ms: config.fsync_interval_ms(),
                    bytes: config.fsync_interval_bytes(),
                }
            } else {
                FsyncSpec::Always
            },
            max_message_bytes: config.max_message_bytes().unwrap_or(0),
            max_delivery_attempts: config.max_delivery_attempts().unwrap_or(0),
            min_insync_replicas: config.min_insync_replicas().unwrap_or(0),
        })
    }

    /// The answer to a Metadata request for every queue, checked for an error.
    async fn metadata_of_all(&self) -> Result<strand_net::Frame, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: None });
        fbb.finish_minimal(root);
        let f = self.call(Api::Metadata, &fbb).await?;
        ClientError::check(response::<MetadataResponse>(&f)?.error())?;
        Ok(f)
    }

    /// The controller leader and every broker with what it leads and holds,
    /// as the node this client talks to knows them.
    pub async fn describe_cluster(&self) -> Result<ClusterDescription, ClientError> {
        let f = self.metadata_of_all().await?;
        let resp = response::<MetadataResponse>(&f)?;
        let mut brokers: Vec<BrokerDescription> = resp
            .brokers()
            .iter()
            .flatten()
            .map(|b| BrokerDescription {
                id: b.node_id(),
                address: format!("{}:{}", b.host().unwrap_or_default(), b.port()),
                alive: !b.fenced(),
                draining: b.draining(),
                decommissioning: b.decommissioning(),
                leaders: 0,
                replicas: 0,
                under_replicated: 0,
                moving_off: 0,
            })
            .collect();
        brokers.sort_by_key(|b| b.id);
        let ids = |v: Option<strand_wire::flatbuffers::Vector<'_, u32>>| v.map(|v| v.iter().collect::<Vec<u32>>());
        let mut partitions = Vec::new();
        for q in resp.queues().iter().flatten() {
            for p in q.partitions().iter().flatten() {
                partitions.push(PartitionPlacement {
                    queue: q.name().unwrap_or_default().to_string(),
                    partition: p.partition(),
                    leader: p.leader(),
                    replicas: ids(p.replicas()).unwrap_or_default(),
                    isr: ids(p.isr()).unwrap_or_default(),
                    target: ids(p.target_replicas()),
                    lost_replica: p.lost_replica(),
                });
            }
        }
        partitions.sort_by(|a, b| (&a.queue, a.partition).cmp(&(&b.queue, b.partition)));
        let mut offline = 0;
        for p in &partitions {
            offline += usize::from(p.leader == 0);
            for b in brokers.iter_mut() {
                let holds = p.replicas.contains(&b.id);
                b.leaders += usize::from(p.leader == b.id);
                b.replicas += usize::from(holds);
                b.under_replicated += usize::from(p.leader == b.id && p.under_replicated());
                b.moving_off += usize::from(holds && p.target.as_ref().is_some_and(|t| !t.contains(&b.id)));
            }
        }
        Ok(ClusterDescription {
            controller: resp.controller(),
            brokers,
            offline,
            partitions,
        })
    }

    /// Puts broker `id` into maintenance (`draining`: its leaderships move
    /// to other in-sync replicas, it stays a follower and takes no new
    /// leadership while another replica can) or takes it out (leader
    /// balancing gives its preferred leaderships back).
    pub async fn drain_broker(&self, id: u32, draining: bool) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let args = DrainBrokerRequestArgs {
            node_id: u64::from(id),
            draining,
        };
        let root = DrainBrokerRequest::create(&mut fbb, &args);
        fbb.finish_minimal(root);
        let f = self.call(Api::DrainBroker, &fbb).await?;
        ClientError::check(response::<DrainBrokerResponse>(&f)?.error())
    }

    /// Decommissions broker `id`: every replica it holds moves to another
    /// broker (progress: [`Admin::describe_cluster`], its `moving_off` and
    /// `replicas` falling to 0) and its leaderships move now. Refused when
    /// the other brokers cannot hold some partition's replication factor.
    pub async fn decommission_broker(&self, id: u32) -> Result<(), ClientError> {
        self.decommission(id, false).await
    }

    /// Cancels broker `id`'s decommission: the moves still in progress go
    /// back to where each partition was, the completed ones stay, and the
    /// broker takes new replicas (and, at the next leader balancing, its
    /// preferred leaderships) again. A broker that is not leaving is left
    /// as it is.
    pub async fn cancel_decommission(&self, id: u32) -> Result<(), ClientError> {
        self.decommission(id, true).await
    }

    async fn decommission(&self, id: u32, cancel: bool) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        // A cancel names the broker in its own field and broker 0 in
        // `node_id`, which a broker that predates cancelling refuses.
        let args = match cancel {
            false => DecommissionBrokerRequestArgs {
                node_id: u64::from(id),
                cancel_node_id: 0,
            },
            true => DecommissionBrokerRequestArgs {
                node_id: 0,
                cancel_node_id: u64::from(id),
            },
        };
        let root = DecommissionBrokerRequest::create(&mut fbb, &args);
        fbb.finish_minimal(root);
        let f = self.call(Api::DecommissionBroker, &fbb).await?;
        ClientError::check(response::<DecommissionBrokerResponse>(&f)?.error())
    }

    /// Moves partition `partition` of `queue` to `replicas` (as many as its
    /// replication factor, the first the preferred leader). Returns once
    /// the move began: new replicas catch up, then the others are removed
    /// ([`PartitionPlacement::target`] shows it until then).
    pub async fn reassign_partition(&self, queue: &str, partition: u32, replicas: &[u32]) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let queue = fbb.create_string(queue);
        let replicas: Vec<u64> = replicas.iter().map(|r| u64::from(*r)).collect();
        let replicas = fbb.create_vector(&replicas);
        let args = ReassignPartitionRequestArgs {
            queue: Some(queue),
            partition,
            replicas: Some(replicas),
        };
        let root = ReassignPartitionRequest::create(&mut fbb, &args);
        fbb.finish_minimal(root);
        let f = self.call(Api::ReassignPartition, &fbb).await?;
        ClientError::check(response::<ReassignPartitionResponse>(&f)?.error())
    }

    /// An unclean election: offline partition `partition` of `queue` (or
    /// every offline partition of it) gets a leader although no alive
    /// replica is known to hold everything it acknowledged — `replica`, or
    /// the first alive replica that did not lose its data. Records only
    /// the missing replicas held are lost for good. Refused for a partition
    /// that has a leader.
    pub async fn elect_unclean(
        &self,
        queue: &str,
        partition: Option<u32>,
        replica: Option<u32>,
    ) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let queue = fbb.create_string(queue);
        let args = ElectLeadersRequestArgs {
            queue: Some(queue),
            partition,
            replica: replica.map(u64::from),
            unclean: true,
        };
        let root = ElectLeadersRequest::create(&mut fbb, &args);
        fbb.finish_minimal(root);
        let f = self.call(Api::ElectLeaders, &fbb).await?;
        ClientError::check(response::<ElectLeadersResponse>(&f)?.error())
    }

    /// The broker at `address` about itself: its data directory's space.
    pub async fn describe_broker(&self, address: &str) -> Result<BrokerDisk, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let root = DescribeBrokerRequest::create(&mut fbb, &DescribeBrokerRequestArgs {});
        fbb.finish_minimal(root);
        let f = self
            .cluster
            .connection_to(address)?
            .request(Api::DescribeBroker, fbb.finished_data(), TailBuilder::default())
            .await?;
        let resp = response::<DescribeBrokerResponse>(&f)?;
        ClientError::check(resp.error())?;
        Ok(BrokerDisk {
            free_bytes: resp.disk_free_bytes(),
            total_bytes: resp.disk_total_bytes(),
            threshold_bytes: resp.disk_threshold_bytes(),
        })
    }

    /// Every queue's name and partition count.
    pub async fn list_queues(&self) -> Result<Vec<(String, u32)>, ClientError> {
        let f = self.metadata_of_all().await?;
        let resp = response::<MetadataResponse>(&f)?;
        Ok(resp
            .queues()
            .iter()
            .flatten()
            .map(|q| {
                (
                    q.name().unwrap_or_default().to_string(),
                    q.partitions().map_or(0, |p| p.len() as u32),
                )
            })
            .collect())
    }
}
