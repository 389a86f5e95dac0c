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
use std::time::{Duration, Instant};

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

/// What a window of new producer ids refused: a partition's share, or
/// the total over all partitions (the bound that was reached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerLimit {
    Partition(usize),
    All(usize),
}

/// Producer ids brought lately (sequence-0 batches under an id not seen
/// here within the window), per partition, oldest first (pure: a
/// connection keeps one, `handlers::produce::NewProducers`, and the node
/// one per principal, [`PrincipalProducers`]). Judged by the monotonic
/// clock: a wall-clock jump neither lifts nor tightens a limit.
#[derive(Debug, Default)]
pub struct ProducerWindow {
    by_partition: HashMap<(String, u32), std::collections::VecDeque<(i64, Instant)>>,
    /// Ids remembered over all partitions.
    total: usize,
    /// When ids of all partitions were last swept for age.
    swept_at: Option<Instant>,
    /// When the newest id came.
    newest: Option<Instant>,
}

impl ProducerWindow {
    /// Whether producer `id` was brought to `partition` of `queue` within
    /// `window` of `now` (that partition's older ids are forgotten).
    pub fn knows(&mut self, queue: &str, partition: u32, id: i64, now: Instant, window: Duration) -> bool {
        let Some(ids) = self.by_partition.get_mut(&(queue.to_string(), partition)) else {
            return false;
        };
        let before = ids.len();
        while ids.front().is_some_and(|(_, at)| now.duration_since(*at) >= window) {
            ids.pop_front();
        }
        self.total -= before - ids.len();
        ids.iter().any(|(p, _)| *p == id)
    }

    /// Whether one more id may come to `partition` of `queue`: at most
    /// `per_partition` there and `in_all` over all partitions within
    /// `window` (all partitions are swept for age at most once a second
    /// when the total is reached: a client at its limit costs no sweep per
    /// batch).
    pub fn room(
        &mut self,
        queue: &str,
        partition: u32,
        now: Instant,
        window: Duration,
        (per_partition, in_all): (usize, usize),
    ) -> Result<(), ProducerLimit> {
        let here = self
            .by_partition
            .get(&(queue.to_string(), partition))
            .map_or(0, |ids| ids.len());
        if here >= per_partition {
            return Err(ProducerLimit::Partition(per_partition));
        }
        let swept_lately = self
            .swept_at
            .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1));
        if self.total >= in_all && !swept_lately {
            self.swept_at = Some(now);
            self.forget_older(now, window);
        }
        match self.total >= in_all {
            true => Err(ProducerLimit::All(in_all)),
            false => Ok(()),
        }
    }

    /// Forgets every id older than `window` (and the partitions left
    /// without any).
    fn forget_older(&mut self, now: Instant, window: Duration) {
        let mut total = 0;
        self.by_partition.retain(|_, ids| {
            ids.retain(|(_, at)| now.duration_since(*at) < window);
            total += ids.len();
            !ids.is_empty()
        });
        self.total = total;
    }

    /// Remembers producer `id` brought to `partition` of `queue` at `now`.
    pub fn insert(&mut self, queue: &str, partition: u32, id: i64, now: Instant) {
        self.by_partition
            .entry((queue.to_string(), partition))
            .or_default()
            .push_back((id, now));
        self.total += 1;
        self.newest = Some(now);
    }

    /// Ids remembered over all partitions.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// New producer ids each principal (a user) brought to this node lately,
/// over all its connections (issue 42): a user may not fill a partition's
/// producer table by opening connections. Shared by the node's shards;
/// its lock is taken only for a batch that starts a producer new to its
/// connection, never per request.
#[derive(Debug)]
pub struct PrincipalProducers {
    /// At most this many ids per principal over all partitions (0: no
    /// limit), and per partition the lesser of it and
    /// [`PRINCIPAL_PRODUCERS_PER_PARTITION`].
    in_all: usize,
    /// Each principal's window, and when principals were last swept.
    windows: Mutex<(HashMap<String, ProducerWindow>, Option<Instant>)>,
}

/// The most producer ids one principal brings to one partition within the
/// window: a quarter of a partition's producer table
/// (`strand_storage::producers::MAX_PRODUCERS`), so one user alone cannot
/// fill it.
pub const PRINCIPAL_PRODUCERS_PER_PARTITION: usize = strand_storage::producers::MAX_PRODUCERS / 4;

impl PrincipalProducers {
    pub fn new(in_all: usize) -> PrincipalProducers {
        PrincipalProducers {
            in_all,
            windows: Mutex::new((HashMap::new(), None)),
        }
    }

    /// Admits producer `id` brought by `principal` to `partition` of
    /// `queue` at `now` (remembered within `window`), or says which bound
    /// it reached.
    pub fn admit(
        &self,
        principal: &str,
        queue: &str,
        partition: u32,
        id: i64,
        now: Instant,
        window: Duration,
    ) -> Result<(), ProducerLimit> {
        if self.in_all == 0 {
            return Ok(());
        }
        let mut guard = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (windows, swept_at) = &mut *guard;
        if !windows.contains_key(principal) {
            // Forget the principals whose ids all aged out, at most once a
            // second (a stream of new principals costs no sweep each).
            let due = swept_at.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1));
            if windows.len() >= 64 && due {
                *swept_at = Some(now);
                // By each window's newest id: no walk over the ids.
                windows.retain(|_, w| w.newest.is_some_and(|at| now.duration_since(at) < window));
            }
            windows.insert(principal.to_string(), ProducerWindow::default());
        }
        let Some(w) = windows.get_mut(principal) else {
            return Ok(());
        };
        if w.knows(queue, partition, id, now, window) {
            return Ok(());
        }
        let per_partition = PRINCIPAL_PRODUCERS_PER_PARTITION.min(self.in_all);
        w.room(queue, partition, now, window, (per_partition, self.in_all))?;
        w.insert(queue, partition, id, now);
        Ok(())
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

    #[test]
    fn a_principal_brings_at_most_so_many_producer_ids_over_all_its_connections() {
        let window = Duration::from_secs(600);
        let counts = PrincipalProducers::new(8);
        let t0 = Instant::now();
        for id in 0..8 {
            counts.admit("alice", "q", (id % 2) as u32, id, t0, window).unwrap();
        }
        // An id it brought goes on; a ninth is refused; bob is apart.
        counts.admit("alice", "q", 0, 0, t0, window).unwrap();
        assert_eq!(
            counts.admit("alice", "q", 0, 99, t0, window),
            Err(ProducerLimit::All(8))
        );
        counts.admit("bob", "q", 0, 99, t0, window).unwrap();
        // Once they age out, new ones come in again.
        counts.admit("alice", "q", 0, 99, t0 + window, window).unwrap();
        // Per partition: a quarter of the producer table at most.
        let counts = PrincipalProducers::new(1 << 20);
        for id in 0..PRINCIPAL_PRODUCERS_PER_PARTITION as i64 {
            counts.admit("alice", "q", 0, id, t0, window).unwrap();
        }
        assert_eq!(
            counts.admit("alice", "q", 0, -1, t0, window),
            Err(ProducerLimit::Partition(PRINCIPAL_PRODUCERS_PER_PARTITION))
        );
        counts.admit("alice", "q", 1, -1, t0, window).unwrap();
        // 0: no limit.
        let open = PrincipalProducers::new(0);
        for id in 0..100 {
            open.admit("alice", "q", 0, id, t0, window).unwrap();
        }
    }
}
