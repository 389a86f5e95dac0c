//! This broker's own lease with the controller, as the broker itself
//! counts it, and the monotonic clock the replication rules run on.
//!
//! The controller leader fences a broker whose lease it has not renewed
//! for `broker_session_ms` (`controller::leases`) and then gives that
//! broker's leaderships to other replicas. A broker cut off from the
//! controller (partitioned from its majority, or the controller without a
//! leader) does not learn of that fence: without a lease of its own it
//! went on leading in its old epochs, answered acks=all for records the
//! new leader lacked, and showed them to consumers (strand-chaos, seed
//! 42, 30 minutes: a node fenced at 13:22:33 still acknowledged
//! `chaos/2` 39066-39067 at 13:22:42; the new leader's log parted below
//! them).
//!
//! So a broker counts its lease too, from its side:
//!
//! - A renewal that succeeded was granted by the controller leader after
//!   it was sent, and that leader then confirmed with a quorum that it
//!   still led (`Controller::renew_lease`): its lease for this broker
//!   runs at least until *send time + session*, and a newer leader gives
//!   every broker a whole session from a first look that comes later.
//!   The broker holds its lease until *send time + session − session/16*
//!   (the sixteenth is room for clocks that run at slightly different
//!   rates on two machines).
//! - While it holds none, the broker's leaders take no produce, answer no
//!   acks=all as committed, and move no high watermark that consumers
//!   see (`NotLeader`, naming the lease): the controller may already have
//!   fenced it and elected other leaders. When a renewal succeeds again
//!   they go on (if the table still makes them leaders).
//!
//! Runs on: shard 0 renews (`Controller::keep_alive`); every shard reads
//! the shared value on its produce path and as high watermarks move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Milliseconds on a monotonic clock shared by the whole process (the
/// replication rules' time, and the lease's).
pub fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// This run's lease: the run (its incarnation, which the broker registers
/// with) and until when it holds the lease, in [`mono_ms`]. Shared by
/// every shard of the process (one atomic).
#[derive(Debug, Clone)]
pub struct OwnLease {
    /// Held before this millisecond; 0: never renewed.
    until_ms: Arc<AtomicU64>,
    incarnation: u64,
}

impl Default for OwnLease {
    fn default() -> OwnLease {
        OwnLease::new()
    }
}

/// A random id for this run of the broker process (never 0, which
/// tables written before incarnations existed hold).
fn new_incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ (u64::from(std::process::id()) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed.max(1)
}

impl OwnLease {
    /// A new run's lease, not held yet.
    pub fn new() -> OwnLease {
        OwnLease {
            until_ms: Arc::new(AtomicU64::new(0)),
            incarnation: new_incarnation(),
        }
    }

    /// This run of the broker process (`BrokerRecord::incarnation` once
    /// registered).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// A renewal sent at `sent_ms` succeeded: the lease holds until
    /// `sent_ms + session − session/16` (never earlier than an earlier
    /// renewal made it).
    pub fn renewed(&self, sent_ms: u64, session_ms: u64) {
        let until = sent_ms + session_ms - session_ms / 16;
        self.until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// Whether the lease holds at `now_ms`.
    pub fn holds_at(&self, now_ms: u64) -> bool {
        now_ms < self.until_ms.load(Ordering::Acquire)
    }

    /// Whether the lease holds now.
    pub fn holds(&self) -> bool {
        self.holds_at(mono_ms())
    }

    /// Until when it holds (0: never renewed), in [`mono_ms`].
    pub fn until_ms(&self) -> u64 {
        self.until_ms.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_from_the_renewal_until_its_send_time_plus_most_of_a_session() {
        let lease = OwnLease::default();
        assert!(!lease.holds_at(0), "never renewed: not held");
        lease.renewed(1_000, 3_200);
        assert!(lease.holds_at(1_000));
        assert!(lease.holds_at(3_999));
        assert!(!lease.holds_at(4_000), "send time + session − session/16");
    }

    #[test]
    fn a_late_answer_to_an_older_renewal_never_shortens_the_lease() {
        let lease = OwnLease::default();
        lease.renewed(2_000, 3_200);
        lease.renewed(1_000, 3_200);
        assert_eq!(lease.until_ms(), 5_000);
        assert!(lease.holds_at(4_999));
    }

    #[test]
    fn clones_share_the_lease() {
        let lease = OwnLease::default();
        let shard_view = lease.clone();
        lease.renewed(mono_ms(), 60_000);
        assert!(shard_view.holds());
    }
}
