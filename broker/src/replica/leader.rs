//! A partition leader's view of its replicas: each follower's position and
//! when it last caught up, the ISR (as committed by the controller, and a
//! change in flight), the high watermark, and when an acks=all produce is
//! committed. See the module doc of `crate::replica` for the rules.

use std::collections::BTreeMap;

use strand_wire::Offset;

use crate::controller::NodeId;

/// Which offset of a replica counts toward the high watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// fdatasync'd (`fsync=always` queues): every acknowledged record is on
    /// stable storage on every ISR member.
    Flushed,
    /// Written (`fsync=interval` queues).
    Written,
}

/// Where a replica's log is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub log_end: Offset,
    pub flushed: Offset,
}

/// How a leader runs its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderSettings {
    pub holds: Holds,
    /// A follower that has not caught up for this long leaves the ISR.
    pub lag_max_ms: u64,
    /// acks=all needs at least this many ISR members.
    pub min_insync: usize,
}

/// The state of an acks=all batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// The high watermark passed it: every ISR member holds it.
    Committed,
    Waiting,
    /// The ISR is smaller than `min_insync`.
    NotEnoughReplicas,
}

#[derive(Debug, Clone)]
struct Follower {
    at: Position,
    /// When it last held everything the leader had (at a fetch).
    caught_up_ms: u64,
    /// The leader's log end and the time at its previous fetch.
    previous_fetch: (Offset, u64),
}

/// See the module doc.
#[derive(Debug, Clone)]
pub struct LeaderState {
    me: NodeId,
    settings: LeaderSettings,
    /// As the controller committed it (the leader among them).
    isr: Vec<NodeId>,
    /// The partition epoch of `isr` (the controller bumps it on every
    /// leader or ISR change).
    partition_epoch: u32,
    /// An ISR change proposed and not yet committed.
    proposed: Option<Vec<NodeId>>,
    local: Position,
    /// The leader's log end when it took the lead: where its epoch starts.
    /// Everything before may have been committed under earlier leaders (its
    /// high watermark may not show it yet).
    epoch_start: Offset,
    followers: BTreeMap<NodeId, Follower>,
    high_watermark: Offset,
}

impl LeaderState {
    /// A leader (`me`) of a partition with `replicas` and the committed
    /// `isr`, its log at `local`, starting from `high_watermark` at
    /// `now_ms`. Followers count as caught up now: each gets `lag_max_ms`
    /// to show it is.
    pub fn new(
        me: NodeId,
        replicas: &[NodeId],
        isr: Vec<NodeId>,
        settings: LeaderSettings,
        local: Position,
        high_watermark: Offset,
        now_ms: u64,
    ) -> LeaderState {
        let mut state = LeaderState {
            me,
            settings,
            isr,
            partition_epoch: 0,
            proposed: None,
            local,
            epoch_start: local.log_end,
            followers: BTreeMap::new(),
            high_watermark: high_watermark.min(local.log_end),
        };
        state.set_replicas(replicas, &[], now_ms);
        state
    }

    /// The partition's replicas changed in this leader's epoch (a
    /// reassignment began or completed): a new follower counts as caught up
    /// now (it gets `lag_max_ms` to show it is) and joins the ISR the usual
    /// way; a removed one is forgotten. A follower outside `isr` holds
    /// nothing for the leader until its next fetch says what it holds: a
    /// replica removed and added back in tables this leader did not all
    /// see (it deleted its copy meanwhile) must not join on its old
    /// position.
    pub fn set_replicas(&mut self, replicas: &[NodeId], isr: &[NodeId], now_ms: u64) {
        self.followers.retain(|id, _| replicas.contains(id));
        for (id, f) in self.followers.iter_mut() {
            if !isr.contains(id) {
                f.at = Position::default();
            }
        }
        for r in replicas.iter().filter(|r| **r != self.me) {
            self.followers.entry(*r).or_insert(Follower {
                at: Position::default(),
                caught_up_ms: now_ms,
                previous_fetch: (Offset::ZERO, now_ms),
            });
        }
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// The partition epoch of the ISR it starts from (0 by default).
    pub fn at_partition_epoch(mut self, partition_epoch: u32) -> LeaderState {
        self.partition_epoch = partition_epoch;
        self
    }

    /// The partition epoch of [`LeaderState::isr`]: a proposal carries it,
    /// and the controller refuses it once the partition moved on.
    pub fn partition_epoch(&self) -> u32 {
        self.partition_epoch
    }

    /// acks=all now needs `n` in-sync replicas (the queue's setting changed).
    pub fn set_min_insync(&mut self, n: usize) {
        self.settings.min_insync = n;
    }

    /// In-sync replicas acks=all needs.
    pub fn min_insync(&self) -> usize {
        self.settings.min_insync
    }

    /// The ISR as the controller committed it.
    pub fn isr(&self) -> &[NodeId] {
        &self.isr
    }

    /// How many replicas the partition has (the leader among them).
    pub fn replica_count(&self) -> usize {
        self.followers.len() + 1
    }

    /// Each follower and how many records it is behind the leader's log end
    /// (at its last fetch), in id order.
    pub fn follower_lags(&self) -> Vec<(NodeId, u64)> {
        let end = self.local.log_end.0;
        self.followers
            .iter()
            .map(|(id, f)| (*id, end.saturating_sub(f.at.log_end.0)))
            .collect()
    }

    /// What each follower holds as the leader last heard: (id, log end,
    /// fdatasync'd), for the logs.
    pub fn follower_positions(&self) -> Vec<(NodeId, u64, u64)> {
        self.followers
            .iter()
            .map(|(id, f)| (*id, f.at.log_end.0, f.at.flushed.0))
            .collect()
    }

    /// The leader's own log moved (an append, a write, an fdatasync).
    /// Returns whether the high watermark moved.
    pub fn on_local(&mut self, at: Position) -> bool {
        self.local = at;
        self.advance()
    }

    /// Follower `id` fetched from `at.log_end` (it holds everything before)
    /// and has `at.flushed` on stable storage; call it only for a fetch
    /// answered with records (one whose log agrees with the leader's). Returns whether the high
    /// watermark moved. A fetch from a broker that is not a replica is
    /// ignored.
    pub fn on_fetch(&mut self, id: NodeId, at: Position, now_ms: u64) -> bool {
        let leader_end = self.local.log_end;
        let Some(f) = self.followers.get_mut(&id) else {
            return false;
        };
        if at.log_end >= leader_end {
            f.caught_up_ms = now_ms;
        } else if at.log_end >= f.previous_fetch.0 {
            // It reached what the leader had at its previous fetch.
            f.caught_up_ms = f.caught_up_ms.max(f.previous_fetch.1);
        }
        f.previous_fetch = (leader_end, now_ms);
        f.at = at;
        self.advance()
    }

    /// The ISR the leader wants now, if it differs from the committed one
    /// and no change is in flight: followers that have not caught up for
    /// `lag_max_ms` out; in, followers that hold (as the high watermark
    /// counts holding: fdatasync'd for `Holds::Flushed`) both the high
    /// watermark and the start of this leader's epoch — what earlier
    /// leaders may have committed — since any ISR member may lead next. The
    /// leader stays in.
    pub fn wanted_isr(&self, now_ms: u64) -> Option<Vec<NodeId>> {
        if self.proposed.is_some() {
            return None;
        }
        let mut wanted = vec![self.me];
        for (id, f) in &self.followers {
            let lagging = now_ms.saturating_sub(f.caught_up_ms) > self.settings.lag_max_ms;
            let keep = self.isr.contains(id) && !lagging;
            let join =
                !self.isr.contains(id) && !lagging && self.holds(f.at) >= self.high_watermark.max(self.epoch_start);
            if keep || join {
                wanted.push(*id);
            }
        }
        let mut now = self.isr.clone();
        now.sort();
        wanted.sort();
        (wanted != now).then_some(wanted)
    }

    /// The leader proposed `isr` to the controller.
    pub fn proposing(&mut self, isr: Vec<NodeId>) {
        self.proposed = Some(isr);
    }

    /// The controller answered: `Some((isr, partition epoch))` committed
    /// (returns whether the high watermark moved), `None` the proposal is
    /// over uncommitted (see [`LeaderState::on_refused`] for a refusal, and
    /// [`LeaderState::on_partition`] for a lost answer).
    pub fn on_isr(&mut self, committed: Option<(Vec<NodeId>, u32)>) -> bool {
        self.proposed = None;
        if let Some((isr, partition_epoch)) = committed {
            self.isr = isr;
            self.partition_epoch = partition_epoch;
        }
        self.advance()
    }

    /// The controller refused the proposal in flight. `moved_on`: because
    /// the partition's epochs had moved past the ones it was made at —
    /// which the proposal itself may have done, committed on an earlier
    /// try whose answer was lost (the glue tries again while the
    /// controller is unreachable). Its members then stay counted toward the
    /// high watermark until the table at the newer epoch arrives
    /// ([`LeaderState::on_partition`] ends it): a member it added counts
    /// for the controller from that commit on, and may lead next. (Dropping
    /// it here let a leader commit records that member lacked, and the
    /// controller then elected it: acknowledged records lost, found by a
    /// 30-minute strand-chaos run.) Otherwise (an ISR the controller found
    /// invalid) the proposal is over. Returns whether the high watermark
    /// moved.
    pub fn on_refused(&mut self, moved_on: bool) -> bool {
        if moved_on {
            return false;
        }
        self.on_isr(None)
    }

    /// The table shows the partition's ISR at `partition_epoch`. If that is
    /// newer than what the leader holds, the controller changed the ISR
    /// (it fenced a member, or committed a proposal whose answer was lost):
    /// the leader takes it, and a proposal in flight is over (committed, or
    /// refused for its old epoch). If not, nothing changed — and a proposal
    /// in flight stays counted: the controller may still commit it.
    /// Returns whether the high watermark moved.
    pub fn on_partition(&mut self, isr: Vec<NodeId>, partition_epoch: u32) -> bool {
        if partition_epoch <= self.partition_epoch {
            return false;
        }
        self.on_isr(Some((isr, partition_epoch)))
    }

    /// Where an acks=all batch whose last offset is `last` stands: refused
    /// while the ISR is smaller than `min_insync` (also once the high
    /// watermark passed it, if the ISR shrank meanwhile: fewer replicas
    /// than promised hold it), else committed once the high watermark
    /// passed it.
    pub fn ack(&self, last: Offset) -> Ack {
        if self.isr.len() < self.settings.min_insync {
            Ack::NotEnoughReplicas
        } else if self.high_watermark > last {
            Ack::Committed
        } else {
            Ack::Waiting
        }
    }

    /// What a replica holds toward the high watermark.
    fn holds(&self, at: Position) -> Offset {
        match self.settings.holds {
            Holds::Flushed => at.flushed.min(at.log_end),
            Holds::Written => at.log_end,
        }
    }

    /// Moves the high watermark to the lowest offset every member of the
    /// committed ISR, and of a change in flight, holds; never back.
    fn advance(&mut self) -> bool {
        let members = self.isr.iter().chain(self.proposed.iter().flatten());
        let mut lowest = self.holds(self.local);
        for id in members.filter(|id| **id != self.me) {
            let held = self.followers.get(id).map_or(Offset::ZERO, |f| self.holds(f.at));
            lowest = lowest.min(held);
        }
        if lowest > self.high_watermark {
            self.high_watermark = lowest;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTINGS: LeaderSettings = LeaderSettings {
        holds: Holds::Flushed,
        lag_max_ms: 10_000,
        min_insync: 2,
    };

    fn at(log_end: u64, flushed: u64) -> Position {
        Position {
            log_end: Offset(log_end),
            flushed: Offset(flushed),
        }
    }

    #[test]
    fn the_high_watermark_is_what_every_isr_member_has_on_disk() {
        let mut l = LeaderState::new(1, &[1, 2, 3], vec![1, 2, 3], SETTINGS, at(0, 0), Offset(0), 0);
        assert!(!l.on_local(at(10, 10)));
        assert!(!l.on_fetch(2, at(10, 10), 1));
        assert_eq!(l.ack(Offset(5)), Ack::Waiting);
        // Follower 3 has it written, not flushed: not yet.
        assert!(l.on_fetch(3, at(10, 6), 2));
        assert_eq!(l.high_watermark(), Offset(6));
        assert_eq!((l.ack(Offset(5)), l.ack(Offset(6))), (Ack::Committed, Ack::Waiting));
        assert!(l.on_fetch(3, at(10, 10), 3));
        assert_eq!(l.high_watermark(), Offset(10));
        // Never back, whatever a replica reports.
        assert!(!l.on_fetch(2, at(4, 4), 4));
        assert_eq!(l.high_watermark(), Offset(10));
        // With written offsets counting (fsync=interval), the flushed one does not matter.
        let written = LeaderSettings {
            holds: Holds::Written,
            ..SETTINGS
        };
        let mut l = LeaderState::new(1, &[1, 2], vec![1, 2], written, at(8, 0), Offset(0), 0);
        assert!(l.on_fetch(2, at(8, 0), 1));
        assert_eq!(l.high_watermark(), Offset(8));
    }

    #[test]
    fn a_proposal_refused_because_the_partition_moved_on_stays_counted_until_the_table_says() {
        // ISR {1, 2}; 3 has caught up and is proposed.
        let mut l = LeaderState::new(1, &[1, 2, 3], vec![1, 2], SETTINGS, at(0, 0), Offset(0), 0);
        l.on_local(at(10, 10));
        l.on_fetch(2, at(10, 10), 1);
        l.on_fetch(3, at(10, 10), 1);
        assert_eq!(l.high_watermark(), Offset(10));
        let wanted = l.wanted_isr(2).expect("3 joins");
        assert_eq!(wanted, vec![1, 2, 3]);
        l.proposing(wanted);
        // The controller committed it, but the answer was lost and the
        // retry is refused: the partition moved on (to epoch 1, by it).
        assert!(!l.on_refused(true));
        // 3 falls behind; 1 and 2 go on. For the controller 3 is in the
        // ISR (it may lead next): nothing 3 lacks is committed.
        l.on_local(at(30, 30));
        l.on_fetch(2, at(30, 30), 3);
        l.on_fetch(3, at(12, 12), 3);
        assert_eq!(l.high_watermark(), Offset(12));
        assert_eq!(l.ack(Offset(20)), Ack::Waiting);
        assert_eq!(l.wanted_isr(4), None, "no new proposal before the table says");
        // The table at epoch 1 ends it: 3 is in the ISR.
        assert!(!l.on_partition(vec![1, 2, 3], 1));
        assert_eq!(l.isr(), &[1, 2, 3]);
        assert_eq!(l.high_watermark(), Offset(12));

        // A refusal for an invalid ISR (not moved on) ends the proposal now.
        let mut l = LeaderState::new(1, &[1, 2, 3], vec![1, 2], SETTINGS, at(0, 0), Offset(0), 0);
        l.on_local(at(10, 10));
        l.on_fetch(2, at(10, 10), 1);
        l.on_fetch(3, at(10, 10), 1);
        let wanted = l.wanted_isr(2).expect("3 joins");
        l.proposing(wanted);
        l.on_fetch(3, at(10, 10), 2);
        l.on_local(at(20, 20));
        l.on_fetch(2, at(20, 20), 3);
        assert_eq!(l.high_watermark(), Offset(10));
        assert!(l.on_refused(false));
        assert_eq!(l.high_watermark(), Offset(20));
    }

    #[test]
    fn a_replica_added_by_a_reassignment_joins_once_it_holds_the_high_watermark() {
        let mut l = LeaderState::new(1, &[1, 2, 3], vec![1, 2, 3], SETTINGS, at(0, 0), Offset(0), 0);
        l.on_local(at(50, 50));
        l.on_fetch(2, at(50, 50), 10);
        l.on_fetch(3, at(50, 50), 10);
        assert_eq!(l.high_watermark(), Offset(50));
        // Replica 4 is added (the table's replicas: target first).
        l.set_replicas(&[2, 3, 4, 1], &[1, 2, 3], 20);
        assert_eq!(l.replica_count(), 4);
        assert_eq!(l.wanted_isr(30), None, "not before it holds the high watermark");
        l.on_fetch(4, at(20, 20), 30);
        assert_eq!(l.wanted_isr(40), None);
        assert_eq!(l.high_watermark(), Offset(50), "a non-member holds nothing back");
        l.on_fetch(4, at(50, 50), 50);
        assert_eq!(l.wanted_isr(60), Some(vec![1, 2, 3, 4]));
        // The move completes with 3 removed: a fetch of its changes nothing.
        l.set_replicas(&[1, 2, 4], &[1, 2, 4], 80);
        assert_eq!(l.replica_count(), 3);
        assert!(l.on_partition(vec![1, 2, 4], 1) || l.high_watermark() == Offset(50));
        // 4 was removed and added back in tables this leader did not all
        // see (its copy deleted meanwhile): out of the ISR, its old
        // position no longer counts until it fetches again.
        l.set_replicas(&[1, 2, 4], &[1, 2], 90);
        l.on_partition(vec![1, 2], 2);
        assert_eq!(l.wanted_isr(100), None, "not back on a position it may no longer hold");
        l.on_fetch(4, at(50, 50), 110);
        assert_eq!(l.wanted_isr(120), Some(vec![1, 2, 4]));
        assert!(!l.on_fetch(3, at(60, 60), 90));
        assert_eq!(
            l.follower_lags().iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![2, 4]
        );
    }

    #[test]
    fn a_lagging_follower_leaves_the_isr_and_comes_back_once_it_holds_the_high_watermark() {
        let mut l = LeaderState::new(1, &[1, 2, 3], vec![1, 2, 3], SETTINGS, at(0, 0), Offset(0), 0);
        l.on_local(at(100, 100));
        l.on_fetch(2, at(100, 100), 1_000);
        // Follower 3 fetches, but never reaches what the leader had.
        l.on_fetch(3, at(10, 10), 1_000);
        assert_eq!(l.high_watermark(), Offset(10));
        assert_eq!(l.wanted_isr(9_000), None, "within the lag limit");
        l.on_local(at(200, 200));
        l.on_fetch(2, at(200, 200), 10_500);
        l.on_fetch(3, at(50, 50), 10_500);
        let shrunk = l.wanted_isr(10_500).expect("3 leaves");
        assert_eq!(shrunk, vec![1, 2]);
        l.proposing(shrunk.clone());
        assert_eq!(l.wanted_isr(10_600), None, "one change at a time");
        // Until committed, the old ISR still holds the high watermark back.
        assert_eq!(l.high_watermark(), Offset(50));
        assert!(l.on_isr(Some((shrunk, 1))));
        assert_eq!(l.high_watermark(), Offset(200));
        // Below min_insync: acks=all refused; with 3 back, accepted.
        let mut alone = l.clone();
        alone.on_isr(Some((vec![1], 2)));
        assert_eq!(alone.ack(Offset(300)), Ack::NotEnoughReplicas);
        // 3 has the high watermark written but not on disk: not yet.
        l.on_fetch(3, at(200, 150), 10_900);
        assert_eq!(l.wanted_isr(10_900), None);
        // 3 catches up to the high watermark: it joins.
        l.on_fetch(3, at(200, 200), 11_000);
        let grown = l.wanted_isr(11_000).expect("3 joins");
        assert_eq!(grown, vec![1, 2, 3]);
        // Joining counts at once for the high watermark (more conservative).
        l.proposing(grown);
        l.on_local(at(250, 250));
        l.on_fetch(2, at(250, 250), 11_100);
        assert_eq!(l.high_watermark(), Offset(200));
        // The table at the same partition epoch says nothing new: the
        // change stays in flight, counted.
        assert!(!l.on_partition(vec![1, 2], 1));
        assert_eq!(l.high_watermark(), Offset(200));
        // A refused change leaves the committed ISR.
        assert!(l.on_isr(None));
        assert_eq!(l.isr(), &[1, 2]);
        assert_eq!(l.high_watermark(), Offset(250));
        // The controller fenced 2 (partition epoch 2): the leader takes it.
        assert!(!l.on_partition(vec![1], 2));
        assert_eq!((l.isr(), l.partition_epoch()), (&[1][..], 2));
    }

    #[test]
    fn a_follower_joins_only_once_it_holds_what_earlier_leaders_may_have_committed() {
        // A new leader with 40 records, its high watermark behind at 10.
        let mut l = LeaderState::new(2, &[1, 2, 3], vec![2, 3], SETTINGS, at(40, 40), Offset(10), 0);
        l.on_fetch(1, at(20, 20), 10);
        assert_eq!(
            l.wanted_isr(10),
            None,
            "it holds the high watermark, not the epoch start"
        );
        l.on_fetch(1, at(40, 40), 20);
        assert_eq!(l.wanted_isr(20), Some(vec![1, 2, 3]));
    }

    #[test]
    fn a_follower_that_keeps_up_with_a_busy_leader_stays_in() {
        let mut l = LeaderState::new(1, &[1, 2], vec![1, 2], SETTINGS, at(0, 0), Offset(0), 0);
        // Each fetch reaches what the leader had at the previous one.
        for t in 1..100u64 {
            l.on_local(at(t * 10, t * 10));
            l.on_fetch(2, at(t * 10 - 5, t * 10 - 5), t * 1_000);
        }
        assert_eq!(l.wanted_isr(100_000), None);
    }
}
