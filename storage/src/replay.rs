//! Start-up replay of a shard journal into the logs it names.
//!
//! Runs on: one shard, before any shard serves (the broker replays every
//! journal directory on shard 0 before the shards join: a partition may
//! have moved to another shard, or its shard may no longer run).
//!
//! For each log with entries to replay: if its directory is gone, or holds
//! another log (its `.journal-id` differs), the entries are skipped: the
//! log was deleted (or created again) after them. Otherwise the log is
//! opened (recovering its segments as always), the entries become appends,
//! truncations and start-overs ([`crate::journal::recover::replay_actions`])
//! applied through the log's own API, its checkpointed high watermark is
//! restored (opening clamped it to what the segments held), and the log is
//! closed, which writes and fdatasyncs it and saves the high watermark. Then the journal records that nothing before its end
//! needs replaying again.

use std::path::Path;

use crate::config::{FsyncPolicy, LogConfig};
use crate::error::{Result, StorageError};
use crate::journal::recover::{by_log, items_of, replay_actions, Action};
use crate::journal::{Journal, JournalConfig};
use crate::log::read_journal_id;
use crate::shard::ShardStorage;

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Entries in the frames replayed.
    pub entries: usize,
    /// Logs replayed into.
    pub logs: usize,
    /// Logs whose entries were skipped (directory gone or another log's).
    pub skipped_logs: usize,
    /// Batches appended, and cuts (truncations and start-overs) made.
    pub appended: usize,
    pub cuts: usize,
}

impl ShardStorage {
    /// Replays the journal in `dir` into the logs under this shard's data
    /// directory, with `log_config` for opening them (its sizes are
    /// widened so that any batch a queue stored reads back). Leaves the
    /// journal recording that nothing needs replaying; does not start it
    /// for this shard ([`ShardStorage::start_journal`] does).
    pub async fn replay_journal(
        &self,
        dir: &Path,
        config: JournalConfig,
        log_config: &LogConfig,
    ) -> Result<ReplayReport> {
        let (journal, plan, replayed) = Journal::open(dir, config).await?;
        let mut report = ReplayReport {
            entries: plan.entries.len(),
            ..ReplayReport::default()
        };
        let replay_config = LogConfig {
            segment_bytes_max: u64::from(u32::MAX) & !(crate::DMA_ALIGN - 1),
            batch_bytes_max: (u32::MAX as usize) & !(crate::DMA_ALIGN as usize - 1),
            fsync: FsyncPolicy::Always,
            journal: false,
            ..log_config.clone()
        };
        for log in by_log(&plan) {
            let name = log.dir;
            let log_dir = self.data_dir().join(name);
            if !log_dir.is_dir() || read_journal_id(&log_dir) != Some(log.log_id) {
                report.skipped_logs += 1;
                continue;
            }
            let (items, bytes) = items_of(log.changes);
            // The high watermark checkpointed may lie past what the
            // segments hold (the journal held the rest): opening clamps it
            // to the log's end, so it is set again once the replay is in.
            let checkpointed = std::fs::read(log_dir.join(crate::checkpoint::HIGH_WATERMARK_FILE))
                .ok()
                .and_then(|bytes| crate::checkpoint::decode_high_watermark(&bytes).ok());
            let log = self.open_log(&log_dir, replay_config.clone()).await?;
            let actions = replay_actions(log.log_end(), &items).map_err(|why| StorageError::CorruptJournal {
                dir: dir.to_path_buf(),
                reason: format!("log {name}: {why}"),
            })?;
            for action in actions {
                match action {
                    Action::Append(i) => {
                        let batch = bytes[i].clone().expect("a batch item has its bytes");
                        log.append_replica(batch).await?;
                        report.appended += 1;
                    }
                    Action::Truncate(to) => {
                        log.truncate_to(to).await?;
                        report.cuts += 1;
                    }
                    Action::StartOver(at) => {
                        log.start_over_at(at).await?;
                        report.cuts += 1;
                    }
                }
            }
            if let Some(hw) = checkpointed {
                log.advance_high_watermark(hw);
            }
            // Written and fdatasync'd: the journal need not hold it.
            log.close().await?;
            report.logs += 1;
        }
        drop(replayed);
        journal.checkpoint().await?;
        Ok(report)
    }
}
