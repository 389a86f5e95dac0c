//! The checker: what the workload saw against what the healed cluster
//! holds. Pure (the run collects a [`History`]; this judges it).
//!
//! Every value the producers send is `KEY:SEQ` (unique; SEQ counts up per
//! key), so each stored record says which send it came from.
//! - **lost**: acknowledged, and stored nowhere;
//! - **misplaced**: acknowledged at (partition, offset), but stored there
//!   with another value (it may also be stored elsewhere);
//! - **duplicates**: copies of one send beyond the first (the idempotent
//!   producer should make them zero);
//! - **reordered**: a key's record stored after a record of the same key
//!   with a higher SEQ (per partition, in offset order);
//! - **phantoms**: stored values never sent;
//! - **commits_backwards**: a group's committed position of a partition
//!   seen lower than it was seen before;
//! - **unconsumed**: acknowledged records the consumer group never
//!   delivered (it reads at least once);
//! - **inconsistent_offsets**: one (partition, offset) seen with two
//!   values over time (by the consumers as they read, or in the final
//!   read): two histories of one log (Jepsen's Kafka checker's
//!   "inconsistent offsets");
//! - **truncated_reads**: a record a consumer read that the final read
//!   shows gone from its offset (a read of data later truncated: it was
//!   never really committed);
//! - **gaps**: offsets missing between two stored records of a partition
//!   (a log's offsets are contiguous from its start);
//! - **unavailable_s**: the longest time without an acknowledgement while
//!   producers were sending.

use std::collections::{BTreeMap, HashMap, HashSet};

/// An acknowledged send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub value: String,
    pub partition: u32,
    pub offset: u64,
    /// Milliseconds since the workload started.
    pub at_ms: u64,
}

/// A record read back from the healed cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub partition: u32,
    pub offset: u64,
    pub value: String,
}

/// What a run saw.
#[derive(Debug, Default)]
pub struct History {
    /// Every value a producer tried to send.
    pub attempted: HashSet<String>,
    pub acked: Vec<Acked>,
    /// Sends that failed (their outcome is unknown: they may be stored).
    pub failed: usize,
    /// The failed sends by kind of error ([`failure_kind`]): how many, and
    /// how long they took together (ms), to tell fast refusals from
    /// sends that waited out their delivery timeout.
    pub failures: BTreeMap<String, Failures>,
    /// Everything the cluster holds afterwards.
    pub stored: Vec<Stored>,
    /// Every value the consumer group delivered.
    pub consumed: HashSet<String>,
    /// Every record the consumers read, as they read it: (partition,
    /// offset, value).
    pub reads: Vec<(u32, u64, String)>,
    /// Samples of the group's committed positions: (ms, partition, position).
    pub positions: Vec<(u64, u32, u64)>,
    /// When the producers stopped (ms since the start).
    pub ended_ms: u64,
}

/// Failed sends of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failures {
    pub count: usize,
    pub total_ms: u64,
}

/// The kind of a failed send, for counting: the broker's error code, or the
/// client error's variant; a timeout names the last error it retried on
/// when the message gives its code (`Timeout(NotLeader)`).
pub fn failure_kind(e: &strand_client::ClientError) -> String {
    use strand_client::ClientError as E;
    match e {
        E::Broker { code, .. } => format!("{code:?}"),
        E::Io { .. } => "Io".into(),
        E::Tls { .. } => "Tls".into(),
        E::Authentication(_) => "Authentication".into(),
        E::Protocol(_) => "Protocol".into(),
        E::Invalid(_) => "Invalid".into(),
        E::MessageTooLarge { .. } => "MessageTooLarge".into(),
        E::BufferFull { .. } => "BufferFull".into(),
        E::Closed => "Closed".into(),
        E::Timeout(message) => match last_code(message) {
            Some(code) => format!("Timeout({code})"),
            None if message.contains("(last error: connection to") => "Timeout(Io)".into(),
            None => "Timeout".into(),
        },
    }
}

/// The error code at the end of a timeout's message, `... (last error: ...
/// (Code))`: the broker error's `Display` ends with its code in brackets.
fn last_code(message: &str) -> Option<&str> {
    let rest = message.strip_suffix("))")?;
    let (_, code) = rest.rsplit_once('(')?;
    (!code.is_empty() && code.chars().all(|c| c.is_ascii_alphanumeric())).then_some(code)
}

/// The checker's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    pub acked: usize,
    pub failed: usize,
    pub failures: BTreeMap<String, Failures>,
    pub stored: usize,
    pub lost: usize,
    pub misplaced: usize,
    pub duplicates: usize,
    pub reordered: usize,
    pub phantoms: usize,
    pub commits_backwards: usize,
    pub unconsumed: usize,
    pub inconsistent_offsets: usize,
    pub truncated_reads: usize,
    pub gaps: usize,
    pub unavailable_ms: u64,
    /// When that longest stretch began (ms since the start).
    pub unavailable_from_ms: u64,
    /// A few examples of each violation, for the summary.
    pub examples: Vec<String>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.lost
            + self.misplaced
            + self.duplicates
            + self.reordered
            + self.phantoms
            + self.commits_backwards
            + self.unconsumed
            + self.inconsistent_offsets
            + self.truncated_reads
            + self.gaps
    }
}

impl Verdict {
    /// The violations of an acks=1 queue's history: a leader's
    /// acknowledgement promises no copy elsewhere, so lost records (and the
    /// offsets they held taken by others: misplaced) are not counted,
    /// whether or not a leader failed (the checker does not tie a loss to a
    /// fault); the rest are. (No group reads it: nothing is unconsumed.)
    pub fn acks_one_violations(&self) -> usize {
        self.violations() - self.lost - self.misplaced - self.unconsumed
    }
}

/// The key and SEQ of a value `KEY:SEQ`.
fn split(value: &str) -> Option<(&str, u64)> {
    let (key, seq) = value.rsplit_once(':')?;
    Some((key, seq.parse().ok()?))
}

pub fn check(h: &History) -> Verdict {
    let mut v = Verdict {
        acked: h.acked.len(),
        failed: h.failed,
        failures: h.failures.clone(),
        stored: h.stored.len(),
        ..Verdict::default()
    };
    let example = |v: &mut Verdict, what: String| {
        if v.examples.len() < 10 {
            v.examples.push(what);
        }
    };
    let at: HashMap<(u32, u64), &str> = h
        .stored
        .iter()
        .map(|s| ((s.partition, s.offset), s.value.as_str()))
        .collect();
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for s in &h.stored {
        *copies.entry(s.value.as_str()).or_default() += 1;
    }
    for a in &h.acked {
        match at.get(&(a.partition, a.offset)) {
            Some(value) if *value == a.value => {}
            Some(other) => {
                v.misplaced += 1;
                example(
                    &mut v,
                    format!("{} acked at {}/{} holds {other}", a.value, a.partition, a.offset),
                );
            }
            None if copies.contains_key(a.value.as_str()) => {
                v.misplaced += 1;
                example(
                    &mut v,
                    format!("{} acked at {}/{}, stored elsewhere", a.value, a.partition, a.offset),
                );
            }
            None => {
                v.lost += 1;
                example(
                    &mut v,
                    format!("{} acked at {}/{} is gone", a.value, a.partition, a.offset),
                );
            }
        }
        if !h.consumed.contains(&a.value) {
            v.unconsumed += 1;
            example(&mut v, format!("{} was never delivered to the group", a.value));
        }
    }
    for (value, n) in &copies {
        if *n > 1 {
            v.duplicates += n - 1;
            example(&mut v, format!("{value} stored {n} times"));
        }
        if !h.attempted.contains(*value) {
            v.phantoms += 1;
            example(&mut v, format!("{value} stored but never sent"));
        }
    }
    // Per partition in offset order, each key's SEQ only grows.
    let mut by_place: Vec<&Stored> = h.stored.iter().collect();
    by_place.sort_by_key(|s| (s.partition, s.offset));
    let mut highest: HashMap<(u32, &str), u64> = HashMap::new();
    for s in by_place {
        if let Some((key, seq)) = split(&s.value) {
            let top = highest.entry((s.partition, key)).or_insert(seq);
            if seq < *top {
                v.reordered += 1;
                example(
                    &mut v,
                    format!("{} at {}/{} after SEQ {top}", s.value, s.partition, s.offset),
                );
            }
            *top = (*top).max(seq);
        }
    }
    // Every value each offset was seen with, read as the run went and
    // read at the end.
    let mut seen_at: HashMap<(u32, u64), HashSet<&str>> = HashMap::new();
    for (p, o, value) in &h.reads {
        seen_at.entry((*p, *o)).or_default().insert(value.as_str());
    }
    for s in &h.stored {
        seen_at
            .entry((s.partition, s.offset))
            .or_default()
            .insert(s.value.as_str());
    }
    let mut places: Vec<(&(u32, u64), &HashSet<&str>)> = seen_at.iter().filter(|(_, vs)| vs.len() > 1).collect();
    places.sort_by_key(|(at, _)| **at);
    for ((p, o), values) in places {
        v.inconsistent_offsets += 1;
        let mut values: Vec<&&str> = values.iter().collect();
        values.sort();
        example(&mut v, format!("{p}/{o} seen holding {values:?}"));
    }
    let mut truncated: Vec<(u32, u64, &str)> = h
        .reads
        .iter()
        .filter(|(p, o, _)| !at.contains_key(&(*p, *o)))
        .map(|(p, o, value)| (*p, *o, value.as_str()))
        .collect();
    truncated.sort();
    truncated.dedup_by_key(|(p, o, _)| (*p, *o));
    for (p, o, value) in truncated {
        v.truncated_reads += 1;
        example(&mut v, format!("{value} read at {p}/{o} is gone from the log"));
    }
    let mut offsets: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for s in &h.stored {
        offsets.entry(s.partition).or_default().push(s.offset);
    }
    for (p, mut os) in offsets {
        os.sort_unstable();
        os.dedup();
        for w in os.windows(2) {
            if w[1] > w[0] + 1 {
                v.gaps += (w[1] - w[0] - 1) as usize;
                example(
                    &mut v,
                    format!("partition {p} has no record at offsets {}..{}", w[0] + 1, w[1]),
                );
            }
        }
    }
    // Committed positions per partition, in time order.
    let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
    let mut samples = h.positions.clone();
    samples.sort_by_key(|(ms, p, _)| (*ms, *p));
    for (ms, p, position) in samples {
        let last = seen.entry(p).or_insert(position);
        if position < *last {
            v.commits_backwards += 1;
            example(
                &mut v,
                format!("partition {p}'s committed position went {last} → {position} at {ms} ms"),
            );
        }
        *last = (*last).max(position);
    }
    let mut times: Vec<u64> = h.acked.iter().map(|a| a.at_ms).collect();
    times.sort_unstable();
    times.push(h.ended_ms);
    let (from, gap) = times
        .windows(2)
        .map(|w| (w[0], w[1].saturating_sub(w[0])))
        .max_by_key(|(_, gap)| *gap)
        .unwrap_or((0, h.ended_ms));
    (v.unavailable_ms, v.unavailable_from_ms) = (gap, from);
    v
}

/// A record read back from the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The `KEY:SEQ` it carries.
    pub value: String,
    /// `strand.source.partition` and `strand.source.offset`.
    pub source: Option<(u32, u64)>,
    /// `strand.attempts`.
    pub attempts: Option<u32>,
}

/// What the ack-mode jobs workload saw (`jobs.rs`).
#[derive(Debug, Default)]
pub struct JobsHistory {
    pub max_attempts: u32,
    /// Every job a producer tried to send.
    pub attempted: HashSet<String>,
    pub acked: Vec<Acked>,
    /// The attempt number of every delivery, per job.
    pub deliveries: HashMap<String, Vec<u32>>,
    /// The group's final position per partition.
    pub positions: BTreeMap<u32, u64>,
    /// The dead-letter queue, read back.
    pub dead: Vec<DeadLetter>,
}

/// The jobs checker's findings:
/// - **poison_live**: an acknowledged poison job the group's position
///   passed that is not in the dead-letter queue (lost);
/// - **unsettled**: an acknowledged job the group's position never passed
///   (neither acked nor dead-lettered);
/// - **dead_duplicates**: dead letters beyond the first of one job;
/// - **dead_wrong**: a dead letter whose `strand.attempts` is not the
///   queue's `max_delivery_attempts`, or whose source is not where the job
///   was acknowledged;
/// - **over_delivered**: a delivery numbered above `max_delivery_attempts`
///   (a job must go to the dead-letter queue instead);
/// - **dead_phantoms**: dead letters of jobs never sent;
/// - **counts_back**: a job delivered twice with the same attempt number
///   (its delivery count went back: a delivery is recorded in `__groups`
///   before it is handed out, so each attempt number comes once).
///
/// Good jobs dead-lettered are counted, not violations: a job whose lock
/// ran out `max_delivery_attempts` times (its worker paused or killed) is
/// dead-lettered by design.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobsVerdict {
    pub acked: usize,
    pub poison: usize,
    pub dead_lettered: usize,
    pub good_dead_lettered: usize,
    pub poison_live: usize,
    pub unsettled: usize,
    pub dead_duplicates: usize,
    pub dead_wrong: usize,
    pub over_delivered: usize,
    pub dead_phantoms: usize,
    pub counts_back: usize,
    pub examples: Vec<String>,
}

impl JobsVerdict {
    pub fn violations(&self) -> usize {
        self.poison_live
            + self.unsettled
            + self.dead_duplicates
            + self.dead_wrong
            + self.over_delivered
            + self.dead_phantoms
            + self.counts_back
    }
}

/// Judges the jobs workload; `poison` says which jobs are poison.
pub fn check_jobs(h: &JobsHistory, poison: impl Fn(&str) -> bool) -> JobsVerdict {
    let mut v = JobsVerdict {
        acked: h.acked.len(),
        dead_lettered: h.dead.len(),
        ..JobsVerdict::default()
    };
    let example = |v: &mut JobsVerdict, what: String| {
        if v.examples.len() < 10 {
            v.examples.push(what);
        }
    };
    let mut dead: HashMap<&str, Vec<&DeadLetter>> = HashMap::new();
    for d in &h.dead {
        dead.entry(d.value.as_str()).or_default().push(d);
        if !h.attempted.contains(&d.value) {
            v.dead_phantoms += 1;
            example(&mut v, format!("{} dead-lettered but never sent", d.value));
        }
        if d.attempts != Some(h.max_attempts) {
            v.dead_wrong += 1;
            example(
                &mut v,
                format!(
                    "{} dead-lettered after {:?} attempts, not {}",
                    d.value, d.attempts, h.max_attempts
                ),
            );
        }
    }
    for (value, copies) in &dead {
        if copies.len() > 1 {
            v.dead_duplicates += copies.len() - 1;
            example(&mut v, format!("{value} dead-lettered {} times", copies.len()));
        }
        if !poison(value) {
            v.good_dead_lettered += 1;
        }
    }
    for a in &h.acked {
        let bad = poison(&a.value);
        v.poison += usize::from(bad);
        let passed = h.positions.get(&a.partition).is_some_and(|p| *p > a.offset);
        if !passed {
            v.unsettled += 1;
            example(
                &mut v,
                format!("job {} at {}/{} never settled", a.value, a.partition, a.offset),
            );
            continue;
        }
        match dead.get(a.value.as_str()) {
            None if bad => {
                v.poison_live += 1;
                example(&mut v, format!("poison {} passed but not dead-lettered", a.value));
            }
            Some(copies) if copies.iter().any(|d| d.source != Some((a.partition, a.offset))) => {
                v.dead_wrong += 1;
                example(
                    &mut v,
                    format!(
                        "{} acked at {}/{}, dead-lettered from {:?}",
                        a.value, a.partition, a.offset, copies[0].source
                    ),
                );
            }
            _ => {}
        }
    }
    for (value, attempts) in &h.deliveries {
        if let Some(n) = attempts.iter().find(|n| **n > h.max_attempts) {
            v.over_delivered += 1;
            example(
                &mut v,
                format!("{value} delivered as attempt {n} of {}", h.max_attempts),
            );
        }
        let mut seen = attempts.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            v.counts_back += 1;
            example(
                &mut v,
                format!("{value} delivered as attempts {attempts:?}: its count went back"),
            );
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history() -> History {
        let mut h = History {
            ended_ms: 1_000,
            ..History::default()
        };
        for (i, value) in ["a:1", "a:2", "b:1", "a:3"].iter().enumerate() {
            h.attempted.insert(value.to_string());
            h.acked.push(Acked {
                value: value.to_string(),
                partition: 0,
                offset: i as u64,
                at_ms: 100 * (i as u64 + 1),
            });
            h.stored.push(Stored {
                partition: 0,
                offset: i as u64,
                value: value.to_string(),
            });
            h.consumed.insert(value.to_string());
        }
        h.positions = vec![(100, 0, 1), (200, 0, 3), (300, 0, 3)];
        h
    }

    #[test]
    fn failures_are_counted_by_the_error_that_ended_them() {
        use strand_client::ClientError;
        use strand_wire::ErrorCode;
        let refused = ClientError::broker(ErrorCode::StorageFull, "the disk is full");
        assert_eq!(failure_kind(&refused), "StorageFull");
        let timed_out = ClientError::Timeout(format!("not acknowledged within 10s (last error: {refused})"));
        assert_eq!(failure_kind(&timed_out), "Timeout(StorageFull)");
        let cut_off = ClientError::Io {
            addr: "10.0.0.1:9092".into(),
            message: "reset (by peer)".into(),
        };
        let timed_out = ClientError::Timeout(format!("not acknowledged within 10s (last error: {cut_off})"));
        assert_eq!(failure_kind(&timed_out), "Timeout(Io)");
        let waited = ClientError::Timeout("the batch waited for its turn past its delivery timeout".into());
        assert_eq!(failure_kind(&waited), "Timeout");
        assert_eq!(failure_kind(&cut_off), "Io");
    }

    #[test]
    fn a_clean_history_passes() {
        let v = check(&history());
        assert_eq!(v.violations(), 0, "{v:?}");
        assert_eq!((v.acked, v.stored), (4, 4));
        // The longest stretch without an ack: the last ack (400) to the end.
        assert_eq!((v.unavailable_ms, v.unavailable_from_ms), (600, 400));
    }

    #[test]
    fn every_kind_of_violation_is_found() {
        let mut h = history();
        // a:2 is lost, b:1 stored twice, a:3 before a:1 elsewhere, a phantom.
        h.stored.retain(|s| s.value != "a:2");
        h.stored.push(Stored {
            partition: 0,
            offset: 9,
            value: "b:1".into(),
        });
        h.stored.push(Stored {
            partition: 1,
            offset: 0,
            value: "c:5".into(),
        });
        h.stored.push(Stored {
            partition: 1,
            offset: 1,
            value: "c:4".into(),
        });
        h.attempted.insert("c:5".into());
        h.positions.push((400, 0, 2));
        h.consumed.remove("b:1");
        let v = check(&h);
        assert_eq!(v.lost, 1, "{v:?}");
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.phantoms, 1, "c:4 was never sent");
        assert_eq!(v.reordered, 1, "c:4 after c:5");
        assert_eq!(v.commits_backwards, 1);
        assert_eq!(v.unconsumed, 1);
        assert_eq!(v.misplaced, 0);
        // An ack whose place holds another value.
        let mut h = history();
        h.stored[1].value = "x:1".into();
        h.attempted.insert("x:1".into());
        assert_eq!(check(&h).misplaced, 1);
    }

    /// What the consumers saw as they read, against the final read.
    #[test]
    fn reads_that_disagree_with_the_log_or_vanish_and_gaps_are_found() {
        let mut h = history();
        h.reads = h
            .stored
            .iter()
            .map(|s| (s.partition, s.offset, s.value.clone()))
            .collect();
        assert_eq!(check(&h).violations(), 0, "reads matching the log");
        // Offset 1 was read holding another value (a history that was cut
        // and written again); offset 7 was read and is gone; a gap.
        h.reads.push((0, 1, "z:9".into()));
        h.reads.push((0, 7, "a:4".into()));
        h.stored.push(Stored {
            partition: 0,
            offset: 6,
            value: "a:5".into(),
        });
        h.attempted.insert("a:5".into());
        let v = check(&h);
        assert_eq!(v.inconsistent_offsets, 1, "{v:?}");
        assert_eq!(v.truncated_reads, 1, "{v:?}");
        assert_eq!(v.gaps, 2, "offsets 4 and 5: {v:?}");
        assert!(
            v.examples.iter().any(|e| e.contains("0/1 seen holding")),
            "{:?}",
            v.examples
        );
    }

    fn jobs() -> JobsHistory {
        let mut h = JobsHistory {
            max_attempts: 3,
            ..JobsHistory::default()
        };
        for (i, value) in ["j0:1", "j0:10", "j1:1"].iter().enumerate() {
            h.attempted.insert(value.to_string());
            h.acked.push(Acked {
                value: value.to_string(),
                partition: 0,
                offset: i as u64,
                at_ms: 0,
            });
        }
        h.deliveries.insert("j0:1".into(), vec![1]);
        h.deliveries.insert("j0:10".into(), vec![1, 2, 3]);
        h.deliveries.insert("j1:1".into(), vec![1]);
        h.positions.insert(0, 3);
        h.dead.push(DeadLetter {
            value: "j0:10".into(),
            source: Some((0, 1)),
            attempts: Some(3),
        });
        h
    }

    fn poison(id: &str) -> bool {
        id.ends_with(":10")
    }

    #[test]
    fn a_clean_jobs_history_passes() {
        let v = check_jobs(&jobs(), poison);
        assert_eq!(v.violations(), 0, "{v:?}");
        assert_eq!((v.acked, v.poison, v.dead_lettered, v.good_dead_lettered), (3, 1, 1, 0));
    }

    #[test]
    fn every_kind_of_jobs_violation_is_found() {
        // The poison job was never dead-lettered, though passed.
        let mut h = jobs();
        h.dead.clear();
        assert_eq!(check_jobs(&h, poison).poison_live, 1);
        // The position stopped before the last job.
        let mut h = jobs();
        h.positions.insert(0, 2);
        assert_eq!(check_jobs(&h, poison).unsettled, 1);
        // Dead-lettered twice, once with the wrong count and source.
        let mut h = jobs();
        h.dead.push(DeadLetter {
            value: "j0:10".into(),
            source: Some((0, 7)),
            attempts: Some(2),
        });
        let v = check_jobs(&h, poison);
        assert_eq!((v.dead_duplicates, v.dead_wrong), (1, 2), "{v:?}");
        // A fourth delivery, and a dead letter of a job never sent.
        let mut h = jobs();
        h.deliveries.get_mut("j0:10").unwrap().push(4);
        h.dead.push(DeadLetter {
            value: "x:1".into(),
            source: None,
            attempts: Some(3),
        });
        let v = check_jobs(&h, poison);
        assert_eq!((v.over_delivered, v.dead_phantoms), (1, 1), "{v:?}");
        // An attempt number twice: the count went back.
        let mut h = jobs();
        h.deliveries.insert("j1:1".into(), vec![1, 2, 1]);
        assert_eq!(check_jobs(&h, poison).counts_back, 1);
        // A good job dead-lettered is counted, not a violation.
        let mut h = jobs();
        h.dead.push(DeadLetter {
            value: "j1:1".into(),
            source: Some((0, 2)),
            attempts: Some(3),
        });
        let v = check_jobs(&h, poison);
        assert_eq!((v.good_dead_lettered, v.violations()), (1, 0), "{v:?}");
    }
}
