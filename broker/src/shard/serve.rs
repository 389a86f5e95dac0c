//! Serving a request for a partition this shard owns: produce (through
//! `produce.rs`), fetch, offsets, describe, calls of the layers above
//! ([`PartitionCall`]), and followers' fetches. All of them only on the
//! partition's leader: a follower's replica answers `NotLeader`.
//!
//! Runs on: the owning shard; the router (`router.rs`) brings requests
//! here from other shards and nodes.

use std::rc::Rc;

use strand_storage::{LeaderEpoch, Offset};
use strand_wire::ErrorCode;

use super::messages::*;
use super::partitions::Partition;
use super::{reply_error, storage_error, Shard};
use crate::replica::fetch::{answer_fetch, FetchAnswer};
use crate::replica::leader::Position;

impl Shard {
    /// Serves a partition request on the owning shard.
    pub async fn serve_partition(self: &Rc<Self>, queue: &str, partition: u32, request: PartitionRequest) {
        let Some(part) = self.partitions.get(queue, partition).filter(|p| p.leading().is_some()) else {
            let table = self.table();
            let err = match table.queue(queue) {
                None => WireError::new(ErrorCode::UnknownQueue, format!("queue {queue:?} does not exist")),
                Some(q) if partition as usize >= q.partitions.len() => WireError::new(
                    ErrorCode::UnknownPartition,
                    format!("queue {queue:?} has {} partitions", q.partitions.len()),
                ),
                // Led here but not open: being (re)opened, or it failed to
                // open. NotLeader makes clients refresh and retry.
                Some(q) if q.partitions[partition as usize].leader == self.config.node_id => WireError::new(
                    ErrorCode::NotLeader,
                    format!(
                        "{queue}/{partition} is not open on this broker yet (opening, or it failed to open: \
                         see the broker's log); retry"
                    ),
                ),
                Some(q) if q.partitions[partition as usize].leader == crate::controller::NO_LEADER => WireError::new(
                    ErrorCode::BrokerUnavailable,
                    format!(
                        "{queue}/{partition} is offline: its in-sync replicas {:?} are fenced; it is back \
                             with one of them",
                        q.partitions[partition as usize].isr
                    ),
                ),
                Some(q) => {
                    let p = &q.partitions[partition as usize];
                    WireError::not_leader(
                        format!("broker {} leads {queue}/{partition}", p.leader),
                        p.leader,
                        p.leader_epoch,
                    )
                }
            };
            reply_error(request, err);
            return;
        };
        match request {
            PartitionRequest::Produce {
                records,
                acks,
                timeout_ms,
                reply,
            } => {
                if let Some(full) = self.disk_refusal() {
                    reply.send(Err(full));
                    return;
                }
                let result = self.produce(&part, records, acks, timeout_ms).await;
                if result
                    .as_ref()
                    .is_err_and(|e| matches!(e.code, ErrorCode::OutOfOrderSequence | ErrorCode::UnknownProducer))
                {
                    self.metrics.sequence_refused();
                }
                reply.send(result);
            }
            PartitionRequest::Fetch {
                offset,
                max_bytes,
                reply,
            } => {
                let log = &part.log;
                let hw = log.high_watermark();
                let result = log
                    .read_below(Offset(offset), max_bytes as usize, hw)
                    .await
                    .map(|mut read| {
                        // Batches read from disk slice this shard's I/O
                        // buffers, which must not be freed on another
                        // thread: copied when the answer leaves the shard.
                        if reply.origin() != self.id.0 {
                            read.detach();
                        }
                        Fetched {
                            read,
                            high_watermark: hw.0,
                            log_start: log.log_start().0,
                        }
                    })
                    .map_err(storage_error);
                reply.send(result);
            }
            PartitionRequest::ReplicaFetch { want, reply } => {
                let result = self.serve_replica_fetch(&part, want, reply.origin()).await;
                reply.send(result);
            }
            PartitionRequest::ListOffsets { query, reply } => {
                let log = &part.log;
                let result = match query {
                    OffsetQuery::Earliest => Ok((log.log_start().0, true)),
                    OffsetQuery::Latest => Ok((log.high_watermark().0, true)),
                    OffsetQuery::Timestamp(ts) => match log.offset_for_timestamp(ts).await {
                        Ok(Some(o)) if o < log.high_watermark() => Ok((o.0, true)),
                        Ok(_) => Ok((log.high_watermark().0, false)),
                        Err(e) => Err(storage_error(e)),
                    },
                };
                reply.send(result);
            }
            PartitionRequest::Call(call) => {
                let at = OpenPartition {
                    shard: self.clone(),
                    queue: queue.to_string(),
                    partition,
                    part,
                };
                call.run(at).await
            }
            PartitionRequest::Describe { reply } => {
                let log = &part.log;
                reply.send(Ok(PartitionStats {
                    log_start: log.log_start().0,
                    log_end: log.log_end().0,
                    high_watermark: log.high_watermark().0,
                    stored_bytes: log.size_bytes(),
                    segments: log.segment_count() as u32,
                }));
            }
        }
    }
}

impl Shard {
    /// A follower's fetch, on the leader: in the same leader epoch, the
    /// follower's position counts toward the high watermark and its records
    /// come from its log end; a diverged log learns where its last epoch
    /// ends here instead (`crate::replica::fetch`).
    async fn serve_replica_fetch(
        &self,
        part: &Partition,
        want: ReplicaWant,
        origin: u16,
    ) -> Result<ReplicaFetched, WireError> {
        let log = &part.log;
        let Some(epoch) = part.leading() else {
            return Err(WireError::new(
                ErrorCode::NotLeader,
                "this broker does not lead the partition",
            ));
        };
        // Another queue of the same name (deleted and created again): the
        // follower's log is not this one's and must not count toward it.
        if want.queue_id != 0 && want.queue_id != part.queue_id {
            return Err(WireError::new(
                ErrorCode::UnknownQueue,
                format!(
                    "the follower fetches queue id {}, this leader's queue of that name has id {}: one of them \
                     has not applied the queue's deletion and re-creation yet",
                    want.queue_id, part.queue_id
                ),
            ));
        }
        let fetch_offset = Offset(want.fetch_offset);
        let answer = answer_fetch(
            LeaderEpoch(epoch),
            LeaderEpoch(want.leader_epoch),
            &log.epochs(),
            log.log_end(),
            fetch_offset,
            want.last_epoch.map(LeaderEpoch),
        );
        let fetched = |read| Fetched {
            read,
            high_watermark: log.high_watermark().0,
            log_start: log.log_start().0,
        };
        match answer {
            FetchAnswer::Fenced { leader_epoch } => Err(WireError::new(
                ErrorCode::NotLeader,
                format!(
                    "leader epoch {} asked, this leader is in epoch {}: refresh the metadata",
                    want.leader_epoch, leader_epoch.0
                ),
            )),
            // Below the log start (retention removed what the follower
            // would fetch, epochs included): no records, and the log start
            // tells it where to start over. Not counted: it holds none of
            // this log.
            _ if fetch_offset < log.log_start() => Ok(ReplicaFetched {
                fetched: fetched(Default::default()),
                diverging: None,
            }),
            FetchAnswer::Diverging { epoch, end_offset } => Ok(ReplicaFetched {
                fetched: fetched(Default::default()),
                diverging: Some((epoch.0, end_offset.0)),
            }),
            FetchAnswer::Records => {
                // Only a position inside this log counts (a fetch from past
                // its end never holds what it claims).
                if fetch_offset > log.log_end() {
                    return Err(WireError::new(
                        ErrorCode::OffsetOutOfRange,
                        format!(
                            "offset {} is outside the leader's log [{}, {}]",
                            fetch_offset.0,
                            log.log_start().0,
                            log.log_end().0
                        ),
                    ));
                }
                let mut read = log
                    .read(fetch_offset, want.max_bytes as usize)
                    .await
                    .map_err(storage_error)?;
                // Counted once the fetch is known good, and only while this
                // replica still leads in the epoch it answered for.
                if part.leading() == Some(epoch) {
                    let at = Position {
                        log_end: fetch_offset,
                        flushed: Offset(want.flushed_offset).min(fetch_offset),
                    };
                    if part.note_fetch(want.replica, at) {
                        self.partitions.new_data.notify_all();
                    }
                }
                if origin != self.id.0 {
                    read.detach();
                }
                Ok(ReplicaFetched {
                    fetched: fetched(read),
                    diverging: None,
                })
            }
        }
    }
}
