//! The broker's settings: built-in defaults, overridden by a TOML file
//! (`--config`), overridden by command-line flags.
//!
//! ```toml
//! node_id = 1
//! data_dir = "./strand-data"
//! listen = "127.0.0.1:9400"
//! metrics_listen = "127.0.0.1:9401"
//! cores = 2                     # default: every core
//! max_message_bytes = 1048576   # largest record batch a queue accepts by default
//! max_frame_bytes = 16777216    # largest frame on a connection
//! default_partitions = 1
//! default_retention_ms = 604800000
//! spin_before_park_us = 50      # an idle shard polls this long before it sleeps
//! recycle_segments = true       # a roll reuses the file of a segment retention frees
//! write_through = true          # fsync=always queues write O_DSYNC instead of write + fdatasync
//! journal = false               # fsync=always queues make appends durable through one journal per shard
//! journal_file_bytes = 67108864 # the shard journal's files
//! journal_checkpoint_ms = 1000  # a journaled partition's segment is fdatasync'd at least this often
//! journal_frame_spacing_us = 1000  # a journal frame after a full one gathers as much, or this long
//! segment_bytes = 1073741824    # a segment rolls before it grows past this (>= max_message_bytes)
//! tail_cache_budget_bytes = 268435456  # per shard: recent batches kept in memory for consumers
//! readahead_budget_bytes = 67108864    # per shard: blocks read ahead for consumers behind the tail
//! io_memory_bytes = 268435456          # per shard: registered memory for disk reads and writes
//! advertise = "10.0.0.1:9400"          # default: listen (refused if that is 0.0.0.0 or ::)
//! controller_voters = "1@10.0.0.1:9400,2@10.0.0.2:9400,3@10.0.0.3:9400"  # default: this node alone
//! controller_heartbeat_ms = 250        # the controller leader's heartbeat to the other voters
//! controller_election_min_ms = 1000    # a voter that hears no leader this long (to the max,
//! controller_election_max_ms = 2000    #   at random) stands for election
//! broker_heartbeat_ms = 500            # a broker renews its lease with the controller leader
//! broker_session_ms = 3000             # a lease not renewed this long expires: the broker is fenced
//! replica_lag_time_max_ms = 10000      # a follower not caught up this long leaves the ISR
//! replica_fetch_wait_ms = 500          # a follower's fetch waits this long for records at most
//! leader_balance_interval_ms = 10000   # leaderships go back to preferred replicas (0: never)
//! min_free_bytes = 1073741824          # produce refused (StorageFull) below this much free space
//!                                      #   (default: 1 GiB or 5 % of the file system, the smaller; 0: never)
//! groups_segment_bytes = 16777216      # __groups' segments (set when __groups is created)
//! groups_compact_bytes = 67108864      # a __groups partition past this much more than after its
//!                                      #   last compaction is compacted (0: never)
//! max_connections = 10000              # open connections this node takes (0: no limit)
//! max_connections_per_ip = 1000        # open connections from one source address (0: no limit)
//! max_connection_rate_per_ip = 1000    # new connections a second from one address (0: no limit)
//! max_producer_ids_per_principal = 65536  # new producers (an id on a partition) one user brings to this broker in 10 minutes (0: no limit)
//! connection_idle_timeout_ms = 600000  # a connection serving nothing and sending nothing is closed
//! frame_receive_timeout_ms = 60000     # a frame begun must be whole within this, or the connection closes
//! connection_in_flight_bytes = 67108864  # requests and answers not yet written, per connection (a fetch counts the largest answer it asks for)
//! request_memory_bytes = 268435456     # per shard: large requests (> 64 KiB) held at once
//! max_request_timeout_ms = 300000      # a produce's timeout_ms is cut to this
//! max_partition_replicas_per_shard = 2000  # the cluster's partition replicas, per shard of its brokers
//! auth = "scram"                       # none, scram or mtls (default: none; must be said off loopback)
//! superusers = ["admin"]               # users that may manage users and nodes
//! inter_broker_user = "strand-broker"  # the brokers' own login (password: $STRAND_INTER_BROKER_PASSWORD)
//! metrics_tls = false                  # the metrics endpoint serves TLS (with tls_cert)
//! metrics_basic_auth = false           # /metrics needs a cluster user allowed describe on the cluster
//! ```
//!
//! **A cluster.** `controller_voters` names the nodes whose controller
//! members vote (KRaft-style static voters): `ID@HOST:PORT` each, the
//! address being that node's advertised client address. Every voter starts
//! with the same list; a node that is not in it is a broker without a
//! vote: it joins the controller as a learner (it receives and applies the
//! metadata). The default, this node alone,
//! is a one-node cluster — the single-node broker, its data unchanged. The
//! timings: a leader heartbeats every `controller_heartbeat_ms`; a follower
//! that hears nothing for a random time between the two election timeouts
//! stands for election; a voter also refuses to vote while it heard the
//! leader less than the maximum ago (openraft's leader lease). So the
//! controller fails over in about the maximum plus an election timeout:
//! with the defaults, 3.2–4.0 s from a kill -9 of the leader to a queue
//! created through another node (median 3.24 s of five, release build,
//! three nodes on one 2-core VM; 5.1–5.9 s with 500 / 1500 / 3000). A busy
//! host that delays heartbeats beyond the minimum causes needless
//! elections (the defaults leave three missed heartbeats' room; none in a
//! 10-minute idle run of three nodes).
//!
//! **Liveness.** Every broker heartbeats the controller leader every
//! `broker_heartbeat_ms`; the leader keeps each broker's lease in memory
//! and fences (in the table, through Raft) a broker whose lease is older
//! than `broker_session_ms`. A new leader gives every broker a whole
//! session from its election, so a controller failover fences nobody.
//! Six heartbeats per session leave room for a busy host. A broker also
//! counts its own lease (`crate::lease`): without a renewal for 15/16 of
//! a session its leaders take and acknowledge nothing, since the
//! controller may have fenced it; a controller failover that takes longer
//! than that (3.2–4.0 s above) refuses produce for the rest of it
//! (clients retry). A longer session shortens that window and lengthens
//! the time to fence a dead broker.
//!
//! `spin_before_park_us` is the latency/CPU trade of a thread-per-core
//! broker: while a shard polls, a request is picked up without a wake-up
//! (tens of µs on virtual machines); a sleeping shard costs no CPU. 50 µs
//! keeps shards hot under steady load; a few hundred µs keeps them hot at a
//! few thousand requests a second too, at the price of a busy core per
//! shard. On the 2-core dev box (client on the same cores), 100 B acks=1
//! records at 5,000/s with 300 µs: p50 100 → 81 µs, but fsync=always p50
//! 378 → 851 µs (the spinning shard starves the kernel's io_uring workers
//! that run the fdatasync): raise it only with cores to spare. Lowering it
//! to 0 cuts the CPU a shard spends per request (at 5,000 small requests a
//! second with 50 µs, the busy shard used 75 % of a core): on a later VM,
//! p50 81–88 µs against 90–95 and p99 179–188 µs against 263–371 for
//! acks=1 on `fsync=interval`, but `fsync=always` p50 233–238 µs against
//! 180–196 (the fdatasync's completion waits for a wake-up). 50 stays the
//! default; 0 suits a broker sharing its cores with its clients.
//!
//! `write_through`: see `strand_storage::LogConfig::write_through` (the
//! same durability; lower latency where io_uring's fdatasync round trip
//! costs more than the kernel's flush on completion). Turn it off to
//! compare, or on a file system whose O_DSYNC writes are slower than
//! write + fdatasync.
//!
//! `journal`: see `strand_storage::journal` and `strand_storage::log`'s
//! `journaled.rs`: every shard writes the appends of all its `fsync=always`
//! partitions into one journal (`<data_dir>/__journal/<shard>/`), one
//! `O_DSYNC` write per round for all of them, and writes the partitions'
//! segments behind, fdatasync'ing each at least every
//! `journal_checkpoint_ms`. Same durability; fewer flushes when many
//! partitions take small batches. At start-up shard 0 replays every
//! journal (also with `journal = false`, and those of shards no longer
//! run) before any shard serves; after a full disk a shard replays its
//! own in place once there is room again (`shard/recover.rs`).
//!
//! `recycle_segments`: see `strand_storage::LogConfig::recycle_segments`.
//! Appends into a recycled file skip ext4's journal commits; the price is
//! that expired records stay on disk (never readable) until written over.
//! Turn it off where deleted records must leave the disk at once.
//!
//! The two budgets bound a shard's read memory however many partitions it
//! serves (`strand_storage::shard`, "Memory budgets"): the tail caches
//! (consumers at the tail never touch the disk) and the read-ahead blocks
//! (a consumer catching up from disk has up to five 4 MiB blocks read or
//! in flight; past the budget, readers read what each fetch needs). Each
//! shard has its own, so the broker holds up to `cores` × (both).
//!
//! `io_memory_bytes` is the shard's pool of memory registered with its
//! io_uring (glommio's buddy allocator: power-of-two blocks), which every
//! O_DIRECT write buffer and read-ahead block comes from. When it runs out,
//! a buffer comes from the heap instead and each read or write into it has
//! the kernel pin its pages: on the dev VM a 4.7 GiB catch-up from disk
//! (`strand-bench consume --count 5000000` after a fresh `produce`, a new
//! broker per run) ran at 1150–1300 MiB/s in 6 of 8 runs with 64 MiB and
//! 1840–1990 MiB/s in 8 of 8 with 256 MiB (128 MiB: 2 of 4 slow); 1 MiB
//! batches were produced at 1128–1189 against 1176–1324 MiB/s (four pairs).
//! (Slow runs of another, unfound cause still come now and then: see
//! bench/results/history.md, sixth session.) It must be at least
//! `readahead_budget_bytes`, whose blocks come from it. The pool is allocated and pinned at
//! start: the broker's resident memory starts at about `cores` × this.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use strand_storage::shard::ShardStorageConfig;

pub use crate::controller::Voter;

/// Fewest bytes of registered I/O memory a shard may have: a few write
/// buffers and read-ahead blocks.
const IO_MEMORY_MIN: usize = 16 << 20;
/// Most: 64 GiB.
const IO_MEMORY_MAX: usize = 64 << 30;

/// What a listener requires of its connections (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Nothing: anyone who reaches the port may do anything.
    #[default]
    None,
    /// SASL SCRAM-SHA-256/512 with the cluster's users.
    Scram,
    /// The client certificate (TLS with `tls_client_ca`): its subject's
    /// common name is the user.
    Mtls,
}

/// The inter-broker user's default name.
pub const DEFAULT_INTER_BROKER_USER: &str = "strand-broker";
/// Everything `strand serve` needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    pub node_id: u64,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    /// Shards (one per core); `None`: every core of the machine.
    pub cores: Option<usize>,
    pub max_message_bytes: u32,
    pub max_frame_bytes: u32,
    pub default_partitions: u32,
    /// `None` in the file is not expressible in TOML; 0 means "keep forever".
    pub default_retention_ms: u64,
    /// Bounded queue between two shards (requests in flight from one to another).
    pub shard_channel_capacity: usize,
    /// How long an idle shard polls before it sleeps, in µs.
    pub spin_before_park_us: u64,
    /// Whether a roll writes the new segment into the file of a segment
    /// retention frees (every queue's logs).
    pub recycle_segments: bool,
    /// Whether `fsync=always` logs write their active segment `O_DSYNC`
    /// (durable as each write completes) instead of write + fdatasync.
    pub write_through: bool,
    /// Whether `fsync=always` logs make appends durable through the shard
    /// journal (module doc).
    pub journal: bool,
    /// The shard journal's file size, in bytes (≥ 1 MiB, a multiple of 4 KiB).
    pub journal_file_bytes: u64,
    /// How old a journaled partition's oldest unflushed append may get
    /// before its segment is written and fdatasync'd, in ms.
    pub journal_checkpoint_ms: u64,
    /// After a journal frame of several entries, the next gathers until
    /// it holds as many or this long has passed since the last started
    /// (µs, ≤ 1,000,000; 0: never waits): fewer, fuller frames under a
    /// steady stream, for up to this much more latency
    /// (`strand_storage::journal::JournalConfig::frame_spacing_us`).
    pub journal_frame_spacing_us: u64,
    /// Largest segment of a partition log, in bytes ([64 KiB, 4 GiB)):
    /// retention deletes (and recycles) whole segments, so this is also its
    /// granularity.
    pub segment_bytes: u64,
    /// Bytes all tail caches of one shard may hold together.
    pub tail_cache_budget_bytes: usize,
    /// Bytes all read-ahead blocks of one shard may hold together.
    pub readahead_budget_bytes: usize,
    /// Memory each shard registers with its io_uring for disk buffers.
    pub io_memory_bytes: usize,
    /// The address other nodes and clients reach this one at (`None`: the
    /// listen address).
    pub advertise: Option<SocketAddr>,
    /// The controller's voters (empty: this node alone).
    #[serde(deserialize_with = "voters_from_text")]
    pub controller_voters: Vec<Voter>,
    pub controller_heartbeat_ms: u64,
    pub controller_election_min_ms: u64,
    pub controller_election_max_ms: u64,
    /// How often this broker renews its lease with the controller leader.
    pub broker_heartbeat_ms: u64,
    /// How long a lease lasts without renewal before the broker is fenced.
    pub broker_session_ms: u64,
    /// A follower that has not caught up with its leader for this long
    /// leaves the partition's ISR.
    pub replica_lag_time_max_ms: u64,
    /// The longest a follower's fetch waits at the leader for records.
    pub replica_fetch_wait_ms: u64,
    /// How often the controller leader gives leaderships back to the
    /// preferred replicas (each partition's first) that are alive and in
    /// sync; 0 turns automatic leader balancing off.
    pub leader_balance_interval_ms: u64,
    /// Below this much free space in the data directory's file system,
    /// produce is refused with `StorageFull` (`None`: the smaller of 1 GiB
    /// and 5 % of the file system; 0: never). See `shard::disk`.
    pub min_free_bytes: Option<u64>,
    /// The segment size of `__groups` when this broker creates it: small,
    /// so compaction frees space soon (it deletes whole segments).
    pub groups_segment_bytes: u64,
    /// A `__groups` partition that grew this much past its size after its
    /// last compaction is compacted (0: never): a snapshot of its groups is
    /// written and the segments before it deleted. See `groups::compact`.
    pub groups_compact_bytes: u64,
    /// Open client connections this node takes in all (0: no limit); one
    /// more is closed as it comes (`crate::limits`).
    pub max_connections: usize,
    /// Open connections from one source address (0: no limit).
    pub max_connections_per_ip: usize,
    /// New connections one source address may open per second (0: no
    /// limit).
    pub max_connection_rate_per_ip: u32,
    /// New producers (a producer id on a partition, counted once per
    /// partition) one user may bring to this broker within ten
    /// minutes over all its connections (0: no limit), and at most a
    /// quarter of a partition's producer table to one partition
    /// (`crate::limits::PrincipalProducers`).
    pub max_producer_ids_per_principal: usize,
    /// A connection with no request being served that sends nothing for
    /// this long is closed, in ms (0: never).
    pub connection_idle_timeout_ms: u64,
    /// A frame whose first bytes came must be whole within this long, or
    /// its connection is closed, in ms (0: no limit): a client that sends
    /// half a frame holds no memory for ever.
    pub frame_receive_timeout_ms: u64,
    /// Bytes of requests one connection may have received and of their
    /// answers not yet written, a fetch, replica fetch or Receive counting
    /// the largest answer it may get (≥ `max_frame_bytes`); past it the broker
    /// reads no more from it until answers go out.
    pub connection_in_flight_bytes: u64,
    /// Bytes of large requests (over 64 KiB) all connections of one shard
    /// may hold at once, being received or served (≥ `max_frame_bytes`);
    /// past it those connections wait before they read a large frame.
    /// Small requests never wait for it.
    pub request_memory_bytes: u64,
    /// The longest wait a request may ask for (a produce's `timeout_ms`),
    /// in ms: a longer one is cut to this.
    pub max_request_timeout_ms: u64,
    /// PEM certificate chain and key: TLS on the client listener and every
    /// link between brokers (`server::tls`); both or neither.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// PEM CA that client certificates must be signed by (mTLS).
    pub tls_client_ca: Option<PathBuf>,
    /// PEM CA of the other brokers' certificates (default: `tls_client_ca`).
    pub tls_ca: Option<PathBuf>,
    /// Partition replicas the cluster may hold per shard of its brokers (0:
    /// no limit): a queue create or a partition increase past it is
    /// refused (`handlers::create_queue::check_replica_room`).
    pub max_partition_replicas_per_shard: u64,
    /// What the listener requires of a connection (`crate::auth`); `None`:
    /// not said, which is `none` on a loopback address and refused on any
    /// other.
    pub auth: Option<AuthMode>,
    /// Users that may manage users and nodes.
    pub superusers: Vec<String>,
    /// The user the brokers log in to one another as, broker N as
    /// `<inter_broker_user>.N` (its password is
    /// `$STRAND_INTER_BROKER_PASSWORD`, the same on every broker; with
    /// `auth = mtls`, broker N's certificate's CN).
    pub inter_broker_user: String,
    /// The metrics endpoint serves TLS, with the listener's certificate
    /// (`tls_cert`).
    pub metrics_tls: bool,
    /// `/metrics` needs HTTP basic auth: a cluster user (its SCRAM
    /// password) that is a superuser or allowed `describe` on the cluster.
    /// `/health` stays open.
    pub metrics_basic_auth: bool,
}

/// Broker `node`'s login name: `<inter_broker_user>.<node>`.
pub fn broker_login(inter_broker_user: &str, node: u64) -> String {
    format!("{inter_broker_user}.{node}")
}

/// The node a broker login name names (`<inter_broker_user>.<node>`, the
/// node in decimal without leading zeros), or none: not a broker's name.
pub fn broker_login_node(inter_broker_user: &str, name: &str) -> Option<u64> {
    let digits = name.strip_prefix(inter_broker_user)?.strip_prefix('.')?;
    let node: u64 = digits.parse().ok()?;
    // One spelling per node: "+3" and "03" are not broker 3.
    (node.to_string() == digits).then_some(node)
}

/// Whether `name` is the brokers' own (the inter-broker user, or one of
/// its per-node logins): no user of the table may take it.
pub fn is_broker_name(inter_broker_user: &str, name: &str) -> bool {
    name.strip_prefix(inter_broker_user)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The TLS files a broker was started with (`server::tls`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates must be signed by it (mTLS).
    pub client_ca: Option<PathBuf>,
    /// The other brokers' certificates must be signed by it.
    pub peer_ca: Option<PathBuf>,
}

/// Parses `ID@HOST:PORT,ID@HOST:PORT,...` (the flag's and the file's form).
pub fn parse_voters(text: &str) -> Result<Vec<Voter>, String> {
    let mut voters: Vec<Voter> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, address) = item
            .split_once('@')
            .ok_or_else(|| format!("voter {item:?} is not ID@HOST:PORT"))?;
        let id: u64 = id
            .parse()
            .map_err(|_| format!("voter {item:?}: {id:?} is not a node id"))?;
        let address: SocketAddr = address.parse().map_err(|_| {
            format!("voter {item:?}: {address:?} is not an IP address and port (HOST:PORT, e.g. 10.0.0.1:9400)")
        })?;
        if id == 0 {
            return Err(format!("voter {item:?}: node ids start at 1"));
        }
        if address.ip().is_unspecified() || address.port() == 0 {
            return Err(format!(
                "voter {item:?}: {address} is no address to reach a node at (give its advertised address)"
            ));
        }
        if let Some(v) = voters.iter().find(|v| v.id == id || v.address == address) {
            return Err(format!(
                "voter {item:?} repeats node {} at {} (each voter once, each at its own address)",
                v.id, v.address
            ));
        }
        voters.push(Voter { id, address });
    }
    Ok(voters)
}

fn voters_from_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Voter>, D::Error> {
    let text = String::deserialize(d)?;
    parse_voters(&text).map_err(serde::de::Error::custom)
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            node_id: 1,
            data_dir: PathBuf::from("./strand-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 9400)),
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 9401)),
            cores: None,
            max_message_bytes: 1 << 20,
            max_frame_bytes: 16 << 20,
            default_partitions: 1,
            default_retention_ms: 7 * 24 * 3600 * 1000,
            shard_channel_capacity: 1024,
            spin_before_park_us: 50,
            recycle_segments: true,
            write_through: true,
            journal: false,
            journal_file_bytes: strand_storage::journal::JournalConfig::default().file_bytes,
            journal_checkpoint_ms: strand_storage::journal::JournalConfig::default().checkpoint_ms,
            journal_frame_spacing_us: strand_storage::journal::JournalConfig::default().frame_spacing_us,
            segment_bytes: 1 << 30,
            tail_cache_budget_bytes: ShardStorageConfig::default().tail_cache_budget_bytes,
            readahead_budget_bytes: ShardStorageConfig::default().readahead_budget_bytes,
            io_memory_bytes: 256 << 20,
            advertise: None,
            controller_voters: Vec::new(),
            controller_heartbeat_ms: 250,
            controller_election_min_ms: 1000,
            controller_election_max_ms: 2000,
            broker_heartbeat_ms: 500,
            broker_session_ms: 3000,
            replica_lag_time_max_ms: 10_000,
            replica_fetch_wait_ms: 500,
            leader_balance_interval_ms: 10_000,
            min_free_bytes: None,
            groups_segment_bytes: 16 << 20,
            groups_compact_bytes: 64 << 20,
            max_connections: 10_000,
            max_connections_per_ip: 1_000,
            max_connection_rate_per_ip: 1_000,
            max_producer_ids_per_principal: 65_536,
            connection_idle_timeout_ms: 600_000,
            frame_receive_timeout_ms: 60_000,
            connection_in_flight_bytes: 64 << 20,
            request_memory_bytes: 256 << 20,
            max_request_timeout_ms: 300_000,
            max_partition_replicas_per_shard: 2_000,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_ca: None,
            auth: None,
            superusers: Vec::new(),
            inter_broker_user: DEFAULT_INTER_BROKER_USER.into(),
            metrics_tls: false,
            metrics_basic_auth: false,
        }
    }
}

/// Why the settings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting: {0}")]
    Invalid(String),
}

/// Flags given on the command line (`strand serve`'s flags, as they are);
/// each `Some` overrides the file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Overrides {
    /// Where queues, the controller's log and snapshots live; locked
    /// against a second broker [default: ./strand-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Client address (port 0: any free port, named in the ready line)
    /// [default: 127.0.0.1:9400].
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<SocketAddr>,
    /// Where /metrics (Prometheus) and /health are served [default: 127.0.0.1:9401].
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// Shards, one per CPU, at most the CPUs this process may use [default: every CPU].
    #[arg(long, value_name = "N")]
    pub cores: Option<usize>,
    /// This node's id in the cluster [default: 1].
    #[arg(long, value_name = "ID")]
    pub node_id: Option<u64>,
    /// How long an idle shard polls before sleeping, in µs [default: 50].
    #[arg(long, value_name = "US")]
    pub spin_before_park_us: Option<u64>,
    /// The address other nodes and clients reach this node at
    /// [default: --listen; required when that is 0.0.0.0 or ::].
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<SocketAddr>,
    /// The controller's voters, each node's id and advertised address;
    /// every voter starts with the same list [default: this node alone].
    #[arg(long, value_name = "ID@HOST:PORT,...")]
    pub controller_voters: Option<String>,
    /// PEM certificate chain: TLS on the client listener and every link
    /// between brokers (with --tls-key).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that client certificates must be signed by: requires and
    /// verifies them (mTLS).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// PEM CA of the other brokers' certificates, for the links between
    /// brokers [default: --tls-client-ca].
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// What a client must do before it is served: none; scram (SASL
    /// SCRAM-SHA-256/512 with the cluster's users; the brokers then log in
    /// to one another with $STRAND_INTER_BROKER_PASSWORD); or mtls (a
    /// client certificate, with --tls-client-ca: its subject CN is the
    /// user, and brokers' certificates name the inter-broker user)
    /// [default: none, which must be said when --listen is not a loopback
    /// address].
    #[arg(long, value_name = "none|scram|mtls")]
    pub auth: Option<AuthMode>,
    /// Users that may manage users and nodes; at a cluster's first start,
    /// with $STRAND_BOOTSTRAP_PASSWORD set, they are created with it.
    #[arg(long, value_name = "NAME[,NAME]", value_delimiter = ',')]
    pub superusers: Option<Vec<String>>,
}

impl BrokerConfig {
    /// Defaults, then the file (if any), then the flags; then checks.
    pub fn load(file: Option<&Path>, flags: &Overrides) -> Result<BrokerConfig, ConfigError> {
        let mut config = match file {
            None => BrokerConfig::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                toml::from_str(&text).map_err(|e| ConfigError::Parse {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
            }
        };
        if let Some(v) = &flags.data_dir {
            config.data_dir = v.clone();
        }
        if let Some(v) = flags.listen {
            config.listen = v;
        }
        if let Some(v) = flags.metrics_listen {
            config.metrics_listen = v;
        }
        if let Some(v) = flags.cores {
            config.cores = Some(v);
        }
        if let Some(v) = flags.node_id {
            config.node_id = v;
        }
        if let Some(v) = flags.spin_before_park_us {
            config.spin_before_park_us = v;
        }
        if let Some(v) = flags.advertise {
            config.advertise = Some(v);
        }
        for (flag, setting) in [
            (&flags.tls_cert, &mut config.tls_cert),
            (&flags.tls_key, &mut config.tls_key),
            (&flags.tls_client_ca, &mut config.tls_client_ca),
            (&flags.tls_ca, &mut config.tls_ca),
        ] {
            if let Some(v) = flag {
                *setting = Some(v.clone());
            }
        }
        if let Some(v) = flags.auth {
            config.auth = Some(v);
        }
        if let Some(v) = &flags.superusers {
            config.superusers = v.clone();
        }
        if let Some(v) = &flags.controller_voters {
            config.controller_voters =
                parse_voters(v).map_err(|e| ConfigError::Invalid(format!("--controller-voters: {e}")))?;
        }
        config.validate()?;
        Ok(config)
    }

    /// The TLS files, when TLS is on.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
            peer_ca: self.tls_ca.clone(),
        })
    }

    /// The log settings every queue's logs start from (a queue's own go on
    /// top: `shard::partitions::log_config`).
    pub fn log_base(&self) -> strand_storage::LogConfig {
        strand_storage::LogConfig {
            segment_bytes_max: self.segment_bytes,
            recycle_segments: self.recycle_segments,
            write_through: self.write_through,
            ..strand_storage::LogConfig::default()
        }
    }

    /// The shard journal's settings (also used to replay journals when
    /// `journal` is off).
    pub fn journal_config(&self) -> strand_storage::journal::JournalConfig {
        strand_storage::journal::JournalConfig {
            file_bytes: self.journal_file_bytes,
            checkpoint_ms: self.journal_checkpoint_ms,
            frame_spacing_us: self.journal_frame_spacing_us,
            ..strand_storage::journal::JournalConfig::default()
        }
    }

    /// Where shard `shard`'s journal lives.
    pub fn journal_dir(&self, shard: u16) -> std::path::PathBuf {
        self.data_dir.join("__journal").join(shard.to_string())
    }

    /// What each shard's storage shares among its logs.
    pub fn shard_storage(&self) -> ShardStorageConfig {
        ShardStorageConfig {
            tail_cache_budget_bytes: self.tail_cache_budget_bytes,
            readahead_budget_bytes: self.readahead_budget_bytes,
            ..ShardStorageConfig::default()
        }
    }

    /// The address this node gives others: `advertise`, else `bound` (the
    /// listen address once bound: a `:0` port resolved).
    pub fn advertised(&self, bound: SocketAddr) -> SocketAddr {
        self.advertise.unwrap_or(bound)
    }

    /// The controller's voters: the configured ones, or this node alone at
    /// `advertised`.
    pub fn voters(&self, advertised: SocketAddr) -> Vec<Voter> {
        match self.controller_voters.is_empty() {
            true => vec![Voter {
                id: self.node_id,
                address: advertised,
            }],
            false => self.controller_voters.clone(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.node_id == 0 {
            return bad("node_id must be at least 1".into());
        }
        let advertised = self.advertise.unwrap_or(self.listen);
        if advertised.ip().is_unspecified() {
            return bad(format!(
                "listen {} is a wildcard address, which other nodes and clients cannot reach: give the \
                 address they reach this node at with --advertise HOST:PORT (advertise in the file)",
                self.listen
            ));
        }
        if self.advertise.is_some_and(|a| a.port() == 0) {
            return bad("advertise needs a port (not 0)".into());
        }
        if let Err(e) = self.journal_config().validate() {
            return bad(e.to_string());
        }
        if let Some(me) = self.controller_voters.iter().find(|v| v.id == self.node_id) {
            // A `:0` listen port is known only once bound.
            if advertised.port() != 0 && me.address != advertised {
                return bad(format!(
                    "controller_voters names node {} at {}, but this node advertises {advertised}",
                    me.id, me.address
                ));
            }
        }
        let (heartbeat, min, max) = (
            self.controller_heartbeat_ms,
            self.controller_election_min_ms,
            self.controller_election_max_ms,
        );
        if heartbeat == 0 || min < 2 * heartbeat || max <= min || max > 600_000 {
            return bad(format!(
                "controller timings: heartbeat {heartbeat} ms, election timeout {min}..{max} ms: the \
                 heartbeat must be > 0, the minimum at least twice the heartbeat, the maximum above the \
                 minimum and at most 10 minutes"
            ));
        }
        let (heartbeat, session) = (self.broker_heartbeat_ms, self.broker_session_ms);
        if heartbeat == 0 || session < 4 * heartbeat || session > 600_000 {
            return bad(format!(
                "broker liveness: heartbeat {heartbeat} ms, session {session} ms: the heartbeat must be > 0 \
                 and the session at least four heartbeats (a renewal may take two) and at most 10 minutes"
            ));
        }
        let (lag, wait) = (self.replica_lag_time_max_ms, self.replica_fetch_wait_ms);
        if wait == 0 || wait > 30_000 || lag < 2 * wait || lag > 600_000 {
            return bad(format!(
                "replication timings: fetch wait {wait} ms, lag limit {lag} ms: the wait must be 1 ms to 30 s, \
                 the lag limit at least two waits (a follower in step fetches once per wait) and at most 10 \
                 minutes"
            ));
        }
        if self.cores == Some(0) {
            return bad("cores must be at least 1".into());
        }
        if self.cores.is_some_and(|c| c > usize::from(u16::MAX)) {
            return bad("cores must fit in 16 bits".into());
        }
        if self.max_frame_bytes < 1024 {
            return bad(format!("max_frame_bytes {} is below 1 KiB", self.max_frame_bytes));
        }
        if self.max_message_bytes == 0 || self.max_message_bytes >= self.max_frame_bytes {
            return bad(format!(
                "max_message_bytes {} must be > 0 and below max_frame_bytes {}",
                self.max_message_bytes, self.max_frame_bytes
            ));
        }
        let frame = u64::from(self.max_frame_bytes);
        if self.connection_in_flight_bytes < frame || self.request_memory_bytes < frame {
            return bad(format!(
                "connection_in_flight_bytes {} and request_memory_bytes {} must each hold a frame of \
                 max_frame_bytes {frame}",
                self.connection_in_flight_bytes, self.request_memory_bytes
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return bad("tls_cert and tls_key (--tls-cert, --tls-key) go together".into());
        }
        if self.tls_cert.is_none() && (self.tls_client_ca.is_some() || self.tls_ca.is_some()) {
            return bad("tls_client_ca and tls_ca (--tls-client-ca, --tls-ca) need tls_cert and tls_key".into());
        }
        if self.tls_cert.is_some() && self.tls_ca.is_none() && self.tls_client_ca.is_none() {
            return bad(
                "tls_cert (--tls-cert) needs tls_ca (--tls-ca), or tls_client_ca (--tls-client-ca): the CA that \
                 signed the other brokers' certificates, to verify them on the links between brokers"
                    .into(),
            );
        }
        if self.max_request_timeout_ms == 0 {
            return bad("max_request_timeout_ms must be above 0".into());
        }
        if self.auth.is_none() && !self.listen.ip().is_loopback() {
            return bad(format!(
                "listen {} is not a loopback address and no authentication was chosen: start with --auth scram \
                 (users and passwords; auth = \"scram\" in the file), or say --auth none to serve anyone who \
                 reaches the port",
                self.listen
            ));
        }
        if let Some(bad_name) =
            self.superusers.iter().chain([&self.inter_broker_user]).find(|n| {
                n.is_empty() || n.len() > strand_net::scram::MAX_USER_BYTES || n.chars().any(char::is_control)
            })
        {
            return bad(format!(
                "user name {bad_name:?} (superusers, inter_broker_user): 1 to {} bytes, no control characters",
                strand_net::scram::MAX_USER_BYTES
            ));
        }
        if self.metrics_basic_auth && !self.metrics_tls {
            return bad(
                "metrics_basic_auth needs metrics_tls: basic auth sends the password as it is, so the endpoint \
                 must serve TLS"
                    .into(),
            );
        }
        if self.metrics_tls && self.tls_cert.is_none() {
            return bad(
                "metrics_tls needs tls_cert and tls_key (the endpoint serves the listener's certificate)".into(),
            );
        }
        if self.auth == Some(AuthMode::Mtls) && self.tls_client_ca.is_none() {
            return bad(
                "auth = mtls (--auth mtls) needs client certificates: tls_cert, tls_key and tls_client_ca \
                 (--tls-client-ca), the CA that signs them"
                    .into(),
            );
        }
        if let Some(taken) = self
            .superusers
            .iter()
            .find(|n| is_broker_name(&self.inter_broker_user, n))
        {
            return bad(format!(
                "{taken:?} is kept for the brokers' own logins (inter_broker_user {:?}, and it with \".<node \
                 id>\" after it): a superuser needs another name",
                self.inter_broker_user
            ));
        }
        if self.spin_before_park_us > 10_000_000 {
            return bad(format!(
                "spin_before_park_us {} is over 10 s: a shard would never sleep",
                self.spin_before_park_us
            ));
        }
        // The bounds of strand_storage::LogConfig::validate, said in this
        // file's terms (its message would name the log's fields).
        if !(64 << 10..=u64::from(u32::MAX)).contains(&self.segment_bytes) {
            return bad(format!(
                "segment_bytes {} must be in [64 KiB, 4 GiB)",
                self.segment_bytes
            ));
        }
        if self.segment_bytes < u64::from(self.max_message_bytes) {
            return bad(format!(
                "segment_bytes {} is below max_message_bytes {}: a segment holds at least one batch",
                self.segment_bytes, self.max_message_bytes
            ));
        }
        if !(64 << 10..=u64::from(u32::MAX)).contains(&self.groups_segment_bytes) {
            return bad(format!(
                "groups_segment_bytes {} must be in [64 KiB, 4 GiB)",
                self.groups_segment_bytes
            ));
        }
        // The defaults make queues: they must pass the controller's checks.
        let partitions_max = crate::controller::PARTITIONS_MAX;
        if self.default_partitions > partitions_max {
            return bad(format!(
                "default_partitions {} is over the most a queue may have ({partitions_max})",
                self.default_partitions
            ));
        }
        let message_max = crate::controller::MESSAGE_BYTES_MAX;
        if self.max_message_bytes > message_max {
            return bad(format!(
                "max_message_bytes {} is over the most a queue may allow ({message_max})",
                self.max_message_bytes
            ));
        }
        if self.default_partitions == 0 {
            return bad("default_partitions must be at least 1".into());
        }
        if !(IO_MEMORY_MIN..=IO_MEMORY_MAX).contains(&self.io_memory_bytes) {
            return bad(format!(
                "io_memory_bytes {} must be in [{} MiB, {} GiB]: the disk buffers of a shard come from it",
                self.io_memory_bytes,
                IO_MEMORY_MIN >> 20,
                IO_MEMORY_MAX >> 30
            ));
        }
        if self.io_memory_bytes < self.readahead_budget_bytes {
            return bad(format!(
                "io_memory_bytes {} is below readahead_budget_bytes {}: read-ahead blocks come from the \
                 shard's I/O memory, and what does not fit is read through slower heap buffers",
                self.io_memory_bytes, self.readahead_budget_bytes
            ));
        }
        if self.shard_channel_capacity == 0 {
            return bad("shard_channel_capacity must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strand.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:7000\"\ncores = 3\nnode_id = 5\nspin_before_park_us = 300\nrecycle_segments = false\nwrite_through = false\nreadahead_budget_bytes = 1048576\nio_memory_bytes = 33554432\njournal = true\njournal_checkpoint_ms = 500\njournal_frame_spacing_us = 2000\n",
        )
        .unwrap();
        let flags = Overrides {
            cores: Some(2),
            ..Overrides::default()
        };
        let c = BrokerConfig::load(Some(&file), &flags).unwrap();
        assert_eq!(c.listen, "127.0.0.1:7000".parse().unwrap());
        assert_eq!((c.cores, c.node_id, c.spin_before_park_us), (Some(2), 5, 300));
        assert!(!c.recycle_segments && BrokerConfig::default().recycle_segments);
        assert!(c.journal && !BrokerConfig::default().journal);
        assert_eq!(c.journal_config().checkpoint_ms, 500);
        assert_eq!(c.journal_config().frame_spacing_us, 2000);
        let small = BrokerConfig {
            journal_file_bytes: 4096,
            ..BrokerConfig::default()
        };
        assert!(small.validate().is_err(), "a journal file under 1 MiB");
        assert!(!c.log_base().write_through && BrokerConfig::default().log_base().write_through);
        let storage = c.shard_storage();
        assert_eq!(storage.readahead_budget_bytes, 1 << 20);
        assert_eq!(c.io_memory_bytes, 32 << 20);
        assert_eq!(BrokerConfig::default().io_memory_bytes, 256 << 20);
        assert_eq!(
            storage.tail_cache_budget_bytes,
            ShardStorageConfig::default().tail_cache_budget_bytes
        );
        let spin = Overrides {
            spin_before_park_us: Some(0),
            ..Overrides::default()
        };
        assert_eq!(BrokerConfig::load(Some(&file), &spin).unwrap().spin_before_park_us, 0);
        assert_eq!(c.data_dir, PathBuf::from("./strand-data"));
    }

    #[test]
    fn request_bounds_must_hold_a_frame() {
        assert!(BrokerConfig::default().validate().is_ok());
        let frame = u64::from(BrokerConfig::default().max_frame_bytes);
        for (in_flight, memory) in [(frame - 1, frame), (frame, frame - 1)] {
            let c = BrokerConfig {
                connection_in_flight_bytes: in_flight,
                request_memory_bytes: memory,
                ..BrokerConfig::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("max_frame_bytes"), "{err}");
        }
        let no_wait = BrokerConfig {
            max_request_timeout_ms: 0,
            ..BrokerConfig::default()
        };
        assert!(no_wait.validate().is_err());
    }

    #[test]
    fn segment_checks_agree_with_the_storage_ones() {
        for segment_bytes in [
            (64 << 10) - 1,
            64 << 10,
            1 << 20,
            u64::from(u32::MAX),
            u64::from(u32::MAX) + 1,
        ] {
            for max_message_bytes in [1024, 64 << 10, 1 << 20] {
                let c = BrokerConfig {
                    segment_bytes,
                    max_message_bytes,
                    ..BrokerConfig::default()
                };
                let log = strand_storage::LogConfig {
                    batch_bytes_max: max_message_bytes as usize,
                    ..c.log_base()
                };
                assert_eq!(
                    c.validate().is_ok(),
                    log.validate().is_ok(),
                    "segment_bytes {segment_bytes}, max_message_bytes {max_message_bytes}"
                );
            }
        }
    }

    #[test]
    fn bad_files_and_values_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strand.toml");
        std::fs::write(&file, "lisen = \"x\"\n").unwrap();
        let err = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
        let flags = Overrides {
            cores: Some(0),
            ..Overrides::default()
        };
        assert!(BrokerConfig::load(None, &flags).is_err());
        for text in ["segment_bytes = 4096\n", "segment_bytes = 65536\n"] {
            std::fs::write(&file, text).unwrap();
            let err = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("segment_bytes"), "{text}: {err}");
        }
        for text in [
            "io_memory_bytes = 1048576\n",
            "io_memory_bytes = 99999999999999\n",
            "io_memory_bytes = 33554432\nreadahead_budget_bytes = 67108864\n",
        ] {
            std::fs::write(&file, text).unwrap();
            let err = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("io_memory_bytes"), "{text}: {err}");
        }
        std::fs::write(&file, "default_partitions = 20000\n").unwrap();
        let err = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("default_partitions"), "{err}");
        let spin = Overrides {
            spin_before_park_us: Some(60_000_000),
            ..Overrides::default()
        };
        assert!(BrokerConfig::load(None, &spin).is_err());
        assert!(BrokerConfig::load(Some(&dir.path().join("missing.toml")), &Overrides::default()).is_err());
    }

    #[test]
    fn auth_settings_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strand.toml");
        std::fs::write(&file, "auth = \"scram\"\nsuperusers = [\"admin\", \"ops\"]\n").unwrap();
        let c = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.auth, Some(AuthMode::Scram));
        assert_eq!(c.superusers, ["admin", "ops"]);
        assert_eq!(c.inter_broker_user, DEFAULT_INTER_BROKER_USER);
        let flags = Overrides {
            auth: Some(AuthMode::None),
            superusers: Some(vec![DEFAULT_INTER_BROKER_USER.into()]),
            ..Overrides::default()
        };
        let e = BrokerConfig::load(Some(&file), &flags).unwrap_err().to_string();
        assert!(e.contains("brokers' own login"), "{e}");
        let flags = Overrides {
            superusers: Some(vec![format!("{DEFAULT_INTER_BROKER_USER}.2")]),
            ..Overrides::default()
        };
        let e = BrokerConfig::load(Some(&file), &flags).unwrap_err().to_string();
        assert!(e.contains("brokers' own login"), "{e}");
        let flags = Overrides {
            superusers: Some(vec!["bad\nname".into()]),
            ..Overrides::default()
        };
        assert!(BrokerConfig::load(None, &flags)
            .unwrap_err()
            .to_string()
            .contains("control"));
        // Basic auth only over TLS.
        std::fs::write(&file, "metrics_basic_auth = true\n").unwrap();
        let e = BrokerConfig::load(Some(&file), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics_tls"), "{e}");
    }

    #[test]
    fn voters_and_the_advertised_address_are_checked() {
        let v = parse_voters("1@10.0.0.1:9400, 2@10.0.0.2:9400,3@[::1]:9400").unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!((v[1].id, v[1].address), (2, "10.0.0.2:9400".parse().unwrap()));
        assert!(parse_voters("").unwrap().is_empty());
        for (bad, says) in [
            ("1-10.0.0.1:9400", "ID@HOST:PORT"),
            ("x@10.0.0.1:9400", "not a node id"),
            ("0@10.0.0.1:9400", "start at 1"),
            ("1@host.example:9400", "IP address"),
            ("1@0.0.0.0:9400", "no address"),
            ("1@10.0.0.1:0", "no address"),
            ("1@10.0.0.1:9400,1@10.0.0.2:9400", "repeats"),
            ("1@10.0.0.1:9400,2@10.0.0.1:9400", "repeats"),
        ] {
            let err = parse_voters(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let load = |f: Overrides| BrokerConfig::load(None, &f).map_err(|e| e.to_string());
        let wildcard = Overrides {
            listen: Some("0.0.0.0:9400".parse().unwrap()),
            ..Overrides::default()
        };
        assert!(load(wildcard.clone()).unwrap_err().contains("--advertise"));
        let advertised = Overrides {
            advertise: Some("10.0.0.1:9400".parse().unwrap()),
            ..wildcard
        };
        // Off loopback, no authentication must be said.
        let unsaid = load(advertised.clone()).unwrap_err();
        assert!(
            unsaid.contains("--auth scram") && unsaid.contains("--auth none"),
            "{unsaid}"
        );
        let advertised = Overrides {
            auth: Some(AuthMode::None),
            ..advertised
        };
        let c = load(advertised.clone()).unwrap();
        assert_eq!(
            c.advertised("0.0.0.0:9400".parse().unwrap()),
            "10.0.0.1:9400".parse().unwrap()
        );
        assert_eq!(c.voters("10.0.0.1:9400".parse().unwrap()).len(), 1, "alone by default");
        let in_voters = Overrides {
            controller_voters: Some("1@10.0.0.1:9400,2@10.0.0.2:9400".into()),
            ..advertised.clone()
        };
        assert_eq!(load(in_voters).unwrap().controller_voters.len(), 2);
        let elsewhere = Overrides {
            controller_voters: Some("1@10.0.0.9:9400,2@10.0.0.2:9400".into()),
            ..advertised.clone()
        };
        assert!(load(elsewhere).unwrap_err().contains("advertises"));
        let learner = Overrides {
            controller_voters: Some("2@10.0.0.2:9400,3@10.0.0.3:9400".into()),
            ..advertised.clone()
        };
        assert_eq!(load(learner).unwrap().voters("10.0.0.1:9400".parse().unwrap()).len(), 2);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("strand.toml");
        std::fs::write(
            &file,
            "controller_heartbeat_ms = 1000\ncontroller_election_min_ms = 1500\n",
        )
        .unwrap();
        let err = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("twice the heartbeat"), "{err}");
        std::fs::write(&file, "controller_voters = \"1@127.0.0.1:9400,2@127.0.0.2:9400\"\n").unwrap();
        let c = BrokerConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.controller_voters[1].address, "127.0.0.2:9400".parse().unwrap());
    }
}
