//! Rebuilding the groups of a `__groups` partition from its records, and
//! the snapshot compaction writes in place of the records it deletes.
//!
//! Runs on: the coordinator's shard. Pure: the coordinator reads the log
//! and feeds the records in (`super::rebuild`), so tests drive the same
//! code with records in memory.
//!
//! A rebuild of the records below an end offset takes three passes:
//! 1. [`Rebuild::marker`] over every record: the newest *complete*
//!    snapshot (a `SnapshotBegin` and a `SnapshotEnd` as of the same offset
//!    C). Compaction writes one after the records below C are committed,
//!    and only then deletes the segments wholly below C.
//! 2. [`Rebuild::snapshot_record`] from that snapshot's begin: its own
//!    records (`snapshot_of` = C), which rebuild every group as of C.
//! 3. [`Rebuild::record`] from C (from the log start without a snapshot):
//!    every ordinary record (`snapshot_of` = 0), in offset order. Other
//!    records may lie between a snapshot's records: they are newer than C,
//!    so they apply after the snapshot, whatever their position.
//!
//! A record about a queue since deleted (its id is not the table's id of
//! that name) is left out in every pass.

use std::collections::BTreeMap;
use std::time::Instant;

use super::ack::AckState;
use super::group::Group;
use super::record::{GroupChange, Settled, Stored};
use crate::controller::MetadataTable;

/// A rebuild in progress (see the module doc).
pub struct Rebuild<'t> {
    table: &'t MetadataTable,
    /// Generations of the rebuilt groups start here.
    seed: u64,
    /// Snapshots begun: covered offset → offset of the begin marker.
    begun: BTreeMap<u64, u64>,
    /// The newest complete snapshot: (covered offset, begin marker offset).
    snapshot: Option<(u64, u64)>,
    groups: BTreeMap<String, Group>,
}

impl<'t> Rebuild<'t> {
    pub fn new(table: &'t MetadataTable, seed: u64) -> Rebuild<'t> {
        Rebuild {
            table,
            seed,
            begun: BTreeMap::new(),
            snapshot: None,
            groups: BTreeMap::new(),
        }
    }

    /// Pass 1: the record at `offset`, for its snapshot markers.
    pub fn marker(&mut self, offset: u64, stored: &Stored) {
        match stored.change {
            GroupChange::SnapshotBegin { covers } => {
                self.begun.insert(covers, offset);
            }
            GroupChange::SnapshotEnd { covers } => {
                if let Some(begin) = self.begun.get(&covers) {
                    if self.snapshot.is_none_or(|(c, _)| covers > c) {
                        self.snapshot = Some((covers, *begin));
                    }
                }
            }
            _ => {}
        }
    }

    /// Where pass 2 reads from: the newest complete snapshot's begin.
    pub fn snapshot_begin(&self) -> Option<u64> {
        self.snapshot.map(|(_, begin)| begin)
    }

    /// The offset the newest complete snapshot covers, if there is one.
    pub fn covers(&self) -> Option<u64> {
        self.snapshot.map(|(covers, _)| covers)
    }

    /// Pass 2: a record at or after the snapshot's begin; applied if it is
    /// one of the snapshot's own. (Its position counts as 0: any ordinary
    /// record is newer.)
    pub fn snapshot_record(&mut self, name: String, stored: Stored) {
        if self.covers().is_some_and(|c| stored.snapshot_of == c) {
            self.apply(name, stored, 0);
        }
    }

    /// Where pass 3 reads from: the snapshot's covered offset, else the
    /// log start.
    pub fn tail_from(&self, log_start: u64) -> u64 {
        self.covers().unwrap_or(log_start)
    }

    /// Pass 3: the record at `offset` (at or after [`Rebuild::tail_from`]),
    /// applied if it is an ordinary one.
    pub fn record(&mut self, offset: u64, name: String, stored: Stored) {
        if stored.snapshot_of == 0 {
            self.apply(name, stored, offset);
        }
    }

    pub fn finish(self) -> BTreeMap<String, Group> {
        self.groups
    }

    fn apply(&mut self, name: String, stored: Stored, offset: u64) {
        let Stored { change, queue_id, .. } = stored;
        if change.is_marker() {
            return;
        }
        // About a queue since deleted (or created anew): stale.
        let now = change.queue().and_then(|q| self.table.queue(q)).map(|q| q.id);
        if queue_id != 0 && now != Some(queue_id) {
            return;
        }
        apply(&mut self.groups, name, change, offset, self.seed, queue_id);
    }
}

/// Applies one replayed change (`offset`: the record's, for the order of
/// commits).
fn apply(
    groups: &mut BTreeMap<String, Group>,
    name: String,
    change: GroupChange,
    offset: u64,
    seed: u64,
    queue_id: u64,
) {
    match change {
        GroupChange::Created { strategy, start } => {
            groups
                .entry(name)
                .or_insert_with(|| Group::created(strategy, start, seed));
        }
        GroupChange::Commit {
            ref queue,
            partition,
            offset: position,
        }
        | GroupChange::Reset {
            ref queue,
            partition,
            offset: position,
        } => {
            if let Some(g) = groups.get_mut(&name) {
                if queue_id != 0 {
                    g.note_queue(queue, queue_id);
                }
                let tp = (queue.clone(), partition);
                match change {
                    GroupChange::Reset { .. } => g.apply_reset(tp, position, offset),
                    _ => g.apply_commit(tp, position, offset),
                }
            }
        }
        GroupChange::Deleted => {
            groups.remove(&name);
        }
        GroupChange::Delivered {
            queue,
            partition,
            offset: record_offset,
            attempts,
        } => {
            if let Some(g) = groups.get_mut(&name) {
                let tp = (queue, partition);
                let position = g.committed(&tp).unwrap_or(record_offset);
                g.acks
                    .entry(tp)
                    .or_insert_with(|| AckState::new(position))
                    .replay_delivered(record_offset, attempts, Instant::now());
            }
        }
        GroupChange::Settled {
            queue,
            partition,
            offset: record_offset,
            outcome,
            reason,
        } => {
            if let Some(a) = groups.get_mut(&name).and_then(|g| g.acks.get_mut(&(queue, partition))) {
                a.replay_settled(record_offset, outcome != Settled::Nack, reason);
                a.advance();
            }
        }
        GroupChange::SnapshotBegin { .. } | GroupChange::SnapshotEnd { .. } => {}
    }
}

/// The changes that rebuild `groups`' durable state from nothing, group by
/// group: its creation, its committed positions, and in ack mode each
/// partition's records between the committed position and the newest
/// handed out (delivery counts, done, last errors). Canonical: equal
/// durable states give equal lists.
pub fn snapshot_changes(groups: &BTreeMap<String, Group>) -> Vec<(String, GroupChange)> {
    let mut out = Vec::new();
    for (name, g) in groups {
        let mut push = |change| out.push((name.clone(), change));
        push(GroupChange::Created {
            strategy: g.strategy,
            start: g.start,
        });
        for ((queue, partition), offset) in g.all_committed() {
            push(GroupChange::Commit {
                queue: queue.clone(),
                partition: *partition,
                offset,
            });
        }
        for ((queue, partition), a) in &g.acks {
            let delivered = |offset, attempts| GroupChange::Delivered {
                queue: queue.clone(),
                partition: *partition,
                offset,
                attempts,
            };
            let settled = |offset, outcome, reason: Option<&str>| GroupChange::Settled {
                queue: queue.clone(),
                partition: *partition,
                offset,
                outcome,
                reason: reason.map(str::to_string),
            };
            // Done records past the committed position that the position
            // already moved over (their commit not yet written).
            let committed = g.committed(&(queue.clone(), *partition)).unwrap_or(a.position);
            for offset in committed.min(a.position)..a.position {
                push(delivered(offset, 1));
                push(settled(offset, Settled::Ack, None));
            }
            for (offset, attempts, done, last_error) in a.durable() {
                push(delivered(offset, attempts));
                if done {
                    push(settled(offset, Settled::Ack, None));
                } else if last_error.is_some() {
                    push(settled(offset, Settled::Nack, last_error));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{QueueRecord, QueueSettings};
    use crate::groups::assign::Strategy;
    use crate::groups::group::Start;

    fn table() -> MetadataTable {
        let mut t = MetadataTable::default();
        for (name, id) in [("a", 1), ("b", 2)] {
            let q = QueueRecord {
                id,
                name: name.into(),
                settings: QueueSettings::for_tests(2, 1),
                partitions: Vec::new(),
            };
            t.queues.insert(name.into(), q);
        }
        t
    }

    type Log = Vec<(u64, String, Stored)>;

    fn ordinary(change: GroupChange) -> Stored {
        let queue_id = match change.queue() {
            Some("a") => 1,
            Some("b") => 2,
            _ => 0,
        };
        Stored {
            change,
            queue_id,
            snapshot_of: 0,
        }
    }

    /// A history of group changes from a seeded generator: creations,
    /// commits, resets (some backwards), deliveries (new records in offset
    /// order from the position, and redeliveries), acks, nacks with
    /// errors, deletions, and records of a queue deleted since (a stale id,
    /// ignored by replay).
    fn history(seed: u64, n: usize) -> Vec<(String, Stored)> {
        let mut x = seed;
        let mut next = move |m: u64| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        // Per (group, queue, partition): where its record state began (a
        // commit, or its first delivery) and the first offset never handed
        // out. Redeliveries are of records handed out since it began.
        let mut fresh: BTreeMap<(String, String, u32), (u64, u64, bool)> = BTreeMap::new();
        let mut exists = std::collections::BTreeSet::new();
        let mut out = Vec::new();
        for _ in 0..n {
            let group = format!("g{}", next(4));
            let queue = if next(2) == 0 { "a" } else { "b" };
            let partition = next(2) as u32;
            let stale = next(25) == 0;
            let key = (group.clone(), queue.to_string(), partition);
            let start = next(20);
            let (base, at, committed) = *fresh.entry(key.clone()).or_insert((start, start, false));
            // Commits and deliveries count only in a group's life.
            let stale = stale || !exists.contains(&group);
            let change = match next(12) {
                0 => GroupChange::Created {
                    strategy: Strategy::Sticky,
                    start: Start::Earliest,
                },
                1 | 2 => {
                    // An operator's reset: forward mostly, sometimes back.
                    let offset = (at + next(6)).saturating_sub(3);
                    if !stale {
                        fresh.insert(key, (offset, offset, true));
                    }
                    // (The record state starts over here: a reset.)
                    GroupChange::Reset {
                        queue: queue.into(),
                        partition,
                        offset,
                    }
                }
                // The coordinator records where a partition's record state
                // starts (a commit) before its first delivery.
                3..=6 if !committed => {
                    if !stale {
                        fresh.insert(key, (at, at, true));
                    }
                    // (Written as a reset: this model starts the record
                    // state over at every position it writes, which a
                    // plain commit no longer does — `Group::apply_commit`
                    // only moves forward, tested on its own.)
                    GroupChange::Reset {
                        queue: queue.into(),
                        partition,
                        offset: at,
                    }
                }
                3..=6 => {
                    // A new record, or one handed out before again.
                    let again = at.saturating_sub(1 + next(4)).max(base);
                    let offset = if next(3) == 0 && at > base { again } else { at };
                    if !stale && offset == at {
                        fresh.insert(key, (base, at + 1, true));
                    }
                    GroupChange::Delivered {
                        queue: queue.into(),
                        partition,
                        offset,
                        attempts: 1 + next(4) as u32,
                    }
                }
                7..=9 => GroupChange::Settled {
                    queue: queue.into(),
                    partition,
                    offset: at.saturating_sub(1 + next(5)),
                    outcome: if next(3) == 0 { Settled::Nack } else { Settled::Ack },
                    reason: Some(format!("error {}", next(100))),
                },
                10 if next(4) == 0 => {
                    fresh.retain(|(g, _, _), _| *g != group);
                    exists.remove(&group);
                    GroupChange::Deleted
                }
                _ => GroupChange::Created {
                    strategy: Strategy::RoundRobin,
                    start: Start::Latest,
                },
            };
            if matches!(change, GroupChange::Created { .. }) {
                exists.insert(group.clone());
            }
            let mut stored = ordinary(change);
            if stale && stored.queue_id != 0 {
                stored.queue_id = 99;
            }
            out.push((group, stored));
        }
        out
    }

    /// Issue 41, item 4, at replay: two settles' commits written out of
    /// order (the lower after the higher) keep the delivery counts of the
    /// records past them; a reset record starts them over.
    #[test]
    fn a_commit_written_late_keeps_the_counts_of_records_past_it() {
        let table = table();
        let q = |o| ("a".to_string(), 0u32, o);
        let mut log: Log = Vec::new();
        let push = |log: &mut Log, change| {
            let at = log.len() as u64;
            log.push((at, "g".to_string(), ordinary(change)));
        };
        push(
            &mut log,
            GroupChange::Created {
                strategy: Strategy::Sticky,
                start: Start::Earliest,
            },
        );
        let commit = |(queue, partition, offset): (String, u32, u64)| GroupChange::Commit {
            queue,
            partition,
            offset,
        };
        push(&mut log, commit(q(0)));
        for (o, attempts) in [(0, 1), (1, 1), (2, 3)] {
            let (queue, partition, offset) = q(o);
            push(
                &mut log,
                GroupChange::Delivered {
                    queue,
                    partition,
                    offset,
                    attempts,
                },
            );
        }
        for o in [0, 1] {
            let (queue, partition, offset) = q(o);
            push(
                &mut log,
                GroupChange::Settled {
                    queue,
                    partition,
                    offset,
                    outcome: Settled::Ack,
                    reason: None,
                },
            );
        }
        push(&mut log, commit(q(2)));
        push(&mut log, commit(q(1)));
        let groups = rebuild(&log, &table);
        let a = &groups["g"].acks[&("a".to_string(), 0)];
        assert_eq!((a.position, a.attempts(2)), (2, 3), "the late commit wiped the counts");
        // Its snapshot rebuilds the same state.
        let snapshot: Log = snapshot_changes(&groups)
            .into_iter()
            .enumerate()
            .map(|(i, (n, c))| (i as u64, n, ordinary(c)))
            .collect();
        assert_eq!(snapshot_changes(&rebuild(&snapshot, &table)), snapshot_changes(&groups));
        let (queue, partition, offset) = q(0);
        push(
            &mut log,
            GroupChange::Reset {
                queue,
                partition,
                offset,
            },
        );
        let groups = rebuild(&log, &table);
        let a = &groups["g"].acks[&("a".to_string(), 0)];
        assert_eq!((a.position, a.attempts(2)), (0, 0), "a reset starts over");
    }

    fn rebuild(log: &Log, table: &MetadataTable) -> BTreeMap<String, Group> {
        let mut r = Rebuild::new(table, 7);
        for (offset, _, stored) in log {
            r.marker(*offset, stored);
        }
        if let Some(begin) = r.snapshot_begin() {
            for (_, name, stored) in log.iter().filter(|(o, _, _)| *o >= begin) {
                r.snapshot_record(name.clone(), stored.clone());
            }
        }
        let from = r.tail_from(log.first().map_or(0, |(o, _, _)| *o));
        for (offset, name, stored) in log.iter().filter(|(o, _, _)| *o >= from) {
            r.record(*offset, name.clone(), stored.clone());
        }
        r.finish()
    }

    /// Compacts `log` as the coordinator does: the state as of `covers`
    /// written after the records up to `end` (those in between stay, and
    /// `interleave` more land between the snapshot's records), then
    /// everything below `keep_from` (at most `covers`: a segment boundary)
    /// deleted.
    fn compact(log: &Log, table: &MetadataTable, covers: u64, keep_from: u64, interleave: &[(String, Stored)]) -> Log {
        let below: Log = log.iter().filter(|(o, _, _)| *o < covers).cloned().collect();
        let state = rebuild(&below, table);
        let snapshot = snapshot_changes(&state);
        let mut out: Log = log.iter().filter(|(o, _, _)| *o >= keep_from).cloned().collect();
        let mut at = log.last().map_or(0, |(o, _, _)| o + 1);
        let mut extra = interleave.iter();
        let marker = |change| Stored {
            change,
            queue_id: 0,
            snapshot_of: covers,
        };
        out.push((at, String::new(), marker(GroupChange::SnapshotBegin { covers })));
        at += 1;
        for (name, change) in snapshot {
            let queue_id = change.queue().and_then(|q| table.queue(q)).map_or(0, |q| q.id);
            let stored = Stored {
                change,
                queue_id,
                snapshot_of: covers,
            };
            out.push((at, name, stored));
            at += 1;
            if let Some((name, stored)) = extra.next() {
                out.push((at, name.clone(), stored.clone()));
                at += 1;
            }
        }
        out.push((at, String::new(), marker(GroupChange::SnapshotEnd { covers })));
        for (name, stored) in extra {
            at += 1;
            out.push((at, name.clone(), stored.clone()));
        }
        out
    }

    #[test]
    fn a_compacted_log_rebuilds_the_same_groups_as_the_whole_log() {
        let table = table();
        for seed in 0..200u64 {
            let changes = history(seed, 300);
            let (before, after) = changes.split_at(240);
            let (tail, interleave) = after.split_at(30);
            // Records 0..240, then the snapshot with 30 more among its
            // records; 30 after it (`tail`).
            let log: Log = before
                .iter()
                .enumerate()
                .map(|(i, (n, s))| (i as u64, n.clone(), s.clone()))
                .collect();
            // At most the log end when the snapshot is written.
            let covers = 100 + (seed * 2) % 140;
            let keep_from = covers - seed % 40;
            let mut compacted = compact(&log, &table, covers, keep_from, interleave);
            let mut whole = log.clone();
            // The same changes in the same order, without a snapshot.
            whole.extend(
                interleave
                    .iter()
                    .enumerate()
                    .map(|(i, (n, s))| (1000 + i as u64, n.clone(), s.clone())),
            );
            let mut at = compacted.last().unwrap().0 + 1;
            for (n, s) in tail {
                compacted.push((at, n.clone(), s.clone()));
                whole.push((at + 1000, n.clone(), s.clone()));
                at += 1;
            }
            let want = snapshot_changes(&rebuild(&whole, &table));
            let got = snapshot_changes(&rebuild(&compacted, &table));
            assert!(!want.is_empty());
            assert_eq!(got, want, "seed {seed}");
            // A second compaction over the first gives the same again.
            let again = compact(&compacted, &table, at - 5, at - 20, &[]);
            assert_eq!(snapshot_changes(&rebuild(&again, &table)), want, "seed {seed}, twice");
        }
    }

    #[test]
    fn an_incomplete_snapshot_is_passed_over() {
        let table = table();
        let log: Log = history(3, 200)
            .into_iter()
            .enumerate()
            .map(|(i, (n, s))| (i as u64, n, s))
            .collect();
        let want = snapshot_changes(&rebuild(&log, &table));
        let mut compacted = compact(&log, &table, 150, 0, &[]);
        // The end marker never made it (a crash while writing).
        compacted.pop();
        assert_eq!(snapshot_changes(&rebuild(&compacted, &table)), want);
    }

    #[test]
    fn ack_state_survives_a_snapshot_with_counts_errors_and_a_done_prefix() {
        let table = table();
        let tp = |offset, attempts| GroupChange::Delivered {
            queue: "a".into(),
            partition: 0,
            offset,
            attempts,
        };
        let settle = |offset, outcome, reason: Option<&str>| GroupChange::Settled {
            queue: "a".into(),
            partition: 0,
            offset,
            outcome,
            reason: reason.map(str::to_string),
        };
        let changes = vec![
            GroupChange::Created {
                strategy: Strategy::Range,
                start: Start::Earliest,
            },
            GroupChange::Commit {
                queue: "a".into(),
                partition: 0,
                offset: 10,
            },
            tp(10, 1),
            tp(11, 1),
            tp(12, 3),
            tp(13, 1),
            // 10 and 11 acked: the position moves to 12 before its commit.
            settle(10, Settled::Ack, None),
            settle(11, Settled::Ack, None),
            settle(12, Settled::Nack, Some("timeout")),
            settle(13, Settled::DeadLetter, Some("poison")),
        ];
        let log: Log = changes
            .into_iter()
            .enumerate()
            .map(|(i, c)| (i as u64, "g".to_string(), ordinary(c)))
            .collect();
        let whole = rebuild(&log, &table);
        let a = &whole["g"].acks[&("a".to_string(), 0)];
        assert_eq!((a.position, a.next, a.attempts(12)), (12, 14, 3));
        let compacted = compact(&log, &table, log.len() as u64, log.len() as u64, &[]);
        let rebuilt = rebuild(&compacted, &table);
        let durable = |a: &AckState| {
            let records: Vec<(u64, u32, bool, Option<String>)> = a
                .durable()
                .map(|(o, n, d, e)| (o, n, d, e.map(str::to_string)))
                .collect();
            (a.position, a.next, records)
        };
        assert_eq!(
            durable(&rebuilt["g"].acks[&("a".to_string(), 0)]),
            durable(&whole["g"].acks[&("a".to_string(), 0)])
        );
        assert_eq!(rebuilt["g"].committed(&("a".to_string(), 0)), Some(10));
    }
}
