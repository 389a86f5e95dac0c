//! The second workload: ack mode with poison records (`--jobs`).
//!
//! A queue `chaos-jobs` (2 partitions, RF 3, `max_delivery_attempts` =
//! [`MAX_ATTEMPTS`]) takes keyed `jK:SEQ` records from one producer
//! (acks=all, about [`JOBS_PER_S`] a second); every tenth SEQ is poison. Two
//! members of the ack-mode group `chaos-workers` receive them: a good
//! record is acked, a poison one nacked (no delay) every time it comes,
//! so the broker must dead-letter it to `chaos-jobs.dlq` after exactly
//! [`MAX_ATTEMPTS`] deliveries. Every delivery's attempt number is
//! recorded. After the heal the run waits until the group's position has
//! passed every acknowledged job (each one acked or dead-lettered), then
//! reads the dead-letter queue back; `checker::check_jobs` judges it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strand_client::{
    block_on, Acks, Admin, ConsumedRecord, ConsumerConfig, GroupConfig, GroupStart, ProducerConfig, QueueSpec,
};

use crate::checker::{Acked, DeadLetter, JobsHistory};
use crate::workload::{as_member, identity, padded, Shared};

pub const QUEUE: &str = "chaos-jobs";
pub const GROUP: &str = "chaos-workers";
pub const MAX_ATTEMPTS: u32 = 3;
/// The jobs producer's pace (the queue workload stays the main load).
const JOBS_PER_S: u64 = 20;
const KEYS: u64 = 8;

/// Whether the job `KEY:SEQ` is poison (every tenth SEQ).
pub fn is_poison(id: &str) -> bool {
    id.rsplit_once(':')
        .and_then(|(_, seq)| seq.parse::<u64>().ok())
        .is_some_and(|seq| seq % 10 == 0)
}

/// Creates the jobs queue.
pub fn create(admin: &Admin) -> Result<(), String> {
    let spec = QueueSpec {
        partitions: Some(2),
        replication_factor: Some(3),
        max_delivery_attempts: Some(MAX_ATTEMPTS),
        ..QueueSpec::default()
    };
    block_on(admin.create_queue(QUEUE, &spec)).map_err(|e| format!("creating {QUEUE}: {e}"))
}

/// The jobs producer (one thread) until producing stops.
pub fn producer(
    bootstrap: &str,
    record_bytes: usize,
    shared: &Arc<Shared>,
    jobs: &Arc<Mutex<JobsHistory>>,
) -> JoinHandle<()> {
    let (bootstrap, shared, jobs) = (bootstrap.to_string(), shared.clone(), jobs.clone());
    std::thread::spawn(move || {
        let config = ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(10),
            ..ProducerConfig::default()
        };
        let Some(producer) = crate::workload::connect_producer(&bootstrap, config, &shared) else {
            return;
        };
        let mut seqs = [0u64; KEYS as usize];
        let mut i = 0u64;
        while !shared.stop_producing.load(Ordering::SeqCst) {
            let k = (i % KEYS) as usize;
            i += 1;
            seqs[k] += 1;
            let key = format!("j{k}");
            let id = format!("{key}:{}", seqs[k]);
            lock(&jobs).attempted.insert(id.clone());
            let sent = block_on(producer.send(QUEUE, Some(key.as_bytes()), &padded(&id, record_bytes), &[]));
            if let Ok(d) = sent {
                let acked = Acked {
                    value: id,
                    partition: d.partition,
                    offset: d.offset.unwrap_or(u64::MAX),
                    at_ms: shared.ms(),
                };
                lock(&jobs).acked.push(acked);
            }
            std::thread::sleep(Duration::from_millis(1000 / JOBS_PER_S));
        }
    })
}

fn lock(jobs: &Mutex<JobsHistory>) -> std::sync::MutexGuard<'_, JobsHistory> {
    jobs.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` ack-mode workers until consuming stops: good jobs acked, poison
/// nacked; every delivery's attempt recorded.
pub fn workers(bootstrap: &str, n: usize, shared: &Arc<Shared>, jobs: &Arc<Mutex<JobsHistory>>) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (bootstrap, shared, jobs) = (bootstrap.to_string(), shared.clone(), jobs.clone());
            std::thread::spawn(move || {
                let config = || GroupConfig {
                    start: GroupStart::Earliest,
                    auto_commit: false,
                    session_timeout: Duration::from_secs(6),
                    lock: Duration::from_secs(5),
                    consumer: ConsumerConfig {
                        max_wait: Duration::from_millis(200),
                        ..ConsumerConfig::default()
                    },
                    ..GroupConfig::default()
                };
                as_member(&bootstrap, GROUP, QUEUE, config, &shared, |member| {
                    for r in block_on(member.receive(16)).map_err(drop)? {
                        let Some(value) = r.record.value.as_deref() else {
                            continue;
                        };
                        let id = identity(value);
                        lock(&jobs).deliveries.entry(id.clone()).or_default().push(r.attempt);
                        // A settle that fails leaves the record to its lock:
                        // it comes again, its count going on.
                        let _ = match is_poison(&id) {
                            true => block_on(member.nack(&r.record, Duration::ZERO, "poison")),
                            false => block_on(member.ack(&r.record)),
                        };
                    }
                    Ok(())
                });
            })
        })
        .collect()
}

/// The group's position per partition (none while it cannot be read).
pub fn positions(bootstrap: &str) -> Option<BTreeMap<u32, u64>> {
    let admin = Admin::connect(bootstrap).ok()?;
    let d = block_on(admin.describe_group(GROUP)).ok()?;
    Some(
        d.partitions
            .into_iter()
            .filter(|p| &*p.queue == QUEUE)
            .filter_map(|p| Some((p.partition, p.position?)))
            .collect(),
    )
}

/// Waits (at most `limit`) until the group's position has passed every
/// acknowledged job; returns the last positions seen.
pub fn settle(bootstrap: &str, jobs: &Mutex<JobsHistory>, limit: Duration) -> BTreeMap<u32, u64> {
    let deadline = Instant::now() + limit;
    let mut last = BTreeMap::new();
    loop {
        if let Some(now) = positions(bootstrap) {
            last = now;
        }
        let done = lock(jobs)
            .acked
            .iter()
            .all(|a| last.get(&a.partition).is_some_and(|p| *p > a.offset));
        if done || Instant::now() > deadline {
            return last;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Everything the dead-letter queue holds (nothing if it was never made).
pub fn dead_letters(bootstrap: &str, limit: Duration) -> Result<Vec<DeadLetter>, String> {
    let dlq = format!("{QUEUE}.dlq");
    let admin = Admin::connect(bootstrap).map_err(|e| e.to_string())?;
    if block_on(admin.describe_queue(&dlq)).is_err() {
        return Ok(Vec::new());
    }
    let header = |r: &ConsumedRecord, name: &str| {
        r.headers
            .iter()
            .find(|(k, _)| &k[..] == name.as_bytes())
            .and_then(|(_, v)| v.as_ref())
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
    };
    let records = crate::workload::read_all(bootstrap, &dlq, limit)?;
    Ok(records
        .iter()
        .map(|r| DeadLetter {
            value: r.value.as_deref().map(identity).unwrap_or_default(),
            source: header(r, "strand.source.partition")
                .zip(header(r, "strand.source.offset"))
                .map(|(p, o)| (p as u32, o)),
            attempts: header(r, "strand.attempts").map(|a| a as u32),
        })
        .collect())
}
