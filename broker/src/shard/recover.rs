//! Logs that stopped taking writes because the disk was full come back by
//! themselves once there is space again, without a broker restart.
//!
//! A write or fdatasync that meets ENOSPC fails the log
//! (`StorageError::LogFailed`): it takes no more writes, and reads go on
//! below what was written. Every [`RECOVER_EVERY`], while the last look at
//! the data directory finds it above its free-space threshold
//! (`disk.rs`) and with room for one more of its segments (with the
//! threshold off, a log would otherwise be reopened every round while the
//! disk is still full, and fail again at its next write), each such
//! partition is closed and opened again from what
//! its directory holds, as a restart would (`Partitions::reopen`), and
//! takes the role the table gives it.
//!
//! - A **follower** reopens at once: what it told its leader it holds was
//!   written (or fdatasync'd) before the failure, and the reopened log
//!   holds all of it; it fetches on from its new log end.
//! - A **leader** first has the controller take the leadership from it
//!   (`Command::LeaderLostWrites`): its memory held batches the disk does
//!   not, which followers may have fetched, so the reopened log must not
//!   take new records at those offsets in the same leader epoch. Another
//!   ISR member leads (this replica leaves the ISR and catches up as a
//!   follower), or, alone in the ISR, it leads on in a new epoch. If the
//!   controller cannot be reached, the next round asks again; the log
//!   stays failed (produce answers `StorageFull`) until then.
//!
//! A journaled partition (`journal = true`) is not reopened: the broker
//! exits to be started again, and the start-up replay of the shard
//! journal brings back what only the journal held.
//!
//! Runs on: every shard, for the partitions it owns (a timer started by
//! `server`).

use std::rc::Rc;
use std::time::Duration;

use super::Shard;
use crate::controller::Command;

/// How often a shard looks for logs to bring back.
pub const RECOVER_EVERY: Duration = Duration::from_secs(1);

impl Shard {
    /// One round (see the module doc).
    pub async fn recover_logs_after_full_disk(self: &Rc<Self>) {
        let Some(space) = self.disk.space().filter(|s| !s.low()) else {
            return;
        };
        // A journaled log that failed is not reopened here: its memory held
        // batches only the shard journal made durable, which only the
        // start-up replay brings back. The broker restarts, as when the
        // journal itself fails (`server::supervise_journal`).
        if let Some(((queue, p), _)) = self
            .partitions
            .all()
            .into_iter()
            .find(|(_, part)| part.log.journaled() && part.log.failed())
        {
            if !self.stopping.get() {
                tracing::error!(
                    queue = %queue,
                    partition = p,
                    "a journaled partition log failed: exiting, to be started again (its records come back from the \
                     shard journal)"
                );
                std::process::exit(crate::server::CONTROLLER_STOPPED_EXIT);
            }
        }
        let failed: Vec<_> = self
            .partitions
            .all()
            .into_iter()
            .filter(|(_, part)| part.log.failed_for_space())
            .filter(|(_, part)| space.free >= self.partitions.segment_bytes(&part.settings))
            .collect();
        for ((queue, p), part) in failed {
            if let Some(epoch) = part.leading() {
                let command = Command::LeaderLostWrites {
                    queue: queue.clone(),
                    partition: p,
                    leader: self.config.node_id,
                    leader_epoch: epoch,
                };
                if let Err(e) = crate::router::propose(self, command).await {
                    tracing::warn!(
                        queue = %queue,
                        partition = p,
                        "a log failed on a full disk: handing its leadership over before reopening it: {e} (asked \
                         again in {RECOVER_EVERY:?})"
                    );
                    continue;
                }
            }
            // Tables apply one at a time, and not while a log reopens.
            let Ok(_turn) = self.applying.acquire_permit(1).await else {
                return;
            };
            let table = self.table.borrow().clone();
            let written = part.log.written_offset();
            match self.partitions.reopen(&queue, p, &table).await {
                Ok(end) => tracing::info!(
                    queue = %queue,
                    partition = p,
                    written = written.0,
                    log_end = end.0,
                    "a log that failed on a full disk is open again: it takes writes"
                ),
                Err(e) => {
                    tracing::warn!(queue = %queue, partition = p, "reopening a log that failed on a full disk: {e}")
                }
            }
        }
    }
}
