//! Ack mode: per-record state of one partition for one group.
//!
//! Runs on: the coordinator's shard. Pure (time passed in); the coordinator
//! persists every change as a `__groups` record (`Delivered`, `Settled`,
//! `Commit`) before it answers, and replays them through the same methods.
//!
//! Between the group's `position` (everything below it is done) and `next`
//! (the first record never handed out) each record is
//! - *acquired* by a member until its lock runs out,
//! - *available* for redelivery (nacked, its lock ran out, or its member
//!   lost the partition), no sooner than `not_before`,
//! - or *done* (acked or dead-lettered),
//!
//! with its delivery count and last error. At most `window` records lie
//! between `position` and `next`. Order within the partition: new records
//! are handed out only while no earlier record waits for redelivery (and no
//! redelivered record is still out), and redeliveries go in offset order —
//! so a key's later record never overtakes an earlier one that failed.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How a member settles a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ack,
    Nack { delay: Duration },
    DeadLetter,
    Renew,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// `lock`: the member's lock period (a renewal extends by it).
    Acquired {
        /// Shared by every record of one receive.
        member: std::rc::Rc<str>,
        until: Instant,
        lock: Duration,
    },
    Available {
        not_before: Instant,
    },
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    attempts: u32,
    state: State,
    last_error: Option<String>,
}

/// What a receive should do, from [`AckState::plan`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Available records out of attempts: dead-letter them (then `done`).
    pub dead: Vec<(u64, u32, Option<String>)>,
    /// Records to hand out again, in offset order.
    pub redeliver: Vec<u64>,
    /// New records may be handed out from `next`, at most this many.
    pub new: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckState {
    pub position: u64,
    pub next: u64,
    records: BTreeMap<u64, Rec>,
}

impl AckState {
    pub fn new(position: u64) -> AckState {
        AckState {
            position,
            next: position,
            records: BTreeMap::new(),
        }
    }

    /// Records handed out and not done.
    pub fn in_flight(&self) -> usize {
        self.records.values().filter(|r| r.state != State::Done).count()
    }

    /// What replay restores of each record handed out and not yet below
    /// the position, in offset order: (offset, delivery attempts, done,
    /// last error). Locks are not durable.
    pub fn durable(&self) -> impl Iterator<Item = (u64, u32, bool, Option<&str>)> {
        self.records
            .iter()
            .map(|(o, r)| (*o, r.attempts, r.state == State::Done, r.last_error.as_deref()))
    }

    /// Delivery attempts of a record so far.
    pub fn attempts(&self, offset: u64) -> u32 {
        self.records.get(&offset).map_or(0, |r| r.attempts)
    }

    /// Locks that ran out make their records available again.
    pub fn expire(&mut self, now: Instant) {
        for r in self.records.values_mut() {
            if matches!(&r.state, State::Acquired { until, .. } if *until <= now) {
                r.state = State::Available { not_before: now };
                r.last_error.get_or_insert_with(|| "its lock ran out".into());
            }
        }
    }

    /// Everything `member` holds becomes available (it lost the partition,
    /// left, or its session ran out).
    pub fn release(&mut self, member: &str, now: Instant) {
        for r in self.records.values_mut() {
            if matches!(&r.state, State::Acquired { member: m, .. } if **m == *member) {
                r.state = State::Available { not_before: now };
            }
        }
    }

    /// What the next receive hands out (see the module doc).
    pub fn plan(&self, now: Instant, max: u32, window: u64, max_attempts: u32) -> Plan {
        let mut plan = Plan::default();
        let mut waiting = false;
        // A record held back (nack delay) holds back the ones after it.
        let mut held_back = false;
        for (&offset, r) in &self.records {
            match &r.state {
                State::Available { .. } if r.attempts >= max_attempts => {
                    plan.dead.push((offset, r.attempts, r.last_error.clone()))
                }
                State::Available { not_before } => {
                    waiting = true;
                    held_back |= *not_before > now;
                    if !held_back && (plan.redeliver.len() as u32) < max {
                        plan.redeliver.push(offset);
                    }
                }
                State::Acquired { .. } if r.attempts > 1 => waiting = true,
                _ => {}
            }
        }
        if !waiting {
            let room = window.saturating_sub(self.next - self.position);
            plan.new = (max as u64).min(room) as u32;
        }
        plan
    }

    /// Whether the record at `offset` may be handed out now: never handed
    /// out (at or past `next`), or available and due.
    pub fn acquirable(&self, offset: u64, now: Instant) -> bool {
        if offset < self.position {
            return false;
        }
        match self.records.get(&offset) {
            None => offset >= self.next,
            Some(r) => matches!(r.state, State::Available { not_before } if not_before <= now),
        }
    }

    /// Records handed out to `member` for `lock` (each one's attempt
    /// counted); offsets at or past `next` move it. Offsets that are not
    /// [`AckState::acquirable`] (another receive took them meanwhile) are
    /// skipped; returns the ones acquired.
    pub fn acquire(&mut self, offsets: &[u64], member: &str, now: Instant, lock: Duration) -> Vec<u64> {
        let mut taken = Vec::new();
        let member: std::rc::Rc<str> = member.into();
        for &o in offsets {
            if !self.acquirable(o, now) {
                continue;
            }
            let r = self.records.entry(o).or_insert(Rec {
                attempts: 0,
                state: State::Done,
                last_error: None,
            });
            r.attempts += 1;
            r.state = State::Acquired {
                member: member.clone(),
                until: now + lock,
                lock,
            };
            self.next = self.next.max(o + 1);
            taken.push(o);
        }
        taken
    }

    /// Checks that `member` holds the record (for a settle).
    pub fn held_by(&self, offset: u64, member: &str) -> bool {
        matches!(self.records.get(&offset), Some(Rec { state: State::Acquired { member: m, .. }, .. }) if **m == *member)
    }

    /// Applies a settle of a record `member` holds; false (nothing changes)
    /// if it does not hold it any more. `Renew` extends the lock by the
    /// member's lock period.
    pub fn settle(
        &mut self,
        offset: u64,
        member: &str,
        outcome: Outcome,
        reason: Option<String>,
        now: Instant,
    ) -> bool {
        if !self.held_by(offset, member) {
            return false;
        }
        let Some(r) = self.records.get_mut(&offset) else {
            return false;
        };
        match outcome {
            Outcome::Ack | Outcome::DeadLetter => r.state = State::Done,
            Outcome::Nack { delay } => {
                r.state = State::Available {
                    not_before: now + delay,
                };
                r.last_error = reason.or_else(|| Some("nacked".into()));
            }
            Outcome::Renew => {
                if let State::Acquired { until, lock, .. } = &mut r.state {
                    *until = now + *lock;
                }
            }
        }
        true
    }

    /// A record that is done without a settle (dead-lettered at receive).
    pub fn done(&mut self, offset: u64) {
        if let Some(r) = self.records.get_mut(&offset) {
            r.state = State::Done;
        }
    }

    /// Replay: a record was delivered for the `attempts`th time. After a
    /// restart no lock holds: it is available again, its count kept.
    pub fn replay_delivered(&mut self, offset: u64, attempts: u32, now: Instant) {
        if offset < self.position {
            return;
        }
        let r = self.records.entry(offset).or_insert(Rec {
            attempts: 0,
            state: State::Available { not_before: now },
            last_error: None,
        });
        r.attempts = r.attempts.max(attempts);
        if r.state != State::Done {
            r.state = State::Available { not_before: now };
        }
        self.next = self.next.max(offset + 1);
    }

    /// Replay: a settle (Ack / DeadLetter → done; Nack → its last error).
    pub fn replay_settled(&mut self, offset: u64, done: bool, reason: Option<String>) {
        if let Some(r) = self.records.get_mut(&offset) {
            if done {
                r.state = State::Done;
            } else if reason.is_some() {
                r.last_error = reason;
            }
        }
    }

    /// A committed position: the records below it are done with (and done
    /// ones right after it too). Never backward: commits of concurrent
    /// settles may land out of order, and an older one must not wipe the
    /// state of records handed out since (issue 41, item 4: their delivery
    /// counts were lost — deliveries past the attempt limit, one record
    /// with two workers, a second dead letter). Only [`AckState::reset`]
    /// goes back.
    pub fn advance_to(&mut self, position: u64) {
        if position <= self.position {
            return;
        }
        self.position = position;
        self.next = self.next.max(position);
        self.records.retain(|&o, _| o >= position);
        self.advance();
    }

    /// An operator's reset (`group reset`): the record state starts over
    /// from `position`, backward or forward — nothing is out any more.
    pub fn reset(&mut self, position: u64) {
        *self = AckState::new(position);
    }

    /// Moves the position past the done prefix; returns whether it moved.
    pub fn advance(&mut self) -> bool {
        let before = self.position;
        while let Some(r) = self.records.get(&self.position) {
            if r.state != State::Done {
                break;
            }
            self.records.remove(&self.position);
            self.position += 1;
        }
        // Records never handed out lie only at or past `next`.
        if self.position >= self.next {
            self.next = self.position;
        }
        self.position != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: Duration = Duration::from_secs(30);

    #[test]
    fn acks_move_the_position_over_the_done_prefix_only() {
        let now = Instant::now();
        let mut s = AckState::new(10);
        assert_eq!(s.plan(now, 5, 100, 5).new, 5);
        s.acquire(&[10, 11, 12], "m", now, LOCK);
        s.settle(11, "m", Outcome::Ack, None, now);
        assert!(!s.advance(), "10 is still out");
        s.settle(10, "m", Outcome::Ack, None, now);
        assert!(s.advance());
        assert_eq!(s.position, 12);
        assert_eq!(s.in_flight(), 1);
    }

    #[test]
    fn a_nacked_record_is_redelivered_before_anything_new() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&[0, 1], "m", now, LOCK);
        s.settle(
            0,
            "m",
            Outcome::Nack { delay: Duration::ZERO },
            Some("boom".into()),
            now,
        );
        let plan = s.plan(now, 10, 100, 5);
        assert_eq!(plan.redeliver, vec![0]);
        assert_eq!(plan.new, 0, "nothing new while 0 waits");
        s.acquire(&[0], "m", now, LOCK);
        assert_eq!(s.attempts(0), 2);
        assert_eq!(s.plan(now, 10, 100, 5).new, 0, "nor while 0 is out again");
        s.settle(0, "m", Outcome::Ack, None, now);
        assert_eq!(s.plan(now, 10, 100, 5).new, 10);
    }

    #[test]
    fn a_delay_holds_the_redelivery_back() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&[0], "m", now, LOCK);
        s.settle(
            0,
            "m",
            Outcome::Nack {
                delay: Duration::from_secs(5),
            },
            None,
            now,
        );
        assert!(s.plan(now, 10, 100, 5).redeliver.is_empty());
        assert_eq!(s.plan(now + Duration::from_secs(5), 10, 100, 5).redeliver, vec![0]);
    }

    #[test]
    fn out_of_attempts_goes_to_the_dead_letter_queue() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        for attempt in 1..=5 {
            s.acquire(&[0], "m", now, LOCK);
            assert_eq!(s.attempts(0), attempt);
            s.settle(
                0,
                "m",
                Outcome::Nack { delay: Duration::ZERO },
                Some(format!("fail {attempt}")),
                now,
            );
        }
        let plan = s.plan(now, 10, 100, 5);
        assert_eq!(plan.dead, vec![(0, 5, Some("fail 5".into()))]);
        assert!(plan.redeliver.is_empty());
        s.done(0);
        assert!(s.advance());
        assert_eq!(s.plan(now, 10, 100, 5).new, 10);
    }

    #[test]
    fn expired_locks_and_released_members_make_records_available() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&[0], "a", now, Duration::from_secs(1));
        s.acquire(&[1], "b", now, LOCK);
        s.expire(now + Duration::from_secs(2));
        assert!(!s.held_by(0, "a"));
        assert!(s.held_by(1, "b"));
        s.release("b", now);
        assert_eq!(s.plan(now + Duration::from_secs(2), 10, 100, 5).redeliver, vec![0, 1]);
    }

    #[test]
    fn a_delayed_record_holds_back_the_ones_after_it() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&[3, 4], "m", now, LOCK);
        let later = Duration::from_secs(10);
        assert!(s.settle(3, "m", Outcome::Nack { delay: later }, None, now));
        assert!(s.settle(4, "m", Outcome::Nack { delay: Duration::ZERO }, None, now));
        assert!(s.plan(now, 10, 100, 5).redeliver.is_empty(), "4 may not overtake 3");
        assert_eq!(s.plan(now + later, 10, 100, 5).redeliver, vec![3, 4]);
    }

    #[test]
    fn an_acquired_record_is_not_handed_out_twice_nor_settled_by_another() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        assert_eq!(s.acquire(&[0, 1], "a", now, LOCK), vec![0, 1]);
        assert!(s.acquire(&[0, 1, 2], "b", now, LOCK) == vec![2], "a holds 0 and 1");
        assert!(!s.settle(0, "b", Outcome::Ack, None, now));
        assert!(s.settle(0, "a", Outcome::Ack, None, now));
    }

    #[test]
    fn a_reset_backwards_starts_the_record_state_over() {
        let now = Instant::now();
        let mut s = AckState::new(100);
        s.acquire(&[100, 101], "m", now, LOCK);
        s.advance_to(0);
        assert_eq!((s.position, s.in_flight()), (100, 2), "a commit never goes back");
        s.reset(0);
        assert_eq!((s.position, s.next, s.in_flight()), (0, 0, 0));
        assert_eq!(s.plan(now, 10, 100, 5).new, 10);
    }

    #[test]
    fn renew_extends_the_lock() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&[0], "m", now, Duration::from_secs(1));
        s.settle(0, "m", Outcome::Renew, None, now + Duration::from_millis(900));
        s.expire(now + Duration::from_millis(1500));
        assert!(s.held_by(0, "m"), "renewed by its own lock period");
        s.expire(now + Duration::from_millis(1950));
        assert!(!s.held_by(0, "m"), "and by no more");
    }

    #[test]
    fn the_window_bounds_what_is_out() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.acquire(&(0..8).collect::<Vec<_>>(), "m", now, LOCK);
        assert_eq!(s.plan(now, 100, 10, 5).new, 2);
    }

    #[test]
    fn replay_keeps_counts_and_frees_locks() {
        let now = Instant::now();
        let mut s = AckState::new(0);
        s.replay_delivered(0, 1, now);
        s.replay_delivered(0, 2, now);
        s.replay_delivered(1, 1, now);
        s.replay_settled(1, true, None);
        assert!(!s.advance());
        assert_eq!(s.attempts(0), 2);
        assert_eq!(s.plan(now, 10, 100, 5).redeliver, vec![0]);
        s.advance_to(2);
        assert_eq!((s.position, s.next, s.in_flight()), (2, 2, 0));
    }
}
