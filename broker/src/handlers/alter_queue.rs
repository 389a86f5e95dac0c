//! AlterQueue: add partitions, change retention, fsync policy, message size.

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::create_queue::fsync;
use super::{error_table, propose_error, request, respond, retention, user_queue_name};
use crate::controller::{Command, FsyncSetting, QueueChanges};
use crate::shard::messages::WireError;
use crate::shard::Shard;

pub async fn handle(shard: &Rc<Shard>, header: FrameHeader, body: &[u8]) -> Result<OutFrame, WireError> {
    let command = {
        let req = request::<AlterQueueRequest>(body)?;
        let name = user_queue_name(req.name())?;
        let current = shard.table().queue(&name).map(|q| q.settings.clone());
        if let (Some(wanted), Some(now)) = (req.partitions(), current.as_ref()) {
            let more = u64::from(wanted.saturating_sub(now.partitions));
            super::create_queue::check_replica_room(shard, more * u64::from(now.replication_factor.max(1)))?;
        }
        let changes = QueueChanges {
            partitions: req.partitions(),
            retention_ms: req
                .retention_ms()
                .map(|v| retention(Some(v), None, "retention_ms"))
                .transpose()?,
            retention_bytes: req
                .retention_bytes()
                .map(|v| retention(Some(v), None, "retention_bytes"))
                .transpose()?,
            fsync: match req.fsync() {
                None => None,
                Some(mode) => {
                    // Interval fields not given keep their current values.
                    let (ms, bytes) = match current.map(|s| s.fsync) {
                        Some(FsyncSetting::Interval { ms, bytes }) => (ms as u32, bytes),
                        _ => (0, 0),
                    };
                    Some(fsync(
                        mode,
                        req.fsync_interval_ms().unwrap_or(ms),
                        req.fsync_interval_bytes().unwrap_or(bytes),
                    )?)
                }
            },
            max_message_bytes: super::create_queue::message_limit(shard, req.max_message_bytes())?,
            max_delivery_attempts: req.max_delivery_attempts(),
            min_insync_replicas: req.min_insync_replicas(),
        };
        Command::AlterQueue { name, changes }
    };
    let result = shard.propose(command).await.map_err(propose_error);
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, result.as_ref().err());
    let root = AlterQueueResponse::create(&mut fbb, &AlterQueueResponseArgs { error });
    fbb.finish_minimal(root);
    Ok(respond(header, &fbb, TailBuilder::default()))
}
