//! One consumer group's state and its rules: membership, sessions,
//! generations, the cooperative hand-over of partitions, commit fencing.
//!
//! Runs on: the coordinator's shard. Pure (no I/O; time is passed in): the
//! coordinator (`mod.rs`) persists what must survive a restart — the group's
//! existence and settings, committed positions — as `__groups` records
//! before it changes this state, and feeds the records back through
//! [`Group::apply_commit`] / [`Group::created`] when it replays them.
//!
//! Membership lives only in memory: after a coordinator restart members are
//! unknown (`UnknownMember`) and join again.
//!
//! # Hand-over
//! The *target* (see `assign.rs`) says who should read each partition; the
//! *holder* says who reads it now. A heartbeat reports what the member
//! holds; the answer grants it the partitions whose target it is and that
//! nobody else holds. A member told it no longer has a partition commits,
//! stops reading it and leaves it out of its next heartbeat: only then is
//! the partition granted to its new member. Partitions that do not move are
//! never paused. A member that leaves or whose session expires releases
//! everything at once.
//!
//! # Fencing
//! A commit is accepted only from the member holding the partition, with a
//! generation at least the one in which it was granted the partition: a
//! member that lost a partition (or an old incarnation of its grant) cannot
//! move the group's position.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::ack::AckState;
use super::assign::{assign, Strategy, Subscriber, Tp};

/// Where a new group starts reading a partition without a committed position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Earliest,
    Latest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupError {
    UnknownMember(String),
    /// The member does not hold the partition, or the generation is older
    /// than its grant.
    Fenced(String),
}

#[derive(Debug, Clone)]
pub struct Member {
    pub id: String,
    /// The user that joined it (`crate::auth`: a user whose ACLs decide;
    /// none for a superuser, a broker or `--auth none`): only that user
    /// may act as the member (`Group::check_owner`).
    pub owner: Option<String>,
    pub client_name: String,
    pub queues: Vec<String>,
    pub session_timeout: Duration,
    pub deadline: Instant,
}

/// Who holds a partition, and since which generation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    member: String,
    generation: u64,
}

/// A committed position, with the `__groups` offset of the record that set
/// it (a later record wins, whatever order the writes completed in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub offset: u64,
    pub record: u64,
}

#[derive(Debug, Clone)]
pub struct Group {
    pub strategy: Strategy,
    pub start: Start,
    pub generation: u64,
    /// In join order.
    members: Vec<Member>,
    target: BTreeMap<Tp, String>,
    holders: BTreeMap<Tp, Holder>,
    committed: BTreeMap<Tp, Committed>,
    /// The partition counts the target was computed with.
    counts: BTreeMap<String, u32>,
    /// Ack mode: per-record state of partitions read with receive/settle.
    pub acks: BTreeMap<Tp, AckState>,
    /// After a coordinator restart, members from before it may still read
    /// their partitions until their next heartbeat tells them to re-join:
    /// until then only partitions a member reports holding are granted.
    pub grace_until: Option<Instant>,
    /// A reset or delete is being written: joins wait.
    pub busy: bool,
    /// The id of each queue positions are kept for.
    queue_ids: BTreeMap<String, u64>,
    /// Rebalances since this coordinator loaded the group (a metric).
    pub rebalances: u64,
}

impl Group {
    /// A group as its `Created` record describes it. `generation` seeds the
    /// generation counter (see `mod.rs`).
    pub fn created(strategy: Strategy, start: Start, generation: u64) -> Group {
        Group {
            strategy,
            start,
            generation,
            members: Vec::new(),
            target: BTreeMap::new(),
            holders: BTreeMap::new(),
            committed: BTreeMap::new(),
            counts: BTreeMap::new(),
            acks: BTreeMap::new(),
            grace_until: None,
            busy: false,
            queue_ids: BTreeMap::new(),
            rebalances: 0,
        }
    }

    /// Refuses `user` acting as member `member_id` when another user
    /// joined it (a user's member is its own: another with `consume` on the
    /// group may not heartbeat, leave, commit, receive or settle as it).
    /// `user` none (a superuser, a broker, `--auth none`) may act as any;
    /// an unknown member is left to the operation to refuse.
    pub fn check_owner(&self, member_id: &str, user: Option<&str>) -> Result<(), String> {
        let Some(user) = user else {
            return Ok(());
        };
        match self.members().iter().find(|m| m.id == member_id) {
            Some(m) if m.owner.as_deref() != Some(user) => Err(format!(
                "user {user:?} may not act as member {member_id:?}: {} joined it",
                m.owner
                    .as_deref()
                    .map_or("a superuser".to_string(), |o| format!("user {o:?}"))
            )),
            _ => Ok(()),
        }
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Queues some member reads.
    pub fn subscribed(&self) -> Vec<String> {
        let mut qs: Vec<String> = self.members.iter().flat_map(|m| m.queues.iter().cloned()).collect();
        qs.sort();
        qs.dedup();
        qs
    }

    /// Partitions `member` holds.
    pub fn held_by(&self, member: &str) -> Vec<Tp> {
        let held = self.holders.iter().filter(|(_, h)| h.member == member);
        held.map(|(tp, _)| tp.clone()).collect()
    }

    pub fn holder(&self, tp: &Tp) -> Option<&str> {
        self.holders.get(tp).map(|h| h.member.as_str())
    }

    pub fn committed(&self, tp: &Tp) -> Option<u64> {
        self.committed.get(tp).map(|c| c.offset)
    }

    /// Every committed position.
    pub fn all_committed(&self) -> impl Iterator<Item = (&Tp, u64)> {
        self.committed.iter().map(|(tp, c)| (tp, c.offset))
    }

    /// Adds a member and rebalances.
    pub fn join(&mut self, member: Member, counts: BTreeMap<String, u32>) {
        self.members.push(member);
        self.rebalance(counts);
    }

    /// Removes a member, releasing what it holds, and rebalances;
    /// `counts_of` gives the partition counts of the queues the remaining
    /// members read.
    pub fn leave(
        &mut self,
        id: &str,
        counts_of: impl FnOnce(&[String]) -> BTreeMap<String, u32>,
    ) -> Result<(), GroupError> {
        let before = self.members.len();
        self.members.retain(|m| m.id != id);
        if self.members.len() == before {
            return Err(GroupError::UnknownMember(id.to_string()));
        }
        self.holders.retain(|_, h| h.member != id);
        self.release_records(id);
        self.rebalance(counts_of(&self.subscribed()));
        Ok(())
    }

    /// Removes members whose session ran out, rebalancing if any did (as
    /// [`Group::leave`]); returns their ids.
    pub fn expire(&mut self, now: Instant, counts_of: impl FnOnce(&[String]) -> BTreeMap<String, u32>) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.deadline <= now)
            .map(|m| m.id.clone())
            .collect();
        if !gone.is_empty() {
            self.members.retain(|m| m.deadline > now);
            self.holders.retain(|_, h| !gone.contains(&h.member));
            for id in &gone {
                self.release_records(id);
            }
            self.rebalance(counts_of(&self.subscribed()));
        }
        gone
    }

    /// A member's heartbeat: renews its session, takes note of what it
    /// holds (releasing what it no longer lists), rebalances if a queue's
    /// partition count changed, and returns the generation and the
    /// partitions the member may hold now.
    pub fn heartbeat(
        &mut self,
        id: &str,
        owned: &[Tp],
        now: Instant,
        counts: BTreeMap<String, u32>,
    ) -> Result<(u64, Vec<Tp>), GroupError> {
        let member = self
            .members
            .iter_mut()
            .find(|m| m.id == id)
            .ok_or_else(|| GroupError::UnknownMember(id.to_string()))?;
        member.deadline = now + member.session_timeout;
        if counts != self.counts {
            self.rebalance(counts);
        }
        // Released: held here before, not listed now.
        let released: Vec<Tp> = self
            .holders
            .iter()
            .filter(|(tp, h)| h.member == id && !owned.contains(tp))
            .map(|(tp, _)| tp.clone())
            .collect();
        for tp in &released {
            self.holders.remove(tp);
            if let Some(a) = self.acks.get_mut(tp) {
                a.release(id, now);
            }
        }
        // Listed and held by nobody (a grant it is taking up, or it held it
        // before this coordinator knew): it holds it until it lets go.
        for tp in owned {
            self.holders.entry(tp.clone()).or_insert_with(|| Holder {
                member: id.to_string(),
                generation: self.generation,
            });
        }
        let mut assigned = Vec::new();
        let in_grace = self.grace_until.is_some_and(|t| now < t);
        for (tp, target) in &self.target {
            if target != id || (in_grace && !self.holders.contains_key(tp)) {
                continue;
            }
            let holder = self.holders.entry(tp.clone()).or_insert_with(|| Holder {
                member: id.to_string(),
                generation: self.generation,
            });
            if holder.member == id {
                assigned.push(tp.clone());
            }
        }
        Ok((self.generation, assigned))
    }

    /// Partitions the assignment gives `id` that it does not hold now:
    /// another member still holds them (a move waits for its release), or
    /// the restart grace keeps them back. The member is waiting for them,
    /// not idle.
    pub fn withheld(&self, id: &str) -> u32 {
        let withheld = self
            .target
            .iter()
            .filter(|(tp, target)| *target == id && self.holders.get(*tp).is_none_or(|h| h.member != id))
            .count();
        u32::try_from(withheld).unwrap_or(u32::MAX)
    }

    /// Checks that `member` may commit positions of `partitions` in
    /// `generation` (see the module doc).
    pub fn check_commit(&self, member: &str, generation: u64, partitions: &[Tp]) -> Result<(), GroupError> {
        if !self.members.iter().any(|m| m.id == member) {
            return Err(GroupError::UnknownMember(member.to_string()));
        }
        for tp in partitions {
            match self.holders.get(tp) {
                Some(h) if h.member == member && generation >= h.generation => {}
                Some(h) if h.member == member => {
                    return Err(GroupError::Fenced(format!(
                        "generation {generation} is older than the grant of {}/{} (generation {})",
                        tp.0, tp.1, h.generation
                    )))
                }
                _ => {
                    return Err(GroupError::Fenced(format!(
                        "member {member} does not hold {}/{}",
                        tp.0, tp.1
                    )))
                }
            }
        }
        Ok(())
    }

    /// Sets a committed position (from a record at `record`; an older
    /// record than the one that set the current value changes nothing).
    /// An ack-mode partition's record state only moves forward
    /// ([`AckState::advance_to`]): commits of concurrent settles may be
    /// written out of order.
    pub fn apply_commit(&mut self, tp: Tp, offset: u64, record: u64) {
        if self.set_committed(&tp, offset, record) {
            if let Some(a) = self.acks.get_mut(&tp) {
                a.advance_to(offset);
            }
        }
    }

    /// An operator's reset to `offset` (from a record at `record`): the
    /// committed position, and an ack-mode record state, start over there.
    pub fn apply_reset(&mut self, tp: Tp, offset: u64, record: u64) {
        if self.set_committed(&tp, offset, record) {
            if let Some(a) = self.acks.get_mut(&tp) {
                a.reset(offset);
            }
        }
    }

    /// Sets the committed position from a record at `record`, unless a
    /// later record set it; returns whether it did.
    fn set_committed(&mut self, tp: &Tp, offset: u64, record: u64) -> bool {
        let slot = self.committed.entry(tp.clone()).or_insert(Committed { offset, record });
        if record < slot.record {
            return false;
        }
        *slot = Committed { offset, record };
        true
    }

    /// The id of the queue whose positions this group holds under `queue`
    /// (from a commit record that named it).
    pub fn queue_id(&self, queue: &str) -> Option<u64> {
        self.queue_ids.get(queue).copied()
    }

    /// Positions of `queue` belong to the queue with this id.
    pub fn note_queue(&mut self, queue: &str, id: u64) {
        self.queue_ids.insert(queue.to_string(), id);
    }

    /// Drops positions and record state of queues for which `current`
    /// (name, id) is false: deleted, or deleted and created anew.
    pub fn forget_queues(&mut self, current: impl Fn(&str, u64) -> bool) {
        let gone: Vec<String> = self
            .queue_ids
            .iter()
            .filter(|(q, id)| !current(q, **id))
            .map(|(q, _)| q.clone())
            .collect();
        for q in gone {
            self.queue_ids.remove(&q);
            self.committed.retain(|(tq, _), _| *tq != q);
            self.acks.retain(|(tq, _), _| *tq != q);
        }
    }

    /// Whether `member` is in the group.
    pub fn has_member(&self, member: &str) -> bool {
        self.members.iter().any(|m| m.id == member)
    }

    /// Records `member` holds in ack mode become available again.
    fn release_records(&mut self, member: &str) {
        let now = Instant::now();
        for a in self.acks.values_mut() {
            a.release(member, now);
        }
    }

    /// Computes a new target and starts a new generation.
    fn rebalance(&mut self, counts: BTreeMap<String, u32>) {
        let subs: Vec<Subscriber> = self
            .members
            .iter()
            .map(|m| Subscriber {
                id: m.id.clone(),
                queues: m.queues.clone(),
            })
            .collect();
        self.target = assign(self.strategy, &subs, &counts, &self.target);
        // Partitions that no longer exist are held by nobody.
        self.holders.retain(|(q, p), _| counts.get(q).is_some_and(|n| p < n));
        self.counts = counts;
        self.generation += 1;
        self.rebalances += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, now: Instant) -> Member {
        Member {
            id: id.into(),
            owner: None,
            client_name: "test".into(),
            queues: vec!["q".into()],
            session_timeout: Duration::from_secs(10),
            deadline: now + Duration::from_secs(10),
        }
    }

    fn counts(n: u32) -> BTreeMap<String, u32> {
        [("q".to_string(), n)].into_iter().collect()
    }

    fn tp(p: u32) -> Tp {
        ("q".into(), p)
    }

    #[test]
    fn a_moved_partition_waits_for_its_release_and_the_others_never_pause() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Sticky, Start::Earliest, 0);
        g.join(member("a", now), counts(4));
        let (_, a1) = g.heartbeat("a", &[], now, counts(4)).unwrap();
        assert_eq!(a1, vec![tp(0), tp(1), tp(2), tp(3)]);
        g.join(member("b", now), counts(4));
        // b gets nothing until a lets go; a keeps two.
        let (_, b1) = g.heartbeat("b", &[], now, counts(4)).unwrap();
        assert!(b1.is_empty());
        assert_eq!((g.withheld("b"), g.withheld("a")), (2, 0), "b waits for two");
        let (_, a2) = g.heartbeat("a", &a1, now, counts(4)).unwrap();
        assert_eq!(a2.len(), 2);
        for kept in &a2 {
            assert!(a1.contains(kept), "a keeps partitions it had");
        }
        // Until a's next heartbeat it still holds the moving two: b waits.
        assert!(g.heartbeat("b", &[], now, counts(4)).unwrap().1.is_empty());
        let (_, a3) = g.heartbeat("a", &a2, now, counts(4)).unwrap();
        assert_eq!(a3, a2);
        let (_, b2) = g.heartbeat("b", &[], now, counts(4)).unwrap();
        assert_eq!(b2.len(), 2);
        assert_eq!(g.withheld("b"), 0, "b has them now");
        assert!(b2.iter().all(|t| !a2.contains(t)));
    }

    #[test]
    fn after_a_restart_unheld_partitions_are_withheld_for_the_grace() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Range, Start::Earliest, 0);
        g.grace_until = Some(now + Duration::from_secs(5));
        g.join(member("a", now), counts(3));
        // a held partition 0 before the restart; 1 and 2 nobody reports.
        let (_, a) = g.heartbeat("a", &[tp(0)], now, counts(3)).unwrap();
        assert_eq!((a, g.withheld("a")), (vec![tp(0)], 2));
        let later = now + Duration::from_secs(6);
        let (_, a) = g.heartbeat("a", &[tp(0)], later, counts(3)).unwrap();
        assert_eq!((a.len(), g.withheld("a")), (3, 0));
    }

    #[test]
    fn a_member_is_its_joiners() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Range, Start::Earliest, 0);
        let alices = Member {
            owner: Some("alice".into()),
            ..member("a", now)
        };
        g.join(alices, counts(1));
        g.join(member("root's", now), counts(1));
        assert_eq!(g.check_owner("a", Some("alice")), Ok(()));
        let refused = g.check_owner("a", Some("bob")).unwrap_err();
        assert!(refused.contains("bob") && refused.contains("alice"), "{refused}");
        // A superuser's member is no user's; a superuser acts as any.
        assert!(g.check_owner("root's", Some("alice")).is_err());
        assert_eq!(g.check_owner("a", None), Ok(()));
        // An unknown member: the operation says so.
        assert_eq!(g.check_owner("gone", Some("bob")), Ok(()));
    }

    #[test]
    fn commits_are_fenced() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Range, Start::Earliest, 0);
        g.join(member("a", now), counts(2));
        let (gen, a) = g.heartbeat("a", &[], now, counts(2)).unwrap();
        assert!(g.check_commit("a", gen, &a).is_ok());
        assert!(matches!(
            g.check_commit("x", gen, &a),
            Err(GroupError::UnknownMember(_))
        ));
        assert!(matches!(g.check_commit("a", gen - 1, &a), Err(GroupError::Fenced(_))));
        g.join(member("b", now), counts(2));
        let (_, a2) = g.heartbeat("a", &a, now, counts(2)).unwrap();
        // a released partition 1 in its next heartbeat: its commits for it
        // are refused from then on.
        g.heartbeat("a", &a2, now, counts(2)).unwrap();
        assert!(matches!(
            g.check_commit("a", gen + 1, &[tp(1)]),
            Err(GroupError::Fenced(_))
        ));
        assert!(g.check_commit("a", gen + 1, &[tp(0)]).is_ok());
    }

    #[test]
    fn an_expired_member_releases_everything() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Sticky, Start::Latest, 0);
        g.join(member("a", now), counts(2));
        g.join(member("b", now), counts(2));
        let (_, a) = g.heartbeat("a", &[], now, counts(2)).unwrap();
        let later = now + Duration::from_secs(8);
        let (_, b) = g.heartbeat("b", &[], later, counts(2)).unwrap();
        assert_eq!((a.len(), b.len()), (1, 1));
        let gone = g.expire(now + Duration::from_secs(11), |_| counts(2));
        assert_eq!(gone, vec!["a".to_string()]);
        let (_, b2) = g.heartbeat("b", &b, now + Duration::from_secs(11), counts(2)).unwrap();
        assert_eq!(b2, vec![tp(0), tp(1)]);
        assert_eq!(
            g.heartbeat("a", &a, later, counts(2)),
            Err(GroupError::UnknownMember("a".into()))
        );
    }

    #[test]
    fn later_commit_records_win() {
        let mut g = Group::created(Strategy::Sticky, Start::Latest, 0);
        g.apply_commit(tp(0), 50, 7);
        g.apply_commit(tp(0), 40, 6);
        assert_eq!(g.committed(&tp(0)), Some(50));
        g.apply_commit(tp(0), 10, 8);
        assert_eq!(g.committed(&tp(0)), Some(10), "a later commit moves positions back");
        g.apply_reset(tp(0), 5, 9);
        g.apply_reset(tp(0), 99, 3);
        assert_eq!(g.committed(&tp(0)), Some(5), "a reset too, in record order");
    }

    /// Issue 41, item 4: two settles of one member commit concurrently and
    /// their commits land out of order. The older, lower one must not wipe
    /// the ack state: records handed out past it stay out, with their
    /// counts. Only a reset starts the state over.
    #[test]
    fn an_older_commit_landing_late_never_moves_an_ack_position_back() {
        use crate::groups::ack::{AckState, Outcome};
        let now = Instant::now();
        let lock = Duration::from_secs(30);
        let mut g = Group::created(Strategy::Sticky, Start::Earliest, 0);
        g.acks.insert(tp(0), AckState::new(0));
        let a = g.acks.get_mut(&tp(0)).unwrap();
        a.acquire(&(0..10).collect::<Vec<_>>(), "m", now, lock);
        for o in 0..8 {
            assert!(a.settle(o, "m", Outcome::Ack, None, now));
        }
        a.advance();
        assert_eq!(a.position, 8);
        // Settle B's commit (8) lands first, then settle A's (5).
        g.apply_commit(tp(0), 8, 1);
        g.apply_commit(tp(0), 5, 2);
        let a = &g.acks[&tp(0)];
        assert_eq!(a.position, 8, "the ack position went back");
        assert_eq!(a.in_flight(), 2, "records 8 and 9 are still out");
        assert!(a.held_by(9, "m"));
        // An operator's reset starts it over.
        g.apply_reset(tp(0), 0, 3);
        let a = &g.acks[&tp(0)];
        assert_eq!((a.position, a.in_flight()), (0, 0));
    }

    #[test]
    fn new_partitions_are_assigned_at_the_next_heartbeat() {
        let now = Instant::now();
        let mut g = Group::created(Strategy::Sticky, Start::Latest, 0);
        g.join(member("a", now), counts(1));
        let (g1, a) = g.heartbeat("a", &[], now, counts(1)).unwrap();
        let (g2, a2) = g.heartbeat("a", &a, now, counts(3)).unwrap();
        assert!(g2 > g1);
        assert_eq!(a2, vec![tp(0), tp(1), tp(2)]);
    }
}
