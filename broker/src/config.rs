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
//! segment_bytes = 1073741824    # a segment rolls before it grows past this (>= max_message_bytes)
//! tail_cache_budget_bytes = 268435456  # per shard: recent batches kept in memory for consumers
//! readahead_budget_bytes = 67108864    # per shard: blocks read ahead for consumers behind the tail
//! io_memory_bytes = 268435456          # per shard: registered memory for disk reads and writes
//! ```
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

/// Fewest bytes of registered I/O memory a shard may have: a few write
/// buffers and read-ahead blocks.
const IO_MEMORY_MIN: usize = 16 << 20;
/// Most: 64 GiB.
const IO_MEMORY_MAX: usize = 64 << 30;

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
            segment_bytes: 1 << 30,
            tail_cache_budget_bytes: ShardStorageConfig::default().tail_cache_budget_bytes,
            readahead_budget_bytes: ShardStorageConfig::default().readahead_budget_bytes,
            io_memory_bytes: 256 << 20,
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
        config.validate()?;
        Ok(config)
    }

    /// The log settings every queue's logs start from (a queue's own go on
    /// top: `shard::partitions::log_config`).
    pub fn log_base(&self) -> strand_storage::LogConfig {
        strand_storage::LogConfig {
            segment_bytes_max: self.segment_bytes,
            recycle_segments: self.recycle_segments,
            ..strand_storage::LogConfig::default()
        }
    }

    /// What each shard's storage shares among its logs.
    pub fn shard_storage(&self) -> ShardStorageConfig {
        ShardStorageConfig {
            tail_cache_budget_bytes: self.tail_cache_budget_bytes,
            readahead_budget_bytes: self.readahead_budget_bytes,
            ..ShardStorageConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
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
            "listen = \"127.0.0.1:7000\"\ncores = 3\nnode_id = 5\nspin_before_park_us = 300\nrecycle_segments = false\nreadahead_budget_bytes = 1048576\nio_memory_bytes = 33554432\n",
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
}
