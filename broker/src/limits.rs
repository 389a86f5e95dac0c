//! What connections may take of a node, counted across its shards: open
//! connections in all and per source address, and new connections per
//! source address per second (issue 42's limits; the per-connection and
//! per-shard memory bounds are in `server/connection.rs`).
//!
//! Runs on: every shard's accept loop (`server::start_accepting`) asks
//! [`ConnectionLimiter::admit`] before it serves or hands over a
//! connection; the [`ConnectionSlot`] it gets travels with the socket
//! (`ShardMessage::Connection`) and gives the place back when the
//! connection ends, on whichever shard served it. The one lock is taken
//! twice per connection (open and close), never per request: the counts
//! must be the node's, and a shard-aware client places its connections on
//! every shard.
//!
//! A limit of 0 is no limit. The rate is a token bucket per address that
//! holds one second's worth (`rate` connections) and refills continuously.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The node's connection limits (`BrokerConfig`'s `max_connections`,
/// `max_connections_per_ip`, `max_connection_rate_per_ip`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectionLimits {
    pub max_total: usize,
    pub max_per_ip: usize,
    /// New connections per second from one address.
    pub rate_per_ip: u32,
}

/// Why a connection was closed as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The node holds `max_connections`.
    Total,
    /// Its address holds `max_connections_per_ip`.
    PerIp,
    /// Its address opened `max_connection_rate_per_ip` in the last second.
    Rate,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::Total, Refusal::PerIp, Refusal::Rate];

    /// The metric label and the log's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Total => "max_connections",
            Refusal::PerIp => "max_connections_per_ip",
            Refusal::Rate => "max_connection_rate_per_ip",
        }
    }
}

#[derive(Debug)]
struct PerIp {
    open: usize,
    /// Connections it may still open now (≤ the rate).
    tokens: f64,
    refilled: Instant,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_ip: HashMap<IpAddr, PerIp>,
    /// Admissions since the last sweep of idle addresses.
    since_sweep: usize,
}

/// The node's open connections, by source address.
#[derive(Debug)]
pub struct ConnectionLimiter {
    limits: ConnectionLimits,
    counts: Mutex<Counts>,
}

/// Addresses with no connection and a full bucket are forgotten every
/// this many admissions (the map stays as large as the addresses seen
/// within about a second, plus those connected).
const SWEEP_EVERY: usize = 1024;

impl ConnectionLimiter {
    pub fn new(limits: ConnectionLimits) -> Arc<ConnectionLimiter> {
        Arc::new(ConnectionLimiter {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    /// A place for a connection from `ip` arriving at `now`, or why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<ConnectionSlot, Refusal> {
        let limits = self.limits;
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.since_sweep += 1;
        if counts.since_sweep >= SWEEP_EVERY {
            counts.since_sweep = 0;
            let rate = f64::from(limits.rate_per_ip);
            counts
                .per_ip
                .retain(|_, e| e.open > 0 || (rate > 0.0 && refilled(e, rate, now) < rate));
        }
        if limits.max_total > 0 && counts.total >= limits.max_total {
            return Err(Refusal::Total);
        }
        let rate = f64::from(limits.rate_per_ip);
        let entry = counts.per_ip.entry(ip).or_insert(PerIp {
            open: 0,
            tokens: rate,
            refilled: now,
        });
        if limits.max_per_ip > 0 && entry.open >= limits.max_per_ip {
            return Err(Refusal::PerIp);
        }
        if rate > 0.0 {
            entry.tokens = refilled(entry, rate, now);
            entry.refilled = now;
            if entry.tokens < 1.0 {
                return Err(Refusal::Rate);
            }
            entry.tokens -= 1.0;
        }
        entry.open += 1;
        counts.total += 1;
        Ok(ConnectionSlot {
            limiter: self.clone(),
            ip,
        })
    }

    /// Open connections: in all, and from `ip`.
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (counts.total, counts.per_ip.get(&ip).map_or(0, |e| e.open))
    }

    fn release(&self, ip: IpAddr) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.total = counts.total.saturating_sub(1);
        if let Some(e) = counts.per_ip.get_mut(&ip) {
            e.open = e.open.saturating_sub(1);
        }
    }
}

/// The tokens `e` holds at `now`: what it had plus the refill since, at
/// most one second's worth.
fn refilled(e: &PerIp, rate: f64, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(e.refilled).as_secs_f64();
    (e.tokens + elapsed * rate).min(rate)
}

/// One admitted connection's place; dropping it gives the place back.
#[derive(Debug)]
pub struct ConnectionSlot {
    limiter: Arc<ConnectionLimiter>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.limiter.release(self.ip);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn places_are_counted_per_node_and_per_address_and_given_back_on_drop() {
        let limiter = ConnectionLimiter::new(ConnectionLimits {
            max_total: 3,
            max_per_ip: 2,
            rate_per_ip: 0,
        });
        let now = Instant::now();
        let a1 = limiter.admit(ip(1), now).unwrap();
        let _a2 = limiter.admit(ip(1), now).unwrap();
        assert_eq!(limiter.admit(ip(1), now).unwrap_err(), Refusal::PerIp);
        let _b1 = limiter.admit(ip(2), now).unwrap();
        assert_eq!(limiter.admit(ip(3), now).unwrap_err(), Refusal::Total);
        assert_eq!(limiter.open(ip(1)), (3, 2));
        drop(a1);
        assert_eq!(limiter.open(ip(1)), (2, 1));
        // A refused connection took no place.
        let _a3 = limiter.admit(ip(1), now).unwrap();
        assert_eq!(limiter.open(ip(1)), (3, 2));
    }

    #[test]
    fn an_address_opens_at_most_its_rate_a_second_and_the_bucket_refills() {
        let limiter = ConnectionLimiter::new(ConnectionLimits {
            max_total: 0,
            max_per_ip: 0,
            rate_per_ip: 4,
        });
        let start = Instant::now();
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(limiter.admit(ip(1), start).unwrap());
        }
        assert_eq!(limiter.admit(ip(1), start).unwrap_err(), Refusal::Rate);
        // Another address has its own bucket.
        held.push(limiter.admit(ip(2), start).unwrap());
        // A quarter of a second brings one back; closing brings none.
        held.clear();
        assert_eq!(limiter.admit(ip(1), start).unwrap_err(), Refusal::Rate);
        let later = start + Duration::from_millis(250);
        held.push(limiter.admit(ip(1), later).unwrap());
        assert_eq!(limiter.admit(ip(1), later).unwrap_err(), Refusal::Rate);
        // A long pause fills it to one second's worth, no more.
        let much_later = start + Duration::from_secs(60);
        for _ in 0..4 {
            held.push(limiter.admit(ip(1), much_later).unwrap());
        }
        assert_eq!(limiter.admit(ip(1), much_later).unwrap_err(), Refusal::Rate);
    }

    #[test]
    fn addresses_without_connections_are_forgotten_once_their_bucket_is_full() {
        let limiter = ConnectionLimiter::new(ConnectionLimits {
            max_total: 0,
            max_per_ip: 0,
            rate_per_ip: 10,
        });
        let start = Instant::now();
        let kept = limiter.admit(ip(1), start).unwrap();
        for i in 0..SWEEP_EVERY {
            let addr = IpAddr::from([10, 1, (i >> 8) as u8, i as u8]);
            drop(limiter.admit(addr, start).unwrap());
        }
        let later = start + Duration::from_secs(2);
        for _ in 0..SWEEP_EVERY {
            drop(limiter.admit(ip(2), later).ok());
        }
        let counts = limiter.counts.lock().unwrap();
        // The connected address and the one just seen stay.
        assert!(counts.per_ip.len() <= 3, "{} addresses kept", counts.per_ip.len());
        assert_eq!(counts.per_ip[&ip(1)].open, 1);
        drop(counts);
        drop(kept);
    }
}
