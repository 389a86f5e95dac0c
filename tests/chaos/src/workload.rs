//! The queue workload: producers sending keyed `KEY:SEQ` records (padded
//! to the run's record size after a `|`, which the history leaves out) with
//! acks=all, one at a time or pipelined, and with acks=1 pipelined into a
//! queue of its own (each key's SEQ counting up, every acknowledgement
//! recorded with its partition and offset), a consumer group reading and committing
//! after every poll, a sampler of the group's committed positions, and
//! the final read-back of everything the healed cluster holds. All of it
//! through `strand-client`, into one shared [`History`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strand_client::{
    block_on, Acks, Admin, ConsumedRecord, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, GroupStart, Producer,
    ProducerConfig, Seek,
};

use crate::checker::{self, Acked, History, Stored};

/// Keys per producer thread.
const KEYS: usize = 8;

/// The `KEY:SEQ` a record's value starts with (the padding cut off).
pub fn identity(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    match text.split_once('|') {
        Some((id, _)) => id.to_string(),
        None => text.into_owned(),
    }
}

/// `id`, padded with `|` and filler to `bytes` (never shorter than `id`).
pub fn padded(id: &str, bytes: usize) -> Vec<u8> {
    let mut v = id.as_bytes().to_vec();
    if v.len() < bytes {
        v.push(b'|');
        v.resize(bytes, b'.');
    }
    v
}

/// What the workload threads share.
pub struct Shared {
    pub history: Mutex<History>,
    pub start: Instant,
    pub stop_producing: AtomicBool,
    pub stop_consuming: AtomicBool,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            history: Mutex::new(History::default()),
            start: Instant::now(),
            stop_producing: AtomicBool::new(false),
            stop_consuming: AtomicBool::new(false),
        })
    }

    pub fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How a group of producer threads sends.
#[derive(Debug, Clone, Copy)]
pub struct Sending {
    pub acks: Acks,
    /// Records each thread keeps on their way at once (1: it waits for
    /// each acknowledgement before the next send; more: pipelined, up to
    /// this many unanswered, several requests of one partition in flight).
    pub in_flight: usize,
    /// Its keys are `{prefix}{thread}k{i}`.
    pub prefix: &'static str,
}

impl Sending {
    /// One record at a time, acks=all: the workload's first producers.
    pub const ONE_AT_A_TIME: Sending = Sending {
        acks: Acks::All,
        in_flight: 1,
        prefix: "p",
    };
}

/// `n` producer threads, each with its own keys, sending records of
/// `record_bytes` as `sending` says (idempotent, 10 s to deliver) until
/// told to stop.
pub fn producers(
    bootstrap: &str,
    queue: &str,
    n: usize,
    record_bytes: usize,
    shared: &Arc<Shared>,
    sending: Sending,
) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|t| {
            let (bootstrap, queue, shared) = (bootstrap.to_string(), queue.to_string(), shared.clone());
            std::thread::spawn(move || {
                let config = ProducerConfig {
                    acks: sending.acks,
                    delivery_timeout: Duration::from_secs(10),
                    max_in_flight_per_partition: sending.in_flight.clamp(1, 5),
                    ..ProducerConfig::default()
                };
                let Some(producer) = connect_producer(&bootstrap, config, &shared) else {
                    return;
                };
                let keys: Vec<String> = (0..KEYS).map(|i| format!("{}{t}k{i}", sending.prefix)).collect();
                let mut seqs = [0u64; KEYS];
                let mut i = 0;
                let mut pending = std::collections::VecDeque::new();
                while !shared.stop_producing.load(Ordering::SeqCst) {
                    let k = i % KEYS;
                    i += 1;
                    seqs[k] += 1;
                    let value = format!("{}:{}", keys[k], seqs[k]);
                    shared.history().attempted.insert(value.clone());
                    let bytes = padded(&value, record_bytes);
                    let sent_at = Instant::now();
                    match block_on(producer.enqueue(&queue, Some(keys[k].as_bytes()), &bytes, &[])) {
                        Ok(delivery) => pending.push_back((value, sent_at, delivery)),
                        Err(e) => note_outcome(&shared, value, sent_at, Err(e)),
                    }
                    while pending.len() >= sending.in_flight {
                        if let Some((value, sent_at, delivery)) = pending.pop_front() {
                            note_outcome(&shared, value, sent_at, block_on(delivery));
                        }
                    }
                }
                for (value, sent_at, delivery) in pending {
                    note_outcome(&shared, value, sent_at, block_on(delivery));
                }
            })
        })
        .collect()
}

/// Records how the send of `value` (sent at `sent_at`) ended.
fn note_outcome(
    shared: &Shared,
    value: String,
    sent_at: Instant,
    outcome: Result<strand_client::Delivered, strand_client::ClientError>,
) {
    match outcome {
        Ok(d) => {
            let acked = Acked {
                value,
                partition: d.partition,
                offset: d.offset.unwrap_or(u64::MAX),
                at_ms: shared.ms(),
            };
            shared.history().acked.push(acked);
        }
        Err(e) => {
            let took_ms = sent_at.elapsed().as_millis() as u64;
            let mut history = shared.history();
            history.failed += 1;
            let kind = history.failures.entry(checker::failure_kind(&e)).or_default();
            kind.count += 1;
            kind.total_ms += took_ms;
        }
    }
}

/// A producer for `bootstrap`, tried every 200 ms until one connects (none
/// once producing stops).
pub fn connect_producer(bootstrap: &str, config: ProducerConfig, shared: &Shared) -> Option<Producer> {
    loop {
        match Producer::new(bootstrap, config.clone()) {
            Ok(p) => return Some(p),
            Err(_) if !shared.stop_producing.load(Ordering::SeqCst) => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => return None,
        }
    }
}

/// `n` members of `group` reading `queue` from the earliest record,
/// committing after every poll that returned records, until told to stop;
/// a member whose calls keep failing joins again.
pub fn consumers(bootstrap: &str, queue: &str, group: &str, n: usize, shared: &Arc<Shared>) -> Vec<JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let (bootstrap, queue, group, shared) = (
                bootstrap.to_string(),
                queue.to_string(),
                group.to_string(),
                shared.clone(),
            );
            std::thread::spawn(move || {
                let config = || GroupConfig {
                    start: GroupStart::Earliest,
                    session_timeout: Duration::from_secs(6),
                    consumer: ConsumerConfig {
                        max_wait: Duration::from_millis(200),
                        ..ConsumerConfig::default()
                    },
                    ..GroupConfig::default()
                };
                as_member(&bootstrap, &group, &queue, config, &shared, |member| {
                    let records = block_on(member.poll()).map_err(drop)?;
                    if records.is_empty() {
                        return Ok(());
                    }
                    {
                        let mut h = shared.history();
                        for r in &records {
                            if let Some(v) = &r.value {
                                let id = identity(v);
                                h.reads.push((r.partition, r.offset, id.clone()));
                                h.consumed.insert(id);
                            }
                        }
                    }
                    let _ = block_on(member.commit());
                    Ok(())
                });
            })
        })
        .collect()
}

/// Runs `step` as a member of `group` (reading `queue` with `config`)
/// until consuming stops: a member whose step fails is closed and joins
/// again (subscribing is retried every 500 ms).
pub fn as_member(
    bootstrap: &str,
    group: &str,
    queue: &str,
    config: impl Fn() -> GroupConfig,
    shared: &Shared,
    mut step: impl FnMut(&mut GroupConsumer) -> Result<(), ()>,
) {
    while !shared.stop_consuming.load(Ordering::SeqCst) {
        let Ok(mut member) = block_on(GroupConsumer::subscribe(bootstrap, group, &[queue], config())) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        while !shared.stop_consuming.load(Ordering::SeqCst) {
            if step(&mut member).is_err() {
                break;
            }
        }
        let _ = block_on(member.close());
    }
}

/// Samples the group's committed positions every 500 ms until consumers
/// stop.
pub fn sampler(bootstrap: &str, group: &str, shared: &Arc<Shared>) -> JoinHandle<()> {
    let (bootstrap, group, shared) = (bootstrap.to_string(), group.to_string(), shared.clone());
    std::thread::spawn(move || {
        let mut admin = None;
        while !shared.stop_consuming.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(500));
            if admin.is_none() {
                admin = Admin::connect(&bootstrap).ok();
            }
            let Some(a) = admin.as_ref() else { continue };
            match block_on(a.describe_group(&group)) {
                Ok(d) => {
                    let at = shared.ms();
                    let mut h = shared.history();
                    for p in d.partitions {
                        if let Some(position) = p.position {
                            h.positions.push((at, p.partition, position));
                        }
                    }
                }
                Err(_) => admin = None,
            }
        }
    })
}

/// Everything `queue` holds, read from each partition's log start to its
/// high watermark (at most `limit`).
pub fn read_back(bootstrap: &str, queue: &str, limit: Duration) -> Result<Vec<Stored>, String> {
    Ok(read_all(bootstrap, queue, limit)?
        .into_iter()
        .map(|r| Stored {
            partition: r.partition,
            offset: r.offset,
            value: r.value.as_deref().map(identity).unwrap_or_default(),
        })
        .collect())
}

/// Every record of `queue` from each partition's log start to its high
/// watermark (at most `limit`).
pub fn read_all(bootstrap: &str, queue: &str, limit: Duration) -> Result<Vec<ConsumedRecord>, String> {
    let admin = Admin::connect(bootstrap).map_err(|e| e.to_string())?;
    let d = block_on(admin.describe_queue(queue)).map_err(|e| e.to_string())?;
    let want: u64 = d
        .partitions
        .iter()
        .map(|p| p.high_watermark.saturating_sub(p.log_start))
        .sum();
    let config = ConsumerConfig {
        start: Seek::Earliest,
        max_wait: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(bootstrap, config).map_err(|e| e.to_string())?;
    block_on(consumer.assign_all(queue)).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    while (out.len() as u64) < want {
        if Instant::now() > deadline {
            return Err(format!(
                "read back {} of {want} records of {queue} within {limit:?}",
                out.len()
            ));
        }
        out.extend(block_on(consumer.poll()).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// The leader of `queue`'s `partition` now (none if the cluster does not
/// say within 3 s).
pub fn leader_of(bootstrap: &str, queue: &str, partition: u32) -> Option<u8> {
    let (bootstrap, queue) = (bootstrap.to_string(), queue.to_string());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let leader = Admin::connect(&bootstrap)
            .ok()
            .and_then(|a| block_on(a.describe_queue(&queue)).ok())
            .and_then(|d| d.partitions.into_iter().find(|p| p.partition == partition))
            .and_then(|p| u8::try_from(p.leader).ok())
            // Offline (no leader): none to isolate.
            .filter(|leader| *leader != 0);
        let _ = tx.send(leader);
    });
    rx.recv_timeout(Duration::from_secs(3)).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_cut_off_again() {
        assert_eq!(padded("p0k1:7", 16), b"p0k1:7|.........");
        assert_eq!(identity(&padded("p0k1:7", 1000)), "p0k1:7");
        assert_eq!(identity(&padded("p0k1:7", 3)), "p0k1:7");
        assert_eq!(identity(b"p0k1:7"), "p0k1:7");
    }
}
