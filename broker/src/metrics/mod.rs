//! Metrics: per-shard counters on the data path, gathered over the shard
//! channels at scrape time, served as Prometheus / OpenMetrics text.
//!
//! Runs on: every shard (its [`ShardMetrics`], plain `Cell`s — no lock, no
//! atomic on the data path) and shard 0 (the HTTP endpoint,
//! `server/metrics_http.rs`, which asks every shard for a
//! [`ShardSnapshot`] over the mesh and renders them with [`render`]). This
//! module is the counters and the rendering only: it depends on no other
//! part of the broker but its build facts (`crate::build_info`).
//!
//! Series (labels in braces):
//! - `strand_build_info` {version, commit}: always 1 (the binary's version
//!   and the git commit it was built from)
//! - `strand_produce_requests_total`, `strand_produce_bytes_total`,
//!   `strand_fetch_bytes_total` {queue}
//! - `strand_request_latency_seconds` histogram {api}
//! - `strand_partition_log_end_offset`, `strand_partition_high_watermark`,
//!   `strand_partition_log_start_offset`, `strand_partition_stored_bytes`
//!   {queue, partition}
//! - `strand_partition_leader_epoch`, `strand_partition_leader` (1 on the
//!   leader, 0 on a follower) {queue, partition}, on every replica
//! - on a partition's leader only: `strand_partition_isr_size`,
//!   `strand_partition_under_replicated` (ISR smaller than the replicas),
//!   `strand_partition_under_min_isr` (ISR smaller than acks=all needs)
//!   {queue, partition}, and `strand_partition_follower_lag_records`
//!   {queue, partition, follower} (records behind the leader's log end at
//!   the follower's last fetch)
//! - `strand_offline_partitions` {queue}: partitions without a leader, as
//!   this broker's metadata says (every broker says the same)
//! - `strand_unclean_elections_total`: partitions given a leader by an
//!   operator's unclean election (`strand queue elect --unclean`) since the
//!   cluster began, from the metadata (every broker says the same)
//! - `strand_disk_free_bytes`, `strand_disk_free_threshold_bytes` {broker}:
//!   this broker's data directory's free space and the threshold below
//!   which produce is refused (`StorageFull`)
//! - `strand_broker_draining` {broker}: 1 for a broker in maintenance, as
//!   this broker's metadata says (every broker says the same)
//! - `strand_broker_decommissioning` {broker}: 1 for a broker being
//!   decommissioned; `strand_broker_replicas_moving_off` {broker}: replicas
//!   it holds that a reassignment in progress removes (a decommission is
//!   done when it is 0) — both from the metadata
//! - `strand_group_lag` {group, queue, partition} (high watermark − committed
//!   position, for partitions with one)
//! - `strand_group_rebalances_total` {group}, `strand_dlq_records_total`
//!   {queue}
//! - `strand_connections_refused_total` {shard, reason}: connections
//!   closed as they came, over `max_connections`,
//!   `max_connections_per_ip` or `max_connection_rate_per_ip`
//!   (`crate::limits`); `strand_connections_closed_total` {shard, reason}:
//!   connections the broker closed for `idle` (nothing sent and nothing
//!   served for `connection_idle_timeout_ms`), `slow_frame` (a frame
//!   begun not whole within `frame_receive_timeout_ms`), `slow_reader`
//!   (answers written to it not taken for `connection_idle_timeout_ms`),
//!   `tls_handshake`
//!   (a TLS handshake that failed or took over 10 s), `plaintext_on_tls`
//!   or `tls_on_plaintext` (a client speaking the other);
//!   `strand_request_memory_bytes` {shard}: large requests the shard's
//!   connections hold (bounded by `request_memory_bytes`)
//! - `strand_authentication_failures_total` {shard, reason}: failed SASL
//!   logins (`wrong_password`, which includes unknown users, or
//!   `malformed`); `strand_authorization_denials_total` {shard, reason}:
//!   requests refused for their principal, by API (`crate::auth`)
//! - `strand_connections_by_state` {shard, listener, state}: open
//!   connections of a listener (`client`: the client port) by where they
//!   stand — `tls_handshake`, `login` (waiting for a SASL login the
//!   listener requires) or `open` (served)
//! - `strand_connections`, `strand_shard_busy_ratio` (share of the time
//!   since the previous scrape the shard's executor ran tasks or I/O, spin
//!   excluded), `strand_shard_requests_in_flight` {shard}
//! - `strand_shard_forward_queue_depth` {shard}: requests the shard sent to
//!   other shards and awaits answers for (queued in the mesh or being
//!   served there)
//! - `strand_shard_forwarded_requests_total` {shard}: requests the shard
//!   forwarded to the owning shard since the start (shard-aware clients
//!   keep it near zero; a rising count means clients that connect to any
//!   shard, each request paying a cross-core hop)
//! - `strand_produce_sequence_refusals_total` {shard}: idempotent
//!   producers' batches refused as out of order or from an unknown producer
//!   (each costs the producer a retry; a steady rate means a producer that
//!   sends out of order, or leaders that keep forgetting producers)
//! - `strand_reactor_stalls_total` {shard}: times the shard's 10 ms timer
//!   woke more than 500 µs late — a task held the shard that long (or the
//!   OS descheduled its thread); logged at most every 10 s with the count
//!   (glommio cannot name the task without its signal-based detector)
//! - `strand_reactor_stalls_off_cpu_total` {shard}: those of them during
//!   which the shard's thread had less than half the time on a CPU — the
//!   OS ran something else, or the host paused the machine while the shard
//!   slept: the machine's doing, not a task's (the rest are the shard's own
//!   work, or a host pause while it ran)
//! - `strand_fsync_latency_seconds` histogram (every open log's fdatasyncs)
//! - `strand_write_through_writes_total` {shard}: writes of `fsync=always`
//!   logs durable as they completed (`write_through`: each is a flush of
//!   its own, with no fdatasync after it)
//! - `strand_journal_frames_total` {shard}, `strand_journal_bytes_total`
//!   {shard}: frames the shard journal wrote (each one `O_DSYNC` write: a
//!   flush for every partition's appends in it) and their bytes (`journal
//!   = true`; 0 without)
//! - `strand_segment_rolls_total` {shard}, `strand_segments_recycled_total`
//!   {shard}: segments the shard's open logs rolled since they were opened,
//!   and how many of those went into the file of a segment retention freed
//!   (`recycle_segments`: overwrites, no journal commit per fdatasync)
//! - `strand_tail_cache_bytes` {shard}, `strand_readahead_bytes` {shard}:
//!   what the shard's tail caches and read-ahead blocks hold (each bounded
//!   by its per-shard budget, `tail_cache_budget_bytes` and
//!   `readahead_budget_bytes`); `strand_readahead_refused_total` {shard}:
//!   blocks not read ahead or not kept because that budget was spent (a
//!   steady rate: more readers from disk than the budget feeds at full
//!   speed)
//! - `strand_storage_foreign_buffer_drops_total`: batches read from disk
//!   whose shard-owned I/O buffer was dropped on another thread, and so
//!   leaked rather than freed (the broker copies batches that leave their
//!   shard, so anything but 0 is a bug; see `strand_storage::log::readahead`)
//!
//! Label cardinality is bounded by what the broker holds: queues ×
//! partitions (a queue has at most `PARTITIONS_MAX`), groups × their
//! partitions, and the fixed API and shard sets; nothing is labelled by
//! client, member or key.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use strand_wire::Api;

/// The last bucket's bound: prometheus-client writes `le="+Inf"` only for
/// `f64::MAX` (`f64::INFINITY` would come out as `inf`).
const INF_BOUND: f64 = f64::MAX;

/// The API id recorded for requests naming an API this build does not
/// know (one series for all of them, whatever a client sends).
pub const UNKNOWN_API: u16 = u16::MAX;

/// Upper bounds (seconds) of the request latency buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0,
];

/// One API's request latencies: per-bucket counts (the last one: above
/// every bound), their sum and count.
#[derive(Debug, Clone, Default)]
pub struct LatencyHistogram {
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
    pub sum_secs: f64,
    pub count: u64,
}

impl LatencyHistogram {
    fn observe(&mut self, secs: f64) {
        let i = LATENCY_BUCKETS.partition_point(|&b| b < secs);
        self.buckets[i] += 1;
        self.sum_secs += secs;
        self.count += 1;
    }

    fn add(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.sum_secs += other.sum_secs;
        self.count += other.count;
    }
}

/// Produce counters of one queue.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueCounters {
    pub produce_requests: u64,
    pub produce_bytes: u64,
    pub fetch_bytes: u64,
    pub dlq_records: u64,
}

impl std::ops::AddAssign for QueueCounters {
    /// Sums every counter (shards' counts of one queue into the node's).
    fn add_assign(&mut self, other: QueueCounters) {
        let QueueCounters {
            produce_requests,
            produce_bytes,
            fetch_bytes,
            dlq_records,
        } = other;
        self.produce_requests += produce_requests;
        self.produce_bytes += produce_bytes;
        self.fetch_bytes += fetch_bytes;
        self.dlq_records += dlq_records;
    }
}

/// Where an open connection stands (`strand_connections_by_state`); its
/// value is its place in [`ConnectionPhase::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum ConnectionPhase {
    /// Its TLS handshake is under way.
    TlsHandshake,
    /// It must log in (SASL) before it is served.
    Login,
    /// It is served.
    Open,
}

impl ConnectionPhase {
    pub const ALL: [ConnectionPhase; 3] = [
        ConnectionPhase::TlsHandshake,
        ConnectionPhase::Login,
        ConnectionPhase::Open,
    ];

    /// The metric's label.
    pub fn name(self) -> &'static str {
        match self {
            ConnectionPhase::TlsHandshake => "tls_handshake",
            ConnectionPhase::Login => "login",
            ConnectionPhase::Open => "open",
        }
    }
}

/// One shard's counters, touched only by its own thread.
pub struct ShardMetrics {
    queues: RefCell<HashMap<String, QueueCounters>>,
    latency: RefCell<BTreeMap<u16, LatencyHistogram>>,
    connections: Cell<i64>,
    /// Open client connections by [`ConnectionPhase`] (in `ALL`'s order).
    phases: Cell<[i64; 3]>,
    /// Connections refused as they came, by reason.
    refused: RefCell<BTreeMap<&'static str, u64>>,
    /// Connections the broker closed, by reason.
    closed_by: RefCell<BTreeMap<&'static str, u64>>,
    /// Failed logins, by reason.
    auth_failures: RefCell<BTreeMap<&'static str, u64>>,
    /// Requests refused for their principal, by API.
    denials: RefCell<BTreeMap<&'static str, u64>>,
    /// When the busy ratio was last taken (the executor's run time counts
    /// from there).
    last_busy: Cell<std::time::Instant>,
    /// Requests this shard forwarded to another and awaits answers for.
    forwarded: Cell<u64>,
    /// Requests this shard forwarded, in all.
    forwarded_total: Cell<u64>,
    /// Idempotent batches refused (out of order, unknown producer).
    sequence_refusals: Cell<u64>,
    /// Timer wake-ups late by more than [`STALL`].
    stalls: Cell<u64>,
    /// Of those, the ones the thread spent mostly off the CPU.
    stalls_off_cpu: Cell<u64>,
}

/// A shard's 10 ms timer waking later than this counts as a reactor stall.
pub const STALL: Duration = Duration::from_micros(500);

/// What kept a shard's timer from waking on time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// The thread was on a CPU for at least half of the wait: a task held
    /// the shard (or the host paused the machine while the shard ran).
    OnCpu,
    /// The thread was off the CPU for most of it: the OS ran something
    /// else, or the host paused the machine while the shard slept.
    OffCpu,
}

impl Stall {
    /// Classifies a wait of `elapsed` during which the thread ran `on_cpu`.
    pub fn of(elapsed: Duration, on_cpu: Duration) -> Stall {
        if on_cpu * 2 >= elapsed {
            Stall::OnCpu
        } else {
            Stall::OffCpu
        }
    }
}

/// Counts one forwarded request while it lives (dropped: answered or given
/// up).
pub struct Forwarded<'a>(&'a ShardMetrics);

impl Drop for Forwarded<'_> {
    fn drop(&mut self) {
        self.0.forwarded.set(self.0.forwarded.get().saturating_sub(1));
    }
}

impl Default for ShardMetrics {
    fn default() -> Self {
        ShardMetrics {
            queues: RefCell::default(),
            latency: RefCell::default(),
            connections: Cell::new(0),
            phases: Cell::new([0; 3]),
            refused: RefCell::default(),
            closed_by: RefCell::default(),
            auth_failures: RefCell::default(),
            denials: RefCell::default(),
            last_busy: Cell::new(std::time::Instant::now()),
            forwarded: Cell::new(0),
            forwarded_total: Cell::new(0),
            sequence_refusals: Cell::new(0),
            stalls: Cell::new(0),
            stalls_off_cpu: Cell::new(0),
        }
    }
}

impl ShardMetrics {
    fn queue(&self, queue: &str, f: impl FnOnce(&mut QueueCounters)) {
        let mut queues = self.queues.borrow_mut();
        match queues.get_mut(queue) {
            Some(c) => f(c),
            None => f(queues.entry(queue.to_string()).or_default()),
        }
    }

    /// Drops the counters of queues `exists` says are gone (deleted), so
    /// the map holds no more queues than the broker does.
    pub fn retain_queues(&self, exists: impl Fn(&str) -> bool) {
        self.queues.borrow_mut().retain(|q, _| exists(q));
    }

    /// A produce request's batches for `queue` were appended.
    pub fn produced(&self, queue: &str, bytes: usize) {
        self.queue(queue, |c| {
            c.produce_requests += 1;
            c.produce_bytes += bytes as u64;
        });
    }

    pub fn fetched(&self, queue: &str, bytes: usize) {
        self.queue(queue, |c| c.fetch_bytes += bytes as u64);
    }

    pub fn dead_lettered(&self, queue: &str) {
        self.queue(queue, |c| c.dlq_records += 1);
    }

    /// A request of `api` was answered after `took`.
    pub fn request(&self, api: u16, took: Duration) {
        let api = Api::from_u16(api).map_or(UNKNOWN_API, |a| a as u16);
        self.latency
            .borrow_mut()
            .entry(api)
            .or_default()
            .observe(took.as_secs_f64());
    }

    pub fn connection_opened(&self) {
        self.connections.set(self.connections.get() + 1);
    }

    pub fn connection_closed(&self) {
        self.connections.set(self.connections.get() - 1);
    }

    /// A connection moved from phase `from` to `to` (`None`: it opened, or
    /// closed).
    pub fn connection_phase(&self, from: Option<ConnectionPhase>, to: Option<ConnectionPhase>) {
        let mut phases = self.phases.get();
        if let Some(from) = from {
            phases[from as usize] -= 1;
        }
        if let Some(to) = to {
            phases[to as usize] += 1;
        }
        self.phases.set(phases);
    }

    /// A connection closed as it came, over the limit `reason` names.
    pub fn connection_refused(&self, reason: &'static str) {
        *self.refused.borrow_mut().entry(reason).or_default() += 1;
    }

    /// A connection the broker closed, for `reason`.
    pub fn connection_closed_by(&self, reason: &'static str) {
        *self.closed_by.borrow_mut().entry(reason).or_default() += 1;
    }

    /// A login failed (`reason`: `wrong_password` or `malformed`).
    pub fn authentication_failed(&self, reason: &'static str) {
        *self.auth_failures.borrow_mut().entry(reason).or_default() += 1;
    }

    /// A request to `api` was refused for its principal.
    pub fn denied(&self, api: &'static str) {
        *self.denials.borrow_mut().entry(api).or_default() += 1;
    }

    /// A request sent to another shard; counted until the guard drops.
    pub fn forwarding(&self) -> Forwarded<'_> {
        self.forwarded.set(self.forwarded.get() + 1);
        self.forwarded_total.set(self.forwarded_total.get() + 1);
        Forwarded(self)
    }

    /// An idempotent producer's batch was refused.
    pub fn sequence_refused(&self) {
        self.sequence_refusals.set(self.sequence_refusals.get() + 1);
    }

    /// A timer woke late after its deadline, for the reason `stall` tells;
    /// returns the stall counts: all of them, and those off the CPU.
    pub fn stalled(&self, stall: Stall) -> (u64, u64) {
        self.stalls.set(self.stalls.get() + 1);
        if stall == Stall::OffCpu {
            self.stalls_off_cpu.set(self.stalls_off_cpu.get() + 1);
        }
        (self.stalls.get(), self.stalls_off_cpu.get())
    }

    /// Share of the time since the last call that the executor spent
    /// running (given its run time over that span).
    pub fn busy_ratio(&self, ran: Duration) -> f64 {
        let now = std::time::Instant::now();
        let span = now.duration_since(self.last_busy.replace(now));
        (ran.as_secs_f64() / span.as_secs_f64().max(1e-9)).clamp(0.0, 1.0)
    }

    /// Copies the counters into a snapshot.
    pub fn fill(&self, snap: &mut ShardSnapshot) {
        snap.queues = self.queues.borrow().iter().map(|(q, c)| (q.clone(), *c)).collect();
        snap.latency = self.latency.borrow().iter().map(|(a, h)| (*a, h.clone())).collect();
        snap.connections = self.connections.get();
        snap.connection_phases = self.phases.get();
        snap.connections_refused = self.refused.borrow().iter().map(|(r, n)| (*r, *n)).collect();
        snap.connections_closed = self.closed_by.borrow().iter().map(|(r, n)| (*r, *n)).collect();
        snap.authentication_failures = self.auth_failures.borrow().iter().map(|(r, n)| (*r, *n)).collect();
        snap.authorization_denials = self.denials.borrow().iter().map(|(r, n)| (*r, *n)).collect();
        snap.forward_queue_depth = self.forwarded.get();
        snap.forwarded_total = self.forwarded_total.get();
        snap.sequence_refusals = self.sequence_refusals.get();
        snap.stalls = self.stalls.get();
        snap.stalls_off_cpu = self.stalls_off_cpu.get();
    }
}

/// A broker as the metadata table shows it (shard 0 reports every one).
#[derive(Debug, Clone, Copy, Default)]
pub struct BrokerGauges {
    pub id: u64,
    pub draining: bool,
    pub decommissioning: bool,
    /// Replicas it holds that a reassignment in progress removes.
    pub moving_off: u64,
}

/// A partition's offsets and size, from the shard that holds it.
#[derive(Debug, Clone)]
pub struct PartitionGauges {
    pub queue: String,
    pub partition: u32,
    pub log_start: u64,
    pub log_end: u64,
    pub high_watermark: u64,
    pub stored_bytes: u64,
    pub leader_epoch: u32,
    /// Set on the partition's leader.
    pub led: Option<LeaderGauges>,
}

/// What a partition's leader knows of its replicas.
#[derive(Debug, Clone, Default)]
pub struct LeaderGauges {
    pub replicas: u32,
    pub isr: u32,
    /// acks=all needs this many in-sync replicas.
    pub min_insync: u32,
    /// (follower, records behind the leader's log end).
    pub follower_lags: Vec<(u64, u64)>,
}

/// What one shard reports at a scrape.
#[derive(Debug, Clone, Default)]
pub struct ShardSnapshot {
    pub shard: u16,
    /// Shard 0 only (from the table, the same on every node): per queue,
    /// its partitions without a leader (every in-sync replica fenced).
    pub offline: Vec<(String, u64)>,
    /// Shard 0 only (from the table): unclean elections since the cluster
    /// began.
    pub unclean_elections: Option<u64>,
    /// Shard 0 only: this broker's id, its data directory's free bytes and
    /// the threshold below which produce is refused.
    pub disk: Option<(u64, u64, u64)>,
    /// Shard 0 only (from the table): each broker's maintenance and moves.
    pub brokers: Vec<BrokerGauges>,
    pub queues: Vec<(String, QueueCounters)>,
    pub latency: Vec<(u16, LatencyHistogram)>,
    pub connections: i64,
    /// Open client connections by [`ConnectionPhase`] (in `ALL`'s order).
    pub connection_phases: [i64; 3],
    /// (reason, count) of connections refused as they came.
    pub connections_refused: Vec<(&'static str, u64)>,
    /// (reason, count) of connections the broker closed.
    pub connections_closed: Vec<(&'static str, u64)>,
    /// (reason, count) of failed logins.
    pub authentication_failures: Vec<(&'static str, u64)>,
    /// (API, count) of requests refused for their principal.
    pub authorization_denials: Vec<(&'static str, u64)>,
    /// Bytes of large requests the shard's connections hold.
    pub request_memory_bytes: u64,
    pub partitions: Vec<PartitionGauges>,
    /// (group, queue, partition, committed position) of the groups this
    /// shard coordinates.
    pub positions: Vec<(String, String, u32, u64)>,
    /// (group, rebalances) of the groups this shard coordinates.
    pub rebalances: Vec<(String, u64)>,
    pub busy_ratio: f64,
    pub requests_in_flight: u64,
    pub forward_queue_depth: u64,
    pub forwarded_total: u64,
    pub sequence_refusals: u64,
    pub stalls: u64,
    pub stalls_off_cpu: u64,
    /// fdatasync latencies of this shard's open logs: per-bucket counts of
    /// `strand_storage::log::SYNC_BUCKETS_SECS`, sum (s), count.
    pub fsync_buckets: Vec<u64>,
    pub fsync_sum_secs: f64,
    pub fsync_count: u64,
    /// Writes of this shard's open logs made durable as they completed
    /// (write-through: no fdatasync after them).
    pub write_through_writes: u64,
    /// Frames the shard journal wrote, and their bytes.
    pub journal_frames: u64,
    pub journal_bytes: u64,
    /// Segment rolls of this shard's open logs, and those into recycled files.
    pub rolls: u64,
    pub recycled: u64,
    /// Bytes the shard's tail caches and read-ahead blocks hold, and the
    /// blocks its read-ahead budget refused.
    pub tail_cache_bytes: u64,
    pub readahead_bytes: u64,
    pub readahead_refused: u64,
}

type Labels = Vec<(&'static str, String)>;

/// The scrape's data, encoded on demand.
#[derive(Debug)]
struct Scrape {
    snapshots: Vec<ShardSnapshot>,
}

/// One metric family: its descriptor, then each labelled series.
fn family<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, m) in series {
        // A series without labels is written `name value`, not `name{} value`.
        if labels.is_empty() {
            return m.encode(metric);
        }
        m.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: Vec<(Labels, u64)>,
) -> Result<(), std::fmt::Error> {
    let series = series.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
    family(encoder, name, help, MetricType::Counter, series)
}

/// A gauge family (integer or float values).
fn gauge<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: Vec<(Labels, V)>,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<V>: EncodeMetric,
{
    let series = series.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
    family(encoder, name, help, MetricType::Gauge, series)
}

fn as_i64(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut queues: BTreeMap<&str, QueueCounters> = BTreeMap::new();
        let mut latency: BTreeMap<u16, LatencyHistogram> = BTreeMap::new();
        let mut hw: BTreeMap<(&str, u32), u64> = BTreeMap::new();
        for s in &self.snapshots {
            for (q, c) in &s.queues {
                *queues.entry(q).or_default() += *c;
            }
            for (api, h) in &s.latency {
                latency.entry(*api).or_default().add(h);
            }
            for p in &s.partitions {
                hw.insert((&p.queue, p.partition), p.high_watermark);
            }
        }
        let by_queue = |f: fn(&QueueCounters) -> u64| -> Vec<(Labels, u64)> {
            queues
                .iter()
                .filter(|(_, c)| f(c) > 0)
                .map(|(q, c)| (vec![("queue", q.to_string())], f(c)))
                .collect()
        };
        counter(
            &mut encoder,
            "strand_produce_requests",
            "Produce requests appended, by queue.",
            by_queue(|c| c.produce_requests),
        )?;
        counter(
            &mut encoder,
            "strand_produce_bytes",
            "Record batch bytes appended, by queue.",
            by_queue(|c| c.produce_bytes),
        )?;
        counter(
            &mut encoder,
            "strand_fetch_bytes",
            "Record batch bytes fetched, by queue.",
            by_queue(|c| c.fetch_bytes),
        )?;
        counter(
            &mut encoder,
            "strand_dlq_records",
            "Records moved to a dead-letter queue, by source queue.",
            by_queue(|c| c.dlq_records),
        )?;
        {
            let mut metric = encoder.encode_descriptor(
                "strand_request_latency_seconds",
                "Time from a request's arrival to its response, by API.",
                None,
                MetricType::Histogram,
            )?;
            for (api, h) in &latency {
                let name = Api::from_u16(*api).map_or("unknown", Api::name);
                let labels: Labels = vec![("api", name.to_string())];
                let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
                    .iter()
                    .copied()
                    .chain(std::iter::once(INF_BOUND))
                    .zip(h.buckets.iter().copied())
                    .collect();
                metric
                    .encode_family(&labels)?
                    .encode_histogram::<prometheus_client::encoding::NoLabelSet>(h.sum_secs, h.count, &buckets, None)?;
            }
        }
        // One series per partition for which `f` has a value.
        let some_partitions = |f: &dyn Fn(&PartitionGauges) -> Option<u64>| -> Vec<(Labels, i64)> {
            let mut all: Vec<(Labels, i64)> = self
                .snapshots
                .iter()
                .flat_map(|s| s.partitions.iter())
                .filter_map(|p| {
                    let labels = vec![("queue", p.queue.clone()), ("partition", p.partition.to_string())];
                    f(p).map(|v| (labels, as_i64(v)))
                })
                .collect();
            all.sort();
            all
        };
        let partitions = |f: fn(&PartitionGauges) -> u64| some_partitions(&|p| Some(f(p)));
        let led = |f: fn(&LeaderGauges) -> u64| some_partitions(&|p| p.led.as_ref().map(f));
        gauge(
            &mut encoder,
            "strand_partition_log_end_offset",
            "Offset after the partition's last record.",
            partitions(|p| p.log_end),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_high_watermark",
            "Offset below which records are committed and readable.",
            partitions(|p| p.high_watermark),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_log_start_offset",
            "Oldest offset still stored.",
            partitions(|p| p.log_start),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_stored_bytes",
            "Bytes the partition's segments hold.",
            partitions(|p| p.stored_bytes),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_leader_epoch",
            "The leader epoch this replica of the partition is in.",
            partitions(|p| u64::from(p.leader_epoch)),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_leader",
            "1 where this broker leads the partition, 0 where it follows.",
            partitions(|p| u64::from(p.led.is_some())),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_isr_size",
            "In-sync replicas of a partition this broker leads (the leader among them).",
            led(|l| u64::from(l.isr)),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_under_replicated",
            "1 where a partition this broker leads has fewer in-sync replicas than replicas.",
            led(|l| u64::from(l.isr < l.replicas)),
        )?;
        gauge(
            &mut encoder,
            "strand_partition_under_min_isr",
            "1 where a partition this broker leads has fewer in-sync replicas than acks=all needs (it refuses acks=all with NotEnoughReplicas).",
            led(|l| u64::from(l.isr < l.min_insync)),
        )?;
        let mut lags: Vec<(Labels, i64)> = Vec::new();
        for p in self.snapshots.iter().flat_map(|s| s.partitions.iter()) {
            for (follower, behind) in p.led.iter().flat_map(|l| l.follower_lags.iter()) {
                let labels = vec![
                    ("queue", p.queue.clone()),
                    ("partition", p.partition.to_string()),
                    ("follower", follower.to_string()),
                ];
                lags.push((labels, as_i64(*behind)));
            }
        }
        lags.sort();
        gauge(
            &mut encoder,
            "strand_partition_follower_lag_records",
            "Records a follower of a partition this broker leads is behind the leader's log end, at its last fetch.",
            lags,
        )?;
        let mut offline: Vec<(Labels, i64)> = self
            .snapshots
            .iter()
            .flat_map(|s| s.offline.iter())
            .map(|(q, n)| (vec![("queue", q.clone())], as_i64(*n)))
            .collect();
        offline.sort();
        gauge(
            &mut encoder,
            "strand_offline_partitions",
            "Partitions of a queue without a leader (every in-sync replica fenced, or the last one lost its data), as \
             this broker's metadata says.",
            offline,
        )?;
        counter(
            &mut encoder,
            "strand_unclean_elections",
            "Partitions given a leader by an operator's unclean election (strand queue elect --unclean), which may \
             have lost acknowledged records.",
            self.snapshots
                .iter()
                .find_map(|s| s.unclean_elections)
                .map(|n| (Vec::new(), n))
                .into_iter()
                .collect(),
        )?;
        let disk = self.snapshots.iter().find_map(|s| s.disk);
        let broker = |id: u64| vec![("broker", id.to_string())];
        gauge(
            &mut encoder,
            "strand_disk_free_bytes",
            "Free bytes in this broker's data directory's file system (for unprivileged writers).",
            disk.map(|(id, free, _)| (broker(id), as_i64(free)))
                .into_iter()
                .collect(),
        )?;
        let brokers = || self.snapshots.iter().flat_map(|s| s.brokers.iter());
        gauge(
            &mut encoder,
            "strand_broker_draining",
            "1 for a broker in maintenance (strand node drain), as this broker's metadata says.",
            brokers().map(|b| (broker(b.id), i64::from(b.draining))).collect(),
        )?;
        gauge(
            &mut encoder,
            "strand_broker_decommissioning",
            "1 for a broker being decommissioned (strand node decommission), as this broker's metadata says.",
            brokers()
                .map(|b| (broker(b.id), i64::from(b.decommissioning)))
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "strand_broker_replicas_moving_off",
            "Replicas a broker holds that a reassignment in progress removes (0 once a decommission is done).",
            brokers().map(|b| (broker(b.id), as_i64(b.moving_off))).collect(),
        )?;
        gauge(
            &mut encoder,
            "strand_disk_free_threshold_bytes",
            "Below this much free space this broker refuses produce with StorageFull (min_free_bytes).",
            disk.map(|(id, _, threshold)| (broker(id), as_i64(threshold)))
                .into_iter()
                .collect(),
        )?;
        let mut lag: Vec<(Labels, i64)> = Vec::new();
        for s in &self.snapshots {
            for (group, queue, partition, position) in &s.positions {
                if let Some(end) = hw.get(&(queue.as_str(), *partition)) {
                    lag.push((
                        vec![
                            ("group", group.clone()),
                            ("queue", queue.clone()),
                            ("partition", partition.to_string()),
                        ],
                        as_i64(end.saturating_sub(*position)),
                    ));
                }
            }
        }
        lag.sort();
        gauge(
            &mut encoder,
            "strand_group_lag",
            "Records the group has yet to read: high watermark minus committed position.",
            lag,
        )?;
        let mut rebalances: Vec<(Labels, u64)> = self
            .snapshots
            .iter()
            .flat_map(|s| s.rebalances.iter())
            .map(|(g, n)| (vec![("group", g.clone())], *n))
            .collect();
        rebalances.sort();
        counter(
            &mut encoder,
            "strand_group_rebalances",
            "Rebalances since the coordinator loaded the group.",
            rebalances,
        )?;
        let build = vec![(
            vec![
                ("version", crate::build_info::VERSION.to_string()),
                ("commit", crate::build_info::COMMIT.to_string()),
            ],
            1i64,
        )];
        gauge(
            &mut encoder,
            "strand_build_info",
            "This broker's version and the git commit it was built from (always 1).",
            build,
        )?;
        gauge(
            &mut encoder,
            "strand_connections",
            "Open client connections, by shard.",
            by_shard(&self.snapshots, |s| s.connections),
        )?;
        let phases: Vec<(Labels, i64)> = self
            .snapshots
            .iter()
            .flat_map(|s| {
                ConnectionPhase::ALL.iter().zip(s.connection_phases).map(|(p, n)| {
                    let labels = vec![
                        ("shard", s.shard.to_string()),
                        ("listener", "client".to_string()),
                        ("state", p.name().to_string()),
                    ];
                    (labels, n)
                })
            })
            .collect();
        gauge(
            &mut encoder,
            "strand_connections_by_state",
            "Open connections by listener and by state: tls_handshake, login (a SASL login required first) or open.",
            phases,
        )?;
        let by_reason = |pick: fn(&ShardSnapshot) -> &Vec<(&'static str, u64)>| {
            let mut series: Vec<(Labels, u64)> = self
                .snapshots
                .iter()
                .flat_map(|s| {
                    pick(s)
                        .iter()
                        .map(|(r, n)| (vec![("shard", s.shard.to_string()), ("reason", r.to_string())], *n))
                })
                .collect();
            series.sort();
            series
        };
        counter(
            &mut encoder,
            "strand_connections_refused",
            "Connections closed as they came: over max_connections, max_connections_per_ip or max_connection_rate_per_ip.",
            by_reason(|s| &s.connections_refused),
        )?;
        counter(
            &mut encoder,
            "strand_connections_closed",
            "Connections the broker closed: idle, slow_frame, slow_reader, tls_handshake, plaintext_on_tls or tls_on_plaintext.",
            by_reason(|s| &s.connections_closed),
        )?;
        counter(
            &mut encoder,
            "strand_authentication_failures",
            "Failed SASL logins: wrong_password (or unknown user) and malformed exchanges.",
            by_reason(|s| &s.authentication_failures),
        )?;
        counter(
            &mut encoder,
            "strand_authorization_denials",
            "Requests refused for their principal (reason: the API), unauthenticated ones included.",
            by_reason(|s| &s.authorization_denials),
        )?;
        gauge(
            &mut encoder,
            "strand_request_memory_bytes",
            "Bytes of large requests (over 64 KiB) the shard's connections hold, received or being served.",
            by_shard(&self.snapshots, |s| s.request_memory_bytes as i64),
        )?;
        gauge(
            &mut encoder,
            "strand_shard_busy_ratio",
            "Share of the time since the previous scrape the shard ran tasks or I/O.",
            by_shard(&self.snapshots, |s| s.busy_ratio),
        )?;
        gauge(
            &mut encoder,
            "strand_shard_requests_in_flight",
            "Requests of this shard's connections being served.",
            by_shard(&self.snapshots, |s| s.requests_in_flight as f64),
        )?;
        gauge(
            &mut encoder,
            "strand_shard_forward_queue_depth",
            "Requests the shard forwarded to other shards and awaits answers for.",
            by_shard(&self.snapshots, |s| s.forward_queue_depth as f64),
        )?;
        counter(
            &mut encoder,
            "strand_shard_forwarded_requests",
            "Requests the shard forwarded to the shard owning their partition.",
            by_shard(&self.snapshots, |s| s.forwarded_total),
        )?;
        counter(
            &mut encoder,
            "strand_produce_sequence_refusals",
            "Idempotent producers' batches refused: out of order, or from a producer the leader does not know.",
            by_shard(&self.snapshots, |s| s.sequence_refusals),
        )?;
        counter(
            &mut encoder,
            "strand_reactor_stalls",
            "Times the shard's 10 ms timer woke more than 500 us late (a task or the OS held the shard).",
            by_shard(&self.snapshots, |s| s.stalls),
        )?;
        counter(
            &mut encoder,
            "strand_reactor_stalls_off_cpu",
            "Reactor stalls during which the shard's thread was mostly off the CPU (the OS or the host held it).",
            by_shard(&self.snapshots, |s| s.stalls_off_cpu),
        )?;
        counter(
            &mut encoder,
            "strand_write_through_writes",
            "Writes of the shard's open partition logs that were durable as they completed (O_DSYNC, no fdatasync after them).",
            by_shard(&self.snapshots, |s| s.write_through_writes),
        )?;
        counter(
            &mut encoder,
            "strand_journal_frames",
            "Frames the shard journal wrote: each one O_DSYNC write that makes every partition's appends in it durable.",
            by_shard(&self.snapshots, |s| s.journal_frames),
        )?;
        counter(
            &mut encoder,
            "strand_journal_bytes",
            "Bytes of the frames the shard journal wrote (padding included).",
            by_shard(&self.snapshots, |s| s.journal_bytes),
        )?;
        counter(
            &mut encoder,
            "strand_segment_rolls",
            "Segments the shard's open partition logs rolled since they were opened.",
            by_shard(&self.snapshots, |s| s.rolls),
        )?;
        counter(
            &mut encoder,
            "strand_segments_recycled",
            "Rolls whose new segment went into the file of a segment retention freed.",
            by_shard(&self.snapshots, |s| s.recycled),
        )?;
        gauge(
            &mut encoder,
            "strand_tail_cache_bytes",
            "Bytes of recent batches the shard's tail caches hold (bounded by tail_cache_budget_bytes).",
            by_shard(&self.snapshots, |s| as_i64(s.tail_cache_bytes)),
        )?;
        gauge(
            &mut encoder,
            "strand_readahead_bytes",
            "Bytes of blocks the shard has read ahead or in flight for readers from disk (bounded by readahead_budget_bytes).",
            by_shard(&self.snapshots, |s| as_i64(s.readahead_bytes)),
        )?;
        counter(
            &mut encoder,
            "strand_readahead_refused",
            "Blocks the shard did not read ahead or keep because its read-ahead budget was spent.",
            by_shard(&self.snapshots, |s| s.readahead_refused),
        )?;
        counter(
            &mut encoder,
            "strand_storage_foreign_buffer_drops",
            "Batches read from disk whose shard-owned I/O buffer was dropped on another thread and leaked (a bug if not 0).",
            vec![(Vec::new(), strand_storage::log::foreign_drops())],
        )?;
        {
            let bounds = strand_storage::log::SYNC_BUCKETS_SECS;
            let mut buckets = vec![0u64; bounds.len() + 1];
            let (mut sum, mut count) = (0.0, 0);
            for s in &self.snapshots {
                for (b, n) in buckets.iter_mut().zip(&s.fsync_buckets) {
                    *b += n;
                }
                sum += s.fsync_sum_secs;
                count += s.fsync_count;
            }
            let pairs: Vec<(f64, u64)> = bounds
                .iter()
                .copied()
                .chain(std::iter::once(INF_BOUND))
                .zip(buckets)
                .collect();
            let mut metric = encoder.encode_descriptor(
                "strand_fsync_latency_seconds",
                "fdatasync latency of the open partition logs.",
                None,
                MetricType::Histogram,
            )?;
            metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &pairs, None)?;
        }
        Ok(())
    }
}

/// The text exposition of every shard's snapshot.
pub fn render(snapshots: Vec<ShardSnapshot>) -> Result<String, String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { snapshots }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).map_err(|e| format!("encoding metrics: {e}"))?;
    Ok(out)
}

/// One series per shard, labelled `shard`, valued by `f`.
fn by_shard<T>(snapshots: &[ShardSnapshot], f: impl Fn(&ShardSnapshot) -> T) -> Vec<(Labels, T)> {
    snapshots
        .iter()
        .map(|s| (vec![("shard", s.shard.to_string())], f(s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_phase_counts_in_its_own_place() {
        for (i, p) in ConnectionPhase::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "{p:?}");
        }
        let m = ShardMetrics::default();
        m.connection_phase(None, Some(ConnectionPhase::TlsHandshake));
        m.connection_phase(Some(ConnectionPhase::TlsHandshake), Some(ConnectionPhase::Open));
        assert_eq!(m.phases.get(), [0, 0, 1]);
    }

    #[test]
    fn a_stall_is_off_cpu_when_the_thread_ran_less_than_half_of_it() {
        let ms = Duration::from_millis;
        assert_eq!(Stall::of(ms(12), ms(11)), Stall::OnCpu);
        assert_eq!(Stall::of(ms(12), ms(6)), Stall::OnCpu);
        assert_eq!(Stall::of(ms(12), ms(5)), Stall::OffCpu);
        assert_eq!(Stall::of(ms(12), Duration::ZERO), Stall::OffCpu);
        let m = ShardMetrics::default();
        assert_eq!(m.stalled(Stall::OnCpu), (1, 0));
        assert_eq!(m.stalled(Stall::OffCpu), (2, 1));
    }

    #[test]
    fn renders_series_with_labels_and_joins_lag() {
        let m = ShardMetrics::default();
        m.produced("orders", 1000);
        m.produced("orders", 500);
        m.request(Api::Produce as u16, Duration::from_micros(80));
        m.request(Api::Produce as u16, Duration::from_millis(3));
        // Unknown API ids from a client share one series.
        m.request(9999, Duration::from_millis(1));
        m.request(12345, Duration::from_millis(1));
        m.connection_opened();
        let mut snap = ShardSnapshot {
            shard: 0,
            partitions: vec![PartitionGauges {
                queue: "orders".into(),
                partition: 0,
                log_start: 0,
                log_end: 42,
                high_watermark: 40,
                stored_bytes: 4096,
                leader_epoch: 3,
                led: Some(LeaderGauges {
                    replicas: 3,
                    isr: 1,
                    min_insync: 2,
                    follower_lags: vec![(2, 0), (3, 17)],
                }),
            }],
            offline: vec![("orders".into(), 0), ("ledger".into(), 2)],
            positions: vec![("billing".into(), "orders".into(), 0, 30)],
            rebalances: vec![("billing".into(), 2)],
            ..ShardSnapshot::default()
        };
        m.fill(&mut snap);
        let text = render(vec![snap]).unwrap();
        for line in [
            "strand_produce_requests_total{queue=\"orders\"} 2",
            "strand_produce_bytes_total{queue=\"orders\"} 1500",
            "strand_partition_log_end_offset{queue=\"orders\",partition=\"0\"} 42",
            "strand_partition_leader_epoch{queue=\"orders\",partition=\"0\"} 3",
            "strand_partition_leader{queue=\"orders\",partition=\"0\"} 1",
            "strand_partition_isr_size{queue=\"orders\",partition=\"0\"} 1",
            "strand_partition_under_replicated{queue=\"orders\",partition=\"0\"} 1",
            "strand_partition_under_min_isr{queue=\"orders\",partition=\"0\"} 1",
            "strand_partition_follower_lag_records{queue=\"orders\",partition=\"0\",follower=\"3\"} 17",
            "strand_offline_partitions{queue=\"ledger\"} 2",
            "strand_group_lag{group=\"billing\",queue=\"orders\",partition=\"0\"} 10",
            "strand_group_rebalances_total{group=\"billing\"} 2",
            "strand_request_latency_seconds_count{api=\"Produce\"} 2",
            "strand_request_latency_seconds_bucket{le=\"0.0001\",api=\"Produce\"} 1",
            "strand_request_latency_seconds_bucket{le=\"+Inf\",api=\"Produce\"} 2",
            "strand_request_latency_seconds_bucket{le=\"+Inf\",api=\"unknown\"} 2",
            "strand_fsync_latency_seconds_bucket{le=\"+Inf\"} 0",
            "strand_connections{shard=\"0\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
