//! Broker leases, as the controller leader keeps them: who heartbeats,
//! from where, and whose lease ran out.
//!
//! Runs on: shard 0 of the controller leader, in memory only (KRaft keeps
//! its broker sessions the same way). What the table must know — a broker
//! alive or fenced — goes through Raft as `RegisterBroker` / `FenceBroker`
//! (`Controller::renew_lease` and the fencing loop); a lease renewal that
//! changes nothing writes nothing.
//!
//! Sans I/O: time is passed in, so tests drive it.
//!
//! - A leader's leases start empty each term. The first time it looks, it
//!   gives every broker the table shows alive a whole session from then:
//!   a controller failover fences nobody who keeps heartbeating.
//! - A renewal from the address that holds the id's lease, or for an id
//!   whose lease expired or that has none, is granted (the lease moves to
//!   that address). One from another address while the lease runs is
//!   refused: two brokers must not run with the same id.
//! - Whether a broker renewed lately ([`Leases::renewed_within`]) is what
//!   leader balancing asks before it gives a broker leaderships: a broker
//!   that crashed keeps its lease for up to a session, and leaderships
//!   given to it then would be offline until it is fenced. A lease granted
//!   by a new term's first look is no renewal.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::stm::ControllerError;
use super::table::{MetadataTable, NodeId};

/// One broker's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    address: String,
    until: Instant,
    /// When the broker last renewed it (`None`: granted by a new term's
    /// first look, not renewed since).
    renewed: Option<Instant>,
}

/// Every broker's lease, for one leader term.
#[derive(Debug)]
pub struct Leases {
    session: Duration,
    term: u64,
    held: HashMap<NodeId, Lease>,
}

impl Leases {
    /// Leases that last `session` after each renewal.
    pub fn new(session: Duration) -> Leases {
        Leases {
            session,
            term: 0,
            held: HashMap::new(),
        }
    }

    /// Starts over when `term` is not the one the leases belong to, and
    /// gives every broker alive in `table` without a lease one until
    /// `now + session`.
    fn catch_up(&mut self, term: u64, table: &MetadataTable, now: Instant) {
        if term != self.term {
            self.term = term;
            self.held.clear();
        }
        for b in table.brokers.values().filter(|b| b.alive) {
            self.held.entry(b.id).or_insert_with(|| Lease {
                address: b.address.clone(),
                until: now + self.session,
                renewed: None,
            });
        }
    }

    /// Renews broker `id`'s lease from `address` until `now + session`, or
    /// refuses it while another address holds a lease that runs. `Ok(true)`:
    /// a new lease (none ran for this address: the broker is new, moved, or
    /// back after its lease expired — the table must be told it is alive,
    /// even if a fence for it is still on its way through Raft).
    pub fn renew(
        &mut self,
        term: u64,
        table: &MetadataTable,
        id: NodeId,
        address: &str,
        now: Instant,
    ) -> Result<bool, ControllerError> {
        self.check(term, table, id, address, now)?;
        let lease = Lease {
            address: address.to_string(),
            until: now + self.session,
            renewed: Some(now),
        };
        let fresh = match self.held.insert(id, lease) {
            Some(old) => old.address != address || old.until <= now,
            None => true,
        };
        Ok(fresh)
    }

    /// Whether broker `id`'s lease ran out by `now` (also if it has none).
    pub fn has_expired(&self, id: NodeId, now: Instant) -> bool {
        self.held.get(&id).is_none_or(|l| l.until <= now)
    }

    /// Whether broker `id` renewed its lease within `window` before `now`
    /// (in this term).
    pub fn renewed_within(&self, id: NodeId, window: Duration, now: Instant) -> bool {
        self.held
            .get(&id)
            .and_then(|l| l.renewed)
            .is_some_and(|at| now.saturating_duration_since(at) <= window)
    }

    /// Whether a broker at `address` may take id `id` now: refused while
    /// another address holds a lease on it that runs. Renews nothing (a
    /// learner's request to join asks this first).
    pub fn check(
        &mut self,
        term: u64,
        table: &MetadataTable,
        id: NodeId,
        address: &str,
        now: Instant,
    ) -> Result<(), ControllerError> {
        self.catch_up(term, table, now);
        match self.held.get(&id) {
            Some(held) if held.address != address && held.until > now => Err(ControllerError::BrokerIdInUse {
                id,
                address: held.address.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The brokers alive in `table` whose lease ran out by `now`: the ones
    /// to fence.
    pub fn expired(&mut self, term: u64, table: &MetadataTable, now: Instant) -> Vec<NodeId> {
        self.catch_up(term, table, now);
        table
            .brokers
            .values()
            .filter(|b| b.alive && self.held.get(&b.id).is_some_and(|l| l.until <= now))
            .map(|b| b.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::table::BrokerRecord;

    fn table(alive: &[(NodeId, bool)]) -> MetadataTable {
        let mut t = MetadataTable::default();
        for (id, alive) in alive {
            t.brokers.insert(
                *id,
                BrokerRecord {
                    id: *id,
                    address: format!("10.0.0.{id}:9400"),
                    shards: 1,
                    alive: *alive,
                    incarnation: 1,
                    draining: false,
                    decommissioning: false,
                    directory: 1,
                },
            );
        }
        t
    }

    const SESSION: Duration = Duration::from_secs(3);

    #[test]
    fn a_broker_that_stops_heartbeating_expires_one_session_after_its_last_renewal() {
        let t = table(&[(1, true), (2, true)]);
        let mut leases = Leases::new(SESSION);
        let start = Instant::now();
        // Known to the table, alive: the first look gave them their lease.
        assert!(!leases.renew(5, &t, 1, "10.0.0.1:9400", start).unwrap());
        assert!(!leases
            .renew(5, &t, 2, "10.0.0.2:9400", start + Duration::from_secs(2))
            .unwrap());
        assert!(leases.expired(5, &t, start + Duration::from_millis(2999)).is_empty());
        assert_eq!(leases.expired(5, &t, start + SESSION), vec![1]);
        assert_eq!(leases.expired(5, &t, start + Duration::from_secs(5)), vec![1, 2]);
        assert!(leases.has_expired(1, start + SESSION) && !leases.has_expired(2, start + SESSION));
        // A renewal after expiry is a new lease: the table must hear of it.
        assert!(leases
            .renew(5, &t, 1, "10.0.0.1:9400", start + Duration::from_secs(6))
            .unwrap());
        // A fenced broker is not reported again.
        let fenced = table(&[(1, false), (2, false)]);
        assert!(leases.expired(5, &fenced, start + Duration::from_secs(9)).is_empty());
    }

    #[test]
    fn only_a_renewal_in_the_window_counts_as_recent() {
        let t = table(&[(1, true), (2, true)]);
        let mut leases = Leases::new(SESSION);
        let start = Instant::now();
        let window = Duration::from_secs(1);
        leases.renew(3, &t, 1, "10.0.0.1:9400", start).unwrap();
        assert!(leases.renewed_within(1, window, start + window));
        // Still leased (a session is 3 s), but quiet for more than the window.
        let quiet = start + Duration::from_millis(1001);
        assert!(!leases.has_expired(1, quiet) && !leases.renewed_within(1, window, quiet));
        // Broker 2 holds a lease from the term's first look only.
        assert!(!leases.has_expired(2, start) && !leases.renewed_within(2, window, start));
        assert!(!leases.renewed_within(9, window, start), "unknown");
        // A new term forgets the renewals of the last.
        leases.renew(3, &t, 2, "10.0.0.2:9400", start).unwrap();
        assert!(leases.expired(4, &t, start).is_empty());
        assert!(!leases.renewed_within(2, window, start));
    }

    #[test]
    fn a_new_term_gives_every_live_broker_a_whole_session() {
        let t = table(&[(1, true), (2, true), (3, false)]);
        let mut leases = Leases::new(SESSION);
        let start = Instant::now();
        leases.renew(1, &t, 1, "10.0.0.1:9400", start).unwrap();
        // Term 2 begins long after broker 1's last renewal in term 1.
        let later = start + Duration::from_secs(60);
        assert!(leases.expired(2, &t, later).is_empty(), "no one fenced on a failover");
        assert_eq!(leases.expired(2, &t, later + SESSION), vec![1, 2]);
    }

    #[test]
    fn an_id_leased_at_another_address_is_refused_until_its_lease_runs_out() {
        let t = table(&[(2, true)]);
        let mut leases = Leases::new(SESSION);
        let start = Instant::now();
        leases.renew(1, &t, 2, "10.0.0.2:9400", start).unwrap();
        let refused = leases.renew(1, &t, 2, "10.0.0.9:9400", start + Duration::from_secs(1));
        assert_eq!(
            refused,
            Err(ControllerError::BrokerIdInUse {
                id: 2,
                address: "10.0.0.2:9400".into()
            })
        );
        // The holder renews; the impostor is still refused.
        leases
            .renew(1, &t, 2, "10.0.0.2:9400", start + Duration::from_secs(2))
            .unwrap();
        assert!(leases
            .renew(1, &t, 2, "10.0.0.9:9400", start + Duration::from_secs(4))
            .is_err());
        // Once the holder stops, the id moves to the new address, and the
        // old holder is the one refused.
        leases
            .renew(1, &t, 2, "10.0.0.9:9400", start + Duration::from_secs(5))
            .unwrap();
        assert!(leases
            .renew(1, &t, 2, "10.0.0.2:9400", start + Duration::from_secs(6))
            .is_err());
        // A table's live broker with no lease yet holds one from the first look.
        let mut fresh = Leases::new(SESSION);
        assert!(fresh.renew(2, &t, 2, "10.0.0.9:9400", start).is_err());
    }
}
