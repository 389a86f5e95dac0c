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
//!   written (or fdatasync'd) before the failure — once its log failed it
//!   reports only what it wrote (`replication::held_end`), never batches
//!   it appended to memory — and the reopened log holds all of it; it
//!   fetches on from its new log end.
//! - A **leader** first has the controller take the leadership from it
//!   (`Command::LeaderLostWrites`): its memory held batches the disk does
//!   not, which followers may have fetched, so the reopened log must not
//!   take new records at those offsets in the same leader epoch. Another
//!   ISR member leads (this replica leaves the ISR and catches up as a
//!   follower), or, alone in the ISR, it leads on in a new epoch. If the
//!   controller cannot be reached, the next round asks again; the log
//!   stays failed (produce answers `StorageFull`) until then.
//!
//! **Journaled partitions** (`journal = true`) come back together, a
//! shard at a time, once the shard's journal failed (a frame write met
//! ENOSPC) or any of its journaled logs did (a segment written behind
//! did), and the disk has room for what its logs had not written to
//! their segments (the replay writes it), a segment and the journal's
//! spare files:
//! 1. the shard journal stops (`Journal::stop`): nothing more becomes
//!    durable in it, and every journaled log of the shard refuses appends
//!    (an append fails its log in the same step, before any reader sees
//!    the batch);
//! 2. every journaled partition this shard leads hands its leadership over
//!    (`Command::LeaderLostWrites`, as above): a log's memory may hold
//!    batches of a frame that never became durable, which followers may
//!    have fetched. If the controller cannot be reached, the next round
//!    tries again (the journal stays stopped meanwhile);
//! 3. `Partitions::restart_journal`: the journaled partitions close (a log
//!    that still works writes and fdatasyncs what it holds), the journal's
//!    files are replayed into their directories as at start-up, a journal
//!    starts again and the partitions reopen in the roles the table gives
//!    them. Should that fail, the broker exits (status 75) to be started
//!    again, and the start-up replay does the same.
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
    /// Replicas of this shard whose log's open found that it lost records
    /// it had made durable (`Log::damage`: a damaged or missing segment, a
    /// corrupt batch that later ones follow, a log below its checkpointed
    /// high watermark) and that the table still counts in sync: the
    /// controller takes each out of the ISR (`Command::ReplicaDamaged`;
    /// alone in it, the partition goes offline for an unclean election).
    /// Until then such a replica does not lead (`Partition::adopt`). Asked
    /// again each round until the table shows it out.
    pub async fn report_damaged_replicas(self: &Rc<Self>) {
        let me = self.config.node_id;
        for ((queue, p), part) in self.partitions.all() {
            let Some(why) = part.log.damage() else {
                continue;
            };
            let partition_epoch = {
                let table = self.table.borrow();
                match table.queue(&queue).and_then(|q| q.partitions.get(p as usize)) {
                    Some(record) if record.isr.contains(&me) => record.partition_epoch,
                    _ => continue,
                }
            };
            let command = Command::ReplicaDamaged {
                queue: queue.clone(),
                partition: p,
                broker: me,
                partition_epoch,
            };
            match self.propose(command).await {
                Ok(()) => tracing::warn!(
                    queue = %queue,
                    partition = p,
                    "{why}: the controller takes this replica out of the ISR; it catches up from a leader"
                ),
                Err(e) => tracing::warn!(
                    queue = %queue,
                    partition = p,
                    "{why}: asking the controller to take this replica out of the ISR: {e} (asked again in \
                     {RECOVER_EVERY:?})"
                ),
            }
        }
    }

    /// One round (see the module doc).
    pub async fn recover_logs_after_full_disk(self: &Rc<Self>) {
        // A fresh look: the room a replay needs is judged on what is free
        // now, not up to `CHECK_EVERY` ago.
        self.disk.refresh(&self.config.data_dir, self.config.min_free_bytes);
        let Some(space) = self.disk.space().filter(|s| !s.low()) else {
            return;
        };
        if let Some(reason) = self.journal_restart_reason() {
            let journaled: Vec<_> = self
                .partitions
                .all()
                .into_iter()
                .filter(|(_, part)| part.log.journaled())
                .collect();
            let segment = journaled
                .iter()
                .map(|(_, part)| self.partitions.segment_bytes(&part.settings))
                .max()
                .unwrap_or(0);
            // The replay writes into segments what their logs had not
            // written (a block more each, rewritten), one may roll, and
            // the new journal prepares its files only with room for
            // `PREPARE_ROOM_FILES` of them (else its frames allocate).
            let unwritten: u64 = journaled
                .iter()
                .map(|(_, part)| part.log.unwritten_bytes() + strand_storage::DMA_ALIGN)
                .sum();
            let journal_room = self.config.journal_file_bytes * strand_storage::journal::PREPARE_ROOM_FILES;
            let needed = unwritten + segment + journal_room;
            if space.free < needed {
                if !self.disk.waiting_for_room.replace(true) {
                    tracing::warn!(
                        free = space.free,
                        needed,
                        unwritten,
                        "{reason}: the shard's journaled partitions come back once the data directory has room \
                         for their replay, a segment and the journal's spare files"
                    );
                }
            } else if !self.stopping.get() {
                self.disk.waiting_for_room.set(false);
                self.restart_journal(&reason).await;
            }
        }
        let failed: Vec<_> = self
            .partitions
            .all()
            .into_iter()
            .filter(|(_, part)| !part.log.journaled() && part.log.failed_for_space())
            .filter(|(_, part)| space.free >= self.partitions.segment_bytes(&part.settings))
            .collect();
        for ((queue, p), part) in failed {
            if let Some(epoch) = part.leading() {
                if !self.hand_over(&queue, p, epoch, "a log failed on a full disk").await {
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

    /// Has the controller take the leadership of `queue`/`p` (led here in
    /// `epoch`) before its log is opened again from the disk
    /// (`Command::LeaderLostWrites`); whether it did (`why` goes into the
    /// warning when not: the next round asks again).
    async fn hand_over(self: &Rc<Self>, queue: &str, p: u32, epoch: u32, why: &str) -> bool {
        let command = Command::LeaderLostWrites {
            queue: queue.to_string(),
            partition: p,
            leader: self.config.node_id,
            leader_epoch: epoch,
        };
        match self.propose(command).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    queue,
                    partition = p,
                    "{why}: handing its leadership over before reopening it: {e} (asked again in {RECOVER_EVERY:?})"
                );
                false
            }
        }
    }

    /// Why this shard's journaled partitions must come back through a
    /// replay of its journal, if they must: the journal failed (or was
    /// stopped by a round that could not finish), or a journaled log did.
    fn journal_restart_reason(&self) -> Option<String> {
        if let Some(why) = self.partitions.storage().journal().and_then(|j| j.failed()) {
            return Some(format!("the shard journal failed: {why}"));
        }
        let all = self.partitions.all();
        let ((queue, p), part) = all.iter().find(|(_, part)| part.log.journaled() && part.log.failed())?;
        Some(format!(
            "the journaled log of {queue}/{p} failed: {}",
            part.log.failure().unwrap_or_default()
        ))
    }

    /// Steps 1 to 3 of the module doc.
    async fn restart_journal(self: &Rc<Self>, reason: &str) {
        let Some(journal) = self.partitions.storage().journal() else {
            return;
        };
        journal.stop(reason).await;
        for ((queue, p), part) in self.partitions.all() {
            let Some(epoch) = part.leading().filter(|_| part.log.journaled()) else {
                continue;
            };
            if !self.hand_over(&queue, p, epoch, "the shard journal stopped").await {
                return;
            }
        }
        // Tables apply one at a time, and not while the partitions reopen.
        let Ok(_turn) = self.applying.acquire_permit(1).await else {
            return;
        };
        let table = self.table.borrow().clone();
        let dir = self.config.journal_dir(self.id.0);
        match self
            .partitions
            .restart_journal(&table, &dir, self.config.journal_config(), reason)
            .await
        {
            Ok(reopened) => tracing::info!(
                journal = %dir.display(),
                reopened,
                "the shard journal stopped ({reason}) and is replayed and started again: its partitions take writes"
            ),
            Err(e) => {
                tracing::error!(
                    journal = %dir.display(),
                    "bringing the journaled partitions back in place failed ({e}): exiting, to be started again (the \
                     start-up replay brings back every acknowledged record)"
                );
                std::process::exit(super::EXIT_TO_RESTART);
            }
        }
    }
}

/// Replays the shard journal in `dir` into the logs under `storage`'s
/// data directory (`ShardStorage::replay_journal`), saying what it did
/// (`when`: at start-up, or in place after a full disk).
pub async fn replay_journal(
    storage: &strand_storage::ShardStorage,
    dir: &std::path::Path,
    config: strand_storage::journal::JournalConfig,
    log_base: &strand_storage::LogConfig,
    when: &str,
) -> Result<strand_storage::replay::ReplayReport, String> {
    let report = storage
        .replay_journal(dir, config, log_base)
        .await
        .map_err(|e| format!("replaying {}: {e}", dir.display()))?;
    if report.entries > 0 {
        tracing::info!(
            journal = %dir.display(),
            entries = report.entries,
            logs = report.logs,
            appended = report.appended,
            cuts = report.cuts,
            skipped_logs = report.skipped_logs,
            "replayed the shard journal {when}"
        );
    }
    Ok(report)
}
