//! The consumer-group APIs: JoinGroup, Heartbeat, LeaveGroup, CommitOffsets,
//! FetchOffsets, ListGroups, DescribeGroup, ResetGroup, DeleteGroup, and
//! ack mode's Receive and Settle.
//!
//! Runs on: the shard that holds the connection. Each request is read into
//! a [`GroupOp`], sent to the shard that owns the group's `__groups`
//! partition (where `crate::groups::Coordinator` serves it), and the answer
//! is written back as the API's response table. ListGroups asks every
//! `__groups` partition: those led here on their shards, those led by
//! other nodes with one ListGroups (`only_led_here`) per node on the peer
//! links.

use std::rc::Rc;
use std::time::Duration;

use strand_net::frame::FrameHeader;
use strand_net::message::{read_body, TailBuilder};
use strand_net::OutFrame;
use strand_wire::flatbuffers::{FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};
use strand_wire::*;

use super::{check_entries, error_table, request, respond};
use crate::controller::{NodeId, NO_LEADER};
use crate::groups::ack::Outcome;
use crate::groups::assign::Tp;
use crate::groups::record::{start_from_wire, start_to_wire, strategy_from_wire, strategy_to_wire};
use crate::groups::{self as g, GroupOp, GroupReply, GROUPS_QUEUE};
use crate::router::{ask, call_node};
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// How long another node may take to list its groups.
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves a group request; `acl_user` is the user whose ACLs decide (none:
/// a superuser, a broker, `--auth none`): it acts only as the members it
/// joined (the coordinator checks), a Receive answer is checked queue by
/// queue, and FetchOffsets and DescribeGroup answers show only the queues
/// it may describe (`super::authorize`).
pub async fn handle(
    shard: &Rc<Shard>,
    api: Api,
    header: FrameHeader,
    body: &[u8],
    acl_user: Option<String>,
) -> Result<OutFrame, WireError> {
    let mut fbb = FlatBufferBuilder::new();
    let mut tail = TailBuilder::default();
    match api {
        Api::ListGroups => {
            let only_led_here = request::<ListGroupsRequest>(body)?.only_led_here();
            let mut all = list_groups(shard, only_led_here).await?;
            // A user sees the groups it may describe.
            if let Some(user) = &acl_user {
                let table = shard.table();
                all.retain(|g| super::authorize::may_describe_group(&table.acls, user, &g.name));
            }
            all.sort_by(|a, b| a.name.cmp(&b.name));
            let groups: Vec<_> = all
                .iter()
                .map(|s| {
                    let name = fbb.create_string(&s.name);
                    GroupSummary::create(
                        &mut fbb,
                        &GroupSummaryArgs {
                            name: Some(name),
                            members: s.members,
                            generation: s.generation,
                        },
                    )
                })
                .collect();
            let groups = fbb.create_vector(&groups);
            let root = ListGroupsResponse::create(
                &mut fbb,
                &ListGroupsResponseArgs {
                    error: None,
                    groups: Some(groups),
                },
            );
            fbb.finish_minimal(root);
        }
        _ => {
            let (group, op) = read_op(api, body)?;
            let p = g::coordinator_partition(shard, &group).await?;
            let mut reply = coordinator(shard, p, op, acl_user.clone()).await?;
            if let Some(user) = &acl_user {
                let table = shard.table();
                let may_describe = |queue: &str| super::authorize::may_describe(&table.acls, user, queue);
                match &mut reply {
                    GroupReply::Received(parts) => {
                        let queues = parts.iter().map(|part| part.tp.0.as_str());
                        super::authorize::check_received(&table.acls, user, queues)?;
                    }
                    GroupReply::Offsets { offsets, .. } => offsets.retain(|(tp, _)| may_describe(&tp.0)),
                    GroupReply::Describe(d) => {
                        d.partitions.retain(|p| may_describe(&p.tp.0));
                        for m in &mut d.members {
                            m.queues.retain(|q| may_describe(q));
                            m.owned.retain(|tp| may_describe(&tp.0));
                        }
                    }
                    _ => {}
                }
            }
            write_reply(&mut fbb, &mut tail, api, reply)?;
        }
    }
    Ok(respond(header, &fbb, tail))
}

/// Every group of the `__groups` partitions led here, and unless
/// `only_led_here`, of those other nodes lead (asked of each node once).
async fn list_groups(shard: &Rc<Shard>, only_led_here: bool) -> Result<Vec<g::GroupSummary>, WireError> {
    let n = g::groups_partitions(shard).await?;
    let me = shard.config.node_id;
    let leaders: Vec<NodeId> = {
        let table = shard.table();
        let q = table.queue(GROUPS_QUEUE);
        (0..n)
            .map(|p| q.and_then(|q| q.partitions.get(p as usize)).map_or(me, |r| r.leader))
            .collect()
    };
    let mut all = Vec::new();
    let mut elsewhere = std::collections::BTreeSet::new();
    for (p, leader) in (0..n).zip(leaders) {
        if leader != me && leader != NO_LEADER {
            elsewhere.insert(leader);
            continue;
        }
        // Led here, offline, or not open yet: the shard says which.
        if let GroupReply::List(list) = coordinator(shard, p, GroupOp::List, None).await? {
            all.extend(list);
        }
    }
    if only_led_here {
        return Ok(all);
    }
    for node in elsewhere {
        all.extend(list_groups_on(shard, node).await?);
    }
    Ok(all)
}

/// The groups of the `__groups` partitions node `node` leads.
async fn list_groups_on(shard: &Rc<Shard>, node: NodeId) -> Result<Vec<g::GroupSummary>, WireError> {
    let mut fbb = FlatBufferBuilder::new();
    let root = ListGroupsRequest::create(&mut fbb, &ListGroupsRequestArgs { only_led_here: true });
    fbb.finish_minimal(root);
    let frame = call_node(
        shard,
        node,
        Api::ListGroups,
        fbb.finished_data(),
        TailBuilder::default(),
        NODE_TIMEOUT,
    )
    .await?;
    let resp = read_body::<ListGroupsResponse>(&frame.body)
        .map_err(|e| WireError::new(ErrorCode::Internal, format!("node {node}'s group list: {e}")))?;
    if let Some(e) = super::error_from_table(resp.error()) {
        return Err(e);
    }
    Ok(resp
        .groups()
        .iter()
        .flatten()
        .map(|s| g::GroupSummary {
            name: s.name().unwrap_or_default().to_string(),
            members: s.members(),
            generation: s.generation(),
        })
        .collect())
}

/// Sends `op` to the shard owning `__groups` partition `p`.
async fn coordinator(shard: &Rc<Shard>, p: u32, op: GroupOp, user: Option<String>) -> Result<GroupReply, WireError> {
    ask(shard, GROUPS_QUEUE.to_string(), p, |reply| {
        g::GroupCall::request(op, user, reply)
    })
    .await
}

fn invalid(message: impl Into<String>) -> WireError {
    WireError::new(ErrorCode::InvalidRequest, message)
}

/// A group name from a request: the queue-name rules.
fn group_name(name: Option<&str>) -> Result<String, WireError> {
    let name = name.ok_or_else(|| invalid("group name missing"))?;
    validate_queue_name(name).map_err(|m| invalid(format!("invalid group name: {m}")))?;
    Ok(name.to_string())
}

fn member_id(id: Option<&str>) -> Result<String, WireError> {
    id.filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| invalid("member_id missing"))
}

/// (queue, partition) pairs from a `[QueuePartitions]`.
fn partitions_of(list: Option<Vector<'_, ForwardsUOffset<QueuePartitions<'_>>>>) -> Result<Vec<Tp>, WireError> {
    let mut out = Vec::new();
    for qp in list.into_iter().flatten() {
        let q = qp.queue().ok_or_else(|| invalid("queue name missing"))?;
        out.extend(qp.partitions().into_iter().flatten().map(|p| (q.to_string(), p)));
        check_entries(out.len())?;
    }
    Ok(out)
}

fn read_op(api: Api, body: &[u8]) -> Result<(String, GroupOp), WireError> {
    Ok(match api {
        Api::JoinGroup => {
            let r = request::<JoinGroupRequest>(body)?;
            let group = group_name(r.group())?;
            let queues: Vec<String> = r.queues().into_iter().flatten().map(str::to_string).collect();
            check_entries(queues.len())?;
            let op = GroupOp::Join(g::JoinRequest {
                group: group.clone(),
                queues,
                strategy: strategy_from_wire(r.strategy())
                    .ok_or_else(|| invalid(format!("unknown assignment strategy {}", r.strategy().0)))?,
                start: start_from_wire(r.start()).ok_or_else(|| invalid(format!("unknown start {}", r.start().0)))?,
                session_timeout: Duration::from_millis(u64::from(r.session_timeout_ms())),
                client_name: r.client_name().unwrap_or_default().to_string(),
            });
            (group, op)
        }
        Api::Heartbeat => {
            let r = request::<HeartbeatRequest>(body)?;
            let group = group_name(r.group())?;
            let op = GroupOp::Heartbeat {
                group: group.clone(),
                member_id: member_id(r.member_id())?,
                owned: partitions_of(r.owned())?,
            };
            (group, op)
        }
        Api::LeaveGroup => {
            let r = request::<LeaveGroupRequest>(body)?;
            let group = group_name(r.group())?;
            let op = GroupOp::Leave {
                group: group.clone(),
                member_id: member_id(r.member_id())?,
            };
            (group, op)
        }
        Api::CommitOffsets => {
            let r = request::<CommitOffsetsRequest>(body)?;
            let group = group_name(r.group())?;
            let mut offsets = Vec::new();
            for qo in r.queues().into_iter().flatten() {
                let q = qo.queue().ok_or_else(|| invalid("queue name missing"))?;
                for po in qo.partitions().into_iter().flatten() {
                    let offset = u64::try_from(po.offset()).map_err(|_| {
                        invalid(format!("offset {} of {q}/{} is negative", po.offset(), po.partition()))
                    })?;
                    offsets.push(((q.to_string(), po.partition()), offset));
                }
                check_entries(offsets.len())?;
            }
            let op = GroupOp::Commit {
                group: group.clone(),
                member_id: member_id(r.member_id())?,
                generation: r.generation(),
                offsets,
            };
            (group, op)
        }
        Api::FetchOffsets => {
            let r = request::<FetchOffsetsRequest>(body)?;
            let group = group_name(r.group())?;
            let op = GroupOp::FetchOffsets {
                group: group.clone(),
                partitions: partitions_of(r.queues())?,
            };
            (group, op)
        }
        Api::DescribeGroup => {
            let r = request::<DescribeGroupRequest>(body)?;
            let group = group_name(r.group())?;
            (group.clone(), GroupOp::Describe { group })
        }
        Api::ResetGroup => {
            let r = request::<ResetGroupRequest>(body)?;
            let group = group_name(r.group())?;
            let queue = r.queue().ok_or_else(|| invalid("queue name missing"))?.to_string();
            let partitions: Vec<u32> = r.partitions().into_iter().flatten().collect();
            check_entries(partitions.len())?;
            let to = match r.to() {
                ResetTo::Earliest => g::ResetTo::Earliest,
                ResetTo::Latest => g::ResetTo::Latest,
                ResetTo::Offset => g::ResetTo::Offset(
                    u64::try_from(r.value()).map_err(|_| invalid(format!("offset {} is negative", r.value())))?,
                ),
                ResetTo::Timestamp => g::ResetTo::Timestamp(r.value()),
                other => return Err(invalid(format!("unknown reset target {}", other.0))),
            };
            let op = GroupOp::Reset {
                group: group.clone(),
                queue,
                partitions,
                to,
            };
            (group, op)
        }
        Api::Receive => {
            let r = request::<ReceiveRequest>(body)?;
            let group = group_name(r.group())?;
            let op = GroupOp::Receive {
                group: group.clone(),
                member_id: member_id(r.member_id())?,
                max_records: r.max_records().min(10_000),
                lock: Duration::from_millis(u64::from(r.lock_ms())),
            };
            (group, op)
        }
        Api::Settle => {
            let r = request::<SettleRequest>(body)?;
            let group = group_name(r.group())?;
            let mut records = Vec::new();
            for item in r.records().into_iter().flatten() {
                let q = item.queue().ok_or_else(|| invalid("queue name missing"))?;
                let outcome = match item.outcome() {
                    strand_wire::Outcome::Ack => Outcome::Ack,
                    strand_wire::Outcome::Nack => Outcome::Nack {
                        delay: Duration::from_millis(u64::from(item.delay_ms())),
                    },
                    strand_wire::Outcome::DeadLetter => Outcome::DeadLetter,
                    strand_wire::Outcome::Renew => Outcome::Renew,
                    other => return Err(invalid(format!("unknown outcome {}", other.0))),
                };
                records.push(g::SettleItem {
                    tp: (q.to_string(), item.partition()),
                    offset: item.offset(),
                    outcome,
                    reason: item.reason().map(|r| r.chars().take(1000).collect()),
                });
                check_entries(records.len())?;
            }
            let op = GroupOp::Settle {
                group: group.clone(),
                member_id: member_id(r.member_id())?,
                records,
            };
            (group, op)
        }
        Api::DeleteGroup => {
            let r = request::<DeleteGroupRequest>(body)?;
            let group = group_name(r.group())?;
            (group.clone(), GroupOp::Delete { group })
        }
        other => return Err(invalid(format!("{} is not a group API", other.name()))),
    })
}

/// `[QueuePartitions]` for a sorted list of partitions.
fn queue_partitions<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    tps: &[Tp],
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueuePartitions<'b>>>> {
    strand_wire::groups::queue_partitions(fbb, tps.iter().map(|(q, p)| (q.as_str(), *p)))
}

/// `[QueueOffsets]` for partitions sorted by queue (-1: none committed).
fn queue_offsets<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    offsets: &[(Tp, Option<u64>)],
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueueOffsets<'b>>>> {
    let items = offsets
        .iter()
        .map(|((q, p), o)| (q.as_str(), (*p, o.map_or(-1, |o| o.min(i64::MAX as u64) as i64))));
    strand_wire::groups::queue_offsets(fbb, items)
}

fn write_reply(
    fbb: &mut FlatBufferBuilder<'_>,
    tail: &mut TailBuilder,
    api: Api,
    reply: GroupReply,
) -> Result<(), WireError> {
    match (api, reply) {
        (Api::Receive, GroupReply::Received(parts)) => {
            let items: Vec<_> = parts
                .into_iter()
                .map(|part| {
                    let start = tail.len() as u32;
                    for b in part.batches {
                        tail.push(b);
                    }
                    let queue = fbb.create_string(&part.tp.0);
                    let offsets: Vec<u64> = part.offsets.iter().map(|(o, _)| *o).collect();
                    let attempts: Vec<u32> = part.offsets.iter().map(|(_, a)| *a).collect();
                    let offsets = fbb.create_vector(&offsets);
                    let attempts = fbb.create_vector(&attempts);
                    ReceivedPartition::create(
                        fbb,
                        &ReceivedPartitionArgs {
                            queue: Some(queue),
                            partition: part.tp.1,
                            records_offset: start,
                            records_len: tail.len() as u32 - start,
                            offsets: Some(offsets),
                            attempts: Some(attempts),
                        },
                    )
                })
                .collect();
            let partitions = fbb.create_vector(&items);
            let root = ReceiveResponse::create(
                fbb,
                &ReceiveResponseArgs {
                    error: None,
                    partitions: Some(partitions),
                },
            );
            fbb.finish_minimal(root);
        }
        (Api::Settle, GroupReply::Done) => {
            let root = SettleResponse::create(fbb, &SettleResponseArgs { error: None });
            fbb.finish_minimal(root);
        }
        (
            Api::JoinGroup,
            GroupReply::Joined {
                member_id,
                generation,
                heartbeat_interval,
            },
        ) => {
            let member_id = fbb.create_string(&member_id);
            let root = JoinGroupResponse::create(
                fbb,
                &JoinGroupResponseArgs {
                    error: None,
                    member_id: Some(member_id),
                    generation,
                    heartbeat_interval_ms: heartbeat_interval.as_millis().min(u128::from(u32::MAX)) as u32,
                },
            );
            fbb.finish_minimal(root);
        }
        (
            Api::Heartbeat,
            GroupReply::Heartbeat {
                generation,
                assigned,
                withheld,
            },
        ) => {
            let assigned = queue_partitions(fbb, &assigned);
            let root = HeartbeatResponse::create(
                fbb,
                &HeartbeatResponseArgs {
                    error: None,
                    generation,
                    assigned: Some(assigned),
                    withheld,
                },
            );
            fbb.finish_minimal(root);
        }
        (Api::LeaveGroup, GroupReply::Done) => {
            let root = LeaveGroupResponse::create(fbb, &LeaveGroupResponseArgs { error: None });
            fbb.finish_minimal(root);
        }
        (Api::CommitOffsets, GroupReply::Done) => {
            let root = CommitOffsetsResponse::create(fbb, &CommitOffsetsResponseArgs { error: None });
            fbb.finish_minimal(root);
        }
        (Api::DeleteGroup, GroupReply::Done) => {
            let root = DeleteGroupResponse::create(fbb, &DeleteGroupResponseArgs { error: None });
            fbb.finish_minimal(root);
        }
        (Api::FetchOffsets, GroupReply::Offsets { start, offsets }) => {
            let queues = queue_offsets(fbb, &offsets);
            let root = FetchOffsetsResponse::create(
                fbb,
                &FetchOffsetsResponseArgs {
                    error: None,
                    start: start_to_wire(start),
                    queues: Some(queues),
                },
            );
            fbb.finish_minimal(root);
        }
        (Api::ResetGroup, GroupReply::Reset(offsets)) => {
            let offsets: Vec<(Tp, Option<u64>)> = offsets.into_iter().map(|(tp, o)| (tp, Some(o))).collect();
            let queues = queue_offsets(fbb, &offsets);
            let root = ResetGroupResponse::create(
                fbb,
                &ResetGroupResponseArgs {
                    error: None,
                    queues: Some(queues),
                },
            );
            fbb.finish_minimal(root);
        }
        (Api::DescribeGroup, GroupReply::Describe(d)) => {
            let members: Vec<_> = d
                .members
                .iter()
                .map(|m| {
                    let member_id = fbb.create_string(&m.id);
                    let client_name = fbb.create_string(&m.client_name);
                    let qs: Vec<_> = m.queues.iter().map(|q| fbb.create_string(q)).collect();
                    let queues = fbb.create_vector(&qs);
                    let owned = queue_partitions(fbb, &m.owned);
                    GroupMember::create(
                        fbb,
                        &GroupMemberArgs {
                            member_id: Some(member_id),
                            client_name: Some(client_name),
                            queues: Some(queues),
                            owned: Some(owned),
                        },
                    )
                })
                .collect();
            let members = fbb.create_vector(&members);
            let as_long = |v: Option<u64>| v.map_or(-1, |v| v.min(i64::MAX as u64) as i64);
            let partitions: Vec<_> = d
                .partitions
                .iter()
                .map(|pd| {
                    let queue = fbb.create_string(&pd.tp.0);
                    let member_id = pd.member.as_ref().map(|m| fbb.create_string(m));
                    let error = error_table(fbb, pd.error.as_ref());
                    let lag = lag(pd, d.start);
                    GroupPartition::create(
                        fbb,
                        &GroupPartitionArgs {
                            queue: Some(queue),
                            partition: pd.tp.1,
                            member_id,
                            position: as_long(pd.position),
                            log_end: as_long(pd.log_end),
                            lag: as_long(lag),
                            error,
                        },
                    )
                })
                .collect();
            let partitions = fbb.create_vector(&partitions);
            let root = DescribeGroupResponse::create(
                fbb,
                &DescribeGroupResponseArgs {
                    error: None,
                    strategy: strategy_to_wire(d.strategy),
                    start: start_to_wire(d.start),
                    generation: d.generation,
                    members: Some(members),
                    partitions: Some(partitions),
                },
            );
            fbb.finish_minimal(root);
        }
        (api, reply) => {
            return Err(WireError::new(
                ErrorCode::Internal,
                format!("the coordinator answered {} with {reply:?}", api.name()),
            ))
        }
    }
    Ok(())
}

/// Records the group has yet to read of a partition: log end − position;
/// without a committed position, what it would read from its start
/// (everything stored for `Earliest`, nothing for `Latest`).
fn lag(pd: &g::PartitionDescription, start: g::group::Start) -> Option<u64> {
    let end = pd.log_end?;
    match (pd.position, start) {
        (Some(pos), _) => Some(end.saturating_sub(pos)),
        (None, g::group::Start::Earliest) => Some(end.saturating_sub(pd.log_start?)),
        (None, g::group::Start::Latest) => Some(0),
    }
}
