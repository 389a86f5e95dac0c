//! CreateQueue: commit a new queue through the controller.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{error_table, propose_error, request, respond, retention, user_queue_name};
use crate::controller::{
    default_min_insync_replicas, Command, FsyncSetting, QueueSettings, DEFAULT_MAX_DELIVERY_ATTEMPTS,
};
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let command = {
        let req = request::<CreateQueueRequest>(body)?;
        let name = user_queue_name(req.name())?;
        let settings = settings(shard, req.config())?;
        let adding = u64::from(settings.partitions) * u64::from(settings.replication_factor.max(1));
        check_replica_room(shard, adding)?;
        Command::CreateQueue { name, settings }
    };
    let result = shard.propose(command).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = CreateQueueResponse::create(&mut fbb, &CreateQueueResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}

/// A new queue's settings: what the request gives, the broker's defaults
/// for the rest.
fn settings(shard: &Shard, config: Option<QueueConfig<'_>>) -> Result<QueueSettings, WireError> {
    let defaults = &shard.config;
    let default_retention = (defaults.default_retention_ms > 0).then_some(defaults.default_retention_ms);
    let Some(c) = config else {
        return Ok(QueueSettings {
            partitions: defaults.default_partitions,
            replication_factor: 1,
            retention_ms: default_retention,
            retention_bytes: None,
            fsync: FsyncSetting::Always,
            max_message_bytes: defaults.max_message_bytes,
            max_delivery_attempts: DEFAULT_MAX_DELIVERY_ATTEMPTS,
            min_insync_replicas: default_min_insync_replicas(1) as u16,
            segment_bytes: 0,
        });
    };
    Ok(QueueSettings {
        partitions: if c.partitions() == 0 {
            defaults.default_partitions
        } else {
            c.partitions()
        },
        replication_factor: c.replication_factor(),
        retention_ms: retention(c.retention_ms(), default_retention, "retention_ms")?,
        retention_bytes: retention(c.retention_bytes(), None, "retention_bytes")?,
        fsync: fsync(c.fsync(), c.fsync_interval_ms(), c.fsync_interval_bytes())?,
        max_message_bytes: message_limit(shard, c.max_message_bytes())?.unwrap_or(defaults.max_message_bytes),
        max_delivery_attempts: c.max_delivery_attempts().unwrap_or(DEFAULT_MAX_DELIVERY_ATTEMPTS),
        min_insync_replicas: c
            .min_insync_replicas()
            .unwrap_or(default_min_insync_replicas(c.replication_factor()) as u16),
        segment_bytes: 0,
    })
}

/// Refuses a change that would give the cluster more partition replicas
/// than `max_partition_replicas_per_shard` times its brokers' shards (each
/// replica holds open files, memory and timers on its broker; without a
/// bound, a client creating queues in a loop takes the brokers down).
/// Checked here, on the table this broker holds, not in the controller's
/// state machine: a limit the voters of two versions (or two settings)
/// judged differently would split their state. Two creates at the same
/// time may together pass it by one queue.
pub fn check_replica_room(shard: &Shard, adding: u64) -> Result<(), WireError> {
    let per_shard = shard.config.max_partition_replicas_per_shard;
    if per_shard == 0 || adding == 0 {
        return Ok(());
    }
    let table = shard.table();
    let held: u64 = table
        .queues
        .values()
        .flat_map(|q| q.partitions.iter())
        // A move in progress counts what it ends with, as placement does.
        .map(|p| p.target.as_ref().unwrap_or(&p.replicas).len() as u64)
        .sum();
    // A broker from an older log reports no shards: one.
    let shards: u64 = table
        .brokers
        .values()
        .filter(|b| !b.decommissioning)
        .map(|b| u64::from(b.shards.max(1)))
        .sum::<u64>()
        .max(u64::from(shard.shards));
    let room = per_shard.saturating_mul(shards);
    if held.saturating_add(adding) > room {
        return Err(WireError::new(
            ErrorCode::InvalidConfig,
            format!(
                "the cluster holds {held} partition replicas and may hold {room} \
                 (max_partition_replicas_per_shard {per_shard} × {shards} shards): {adding} more do not fit; \
                 delete queues, add brokers, or raise the setting"
            ),
        ));
    }
    Ok(())
}

/// A queue's largest batch must fit in a frame with room to spare, or its
/// producers would have their connections closed with FrameTooLarge.
pub fn message_limit(shard: &Shard, value: Option<u32>) -> Result<Option<u32>, WireError> {
    match value {
        Some(v) if v >= shard.config.max_frame_bytes => Err(WireError::new(
            ErrorCode::InvalidConfig,
            format!(
                "max_message_bytes {v} must be below this broker's frame limit of {} bytes (its max_frame_bytes)",
                shard.config.max_frame_bytes
            ),
        )),
        other => Ok(other),
    }
}

/// The fsync setting from its wire fields.
pub fn fsync(mode: FsyncMode, ms: u32, bytes: u64) -> Result<FsyncSetting, WireError> {
    match mode {
        FsyncMode::Always => Ok(FsyncSetting::Always),
        FsyncMode::Interval => Ok(FsyncSetting::Interval {
            ms: u64::from(ms),
            bytes,
        }),
        other => Err(WireError::new(
            ErrorCode::InvalidConfig,
            format!("unknown fsync mode {}", other.0),
        )),
    }
}
