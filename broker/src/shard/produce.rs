//! The produce path on the shard that owns the partition: the request's
//! batches checked, each appended once under the leader's epoch
//! (idempotent producers: a resent batch is answered with where it was
//! stored), the durability wait the acks ask for, and the high watermark
//! moved — to what every in-sync replica holds (`crate::replica::leader`);
//! acks=all waits until it passes the request's last record.
//!
//! Runs on: the owning shard, on the partition's leader only.

use std::rc::Rc;
use std::time::{Duration, Instant};

use strand_storage::{LeaderEpoch, Offset, StorageError};
use strand_wire::ErrorCode;

use super::messages::{Produced, WireError};
use super::partitions::{Partition, Role};
use super::{storage_error, Shard};
use crate::replica::leader::Ack;
use strand_storage::producers::{Sequenced, Verdict};

impl Shard {
    /// Appends the batches in `records` and, for acks ≥ 1, waits until they
    /// are durable here per the queue's policy, then moves the high
    /// watermark as far as the in-sync replicas hold; acks=all also waits
    /// (at most `timeout_ms`) until the high watermark passes the last
    /// record.
    pub(crate) async fn produce(
        self: &Rc<Self>,
        part: &Rc<Partition>,
        mut records: bytes::BytesMut,
        acks: i8,
        timeout_ms: u32,
    ) -> Result<Produced, WireError> {
        let log = &part.log;
        let Some(epoch) = part.leading() else {
            return Err(not_leader(part));
        };
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        // Refused before anything is appended while too few replicas are in
        // sync: nothing stored that cannot be acknowledged.
        if acks == -1 {
            check_insync(part)?;
        }
        let interval = matches!(log.config().fsync, strand_storage::FsyncPolicy::Interval { .. });
        if records.is_empty() {
            return Err(WireError::new(ErrorCode::InvalidRequest, "no record batch"));
        }
        let max = log.config().batch_bytes_max;
        // Several batches in one request: check them all before appending
        // any, so a bad one cannot leave the request half applied.
        let mut rest = &records[..];
        let mut count = 0;
        while !rest.is_empty() {
            let len = (strand_storage::batch::batch_length(rest).unwrap_or(0) as usize).min(rest.len());
            if count > 0 || len < rest.len() {
                strand_storage::batch::validate(&rest[..len], max)
                    .map_err(|e| storage_error(StorageError::InvalidBatch(e)))?;
            }
            count += 1;
            rest = &rest[len.max(1).min(rest.len())..];
        }
        let mut first = None;
        let mut last = None;
        let mut stored_bytes = 0;
        while !records.is_empty() {
            let len = strand_storage::batch::batch_length(&records).unwrap_or(0) as usize;
            if len > max {
                return Err(WireError::new(
                    ErrorCode::MessageTooLarge,
                    format!("record batch of {len} bytes is over the queue's limit of {max}"),
                ));
            }
            if len < strand_storage::batch::HEADER_LEN || len > records.len() {
                return Err(WireError::new(
                    ErrorCode::CorruptBatch,
                    format!(
                        "record batch length {len} does not fit the {} bytes sent",
                        records.len()
                    ),
                ));
            }
            let batch = records.split_to(len);
            let info = {
                let _turn = part
                    .appending
                    .acquire_permit(1)
                    .await
                    .map_err(|_| WireError::new(ErrorCode::NotLeader, "the partition is closing; retry"))?;
                // Leadership may have moved while this request waited.
                if part.leading() != Some(epoch) {
                    return Err(not_leader(part));
                }
                // Nor without the lease (`crate::lease`).
                self.check_lease()?;
                append_once(part, batch, LeaderEpoch(epoch)).await?
            };
            // Followers waiting for records fetch them now.
            self.partitions.appended.notify_all();
            // Wakes the interval timer (it sleeps while nothing is to be
            // written): per batch, so a later batch's failure cannot leave
            // an earlier one unwritten until the timer's next look.
            if interval {
                self.partitions.interval_appends.notify_all();
            }
            first.get_or_insert(info);
            last = Some(info);
            stored_bytes += info.bytes;
        }
        let (Some(first), Some(last)) = (first, last) else {
            return Err(WireError::new(ErrorCode::InvalidRequest, "no record batch"));
        };
        let commit = {
            let (part, shard) = (part.clone(), self.clone());
            async move {
                let result = part.log.wait_durable(last.last_offset).await;
                if result.is_ok() && part.note_local() {
                    shard.partitions.new_data.notify_all();
                }
                result
            }
        };
        // What an acknowledgement waits for (the schema's ProduceRequest.acks):
        // acks=0 nothing; acks=1 on an fsync=interval queue the append to
        // the leader's log — like Kafka's acks=1, whose leader answers from
        // its page cache: the records are written within milliseconds and
        // fdatasync'd per the interval, and a broker crash before then loses
        // them (REQUIREMENTS: only acks=all must survive kill -9); acks=1 on
        // fsync=always and acks=all wait until the records are durable per
        // the policy (written to the device, or fdatasync'd). Consumers see
        // records only once they are durable per the policy, whatever the
        // acks (the high watermark moves in `commit`).
        let wait = !matches!(
            (acks, log.config().fsync),
            (0, _) | (1, strand_storage::FsyncPolicy::Interval { .. })
        );
        if wait {
            commit.await.map_err(storage_error)?;
            if acks == -1 {
                self.wait_replicated(part, epoch, last.last_offset, deadline).await?;
            } else {
                self.check_lease()?;
            }
        } else {
            glommio::spawn_local(async move {
                if let Err(e) = commit.await {
                    tracing::warn!("an append answered before it was durable failed to become durable: {e}");
                }
            })
            .detach();
        }
        Ok(Produced {
            base_offset: first.base_offset.0,
            last_offset: last.last_offset.0,
            log_append_time_ms: if log.config().log_append_time {
                last.max_timestamp
            } else {
                -1
            },
            log_start: log.log_start().0,
            stored_bytes,
        })
    }
}

impl Shard {
    /// Waits until every in-sync replica holds `last` (the high watermark
    /// passed it), the ISR is below the queue's minimum (`NotEnoughReplicas`),
    /// leadership moved (`NotLeader`: the new leader may or may not have the
    /// records, and an idempotent resend there is answered either way), or
    /// the deadline passed (`Timeout`).
    pub(crate) async fn wait_replicated(
        &self,
        part: &Partition,
        epoch: u32,
        last: Offset,
        deadline: Instant,
    ) -> Result<(), WireError> {
        loop {
            let seen = part.acks.epoch();
            let ack = match &*part.role.borrow() {
                Role::Leader { epoch: e, state } if *e == epoch => state.ack(last),
                _ => return Err(not_leader(part)),
            };
            match ack {
                // Not answered as committed without the lease: the
                // controller may have fenced this broker and elected a
                // leader that lacks the records.
                Ack::Committed => {
                    self.check_lease()?;
                    // Consumers see them too (a high watermark held back
                    // while the lease ran out moves on).
                    self.partitions.release_held_back();
                    return Ok(());
                }
                Ack::NotEnoughReplicas => return Err(check_insync(part).err().unwrap_or_else(|| not_leader(part))),
                Ack::Waiting => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stopping.get() {
                return Err(WireError::new(
                    ErrorCode::Timeout,
                    format!(
                        "the in-sync replicas did not all confirm offset {} within the request's timeout (the \
                         records are on the leader and may still be committed)",
                        last.0
                    ),
                ));
            }
            let _ = glommio::timer::timeout(left, async {
                part.acks.wait(seen).await;
                Ok(())
            })
            .await;
        }
    }
}

/// `NotEnoughReplicas` while the partition's ISR is smaller than acks=all
/// needs.
fn check_insync(part: &Partition) -> Result<(), WireError> {
    if let Role::Leader { state, .. } = &*part.role.borrow() {
        let need = state.min_insync();
        if state.isr().len() < need {
            return Err(WireError::new(
                ErrorCode::NotEnoughReplicas,
                format!(
                    "acks=all needs {need} in-sync replicas and the partition has {} ({:?}); retry once a \
                     replica has caught up",
                    state.isr().len(),
                    state.isr()
                ),
            ));
        }
    }
    Ok(())
}

/// The answer of a replica that does not lead (any more).
fn not_leader(part: &Partition) -> WireError {
    match part.following() {
        Some((leader, epoch)) => {
            WireError::not_leader(format!("broker {leader} leads the partition now"), leader, epoch)
        }
        None => WireError::new(ErrorCode::NotLeader, "this broker does not lead the partition; retry"),
    }
}

/// Appends one batch of a produce request, unless its producer's sequence
/// says otherwise ([`strand_storage::producers`]; the log notes the
/// batches it appends): a duplicate is answered with the
/// offsets it was stored at; a batch out of order is refused
/// (`OutOfOrderSequence`, which the producer retries in order).
async fn append_once(
    part: &Partition,
    batch: bytes::BytesMut,
    epoch: LeaderEpoch,
) -> Result<strand_storage::AppendInfo, WireError> {
    let seq = strand_storage::batch::BatchHeader::parse(&batch)
        .and_then(|h| Sequenced::of(h.producer_id, h.base_sequence, h.record_count));
    let Some(seq) = seq else {
        return part.log.append(batch, epoch).await.map_err(storage_error);
    };
    let verdict = part.log.check_producer(seq);
    let (code, why) = match verdict {
        Verdict::Append => {
            return part.log.append(batch, epoch).await.map_err(storage_error);
        }
        Verdict::Duplicate((base, last, max_timestamp)) => {
            return Ok(strand_storage::AppendInfo {
                base_offset: Offset(base),
                last_offset: Offset(last),
                max_timestamp,
                bytes: 0,
            })
        }
        Verdict::OutOfOrder { expected } => (
            ErrorCode::OutOfOrderSequence,
            format!("out of order: the partition expects sequence {expected} next"),
        ),
        Verdict::TooMany => (
            ErrorCode::TooManyProducers,
            format!(
                "the partition remembers {} producers, each active within the last {} minutes: a new producer \
                 id would push out one whose retries may still come; retry later, or reuse producers",
                strand_storage::producers::MAX_PRODUCERS,
                strand_storage::producers::FORGET_AFTER_MS / 60_000
            ),
        ),
        Verdict::Unknown => (
            ErrorCode::UnknownProducer,
            "this leader does not know the producer (restarted, moved, or forgot it); go on under a new \
             producer id from sequence 0"
                .to_string(),
        ),
    };
    tracing::debug!(
        producer = seq.producer_id,
        sequence = seq.first,
        "produce refused: {why}"
    );
    Err(WireError::new(
        code,
        format!("producer {}, sequence {}: {why}", seq.producer_id, seq.first),
    ))
}
