//! Partition replication's I/O on each shard (the rules are
//! `crate::replica`, sans I/O):
//!
//! - **Fetchers** (follower side): one task per leader node this shard
//!   follows partitions of. Each round it sends one `ReplicaFetch` naming
//!   all of them (its log end, last epoch, fdatasync'd offset and the high
//!   watermark it knows) over this shard's peer link, then applies the
//!   answer: batches appended as the leader stored them
//!   (`Log::append_replica`), the producer table kept from them (a
//!   follower that takes over answers a resent batch with where it was
//!   stored), a diverged log truncated where the leader says
//!   (`replica::fetch::truncation_point`; below its high watermark only
//!   where an invariant broke, with an error in the log),
//!   a log that ends before the leader's log start started over there,
//!   and the high watermark taken from the leader; segments wholly below the
//!   leader's log start (its retention, a `__groups` compaction) are
//!   deleted once committed here too. Before its next fetch,
//!   which tells the leader, the follower makes what it appended durable as
//!   the queue's policy says (fdatasync'd on `fsync=always` queues, written
//!   on `fsync=interval` ones): its fetch offset is what the leader counts
//!   toward the high watermark, and so toward acks=all. An answer is applied only while the partition
//!   still follows the same leader in the same epoch from the same log
//!   end. A fetch that keeps failing (a partition's, or all of them from
//!   one leader) is a warning once it has lasted 10 s ([`Troubles`]).
//! - **ISR upkeep** (leader side): every 250 ms, the ISR each led
//!   partition wants (`LeaderState::wanted_isr`) is proposed to the
//!   controller as `AlterIsr`, fenced by the partition epoch; a lost answer
//!   is retried with the same epoch (the controller commits it once or
//!   refuses it); a refusal because the partition moved on (perhaps by
//!   this very proposal, its answer lost) keeps the proposed members
//!   counted toward the high watermark until the table at the newer epoch
//!   arrives (`LeaderState::on_refused`), any other refusal drops it.
//! - **High-watermark checkpoints**: every 5 s, each partition's high
//!   watermark and epoch history are written if they changed
//!   (`Log::checkpoint`), so a restarted replica never shows what was not
//!   committed.
//!
//! Runs on: every shard, for the partitions it owns.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use strand_net::message::TailBuilder;
use strand_net::Frame;
use strand_storage::{FsyncPolicy, LeaderEpoch, Offset};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use crate::controller::{Command, ControllerError, NodeId, ProposeError};
use crate::lease::mono_ms;
use crate::replica::fetch::{below_high_watermark, truncation_point};
use crate::shard::partitions::{Partition, Role};
use crate::shard::Shard;

/// Bytes a follower asks for per partition and fetch.
const FETCH_MAX_BYTES: u32 = 1 << 20;
/// How often leaders look at their partitions' ISR.
const ISR_EVERY: Duration = Duration::from_millis(250);
/// How often high watermarks are checkpointed.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
/// The pause after a failed fetch before the next.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// A fetch failing this long (for a partition, or for all from a leader)
/// is said in the log; shorter troubles are the usual failover churn.
const TROUBLE_SAID_AFTER: Duration = Duration::from_secs(10);
/// And said again this often while it lasts.
const TROUBLE_SAID_EVERY: Duration = Duration::from_secs(30);

/// Starts this shard's fetchers, ISR upkeep and checkpoints.
pub fn start(shard: &Rc<Shard>) {
    start_fetchers(shard);
    start_isr_upkeep(shard);
    let s = shard.clone();
    glommio::spawn_local(async move {
        while !s.stopping.get() {
            glommio::timer::sleep(CHECKPOINT_EVERY).await;
            for ((queue, p), part) in s.partitions.all() {
                if let Err(e) = part.log.checkpoint().await {
                    tracing::warn!(queue = %queue, partition = p, "checkpointing the high watermark and producers: {e}");
                }
            }
        }
    })
    .detach();
}

/// A followed partition as one fetch round saw it.
struct Followed {
    queue: String,
    partition: u32,
    part: Rc<Partition>,
    epoch: u32,
    fetch_offset: Offset,
}

/// Keeps one fetcher running per leader node that this shard follows
/// partitions of (looked at whenever roles change, and every second).
fn start_fetchers(shard: &Rc<Shard>) {
    let s = shard.clone();
    glommio::spawn_local(async move {
        let running: Rc<RefCell<HashSet<NodeId>>> = Rc::default();
        while !s.stopping.get() {
            let seen = s.partitions.roles_changed.epoch();
            let leaders: HashSet<NodeId> = s
                .partitions
                .logs()
                .iter()
                .filter_map(|p| p.following().map(|(leader, _)| leader))
                .filter(|leader| *leader != s.config.node_id)
                .collect();
            for leader in leaders {
                if running.borrow_mut().insert(leader) {
                    let (s, running) = (s.clone(), running.clone());
                    glommio::spawn_local(async move {
                        fetch_from(&s, leader).await;
                        running.borrow_mut().remove(&leader);
                        // It may have stopped just as a partition came.
                        s.partitions.roles_changed.notify_all();
                    })
                    .detach();
                }
            }
            let _ = glommio::timer::timeout(Duration::from_secs(1), async {
                s.partitions.roles_changed.wait(seen).await;
                Ok(())
            })
            .await;
        }
    })
    .detach();
}

/// Fetch failures that last: each one (a partition's, or a whole fetch's
/// from one leader) is said as a warning once it has lasted
/// [`TROUBLE_SAID_AFTER`], again every [`TROUBLE_SAID_EVERY`], and its end
/// once it was said. A follower that cannot catch up keeps its partition
/// under-replicated; this says why, where a debug line per round would be
/// either noise or invisible. Pure: the clock comes in.
#[derive(Default)]
struct Troubles {
    open: HashMap<String, Trouble>,
}

struct Trouble {
    since: std::time::Instant,
    said: Option<std::time::Instant>,
    message: String,
}

/// What to log about one trouble now.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    Nothing,
    /// It has lasted this long, with its latest message.
    Lasting(Duration, String),
    /// It ended after this long (it had been said).
    Ended(Duration),
}

impl Troubles {
    fn failed(&mut self, what: String, message: String, now: std::time::Instant) -> Say {
        let t = self.open.entry(what).or_insert_with(|| Trouble {
            since: now,
            said: None,
            message: String::new(),
        });
        t.message = message;
        let lasted = now.saturating_duration_since(t.since);
        let due = match t.said {
            None => lasted >= TROUBLE_SAID_AFTER,
            Some(at) => now.saturating_duration_since(at) >= TROUBLE_SAID_EVERY,
        };
        if !due {
            return Say::Nothing;
        }
        t.said = Some(now);
        Say::Lasting(lasted, t.message.clone())
    }

    /// Whether any trouble is open (else [`Troubles::ok`] has nothing to end).
    fn any(&self) -> bool {
        !self.open.is_empty()
    }

    fn ok(&mut self, what: &str, now: std::time::Instant) -> Say {
        match self.open.remove(what) {
            Some(Trouble {
                since, said: Some(_), ..
            }) => Say::Ended(now.saturating_duration_since(since)),
            _ => Say::Nothing,
        }
    }
}

/// Logs what [`Troubles`] says about `what`.
fn say(what: &str, said: Say) {
    match said {
        Say::Nothing => {}
        Say::Lasting(lasted, message) => {
            tracing::warn!(
                "replica fetch of {what} failing for {:.0} s: {message}",
                lasted.as_secs_f64()
            )
        }
        Say::Ended(lasted) => tracing::info!(
            "replica fetch of {what} works again after {:.0} s",
            lasted.as_secs_f64()
        ),
    }
}

/// Fetches from `leader` until this shard follows nothing of it.
async fn fetch_from(shard: &Rc<Shard>, leader: NodeId) {
    let wait = Duration::from_millis(shard.config.replica_fetch_wait_ms);
    let mut troubles = Troubles::default();
    let whole = format!("everything from node {leader}");
    while !shard.stopping.get() {
        let followed: Vec<Followed> = shard
            .partitions
            .all()
            .into_iter()
            .filter_map(|((queue, partition), part)| {
                let (l, epoch) = part.following()?;
                (l == leader).then(|| Followed {
                    queue,
                    partition,
                    epoch,
                    fetch_offset: held_end(&part.log),
                    part,
                })
            })
            .collect();
        if followed.is_empty() {
            return;
        }
        let body = fetch_request(shard.config.node_id, wait, &followed);
        // The leader answers within `wait`; the rest is for the trip.
        let answer = crate::router::call_node(
            shard,
            leader,
            Api::ReplicaFetch,
            &body,
            TailBuilder::default(),
            wait + Duration::from_secs(5),
        )
        .await;
        let now = std::time::Instant::now();
        let progressed = match answer {
            Ok(frame) => {
                say(&whole, troubles.ok(&whole, now));
                apply_answer(shard, &followed, frame, leader, &whole, &mut troubles).await
            }
            Err(e) => {
                tracing::debug!(leader, "replica fetch: {}", e.message);
                say(&whole, troubles.failed(whole.clone(), e.message, now));
                false
            }
        };
        if !progressed {
            glommio::timer::sleep(RETRY_AFTER).await;
        }
    }
}

/// The `ReplicaFetchRequest` for one round.
fn fetch_request(me: NodeId, wait: Duration, followed: &[Followed]) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let mut queues = Vec::new();
    for run in followed.chunk_by(|a, b| a.queue == b.queue) {
        let mut entries = Vec::with_capacity(run.len());
        for f in run {
            let log = &f.part.log;
            entries.push(ReplicaFetchPartition::create(
                &mut fbb,
                &ReplicaFetchPartitionArgs {
                    partition: f.partition,
                    leader_epoch: f.epoch,
                    fetch_offset: f.fetch_offset.0,
                    last_epoch: log
                        .latest_epoch()
                        .map_or(-1, |e| i32::try_from(e.0).unwrap_or(i32::MAX)),
                    flushed_offset: log.flushed_offset().0,
                    high_watermark: log.high_watermark().0,
                    max_bytes: FETCH_MAX_BYTES,
                },
            ));
        }
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string(&run[0].queue);
        queues.push(ReplicaFetchQueue::create(
            &mut fbb,
            &ReplicaFetchQueueArgs {
                name: Some(name),
                partitions: Some(entries),
                id: run[0].part.queue_id,
            },
        ));
    }
    let queues = fbb.create_vector(&queues);
    let root = ReplicaFetchRequest::create(
        &mut fbb,
        &ReplicaFetchRequestArgs {
            replica_id: me,
            max_wait_ms: wait.as_millis().min(u128::from(u32::MAX)) as u32,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// Applies a leader's answer; returns whether any partition's log end or
/// high watermark moved (else the fetcher pauses before the next round:
/// an error, or a divergence it cannot resolve, must not spin).
async fn apply_answer(
    shard: &Rc<Shard>,
    followed: &[Followed],
    frame: Frame,
    leader: NodeId,
    whole: &str,
    troubles: &mut Troubles,
) -> bool {
    let now = std::time::Instant::now();
    let resp = match strand_net::message::read_body::<ReplicaFetchResponse>(&frame.body) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("replica fetch: an answer that does not parse: {e}");
            return false;
        }
    };
    if let Some(e) = resp.error().filter(|e| e.code() != ErrorCode::None) {
        let message = e.message().unwrap_or_default().to_string();
        tracing::debug!("replica fetch refused: {message}");
        say(whole, troubles.failed(whole.to_string(), message, now));
        return false;
    }
    let by_name: HashMap<(&str, u32), &Followed> =
        followed.iter().map(|f| ((f.queue.as_str(), f.partition), f)).collect();
    let mut progressed = false;
    let mut syncs = Vec::new();
    for q in resp.queues().iter().flatten() {
        let name = q.name().unwrap_or_default();
        for r in q.partitions().iter().flatten() {
            let Some(f) = by_name.get(&(name, r.partition())) else {
                continue;
            };
            // Only while nothing moved since the fetch was made.
            if f.part.following().map(|(_, e)| e) != Some(f.epoch) || f.part.log.log_end() != f.fetch_offset {
                continue;
            }
            // Named only when said or looked up: not per partition and round.
            let what = || format!("{name}/{} from node {leader}", r.partition());
            if let Some(e) = r.error().filter(|e| e.code() != ErrorCode::None) {
                let message = format!("{:?}: {}", e.code(), e.message().unwrap_or_default());
                tracing::debug!(queue = name, partition = r.partition(), "replica fetch: {message}");
                let what = what();
                say(&what, troubles.failed(what.clone(), message, now));
                continue;
            }
            let log = &f.part.log;
            let before = (log.log_end(), log.high_watermark());
            if let Ok(epoch) = u32::try_from(r.diverging_epoch()) {
                let to = truncation_point(
                    &log.epochs(),
                    log.log_end(),
                    LeaderEpoch(epoch),
                    Offset(r.diverging_end_offset()),
                );
                if below_high_watermark(to, log.high_watermark()) {
                    tracing::error!(
                        queue = name,
                        partition = r.partition(),
                        leader,
                        epoch,
                        from = log.log_end().0,
                        to = to.0,
                        high_watermark = log.high_watermark().0,
                        "truncating below the high watermark: the leader's log parts from this one before records \
                         this replica saw committed (an invariant broke: report it); following the leader"
                    );
                } else if to < log.log_end() {
                    tracing::info!(
                        queue = name,
                        partition = r.partition(),
                        from = log.log_end().0,
                        to = to.0,
                        "truncating a diverged log"
                    );
                }
                match cut(&f.part, Cut::At(to)).await {
                    Ok(()) if log.log_end() != f.fetch_offset => progressed = true,
                    Ok(()) => {
                        // Nothing to cut, or not below the high watermark:
                        // the next fetch gets the same answer.
                        let message = format!(
                            "the leader says this log diverges after epoch {epoch} at offset {}; it ends at {} \
                             with high watermark {} and cannot be cut below that",
                            r.diverging_end_offset(),
                            log.log_end().0,
                            log.high_watermark().0
                        );
                        let what = what();
                        say(&what, troubles.failed(what.clone(), message, now));
                    }
                    Err(e) => tracing::warn!(queue = name, partition = r.partition(), "truncating: {e}"),
                }
                continue;
            }
            if r.records_len() == 0 && Offset(r.log_start()) > f.fetch_offset {
                let start = Offset(r.log_start());
                tracing::info!(
                    queue = name,
                    partition = r.partition(),
                    from = f.fetch_offset.0,
                    to = start.0,
                    "behind the leader's log start: starting over there"
                );
                match cut(&f.part, Cut::StartOverAt(start)).await {
                    Ok(()) => progressed = true,
                    Err(e) => tracing::warn!(queue = name, partition = r.partition(), "starting over: {e}"),
                }
                continue;
            }
            if troubles.any() {
                let what = what();
                say(&what, troubles.ok(&what, now));
            }
            let start = r.records_offset() as usize;
            let end = start.saturating_add(r.records_len() as usize);
            if end > frame.tail.len() {
                tracing::warn!(
                    queue = name,
                    partition = r.partition(),
                    "replica fetch: records outside the frame"
                );
                continue;
            }
            // What was appended is made durable (or written, on an
            // interval queue) before the next fetch reports it, also when a
            // later batch of the answer failed.
            let (appended, failed) = append_all(shard, &f.part, frame.tail.slice(start..end)).await;
            if let Some(last) = appended {
                let part = f.part.clone();
                syncs.push(glommio::spawn_local(async move { part.log.wait_durable(last).await }));
            }
            if let Some(e) = failed {
                tracing::warn!(queue = name, partition = r.partition(), "replica append: {e}");
            }
            let hw = Offset(r.high_watermark()).min(log.log_end());
            if log.advance_high_watermark(hw) {
                shard.partitions.new_data.notify_all();
            }
            // What the leader deleted (a `__groups` compaction, its
            // retention) goes here too, once committed here.
            if Offset(r.log_start()) > log.log_start() {
                if let Err(e) = log.delete_before(Offset(r.log_start())).await {
                    tracing::warn!(
                        queue = name,
                        partition = r.partition(),
                        "following the leader's log start: {e}"
                    );
                }
            }
            progressed |= (log.log_end(), log.high_watermark()) != before;
        }
    }
    for sync in syncs {
        // A failed write or sync fails the log: the next fetch reports only
        // what it wrote ([`held_end`]), so the leader never counts it.
        if let Err(e) = sync.await {
            tracing::warn!("replica write or fdatasync failed (the log reports only what it wrote): {e}");
        }
    }
    progressed
}

/// The end a follower tells its leader it holds: its log end, or, once
/// its log failed (a write or fdatasync refused: a full disk, a stopped
/// journal), only what it wrote — batches it appended to memory and never
/// wrote must not count toward the leader's high watermark (an acks=all
/// record would be acknowledged with one copy fewer than it claims). A
/// queue with `fsync = always` counts only what was fdatasync'd: a failed
/// fdatasync may have dropped written pages (the kernel marks them clean),
/// and that queue promises every acknowledged record on a disk.
fn held_end(log: &strand_storage::Log) -> Offset {
    if !log.failed() {
        return log.log_end();
    }
    let kept = match log.config().fsync {
        strand_storage::FsyncPolicy::Always => log.flushed_offset(),
        strand_storage::FsyncPolicy::Interval { .. } => log.written_offset(),
    };
    kept.min(log.log_end())
}

/// Appends the leader's batches in `records` to a follower's log, in
/// order (the log notes their producers), each checked first (CRC and
/// framing). Returns the last offset appended (also when a later batch failed) and
/// the failure, if one stopped it.
async fn append_all(shard: &Shard, part: &Partition, mut records: Bytes) -> (Option<Offset>, Option<String>) {
    let Ok(_turn) = part.appending.acquire_permit(1).await else {
        return (None, Some("the partition is closing".to_string()));
    };
    if part.following().is_none() {
        return (None, None);
    }
    let mut last = None;
    let mut failed = None;
    while !records.is_empty() {
        let len = strand_storage::batch::batch_length(&records).unwrap_or(0) as usize;
        if len < strand_storage::batch::HEADER_LEN || len > records.len() {
            failed = Some(format!("a batch of {len} bytes in {} bytes of records", records.len()));
            break;
        }
        // A slice of the answer's frame, not a copy (nor is its clone).
        let batch = records.split_to(len);
        // The append checks its CRC and framing, as a produce's: a leader's
        // log damaged on its disk below what it checked at open must not
        // spread to its followers (the fetch fails, is said, and is tried
        // again; the partition stays under-replicated until another
        // replica leads).
        match part.log.append_replica(batch.clone()).await {
            Ok(info) => last = Some(info.last_offset),
            Err(e @ strand_storage::StorageError::InvalidBatch(_)) => {
                // Said with its offset (the check runs again only here).
                failed = Some(check_from_leader(&batch).err().unwrap_or_else(|| e.to_string()));
                break;
            }
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    if last.is_some() && matches!(part.log.config().fsync, FsyncPolicy::Interval { .. }) {
        shard.partitions.interval_appends.notify_all();
    }
    (last, failed)
}

/// A batch from the leader, checked as a produce's is (CRC and framing);
/// the refusal names its offset. Run only for a batch the log refused.
fn check_from_leader(batch: &[u8]) -> Result<(), String> {
    strand_storage::batch::check_frame(batch, usize::MAX)
        .map(drop)
        .map_err(|e| {
            let at = strand_storage::batch::BatchHeader::parse(batch).map_or_else(
                || "an unreadable offset".to_string(),
                |h| format!("offset {}", h.base_offset),
            );
            format!("a corrupt batch from the leader at {at}: {e} (not appended; the fetch is tried again)")
        })
}

/// How a follower's log goes back into step with its leader's.
enum Cut {
    /// Truncated at this offset (a diverged tail).
    At(Offset),
    /// Emptied to go on from the leader's log start.
    StartOverAt(Offset),
}

/// Cuts a follower's log (under the append turn; the log rebuilds its
/// producer table without the batches cut off).
async fn cut(part: &Partition, cut: Cut) -> Result<(), String> {
    let _turn = part
        .appending
        .acquire_permit(1)
        .await
        .map_err(|_| "the partition is closing".to_string())?;
    let done = match cut {
        Cut::At(to) if to >= part.log.log_end() => return Ok(()),
        Cut::At(to) => part.log.truncate_to(to).await.map(|_| ()),
        Cut::StartOverAt(at) => part.log.start_over_at(at).await,
    };
    done.map_err(|e| e.to_string())
}

/// Every `ISR_EVERY`, proposes the ISR each led partition wants.
fn start_isr_upkeep(shard: &Rc<Shard>) {
    let s = shard.clone();
    glommio::spawn_local(async move {
        while !s.stopping.get() {
            glommio::timer::sleep(ISR_EVERY).await;
            let now = mono_ms();
            let table = s.table();
            // The controller refuses a fenced broker into an ISR: not asked
            // for.
            let alive = |id: &NodeId| table.brokers.get(id).is_some_and(|b| b.alive);
            for ((queue, partition), part) in s.partitions.all() {
                let proposal = match &mut *part.role.borrow_mut() {
                    Role::Leader { epoch, state } => state
                        .wanted_isr(now)
                        // Fenced joiners left out; the rest of the change
                        // (a lagging member's removal) still goes.
                        .map(|mut isr| {
                            isr.retain(|id| alive(id) || state.isr().contains(id));
                            isr
                        })
                        .filter(|isr| {
                            let mut now = state.isr().to_vec();
                            now.sort_unstable();
                            *isr != now
                        })
                        .map(|isr| {
                            tracing::info!(
                                queue = %queue,
                                partition,
                                epoch = *epoch,
                                partition_epoch = state.partition_epoch(),
                                from = ?state.isr(),
                                to = ?isr,
                                high_watermark = state.high_watermark().0,
                                followers = ?state.follower_positions(),
                                "proposing an ISR change"
                            );
                            state.proposing(isr.clone());
                            Command::AlterIsr {
                                queue: queue.clone(),
                                partition,
                                leader: s.config.node_id,
                                leader_epoch: *epoch,
                                partition_epoch: state.partition_epoch(),
                                isr,
                            }
                        }),
                    Role::Follower { .. } => None,
                };
                if let Some(command) = proposal {
                    let s = s.clone();
                    glommio::spawn_local(async move { propose_isr(&s, &part, command).await }).detach();
                }
            }
        }
    })
    .detach();
}

/// Commits an ISR change: retried while the answer is lost and the
/// partition is still where the proposal saw it; a refusal ends it.
async fn propose_isr(shard: &Rc<Shard>, part: &Partition, command: Command) {
    let Command::AlterIsr {
        leader_epoch,
        partition_epoch,
        ..
    } = command
    else {
        return;
    };
    // The proposal is still the one in flight.
    let current = || match &*part.role.borrow() {
        Role::Leader { epoch, state } => *epoch == leader_epoch && state.partition_epoch() == partition_epoch,
        Role::Follower { .. } => false,
    };
    loop {
        match shard.propose(command.clone()).await {
            // The table applied on return ended the proposal
            // (`LeaderState::on_partition`).
            Ok(()) => return,
            Err(ProposeError::Refused(e)) => {
                tracing::info!("ISR change refused: {e}");
                // The partition moved on: perhaps by this very proposal,
                // committed on a try whose answer was lost
                // (`LeaderState::on_refused`).
                let moved_on = matches!(e, ControllerError::StaleIsrChange { .. });
                // Only the proposal this was: a newer one may be in flight.
                if let Role::Leader { epoch, state } = &mut *part.role.borrow_mut() {
                    if *epoch == leader_epoch && state.partition_epoch() == partition_epoch {
                        state.on_refused(moved_on);
                    }
                }
                if part.note_local() {
                    shard.partitions.new_data.notify_all();
                }
                return;
            }
            Err(ProposeError::Unavailable(why)) => {
                tracing::debug!("ISR change not committed yet ({why}); retrying");
                glommio::timer::sleep(Duration::from_millis(500)).await;
                if !current() || shard.stopping.get() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Issue 41, item 6: a follower whose write failed (here its shard
    /// journal stopped, as on a full disk) reports only what it wrote; it
    /// reported the batch it appended to memory, and the leader counted it
    /// toward the high watermark.
    #[test]
    fn a_follower_whose_write_failed_reports_only_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        strand_storage::testkit::run_on_executor(move || async move {
            use strand_storage::testkit::{batch, stamp_at};
            let storage = strand_storage::ShardStorage::open(&path, Default::default())
                .await
                .unwrap();
            let journal = strand_storage::journal::JournalConfig {
                file_bytes: 1 << 20,
                spare_files: 1,
                ..Default::default()
            };
            storage.start_journal(&path.join("__journal"), journal).await.unwrap();
            let config = strand_storage::LogConfig {
                retention_ms: None,
                ..Default::default()
            };
            let log = storage.open_log(path.join("q/0"), config).await.unwrap();
            assert!(log.journaled());
            let first = log
                .append_replica(stamp_at(batch(1, 3, 10, 0), 0).into_bytes())
                .await
                .unwrap();
            log.wait_durable(first.last_offset).await.unwrap();
            assert_eq!(held_end(&log), Offset(3));
            storage.stop_journal("the test stops it").await;
            let refused = log.append_replica(stamp_at(batch(2, 4, 10, 0), 3).into_bytes()).await;
            let failed = match refused {
                Err(_) => true,
                Ok(info) => log.wait_durable(info.last_offset).await.is_err(),
            };
            assert!(failed && log.failed(), "the write failed");
            assert_eq!(held_end(&log), Offset(3), "log end {:?}", log.log_end());
        });
    }

    /// A follower takes no batch whose bytes changed on the leader's disk
    /// (a strand-chaos corrupt nemesis flips bytes inside segments).
    #[test]
    fn a_follower_refuses_a_corrupt_batch_from_its_leader() {
        use strand_storage::testkit::{batch, stamp_at};
        let good = stamp_at(batch(1, 3, 10, 0), 7).into_bytes();
        check_from_leader(&good).unwrap();
        for at in [20, good.len() / 2, good.len() - 1] {
            let mut bad = good.to_vec();
            bad[at] ^= 0x10;
            let why = check_from_leader(&bad).unwrap_err();
            assert!(why.contains("a corrupt batch from the leader"), "{why}");
        }
    }

    #[test]
    fn a_fetch_trouble_is_said_once_it_lasts_then_now_and_then_and_its_end_once() {
        let mut t = Troubles::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let p = || "q/0 from node 2".to_string();
        assert_eq!(t.failed(p(), "NotLeader: a".into(), at(0)), Say::Nothing);
        assert_eq!(t.failed(p(), "NotLeader: b".into(), at(9)), Say::Nothing);
        assert_eq!(
            t.failed(p(), "OffsetOutOfRange: c".into(), at(10)),
            Say::Lasting(Duration::from_secs(10), "OffsetOutOfRange: c".into())
        );
        assert_eq!(t.failed(p(), "c".into(), at(39)), Say::Nothing);
        assert!(matches!(t.failed(p(), "c".into(), at(40)), Say::Lasting(d, _) if d == Duration::from_secs(40)));
        // Another partition's trouble is its own.
        assert_eq!(t.failed("q/1 from node 2".into(), "x".into(), at(40)), Say::Nothing);
        assert_eq!(t.ok(&p(), at(45)), Say::Ended(Duration::from_secs(45)));
        assert_eq!(t.ok(&p(), at(46)), Say::Nothing);
        // A short trouble that was never said ends quietly, and starts over.
        assert_eq!(t.ok("q/1 from node 2", at(41)), Say::Nothing);
        assert_eq!(t.failed("q/1 from node 2".into(), "x".into(), at(50)), Say::Nothing);
    }
}
