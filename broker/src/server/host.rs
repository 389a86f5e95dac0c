//! What this machine allows the broker: CPUs to pin shards to, memory for
//! their I/O pools and caches, and locked memory to register the pools
//! with io_uring. Checked once at start, before anything is allocated, so
//! a configuration the machine cannot hold is refused with what to lower
//! (rather than a broker that grows for minutes and never gets ready).
//!
//! Runs on: the main thread, before any shard starts. [`check`] is pure
//! (the readings come in as a [`Host`]), so its rules are unit-tested.

use crate::config::BrokerConfig;

/// What was read off the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Host {
    /// CPUs this process may run on (its affinity mask).
    pub cpus: usize,
    /// Physical memory, or the process's cgroup limit if lower.
    pub memory_bytes: u64,
    /// `MemAvailable`: what can be allocated now without swapping out.
    pub available_bytes: u64,
    /// RLIMIT_MEMLOCK (`None`: unlimited).
    pub memlock_bytes: Option<u64>,
    /// CAP_IPC_LOCK: registered buffers are then not charged to the limit.
    pub can_lock_any: bool,
}

/// A start that would fail, or a warning for one that runs slower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    /// Starts, but the shards' I/O memory cannot be registered.
    Warn(String),
}

impl Host {
    /// Reads the machine; unknown values read as "no limit".
    pub fn read() -> Host {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |name: &str| {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib << 10)
        };
        let total = field("MemTotal:").unwrap_or(u64::MAX);
        let available = field("MemAvailable:").unwrap_or(total);
        let memory_bytes = total.min(cgroup_memory_limit().unwrap_or(u64::MAX));
        Host {
            cpus: usable_cpu_ids().len(),
            memory_bytes,
            available_bytes: available.min(memory_bytes),
            memlock_bytes: memlock_limit(),
            can_lock_any: has_cap_ipc_lock(),
        }
    }
}

/// glommio will not start a shard under this locked-memory limit, even
/// with CAP_IPC_LOCK.
pub const MEMLOCK_MIN: u64 = 512 << 10;

/// Shards when `cores` is not set: one per CPU, but no more than the
/// machine's memory holds (each may pin `io_memory_bytes` and cache up to
/// `tail_cache_budget_bytes`), and at least one.
pub fn default_shards(config: &BrokerConfig, host: &Host) -> usize {
    let io = (config.io_memory_bytes as u64).max(1);
    let per_shard = io.saturating_add(config.tail_cache_budget_bytes as u64);
    let fits = (host.memory_bytes / per_shard).min(host.available_bytes / io);
    host.cpus.min(usize::try_from(fits).unwrap_or(usize::MAX)).max(1)
}

/// Whether `shards` shards of `config` fit on `host`.
pub fn check(config: &BrokerConfig, shards: usize, host: &Host) -> Result<Verdict, String> {
    if let Some(limit) = host.memlock_bytes.filter(|l| *l < MEMLOCK_MIN) {
        return Err(format!(
            "the locked-memory limit (ulimit -l) is {} KiB; a shard needs at least {} KiB to start: raise it \
             (ulimit -l unlimited, or LimitMEMLOCK=infinity in the systemd unit)",
            limit >> 10,
            MEMLOCK_MIN >> 10
        ));
    }
    if shards > host.cpus {
        return Err(format!(
            "cores {shards} is more than the {} CPUs this process may run on (each shard is pinned to a CPU \
             of its own): lower --cores (or `cores` in the config file)",
            host.cpus
        ));
    }
    let n = shards as u64;
    let io = config.io_memory_bytes as u64;
    let cache = config.tail_cache_budget_bytes as u64;
    let pinned = n.saturating_mul(io);
    if pinned > host.available_bytes {
        return Err(format!(
            "the shards' I/O memory, {n} × {} = {} (allocated and pinned at start), is more than the {} this \
             machine has available: lower io_memory_bytes in the config file, or --cores",
            size(io),
            size(pinned),
            size(host.available_bytes)
        ));
    }
    let peak = n.saturating_mul(io.saturating_add(cache));
    if peak > host.memory_bytes {
        return Err(format!(
            "the shards may hold {n} × ({} I/O memory + {} tail cache) = {}, more than this machine's {}: lower \
             tail_cache_budget_bytes or io_memory_bytes in the config file, or --cores",
            size(io),
            size(cache),
            size(peak),
            size(host.memory_bytes)
        ));
    }
    match host.memlock_bytes {
        Some(limit) if !host.can_lock_any && limit < pinned => Ok(Verdict::Warn(format!(
            "the locked-memory limit (ulimit -l) is {}, below the {} of I/O memory the shards register with \
             io_uring: disk I/O goes through unregistered buffers, which the kernel pins at every read and write \
             (catch-up reads from disk were up to 40 % slower, produce 5-15 %); raise it (ulimit -l unlimited, \
             or LimitMEMLOCK=infinity in the systemd unit) or run with CAP_IPC_LOCK",
            size(limit),
            size(pinned)
        ))),
        _ => Ok(Verdict::Fits),
    }
}

/// `512 MiB`, `1.5 GiB`.
fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The CPUs in this process's affinity mask, by id (what shards are pinned
/// to: `taskset -c 2,3 strand serve` runs its shards on CPUs 2 and 3).
pub fn usable_cpu_ids() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills it for this process (pid 0); CPU_ISSET reads it in bounds.
    let ids: Vec<usize> = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            Vec::new()
        } else {
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    };
    if ids.is_empty() {
        (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
    } else {
        ids
    }
}

/// The memory limit of this process's cgroup (v2), if it has one.
fn cgroup_memory_limit() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let limit = std::fs::read_to_string(format!("/sys/fs/cgroup{}/memory.max", path.trim_end())).ok()?;
    limit.trim().parse().ok()
}

fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(limit.rlim_cur)
}

/// Whether CAP_IPC_LOCK (bit 14) is in this process's effective set.
fn has_cap_ipc_lock() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn host() -> Host {
        Host {
            cpus: 2,
            memory_bytes: 24 * GIB,
            available_bytes: 22 * GIB,
            memlock_bytes: None,
            can_lock_any: false,
        }
    }

    #[test]
    fn the_defaults_fit_a_small_machine() {
        let c = BrokerConfig::default();
        assert_eq!(check(&c, 2, &host()), Ok(Verdict::Fits));
        let small = Host {
            memory_bytes: 2 * GIB,
            available_bytes: 3 * GIB / 2,
            ..host()
        };
        assert_eq!(check(&c, 2, &small), Ok(Verdict::Fits));
    }

    #[test]
    fn more_shards_than_cpus_are_refused() {
        let err = check(&BrokerConfig::default(), 64, &host()).unwrap_err();
        assert!(err.contains("cores 64 is more than the 2 CPUs"), "{err}");
    }

    #[test]
    fn memory_the_machine_lacks_is_refused_naming_the_setting() {
        let big_io = BrokerConfig {
            io_memory_bytes: 16 << 30,
            ..BrokerConfig::default()
        };
        let err = check(&big_io, 2, &host()).unwrap_err();
        assert!(err.contains("io_memory_bytes") && err.contains("32.0 GiB"), "{err}");
        let big_cache = BrokerConfig {
            tail_cache_budget_bytes: 12 << 30,
            ..BrokerConfig::default()
        };
        let err = check(&big_cache, 2, &host()).unwrap_err();
        assert!(err.contains("tail_cache_budget_bytes"), "{err}");
        // The pool is pinned at start: what is available now counts.
        let busy = Host {
            available_bytes: 300 << 20,
            ..host()
        };
        assert!(check(&BrokerConfig::default(), 2, &busy).is_err());
    }

    #[test]
    fn a_low_locked_memory_limit_is_one_warning() {
        let limited = Host {
            memlock_bytes: Some(8 << 20),
            ..host()
        };
        let Ok(Verdict::Warn(w)) = check(&BrokerConfig::default(), 2, &limited) else {
            panic!("a warning expected")
        };
        assert!(
            w.contains("ulimit -l") && w.contains("8 MiB") && !w.contains('\n'),
            "{w}"
        );
        let privileged = Host {
            can_lock_any: true,
            ..limited
        };
        assert_eq!(check(&BrokerConfig::default(), 2, &privileged), Ok(Verdict::Fits));
    }

    #[test]
    fn a_limit_glommio_cannot_start_under_is_refused() {
        let tiny = Host {
            memlock_bytes: Some(64 << 10),
            can_lock_any: true,
            ..host()
        };
        let err = check(&BrokerConfig::default(), 1, &tiny).unwrap_err();
        assert!(err.contains("64 KiB") && err.contains("512 KiB"), "{err}");
    }

    #[test]
    fn the_default_shard_count_fits_the_memory() {
        let c = BrokerConfig::default();
        let big = Host { cpus: 16, ..host() };
        assert_eq!(default_shards(&c, &big), 16);
        // 2 GiB holds four shards of 256 MiB I/O memory + 256 MiB cache.
        let small = Host {
            cpus: 16,
            memory_bytes: 2 * GIB,
            available_bytes: 2 * GIB,
            ..host()
        };
        assert_eq!(default_shards(&c, &small), 4);
        assert_eq!(check(&c, default_shards(&c, &small), &small), Ok(Verdict::Fits));
        let tiny = Host {
            memory_bytes: 100 << 20,
            available_bytes: 100 << 20,
            ..host()
        };
        assert_eq!(default_shards(&c, &tiny), 1, "at least one (then refused by check)");
    }

    #[test]
    fn the_machine_reads_sensibly() {
        let h = Host::read();
        assert!(h.cpus >= 1 && h.memory_bytes > 64 << 20, "{h:?}");
        assert!(h.available_bytes <= h.memory_bytes);
    }
}
