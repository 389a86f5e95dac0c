//! Metadata: brokers, queues, partitions and their leaders. A user whose
//! ACLs decide sees only the queues it may describe: all of them means
//! those, and a queue it names but may not describe is answered
//! `NotAuthorized`, whether it exists or not. The broker's own queues
//! (`__groups`) are shown to all: group members find their coordinator
//! through them.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{config_table, error_table, request, respond};
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// `acl_user`: the user whose ACLs decide (none: a superuser, a broker,
/// `--auth none`).
pub fn handle(
    shard: &Rc<Shard>,
    header: FrameHeader,
    body: &[u8],
    acl_user: Option<String>,
) -> Result<OutFrame, WireError> {
    let req = request::<MetadataRequest>(body)?;
    let table = shard.table();
    // The broker's own queues are shown to all: a group member finds its
    // coordinator through `__groups`' leaders.
    let may_describe = |queue: &str| {
        crate::groups::is_internal(queue)
            || acl_user
                .as_deref()
                .is_none_or(|user| super::authorize::may_describe(&table.acls, user, queue))
    };
    let wanted: Vec<String> = match req.queues() {
        Some(names) if !names.is_empty() => names.iter().map(str::to_string).collect(),
        _ => table.queues.keys().filter(|q| may_describe(q)).cloned().collect(),
    };
    let mut fbb = FlatBufferBuilder::new();
    let brokers: Vec<_> = table
        .brokers
        .values()
        .map(|b| {
            let (host, port) = match b.address.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().unwrap_or(0)),
                None => (b.address.clone(), 0),
            };
            let host = fbb.create_string(&host);
            BrokerInfo::create(
                &mut fbb,
                &BrokerInfoArgs {
                    node_id: b.id as u32,
                    host: Some(host),
                    port,
                    shards: b.shards,
                    fenced: !b.alive,
                    draining: b.draining,
                    decommissioning: b.decommissioning,
                },
            )
        })
        .collect();
    let brokers = fbb.create_vector(&brokers);
    let mut queues = Vec::new();
    for name in &wanted {
        let name_off = fbb.create_string(name);
        let found = table.queue(name).filter(|_| may_describe(name));
        let Some(q) = found else {
            let err = match may_describe(name) {
                true => WireError::new(ErrorCode::UnknownQueue, format!("queue {name:?} does not exist")),
                false => WireError::new(
                    ErrorCode::NotAuthorized,
                    format!(
                        "user {:?} may not describe queue {name:?}",
                        acl_user.as_deref().unwrap_or_default()
                    ),
                ),
            };
            let error = error_table(&mut fbb, Some(&err));
            queues.push(QueueMetadata::create(
                &mut fbb,
                &QueueMetadataArgs {
                    name: Some(name_off),
                    error,
                    partitions: None,
                    config: None,
                    id: 0,
                },
            ));
            continue;
        };
        let parts: Vec<_> = q
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let replicas: Vec<u32> = p.replicas.iter().map(|r| *r as u32).collect();
                let replicas = fbb.create_vector(&replicas);
                let isr: Vec<u32> = p.isr.iter().map(|r| *r as u32).collect();
                let isr = fbb.create_vector(&isr);
                let target = p.target.as_ref().map(|t| {
                    let t: Vec<u32> = t.iter().map(|r| *r as u32).collect();
                    fbb.create_vector(&t)
                });
                PartitionInfo::create(
                    &mut fbb,
                    &PartitionInfoArgs {
                        partition: i as u32,
                        leader: p.leader as u32,
                        leader_epoch: p.leader_epoch,
                        replicas: Some(replicas),
                        isr: Some(isr),
                        target_replicas: target,
                        lost_replica: p.lost.map(|l| l.broker as u32),
                    },
                )
            })
            .collect();
        let parts = fbb.create_vector(&parts);
        let config = config_table(&mut fbb, &q.settings);
        queues.push(QueueMetadata::create(
            &mut fbb,
            &QueueMetadataArgs {
                name: Some(name_off),
                error: None,
                partitions: Some(parts),
                config: Some(config),
                id: q.id,
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = MetadataResponse::create(
        &mut fbb,
        &MetadataResponseArgs {
            error: None,
            brokers: Some(brokers),
            controller: shard.controller_leader.load(std::sync::atomic::Ordering::Relaxed) as u32,
            queues: Some(queues),
            applied_index: table.applied_index,
        },
    );
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
