//! Free space in the data directory: producers are refused (`StorageFull`,
//! naming the node) while it is below a threshold, before the disk fills
//! and writes fail halfway; reads, consumer groups (whose `__groups`
//! commits are small) and replication go on. Writing resumes by itself
//! once space is freed (retention, or an operator), at the next look.
//!
//! Runs on: every shard, which looks at the file system every
//! [`CHECK_EVERY`]; the produce path reads the last look
//! (`Shard::disk_refusal`).
//!
//! The threshold: `min_free_bytes` when set (0: never refuse), else the
//! smaller of 1 GiB and 5 % of the file system.

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use strand_wire::ErrorCode;

use super::messages::WireError;

/// How often a shard looks at the free space: often enough that producers
/// writing a few GiB/s cannot cross the default threshold (1 GiB) between
/// two looks; a look is one `statvfs` (the file system's counters, no I/O).
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The default threshold's two bounds: the smaller one holds.
const DEFAULT_MIN_FREE: u64 = 1 << 30;
const DEFAULT_MIN_FREE_PERCENT: u64 = 5;

/// Space in the file system, as the last look found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Space {
    /// Bytes an unprivileged writer may still use.
    pub free: u64,
    /// The file system's size.
    pub total: u64,
    /// Below this, produce is refused.
    pub threshold: u64,
}

impl Space {
    pub fn low(&self) -> bool {
        self.free < self.threshold
    }
}

/// The threshold for a file system of `total` bytes.
pub fn threshold(min_free_bytes: Option<u64>, total: u64) -> u64 {
    min_free_bytes.unwrap_or_else(|| DEFAULT_MIN_FREE.min(total / 100 * DEFAULT_MIN_FREE_PERCENT))
}

pub use strand_storage::space::statvfs;

/// One shard's last look at the data directory's space.
#[derive(Debug, Default)]
pub struct DiskSpace {
    last: Cell<Option<Space>>,
    /// The last look failed (logged once per run of failures, not every
    /// 100 ms).
    failing: Cell<bool>,
    /// A journal replay in place (`recover.rs`) waits for room: logged
    /// once per wait, not every round.
    pub waiting_for_room: Cell<bool>,
}

impl DiskSpace {
    /// Looks again; a failed look keeps the last one (and is logged when
    /// looks start failing).
    pub fn refresh(&self, dir: &Path, min_free_bytes: Option<u64>) {
        match statvfs(dir) {
            Ok((free, total)) => {
                self.failing.set(false);
                let now = Space {
                    free,
                    total,
                    threshold: threshold(min_free_bytes, total),
                };
                let was_low = self.last.get().is_some_and(|s| s.low());
                if now.low() != was_low {
                    if now.low() {
                        tracing::warn!(
                            free,
                            threshold = now.threshold,
                            "the data directory is below its free-space threshold: produce is refused \
                             (StorageFull) until space is freed"
                        );
                    } else {
                        tracing::info!(free, threshold = now.threshold, "free space is back: produce resumes");
                    }
                }
                self.last.set(Some(now));
            }
            Err(e) => {
                if !self.failing.replace(true) {
                    tracing::warn!(dir = %dir.display(), "statvfs: {e} (the free-space check keeps its last look)");
                }
            }
        }
    }

    /// The last look (`None` before the first).
    pub fn space(&self) -> Option<Space> {
        self.last.get()
    }

    /// `StorageFull` for a produce while the space is low.
    pub fn refusal(&self, node: u64, dir: &Path) -> Option<WireError> {
        let space = self.last.get().filter(Space::low)?;
        Some(WireError::new(
            ErrorCode::StorageFull,
            format!(
                "node {node}: its data directory {} has {} free, below its threshold of {} (min_free_bytes): \
                 produce is refused until space is freed (retention, or an operator); reads go on",
                dir.display(),
                mib(space.free),
                mib(space.threshold)
            ),
        ))
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_threshold_is_the_smaller_of_a_gibibyte_and_five_percent() {
        assert_eq!(threshold(None, 100 << 30), 1 << 30);
        assert_eq!(threshold(None, 10 << 30), (10u64 << 30) / 100 * 5);
        assert_eq!(threshold(Some(0), 10 << 30), 0, "0 turns it off");
        assert_eq!(threshold(Some(123), 10 << 30), 123);
    }

    #[test]
    fn produce_is_refused_only_below_the_threshold() {
        let disk = DiskSpace::default();
        let dir = Path::new("/data");
        assert!(disk.refusal(1, dir).is_none(), "nothing known yet");
        for (free, refused) in [(99, true), (100, false), (5000, false)] {
            disk.last.set(Some(Space {
                free,
                total: 10_000,
                threshold: 100,
            }));
            let r = disk.refusal(7, dir);
            assert_eq!(r.is_some(), refused, "{free} bytes free");
            if let Some(e) = r {
                assert_eq!(e.code, ErrorCode::StorageFull);
                assert!(
                    e.message.starts_with("node 7: its data directory /data"),
                    "{}",
                    e.message
                );
            }
        }
    }

    #[test]
    fn the_file_system_of_a_directory_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let (free, total) = statvfs(dir.path()).unwrap();
        assert!(total > 0 && free <= total);
        assert!(statvfs(&dir.path().join("missing")).is_err());
    }
}
