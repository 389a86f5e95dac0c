//! Idempotent producers: what a partition's log remembers of each producer
//! so that pipelined and retried batches are appended once each, in the
//! order the producer made them — also across restarts and failovers.
//!
//! Runs on: the shard that owns the partition. One [`ProducerTable`] per
//! open [`Log`](crate::Log), kept by the log itself in step with its
//! batches: every batch appended (by a leader's produce or a follower's
//! replication) that carries a producer id is noted; a truncation rebuilds
//! the table; opening the log rebuilds it from the latest snapshot and the
//! batches after it (see "Snapshots").
//!
//! A producer that wants this stamps its batches with a producer id (any
//! non-negative `i64` — `strand-client` picks a random one per producer)
//! and, per partition, a *sequence*: the first record of its first batch is
//! 0, and each batch's `base_sequence` is the previous one's plus its
//! record count (wrapping at `i32::MAX` to 0). A batch with producer id -1
//! is appended as it comes. For the others the table decides:
//!
//! - the batch is one of the last [`WINDOW`] this producer had appended (same
//!   first and last sequence): a **duplicate** — a retry whose first answer
//!   was lost. It is not appended again; the answer carries the offsets it
//!   got the first time;
//! - it starts right after the last batch the producer had appended: it is
//!   **appended**;
//! - anything else: **out of order** (`OutOfOrderSequence`) — an earlier
//!   batch failed or has not arrived; the producer sends again from its first
//!   unacknowledged batch, in order. So with up to [`WINDOW`] requests in
//!   flight a retry can never reorder a partition's records, and never store
//!   one twice.
//!
//! A producer the table does not know starts at sequence 0; any other batch
//! of it is refused as **unknown** (`UnknownProducer`): the producer goes on
//! under a new id from 0, resending its unacknowledged batches in order
//! (stored at least once, never out of order).
//!
//! A table keeps [`KEEP_PRODUCERS`] producers; past that, a new producer
//! takes the place of the one idle longest if that one has been idle
//! [`FORGET_AFTER_MS`] or more — longer than any producer goes on retrying
//! a batch (a client's delivery timeout; 60 s by default), so no retry of a
//! forgotten producer can come and be stored twice — and the table grows
//! otherwise, up to [`MAX_PRODUCERS`]. Full of producers active within
//! that time, it refuses new ones ([`Verdict::TooMany`],
//! `TooManyProducers`): a client opening producer ids as fast as it can
//! (each one a sequence 0) pushed out live producers, whose retry of their
//! sequence 0 was then stored again (issue 41, item 3); now it meets a
//! typed error, and no retry becomes a silent duplicate. Idle is judged by
//! the broker's monotonic clock when each producer's last batch was noted
//! (a log opened notes its batches as of the open), so a wall-clock jump
//! changes nothing.
//!
//! # Snapshots
//! The table as it stood at some log end is written to
//! `<offset, 20 digits>.producers` (layout: `checkpoint.rs`) when a
//! segment rolls, by the log's periodic checkpoint when the log moved, and
//! at close, fdatasync'd before it is named (a power loss left the
//! unsynced ones empty: strand-chaos); the two newest are kept, and a
//! truncation removes those past its cut. Opening (or truncating) loads the newest snapshot at or
//! below the log end and notes every batch after it: so a leader that
//! restarts, and a follower that becomes leader (its table came from the
//! replicated batches), answers a batch resent across that event with its
//! first offsets instead of storing it twice. Without any readable
//! snapshot (a log from a broker before this, or all of them damaged)
//! every batch from the log start is noted: slow on a long log, but a
//! producer whose last batch sat in an older segment would otherwise be
//! forgotten, and its retry stored twice (a 30-minute strand-chaos run:
//! both snapshots came back empty after a power loss, one record stored
//! twice).

use std::collections::{HashMap, VecDeque};

use crate::batch::BatchHeader;

/// Batches remembered per producer: the most requests a producer may have
/// in flight per partition and still be deduplicated.
pub const WINDOW: usize = 5;
/// Producers a partition keeps before it forgets idle ones for new ones.
pub const KEEP_PRODUCERS: usize = 1024;
/// Producers a partition remembers at most (new ones are refused past it
/// while every one is active).
pub const MAX_PRODUCERS: usize = 16_384;
/// A producer idle this long may be forgotten to make room: ten minutes,
/// ten times a client's default delivery timeout.
pub const FORGET_AFTER_MS: i64 = 10 * 60 * 1000;

/// The broker's monotonic clock in ms (from the first use in this
/// process): a wall-clock jump neither makes a live producer look idle nor
/// keeps an idle one. Times are not kept across restarts (a log opened
/// notes its batches as of the open).
fn mono_ms() -> i64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as i64
}

/// A batch's idempotence fields, from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequenced {
    pub producer_id: i64,
    pub first: i32,
    pub last: i32,
}

impl Sequenced {
    /// The producer id and sequences of a batch whose header carries
    /// `producer_id`, `base_sequence` and `record_count`; `None` for a batch
    /// without a producer id (or with a negative sequence).
    pub fn of(producer_id: i64, base_sequence: i32, record_count: u32) -> Option<Sequenced> {
        if producer_id < 0 || base_sequence < 0 || record_count == 0 {
            return None;
        }
        let span = (record_count - 1) % (i32::MAX as u32 + 1);
        Some(Sequenced {
            producer_id,
            first: base_sequence,
            last: wrap_add(base_sequence, span),
        })
    }
}

/// `seq + n` in the sequence space `0..=i32::MAX`.
fn wrap_add(seq: i32, n: u32) -> i32 {
    ((seq as u64 + u64::from(n)) % (i32::MAX as u64 + 1)) as i32
}

/// Offsets a batch was stored at: (base, last, max timestamp).
pub type Stored = (u64, u64, i64);

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it, then tell [`ProducerTable::appended`].
    Append,
    /// Stored already at these offsets: answer with them.
    Duplicate(Stored),
    /// Not the next batch; the partition expects sequence `expected`.
    OutOfOrder { expected: i32 },
    /// A producer the table does not know, not at sequence 0.
    Unknown,
    /// A new producer, and the table holds [`MAX_PRODUCERS`], each active
    /// within [`FORGET_AFTER_MS`].
    TooMany,
}

/// One producer's remembered batches, oldest first: (first sequence, last
/// sequence, where it was stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerBatches {
    pub producer_id: i64,
    pub batches: Vec<(i32, i32, Stored)>,
}

#[derive(Debug)]
struct Entry {
    first: i32,
    last: i32,
    stored: Stored,
}

#[derive(Debug, Default)]
struct ProducerState {
    /// The last batches stored, oldest first (never empty).
    batches: VecDeque<Entry>,
    /// [`ProducerTable::clock`] at the last batch (for eviction).
    used: u64,
    /// The broker's monotonic clock (ms) when its last batch was noted.
    last_ms: i64,
}

/// One partition's producers. The caller checks and appends one batch at a
/// time per partition (the produce path holds the partition's append turn
/// from [`check`](Self::check) to [`appended`](Self::appended)), so a batch
/// being appended is never judged against: an append that fails leaves the
/// table as it was, and the producer's resend is the next batch again.
#[derive(Debug, Default)]
pub struct ProducerTable {
    producers: HashMap<i64, ProducerState>,
    clock: u64,
}

impl ProducerTable {
    /// Decides what to do with `batch`.
    pub fn check(&self, batch: Sequenced) -> Verdict {
        self.check_at(batch, mono_ms())
    }

    /// [`ProducerTable::check`] at `now_ms` on the broker's monotonic clock.
    pub fn check_at(&self, batch: Sequenced, now_ms: i64) -> Verdict {
        let Some(p) = self.producers.get(&batch.producer_id) else {
            return match batch.first {
                0 if self.producers.len() < MAX_PRODUCERS || self.forgettable(now_ms).is_some() => Verdict::Append,
                0 => Verdict::TooMany,
                _ => Verdict::Unknown,
            };
        };
        if let Some(e) = p
            .batches
            .iter()
            .find(|e| e.first == batch.first && e.last == batch.last)
        {
            return Verdict::Duplicate(e.stored);
        }
        let expected = p.batches.back().map_or(0, |e| wrap_add(e.last, 1));
        if batch.first == expected {
            Verdict::Append
        } else {
            Verdict::OutOfOrder { expected }
        }
    }

    /// A batch [`check`](Self::check) let through was stored at `stored`.
    pub fn appended(&mut self, batch: Sequenced, stored: Stored) {
        self.appended_at(batch, stored, mono_ms())
    }

    /// [`ProducerTable::appended`] at `now_ms` on the broker's monotonic clock. A new
    /// producer past [`KEEP_PRODUCERS`] takes the place of the one idle
    /// longest if it was idle [`FORGET_AFTER_MS`]; at [`MAX_PRODUCERS`] in
    /// any case (a check let it in only if one was; a follower's or a
    /// rebuild's batch was let in by a leader, and is noted whatever).
    pub fn appended_at(&mut self, batch: Sequenced, stored: Stored, now_ms: i64) {
        self.clock += 1;
        if !self.producers.contains_key(&batch.producer_id) {
            if self.producers.len() >= KEEP_PRODUCERS {
                if let Some(idle) = self.forgettable(now_ms) {
                    self.producers.remove(&idle);
                }
            }
            if self.producers.len() >= MAX_PRODUCERS {
                self.evict_least_recent();
            }
        }
        let p = self.producers.entry(batch.producer_id).or_default();
        p.used = self.clock;
        p.last_ms = now_ms;
        p.batches.push_back(Entry {
            first: batch.first,
            last: batch.last,
            stored,
        });
        while p.batches.len() > WINDOW {
            p.batches.pop_front();
        }
    }

    /// Notes a batch the log holds, from its header: remembered if it
    /// carries a producer id (the log stores it whatever a check would have
    /// said: a follower's batch, or one found again while rebuilding).
    /// Returns whether the table changed.
    pub fn note_stored(&mut self, header: &BatchHeader) -> bool {
        let Some(seq) = Sequenced::of(header.producer_id, header.base_sequence, header.record_count) else {
            return false;
        };
        let stored = (header.base_offset.0, header.last_offset().0, header.max_timestamp);
        self.appended(seq, stored);
        true
    }

    /// Every producer's remembered batches, least recently used first
    /// (what a snapshot stores).
    pub fn entries(&self) -> Vec<ProducerBatches> {
        let mut all: Vec<(&i64, &ProducerState)> = self.producers.iter().collect();
        all.sort_by_key(|(_, p)| p.used);
        all.into_iter()
            .map(|(id, p)| ProducerBatches {
                producer_id: *id,
                batches: p.batches.iter().map(|e| (e.first, e.last, e.stored)).collect(),
            })
            .collect()
    }

    /// A table holding `entries` (as [`entries`](Self::entries) gave
    /// them: least recently used first).
    pub fn from_entries(entries: Vec<ProducerBatches>) -> ProducerTable {
        let mut table = ProducerTable::default();
        for p in entries {
            for (first, last, stored) in p.batches {
                let seq = Sequenced {
                    producer_id: p.producer_id,
                    first,
                    last,
                };
                table.appended(seq, stored);
            }
        }
        table
    }

    /// Producers remembered.
    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// The producer idle longest, if idle [`FORGET_AFTER_MS`] by `now_ms`.
    fn forgettable(&self, now_ms: i64) -> Option<i64> {
        let (id, p) = self.producers.iter().min_by_key(|(_, p)| p.used)?;
        (now_ms.saturating_sub(p.last_ms) >= FORGET_AFTER_MS).then_some(*id)
    }

    fn evict_least_recent(&mut self) {
        let oldest = self.producers.iter().min_by_key(|(_, p)| p.used).map(|(id, _)| *id);
        if let Some(id) = oldest {
            self.producers.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn batch(first: i32, count: u32) -> Sequenced {
        Sequenced::of(7, first, count).unwrap()
    }

    /// Checks and stores `b` at `offset`; returns the verdict.
    fn send(t: &mut ProducerTable, b: Sequenced, offset: u64) -> Verdict {
        let v = t.check(b);
        if v == Verdict::Append {
            t.appended(b, (offset, offset + (b.last - b.first) as u64, 0));
        }
        v
    }

    #[test]
    fn in_order_batches_append_and_retries_are_answered_from_memory() {
        let mut t = ProducerTable::default();
        assert_eq!(send(&mut t, batch(0, 3), 100), Verdict::Append);
        assert_eq!(send(&mut t, batch(3, 2), 103), Verdict::Append);
        // A retry of either: the first offsets, nothing appended.
        assert_eq!(send(&mut t, batch(0, 3), 999), Verdict::Duplicate((100, 102, 0)));
        assert_eq!(send(&mut t, batch(3, 2), 999), Verdict::Duplicate((103, 104, 0)));
        assert_eq!(send(&mut t, batch(5, 1), 105), Verdict::Append);
    }

    #[test]
    fn a_gap_is_refused_until_the_missing_batch_comes() {
        let mut t = ProducerTable::default();
        assert_eq!(send(&mut t, batch(0, 2), 0), Verdict::Append);
        // Batch 2..3 was lost; 4.. arrives first.
        assert_eq!(send(&mut t, batch(4, 2), 9), Verdict::OutOfOrder { expected: 2 });
        assert_eq!(send(&mut t, batch(2, 2), 2), Verdict::Append);
        assert_eq!(send(&mut t, batch(4, 2), 4), Verdict::Append);
    }

    #[test]
    fn a_batch_whose_append_failed_comes_again_before_its_successor() {
        let mut t = ProducerTable::default();
        assert_eq!(send(&mut t, batch(0, 1), 0), Verdict::Append);
        let b = batch(1, 1);
        // Let through, but the append fails (never reported appended).
        assert_eq!(t.check(b), Verdict::Append);
        assert_eq!(send(&mut t, batch(2, 1), 9), Verdict::OutOfOrder { expected: 1 });
        assert_eq!(send(&mut t, b, 1), Verdict::Append);
        assert_eq!(send(&mut t, batch(2, 1), 2), Verdict::Append);
    }

    #[test]
    fn unknown_producers_start_at_zero_and_ids_are_separate() {
        let mut t = ProducerTable::default();
        assert_eq!(send(&mut t, batch(500, 1), 0), Verdict::Unknown);
        assert_eq!(send(&mut t, batch(0, 1), 0), Verdict::Append);
        let other = Sequenced::of(8, 0, 1).unwrap();
        assert_eq!(send(&mut t, other, 1), Verdict::Append);
        assert_eq!(send(&mut t, batch(1, 1), 2), Verdict::Append);
        assert_eq!(Sequenced::of(-1, 0, 1), None, "no producer id: not tracked");
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn sequences_wrap_at_i32_max() {
        let mut t = ProducerTable::default();
        assert_eq!(send(&mut t, batch(0, i32::MAX as u32 - 1), 0), Verdict::Append);
        // Sequences MAX - 1, MAX, 0.
        let b = batch(i32::MAX - 1, 3);
        assert_eq!((b.first, b.last), (i32::MAX - 1, 0));
        assert_eq!(send(&mut t, b, 0), Verdict::Append);
        assert_eq!(send(&mut t, batch(1, 1), 3), Verdict::Append);
    }

    #[test]
    fn only_the_last_window_is_remembered_and_producers_are_bounded() {
        let mut t = ProducerTable::default();
        for i in 0..(WINDOW as i32 + 2) {
            assert_eq!(send(&mut t, batch(i, 1), i as u64), Verdict::Append);
        }
        // The oldest fell out of the window: a retry of it is out of order.
        assert_eq!(
            t.check(batch(0, 1)),
            Verdict::OutOfOrder {
                expected: WINDOW as i32 + 2
            }
        );
        assert_eq!(t.check(batch(2, 1)), Verdict::Duplicate((2, 2, 0)));
    }

    /// Issue 41, item 3: a client opening producer ids as fast as it can
    /// must not push out a live producer, whose retry of its sequence 0
    /// would then be stored again. Past [`KEEP_PRODUCERS`] only producers
    /// idle [`FORGET_AFTER_MS`] make room, the table grows while none is,
    /// and at [`MAX_PRODUCERS`] new producers are refused.
    #[test]
    fn a_full_table_refuses_new_producers_until_one_has_been_idle_long_enough() {
        let mut t = ProducerTable::default();
        let at = |t: &mut ProducerTable, id: i64, now: i64| {
            let b = Sequenced::of(id, 0, 1).unwrap();
            let v = t.check_at(b, now);
            if v == Verdict::Append {
                t.appended_at(b, (id as u64, id as u64, 0), now);
            }
            v
        };
        // The live producer, then a flood of fresh ids.
        assert_eq!(at(&mut t, 7, 0), Verdict::Append);
        for id in 1000..(1000 + MAX_PRODUCERS as i64 - 1) {
            assert_eq!(at(&mut t, id, 1_000), Verdict::Append);
        }
        assert_eq!(t.len(), MAX_PRODUCERS, "it grew: none was idle long enough");
        assert_eq!(at(&mut t, 99_999, 2_000), Verdict::TooMany, "every producer is active");
        // Producer 7's retry of its sequence 0 is still a duplicate.
        let retry = Sequenced::of(7, 0, 1).unwrap();
        assert_eq!(t.check_at(retry, 2_000), Verdict::Duplicate((7, 7, 0)));
        // Once producer 7 has been idle long enough, it makes room.
        assert_eq!(at(&mut t, 99_999, FORGET_AFTER_MS - 1), Verdict::TooMany);
        assert_eq!(at(&mut t, 99_999, FORGET_AFTER_MS), Verdict::Append);
        assert_eq!(t.len(), MAX_PRODUCERS);
        // 7 was forgotten (not another): its next batch is unknown, and a
        // sequence 0 of it would be a new producer, refused while full.
        let next = Sequenced::of(7, 1, 1).unwrap();
        assert_eq!(t.check_at(next, FORGET_AFTER_MS), Verdict::Unknown);
        assert_eq!(t.check_at(retry, FORGET_AFTER_MS), Verdict::TooMany);
        // Later, each new producer forgets one idle one: the table shrinks
        // back no further than it grew, and stays bounded.
        let later = 1_000 + FORGET_AFTER_MS;
        for id in 300_000..300_100 {
            assert_eq!(at(&mut t, id, later), Verdict::Append);
        }
        assert_eq!(t.len(), MAX_PRODUCERS);
        // A follower (or a rebuild) notes what its leader stored, full or not.
        for id in 200_000..200_010 {
            t.appended_at(Sequenced::of(id, 0, 1).unwrap(), (0, 0, 0), 0);
        }
        assert_eq!(t.len(), MAX_PRODUCERS);
    }

    /// Below [`KEEP_PRODUCERS`] nothing is forgotten; past it, only idle ones.
    #[test]
    fn past_the_kept_count_only_idle_producers_are_forgotten() {
        let mut t = ProducerTable::default();
        for id in 0..KEEP_PRODUCERS as i64 {
            t.appended_at(Sequenced::of(id, 0, 1).unwrap(), (0, 0, 0), 0);
        }
        // Not idle long enough: the table grows.
        t.appended_at(Sequenced::of(100_000, 0, 1).unwrap(), (0, 0, 0), 1);
        assert_eq!(t.len(), KEEP_PRODUCERS + 1);
        // Idle long enough: the oldest makes room.
        t.appended_at(Sequenced::of(100_001, 0, 1).unwrap(), (0, 0, 0), FORGET_AFTER_MS);
        assert_eq!(t.len(), KEEP_PRODUCERS + 1);
        assert_eq!(
            t.check_at(Sequenced::of(0, 1, 1).unwrap(), FORGET_AFTER_MS),
            Verdict::Unknown
        );
    }

    proptest! {
        /// A producer's batches, sent in any order with any repeats and
        /// failures, are stored each at most once and in sequence order.
        #[test]
        fn any_delivery_order_stores_in_sequence(
            counts in proptest::collection::vec(1u32..5, 1..12),
            order in proptest::collection::vec((0usize..12, any::<bool>()), 0..80),
        ) {
            let mut batches = Vec::new();
            let mut seq = 0;
            for c in &counts {
                batches.push(batch(seq, *c));
                seq += *c as i32;
            }
            let mut t = ProducerTable::default();
            let mut stored: Vec<i32> = Vec::new();
            let mut next_offset = 0;
            // Random deliveries, then the producer's in-order resend of
            // everything (what retries converge to).
            let tail: Vec<(usize, bool)> = (0..batches.len()).map(|i| (i, false)).collect();
            for (i, fail) in order.into_iter().chain(tail) {
                let Some(&b) = batches.get(i) else { continue };
                // A failed append is never reported appended.
                if t.check(b) == Verdict::Append && !fail {
                    t.appended(b, (next_offset, next_offset, 0));
                    next_offset += 1;
                    stored.push(b.first);
                }
            }
            // Every batch stored once, in order.
            let want: Vec<i32> = batches.iter().map(|b| b.first).collect();
            prop_assert_eq!(stored, want);
        }
    }
}
