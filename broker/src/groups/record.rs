//! The records of `__groups`: how a group's durable state is stored.
//!
//! Runs on: the coordinator's shard (written before a change is answered;
//! read back when a `__groups` partition is first used after a start).
//!
//! Each record of a `__groups` partition is an ordinary record of a record
//! batch (layout in `strand_wire::batch`): key = the group's name in UTF-8,
//! value = a `GroupRecord` flatbuffer (schema: `flatbuffers/schema/strand.fbs`,
//! "On disk: the records of `__groups`"). A batch's CRC covers its records;
//! a value that is not a valid `GroupRecord` (a bug, or a newer kind this
//! build does not know) is reported and skipped at replay rather than
//! stopping every group of the partition. A snapshot (compaction) is the
//! same records tagged `snapshot_of`, between two markers whose key is
//! empty ([`snapshot_batches`]; replayed by `replay.rs`).

use bytes::BytesMut;
use strand_wire::batch::BatchBuilder;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::{AssignStrategy, GroupRecordArgs, GroupRecordKind, GroupStart, Outcome};

use super::assign::Strategy;
use super::group::Start;

/// One change of a group's durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupChange {
    Created {
        strategy: Strategy,
        start: Start,
    },
    Commit {
        queue: String,
        partition: u32,
        offset: u64,
    },
    /// An operator's reset (`group reset`) to `offset`: a `Commit` record
    /// with `reset` set. Unlike a commit it may move an ack-mode position
    /// back, and starts its record state over.
    Reset {
        queue: String,
        partition: u32,
        offset: u64,
    },
    Deleted,
    /// Ack mode: a record handed out for the `attempts`th time.
    Delivered {
        queue: String,
        partition: u32,
        offset: u64,
        attempts: u32,
    },
    /// Ack mode: a record settled (`done`: acked or dead-lettered; else
    /// nacked), with its last error.
    Settled {
        queue: String,
        partition: u32,
        offset: u64,
        outcome: Settled,
        reason: Option<String>,
    },
    /// Compaction: a snapshot of the partition's groups as of offset
    /// `covers` (every record below it applied) begins…
    SnapshotBegin {
        covers: u64,
    },
    /// …and is complete.
    SnapshotEnd {
        covers: u64,
    },
}

/// A record value read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub change: GroupChange,
    /// The id of its queue when written (0: none).
    pub queue_id: u64,
    /// Not 0: part of the snapshot as of this offset.
    pub snapshot_of: u64,
}

/// How a record was settled, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Ack,
    Nack,
    DeadLetter,
}

pub fn strategy_to_wire(s: Strategy) -> AssignStrategy {
    match s {
        Strategy::Range => AssignStrategy::Range,
        Strategy::RoundRobin => AssignStrategy::RoundRobin,
        Strategy::Sticky => AssignStrategy::Sticky,
    }
}

pub fn strategy_from_wire(s: AssignStrategy) -> Option<Strategy> {
    match s {
        AssignStrategy::Range => Some(Strategy::Range),
        AssignStrategy::RoundRobin => Some(Strategy::RoundRobin),
        AssignStrategy::Sticky => Some(Strategy::Sticky),
        _ => None,
    }
}

pub fn start_to_wire(s: Start) -> GroupStart {
    match s {
        Start::Earliest => GroupStart::Earliest,
        Start::Latest => GroupStart::Latest,
    }
}

pub fn start_from_wire(s: GroupStart) -> Option<Start> {
    match s {
        GroupStart::Earliest => Some(Start::Earliest),
        GroupStart::Latest => Some(Start::Latest),
        _ => None,
    }
}

impl GroupChange {
    /// The data queue the change is about, if any.
    pub fn queue(&self) -> Option<&str> {
        match self {
            GroupChange::Commit { queue, .. }
            | GroupChange::Reset { queue, .. }
            | GroupChange::Delivered { queue, .. }
            | GroupChange::Settled { queue, .. } => Some(queue),
            GroupChange::Created { .. }
            | GroupChange::Deleted
            | GroupChange::SnapshotBegin { .. }
            | GroupChange::SnapshotEnd { .. } => None,
        }
    }

    /// A snapshot's begin or end.
    pub fn is_marker(&self) -> bool {
        matches!(
            self,
            GroupChange::SnapshotBegin { .. } | GroupChange::SnapshotEnd { .. }
        )
    }
}

/// A change's record value; `queue_id` is the id of its queue (0: none),
/// `snapshot_of` the snapshot it is part of (0: none).
pub fn encode(change: &GroupChange, queue_id: u64, snapshot_of: u64) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::with_capacity(64);
    let mut args = GroupRecordArgs {
        queue_id,
        snapshot_of,
        ..GroupRecordArgs::default()
    };
    let queue;
    match change {
        GroupChange::Delivered {
            queue: q,
            partition,
            offset,
            attempts,
        } => {
            queue = fbb.create_string(q);
            args.kind = GroupRecordKind::Delivered;
            args.queue = Some(queue);
            args.partition = *partition;
            args.offset = *offset;
            args.attempts = *attempts;
        }
        GroupChange::Settled {
            queue: q,
            partition,
            offset,
            outcome,
            reason,
        } => {
            queue = fbb.create_string(q);
            args.reason = reason.as_deref().map(|r| fbb.create_string(r));
            args.kind = GroupRecordKind::Settled;
            args.queue = Some(queue);
            args.partition = *partition;
            args.offset = *offset;
            args.outcome = match outcome {
                Settled::Ack => Outcome::Ack,
                Settled::Nack => Outcome::Nack,
                Settled::DeadLetter => Outcome::DeadLetter,
            };
        }
        GroupChange::Created { strategy, start } => {
            args.kind = GroupRecordKind::Created;
            args.strategy = strategy_to_wire(*strategy);
            args.start = start_to_wire(*start);
        }
        GroupChange::Commit {
            queue: q,
            partition,
            offset,
        }
        | GroupChange::Reset {
            queue: q,
            partition,
            offset,
        } => {
            queue = fbb.create_string(q);
            args.kind = GroupRecordKind::Commit;
            args.queue = Some(queue);
            args.partition = *partition;
            args.offset = *offset;
            args.reset = matches!(change, GroupChange::Reset { .. });
        }
        GroupChange::Deleted => args.kind = GroupRecordKind::Deleted,
        GroupChange::SnapshotBegin { covers } => {
            args.kind = GroupRecordKind::SnapshotBegin;
            args.offset = *covers;
        }
        GroupChange::SnapshotEnd { covers } => {
            args.kind = GroupRecordKind::SnapshotEnd;
            args.offset = *covers;
        }
    }
    let root = strand_wire::GroupRecord::create(&mut fbb, &args);
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Reads a record value back.
pub fn decode(value: &[u8]) -> Result<Stored, String> {
    let r = strand_wire::flatbuffers::root::<strand_wire::GroupRecord>(value).map_err(|e| e.to_string())?;
    change_of(&r).map(|change| Stored {
        change,
        queue_id: r.queue_id(),
        snapshot_of: r.snapshot_of(),
    })
}

fn change_of(r: &strand_wire::GroupRecord<'_>) -> Result<GroupChange, String> {
    match r.kind() {
        GroupRecordKind::Created => Ok(GroupChange::Created {
            strategy: strategy_from_wire(r.strategy())
                .ok_or_else(|| format!("unknown assignment strategy {}", r.strategy().0))?,
            start: start_from_wire(r.start()).ok_or_else(|| format!("unknown start {}", r.start().0))?,
        }),
        GroupRecordKind::Commit if r.reset() => Ok(GroupChange::Reset {
            queue: r.queue().ok_or("a reset record without a queue")?.to_string(),
            partition: r.partition(),
            offset: r.offset(),
        }),
        GroupRecordKind::Commit => Ok(GroupChange::Commit {
            queue: r.queue().ok_or("a commit record without a queue")?.to_string(),
            partition: r.partition(),
            offset: r.offset(),
        }),
        GroupRecordKind::Deleted => Ok(GroupChange::Deleted),
        GroupRecordKind::Delivered => Ok(GroupChange::Delivered {
            queue: r.queue().ok_or("a delivery record without a queue")?.to_string(),
            partition: r.partition(),
            offset: r.offset(),
            attempts: r.attempts(),
        }),
        GroupRecordKind::Settled => Ok(GroupChange::Settled {
            queue: r.queue().ok_or("a settle record without a queue")?.to_string(),
            partition: r.partition(),
            offset: r.offset(),
            outcome: match r.outcome() {
                Outcome::Ack => Settled::Ack,
                Outcome::Nack => Settled::Nack,
                Outcome::DeadLetter => Settled::DeadLetter,
                other => return Err(format!("a settle record with outcome {}", other.0)),
            },
            reason: r.reason().map(str::to_string),
        }),
        GroupRecordKind::SnapshotBegin => Ok(GroupChange::SnapshotBegin { covers: r.offset() }),
        GroupRecordKind::SnapshotEnd => Ok(GroupChange::SnapshotEnd { covers: r.offset() }),
        other => Err(format!("unknown group record kind {}", other.0)),
    }
}

/// One record batch holding `changes` of `group`, stamped `now_ms`;
/// `queue_id` gives each change's queue id.
pub fn batch(group: &str, changes: &[GroupChange], now_ms: i64, queue_id: impl Fn(&str) -> u64) -> BytesMut {
    let mut b = BatchBuilder::new();
    for change in changes {
        let id = change.queue().map_or(0, &queue_id);
        b.push(Some(group.as_bytes()), Some(&encode(change, id, 0)), &[], now_ms);
    }
    b.build()
}

/// The record batches of a snapshot as of `covers`: a begin marker, every
/// (group, change) of `entries` in order, an end marker; each batch at
/// most about `batch_bytes` (at least one record).
pub fn snapshot_batches(
    entries: &[(String, GroupChange)],
    covers: u64,
    batch_bytes: usize,
    now_ms: i64,
    queue_id: impl Fn(&str) -> u64,
) -> Vec<BytesMut> {
    let begin = (String::new(), GroupChange::SnapshotBegin { covers });
    let end = (String::new(), GroupChange::SnapshotEnd { covers });
    let mut out = Vec::new();
    let (mut b, mut bytes) = (BatchBuilder::new(), 0);
    for (group, change) in std::iter::once(&begin).chain(entries).chain(std::iter::once(&end)) {
        let value = encode(change, change.queue().map_or(0, &queue_id), covers);
        if bytes > 0 && bytes + value.len() + group.len() > batch_bytes {
            out.push(std::mem::replace(&mut b, BatchBuilder::new()).build());
            bytes = 0;
        }
        bytes += value.len() + group.len() + 32;
        b.push(Some(group.as_bytes()), Some(&value), &[], now_ms);
    }
    out.push(b.build());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use strand_wire::batch::RecordBatch;

    fn samples() -> Vec<GroupChange> {
        vec![
            GroupChange::Created {
                strategy: Strategy::RoundRobin,
                start: Start::Earliest,
            },
            GroupChange::Commit {
                queue: "orders".into(),
                partition: 7,
                offset: u64::MAX - 1,
            },
            GroupChange::Reset {
                queue: "orders".into(),
                partition: 7,
                offset: 3,
            },
            GroupChange::Deleted,
            GroupChange::Delivered {
                queue: "q".into(),
                partition: 1,
                offset: 9,
                attempts: 3,
            },
            GroupChange::Settled {
                queue: "q".into(),
                partition: 1,
                offset: 9,
                outcome: Settled::Nack,
                reason: Some("exit status 1".into()),
            },
            GroupChange::Settled {
                queue: "q".into(),
                partition: 0,
                offset: 0,
                outcome: Settled::Ack,
                reason: None,
            },
            GroupChange::SnapshotBegin { covers: 41 },
            GroupChange::SnapshotEnd { covers: u64::MAX },
        ]
    }

    #[test]
    fn round_trip_through_a_batch() {
        let b = batch("g-1", &samples(), 1_700_000_000_000, |q| q.len() as u64);
        let rb = RecordBatch::new(b.freeze(), 1 << 20).unwrap();
        let back: Vec<(Bytes, Stored)> = rb
            .records()
            .map(|r| (r.key.unwrap(), decode(&r.value.unwrap()).unwrap()))
            .collect();
        assert_eq!(back.len(), samples().len());
        for ((key, stored), want) in back.into_iter().zip(samples()) {
            assert_eq!(&key[..], b"g-1");
            assert_eq!(stored.queue_id, want.queue().map_or(0, |q| q.len() as u64));
            assert_eq!((stored.change, stored.snapshot_of), (want, 0));
        }
    }

    #[test]
    fn a_snapshot_is_framed_by_markers_and_split_into_batches() {
        let entries: Vec<(String, GroupChange)> = (0..100)
            .map(|i| {
                let change = GroupChange::Commit {
                    queue: "orders".into(),
                    partition: i,
                    offset: u64::from(i) * 10,
                };
                (format!("g{}", i % 7), change)
            })
            .collect();
        let batches = snapshot_batches(&entries, 500, 1024, 1_700_000_000_000, |_| 9);
        assert!(batches.len() > 3, "{} batches", batches.len());
        let mut read = Vec::new();
        for b in batches {
            assert!(b.len() <= 1024 + 256, "{}", b.len());
            let rb = RecordBatch::new(b.freeze(), 1 << 20).unwrap();
            for r in rb.records() {
                let stored = decode(&r.value.unwrap()).unwrap();
                assert_eq!(stored.snapshot_of, 500);
                let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
                read.push((key, stored.change));
            }
        }
        assert_eq!(read.first().unwrap().1, GroupChange::SnapshotBegin { covers: 500 });
        assert_eq!(read.last().unwrap().1, GroupChange::SnapshotEnd { covers: 500 });
        assert_eq!(&read[1..read.len() - 1], &entries[..]);
    }

    #[test]
    fn every_truncation_and_byte_flip_is_an_error_or_a_valid_change() {
        for change in samples() {
            let value = encode(&change, 7, 3);
            for cut in 0..value.len() {
                let _ = decode(&value[..cut]); // must not panic
            }
            for i in 0..value.len() {
                for bit in 0..8 {
                    let mut v = value.clone();
                    v[i] ^= 1 << bit;
                    // A flip either fails verification or reads as some
                    // change; the batch CRC is what detects it on disk.
                    let _ = decode(&v);
                }
            }
        }
        assert!(decode(b"").is_err());
        assert!(decode(&[0xff; 3]).is_err());
    }
}
