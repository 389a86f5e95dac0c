//! `strand consume QUEUE`: print messages as they arrive, from every
//! partition of the queue (from `--from`, `latest` by default: only new
//! messages) — or, with `--group G`, from the partitions the group's
//! coordinator assigns this member, committing the positions after each
//! polled batch is printed and flushed (at-least-once: a batch printed but
//! not yet committed when the process dies is printed again by the next
//! member; one fsync'd commit per batch, not per message).
//!
//! Transient failures (the broker restarting, a leader moving) are said on
//! stderr and retried, until `--idle-exit-ms` has passed without a message
//! (then the last failure is the exit's error) or for ever. SIGINT/SIGTERM
//! stop it at its next turn (a second one at once); a group member then
//! commits and leaves its group, so its partitions move to the other
//! members at once rather than after the session timeout.
//!
//! `--format value` prints each value and a newline; `--format json` prints
//! one object per line: `queue`, `partition`, `offset`, `key` (string or
//! null), `value` (string or null; bytes that are not UTF-8 are replaced by
//! U+FFFD), `timestamp_ms` and `headers` (an object). Exits after `--max`
//! messages, or after `--idle-exit-ms` without any, or when stdout closes.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use strand_client::{
    block_on, is_fenced, ClientError, ConsumedRecord, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, GroupStart,
    Seek,
};
use strand_wire::ErrorCode;

use crate::groups::offset_outside_log;

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    /// The queue to read.
    pub queue: String,
    /// Where to start: earliest, latest (only messages produced from now
    /// on), offset:N (in every partition; refused outside a partition's
    /// log) or time:RFC3339. With --group: earliest or latest, used when
    /// the group is new (a group goes on from its committed positions).
    #[arg(long, default_value = "latest", value_name = "WHERE")]
    pub from: String,
    /// Read as a member of this consumer group (positions are the group's).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// With --group: run `sh -c CMD` per message (value on stdin, STRAND_QUEUE,
    /// STRAND_PARTITION, STRAND_OFFSET, STRAND_KEY, STRAND_DELIVERY_ATTEMPT in
    /// the environment); exit 0 acknowledges, anything else asks for
    /// redelivery (dead-lettered after the queue's max attempts); exit 126
    /// or 127 (the command cannot run) stops the consumer.
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// With --exec: how long a failed message waits before its redelivery,
    /// doubling with each attempt up to the lock time (30s); 0: at once.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub retry_backoff: String,
    /// Exit after this many messages.
    #[arg(long, value_name = "N")]
    pub max: Option<u64>,
    /// Exit after this long without a message, in ms (time spent waiting for
    /// this consumer's own delayed redeliveries does not count).
    #[arg(long, value_name = "MS")]
    pub idle_exit_ms: Option<u64>,
    /// How to print each message: value (its bytes and a newline) or json.
    #[arg(long, default_value = "value", value_name = "value|json")]
    pub format: String,
}

/// Parses `--from`.
pub fn start(text: &str) -> Result<Seek, String> {
    match text {
        "earliest" => return Ok(Seek::Earliest),
        "latest" => return Ok(Seek::Latest),
        _ => {}
    }
    if let Some(n) = text.strip_prefix("offset:") {
        return n
            .parse()
            .map(Seek::Offset)
            .map_err(|_| format!("bad offset in --from {text:?}"));
    }
    if let Some(t) = text.strip_prefix("time:") {
        return chrono::DateTime::parse_from_rfc3339(t)
            .map(|d| Seek::Timestamp(d.timestamp_millis()))
            .map_err(|e| format!("bad time in --from {text:?} ({e}; e.g. time:2026-11-29T12:00:00Z)"));
    }
    Err(format!(
        "--from must be earliest, latest, offset:N or time:RFC3339, not {text:?}"
    ))
}

fn text(b: &Option<bytes::Bytes>) -> serde_json::Value {
    b.as_ref().map_or(serde_json::Value::Null, |b| {
        serde_json::Value::String(String::from_utf8_lossy(b).into_owned())
    })
}

/// One record as a JSON line.
pub fn json_line(r: &ConsumedRecord) -> String {
    let headers: serde_json::Map<String, serde_json::Value> = r
        .headers
        .iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), text(v)))
        .collect();
    serde_json::json!({
        "queue": &*r.queue,
        "partition": r.partition,
        "offset": r.offset,
        "key": text(&r.key),
        "value": text(&r.value),
        "timestamp_ms": r.timestamp_ms,
        "headers": headers,
    })
    .to_string()
}

/// Where printed messages come from.
trait Source {
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, ClientError>;
    /// Called once `records` (a polled batch, or its start) are printed
    /// and flushed.
    fn printed(&mut self, records: &[ConsumedRecord]) -> Result<(), String>;
    /// Whether partitions meant for this reader are still to come (a group
    /// member waiting for them is not idle).
    fn waiting(&self) -> bool {
        false
    }
}

impl Source for Consumer {
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, ClientError> {
        block_on(Consumer::poll(self))
    }

    fn printed(&mut self, _: &[ConsumedRecord]) -> Result<(), String> {
        Ok(())
    }
}

/// Whether the consumer should wait and go on after `e` (the broker
/// restarted or is busy, a leader moved, the member is re-joining) rather
/// than exit.
fn transient(e: &ClientError) -> bool {
    e.is_io()
        || is_fenced(e)
        || matches!(
            e.code(),
            Some(
                ErrorCode::NotLeader
                    | ErrorCode::Overloaded
                    | ErrorCode::Timeout
                    | ErrorCode::ControllerUnavailable
                    | ErrorCode::UnknownGroup
            )
        )
}

/// A transient failure: said on stderr, then a short pause.
fn warn_and_wait(e: &ClientError) {
    eprintln!("strand: warning: {e}; retrying");
    std::thread::sleep(Duration::from_millis(200));
}

impl Source for GroupConsumer {
    fn waiting(&self) -> bool {
        self.waiting_for_partitions()
    }

    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, ClientError> {
        let records = block_on(GroupConsumer::poll(self));
        for r in self.take_resets() {
            eprintln!(
                "strand: warning: {}/{}: position {} was below the log start {} (retention removed the records); \
                 reset to {:?}",
                r.queue, r.partition, r.position, r.log_start, r.to
            );
        }
        records
    }

    fn printed(&mut self, records: &[ConsumedRecord]) -> Result<(), String> {
        // One commit for the batch: per partition, the position past its
        // last printed record.
        let offsets: BTreeMap<_, _> = records
            .iter()
            .map(|r| ((r.queue.clone(), r.partition), r.offset + 1))
            .collect();
        if offsets.is_empty() {
            return Ok(());
        }
        match block_on(self.commit_offsets(&offsets)) {
            // Not this member's any more (or it re-joins): the records go
            // to the partition's next reader again (at-least-once).
            Err(e) if transient(&e) => {
                eprintln!("strand: warning: committing the positions: {e}");
                Ok(())
            }
            other => other.map_err(|e| format!("committing the positions: {e}")),
        }
    }
}

/// Set by the first SIGINT or SIGTERM; a second one ends the process at
/// once (exit 130).
fn stop_on_signals() -> Result<Arc<AtomicBool>, String> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(signal, stop.clone()))
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    Ok(stop)
}

/// The check `group reset --to offset:N` makes ([`offset_outside_log`]),
/// for a plain consume from `offset:N`: N must lie in every partition's
/// log, or the consumer would be moved elsewhere without a word.
fn check_offset_in_range(brokers: &str, queue: &str, offset: u64) -> Result<(), String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    let d = block_on(admin.describe_queue(queue)).map_err(|e| e.to_string())?;
    match d
        .partitions
        .iter()
        .find_map(|p| offset_outside_log(queue, p.partition, offset, p.log_start, p.high_watermark))
    {
        None => Ok(()),
        Some(why) => Err(ClientError::broker(ErrorCode::OffsetOutOfRange, why).to_string()),
    }
}

pub fn run(args: ConsumeArgs, brokers: &str) -> Result<(), String> {
    let json = match args.format.as_str() {
        "json" => true,
        "value" => false,
        other => return Err(format!("--format must be value or json, not {other:?}")),
    };
    let idle = args.idle_exit_ms.map(Duration::from_millis);
    let config = ConsumerConfig {
        // Short enough to notice the idle deadline on time.
        max_wait: idle.map_or(Duration::from_millis(500), |d| {
            d.clamp(Duration::from_millis(1), Duration::from_millis(500))
        }),
        // A consumer that fell behind retention goes on from what is left.
        reset_out_of_range: Some(Seek::Earliest),
        ..ConsumerConfig::default()
    };
    match &args.group {
        None if args.exec.is_some() => Err("--exec needs --group (messages are acknowledged to a group)".into()),
        None => {
            let start = start(&args.from)?;
            if let Seek::Offset(n) = start {
                check_offset_in_range(brokers, &args.queue, n)?;
            }
            let config = ConsumerConfig { start, ..config };
            let stop = stop_on_signals()?;
            let mut consumer = Consumer::new(brokers, config).map_err(|e| e.to_string())?;
            block_on(consumer.assign_all(&args.queue)).map_err(|e| e.to_string())?;
            print_loop(&args, json, idle, &stop, &mut consumer)
        }
        Some(group) => {
            let start = match args.from.as_str() {
                "earliest" => GroupStart::Earliest,
                "latest" => GroupStart::Latest,
                other => {
                    return Err(format!(
                        "with --group, --from must be earliest or latest (it applies when the group is new), \
                         not {other:?}; to move a group's position use `strand group reset`"
                    ))
                }
            };
            let config = GroupConfig {
                start,
                auto_commit: false,
                client_name: "strand-cli".into(),
                consumer: config,
                ..GroupConfig::default()
            };
            let backoff = match args.retry_backoff.trim() {
                "0" | "0s" | "0ms" => Duration::ZERO,
                text => Duration::from_millis(
                    super::parse::duration_ms(text)?
                        .ok_or_else(|| format!("--retry-backoff must be a duration (1s, 500ms, 0), not {text:?}"))?,
                ),
            };
            let lock = config.lock;
            let stop = stop_on_signals()?;
            let mut consumer = block_on(GroupConsumer::subscribe(brokers, group, &[&args.queue], config))
                .map_err(|e| e.to_string())?;
            let result = match &args.exec {
                Some(cmd) => exec_loop(
                    &args,
                    cmd,
                    idle,
                    &stop,
                    Backoff {
                        first: backoff,
                        most: lock,
                    },
                    &mut consumer,
                ),
                None => print_loop(&args, json, idle, &stop, &mut consumer),
            };
            // Leaves the group: its partitions move to the others now.
            let closed = block_on(consumer.close()).map_err(|e| e.to_string());
            result.and(closed)
        }
    }
}

/// When a consumer with `--idle-exit-ms` has been idle long enough to
/// exit. Idle time counts from the last message, or from when this
/// consumer's own delayed redeliveries come due; not while a group member
/// waits for partitions meant for it (said on stderr once it lasts a
/// second). An exit while polls fail reports the failure.
struct IdleClock {
    limit: Option<Duration>,
    busy_until: Instant,
    failing: Option<ClientError>,
    waiting_since: Option<Instant>,
    said: bool,
}

impl IdleClock {
    fn new(limit: Option<Duration>) -> IdleClock {
        IdleClock {
            limit,
            busy_until: Instant::now(),
            failing: None,
            waiting_since: None,
            said: false,
        }
    }

    /// Not idle until `until` (a message now, or a redelivery due then).
    fn busy_until(&mut self, until: Instant) {
        self.busy_until = self.busy_until.max(until);
    }

    /// A poll was answered.
    fn answered(&mut self) {
        self.failing = None;
    }

    /// A poll failed with a transient error: said, then a short pause.
    fn failed(&mut self, e: ClientError) {
        warn_and_wait(&e);
        self.failing = Some(e);
    }

    /// Whether the member now waits for its partitions.
    fn waiting(&mut self, waiting: bool, queue: &str) {
        if !waiting {
            (self.waiting_since, self.said) = (None, false);
            return;
        }
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        if !self.said && since.elapsed() >= Duration::from_secs(1) {
            eprintln!(
                "strand: waiting for partitions of {queue} (another member still holds them, or the broker \
                 restarted moments ago and waits for its earlier members)"
            );
            self.said = true;
        }
        if self.failing.is_none() {
            self.busy_until(Instant::now());
        }
    }

    /// `Some(how to exit)` once idle for the limit.
    fn expired(&mut self) -> Option<Result<(), String>> {
        let limit = self.limit?;
        let idle_at = self.busy_until.checked_add(limit)?;
        (Instant::now() >= idle_at).then(|| {
            self.failing.take().map_or(Ok(()), |e| {
                Err(format!("no message for --idle-exit-ms while retrying: {e}"))
            })
        })
    }
}

/// How long a failed message waits before it is delivered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// After the first failed attempt.
    pub first: Duration,
    /// The most (the lock time: a longer wait holds up the partition's
    /// later messages for longer than a crashed consumer would).
    pub most: Duration,
}

impl Backoff {
    /// The wait after failed attempt `attempt` (1, 2, ...): `first`,
    /// doubling, at most `most`.
    pub fn after(self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.first.saturating_mul(1 << doublings).min(self.most)
    }
}

/// What the shell's exit status says about a handler that failed.
fn handler_failure(cmd: &str, status: Option<i32>) -> (String, bool) {
    match status {
        // POSIX shells: 127 command not found, 126 found but not
        // executable. Every message would fail alike: stop rather than
        // dead-letter the whole queue.
        Some(code @ (126 | 127)) => (
            format!(
                "`{cmd}` could not run (exit {code}: {})",
                if code == 127 {
                    "command not found"
                } else {
                    "not executable"
                }
            ),
            true,
        ),
        Some(code) => (format!("`{cmd}` exited with status {code}"), false),
        None => (format!("`{cmd}` was killed by a signal"), false),
    }
}

/// Runs `cmd` per received message until `--max` messages, `--idle-exit-ms`
/// without any, or a signal.
fn exec_loop(
    args: &ConsumeArgs,
    cmd: &str,
    idle: Option<Duration>,
    stop: &AtomicBool,
    backoff: Backoff,
    member: &mut GroupConsumer,
) -> Result<(), String> {
    let mut handled = 0u64;
    let mut clock = IdleClock::new(idle);
    loop {
        if stop.load(Ordering::SeqCst) || args.max.is_some_and(|m| handled >= m) {
            return Ok(());
        }
        clock.waiting(member.waiting_for_partitions(), &args.queue);
        if let Some(exit) = clock.expired() {
            return exit;
        }
        let received = match block_on(member.receive(1)) {
            Err(e) if transient(&e) => {
                clock.failed(e);
                continue;
            }
            other => other.map_err(|e| e.to_string())?,
        };
        clock.answered();
        for r in received {
            let status = run_one(cmd, &r, member)?;
            let mut cannot_run = None;
            let settled = match status {
                Some(0) => block_on(member.ack(&r.record)),
                other => {
                    let (why, fatal) = handler_failure(cmd, other);
                    let delay = if fatal || stop.load(Ordering::SeqCst) {
                        Duration::ZERO
                    } else {
                        backoff.after(r.attempt)
                    };
                    clock.busy_until(Instant::now() + delay);
                    if fatal {
                        cannot_run = Some(why.clone());
                    }
                    block_on(member.nack(&r.record, delay, &why))
                }
            };
            match settled {
                // Its lock ran out or the partition moved: it is delivered
                // again (at-least-once).
                Err(e) if transient(&e) => eprintln!("strand: warning: settling offset {}: {e}", r.record.offset),
                other => other.map_err(|e| {
                    format!(
                        "settling {}/{} offset {}: {e}",
                        r.record.queue, r.record.partition, r.record.offset
                    )
                })?,
            }
            if let Some(why) = cannot_run {
                return Err(format!(
                    "{why}: stopping; {}/{} offset {} was not handled and waits for the next consumer \
                     (this delivery counts as attempt {})",
                    r.record.queue, r.record.partition, r.record.offset, r.attempt
                ));
            }
            handled += 1;
            clock.busy_until(Instant::now());
        }
    }
}

/// Runs `sh -c cmd` for one message (renewing its lock while it runs);
/// returns its exit code (`None`: killed by a signal).
fn run_one(cmd: &str, r: &strand_client::Received, member: &GroupConsumer) -> Result<Option<i32>, String> {
    use std::process::{Command, Stdio};
    let rec = &r.record;
    let mut child = Command::new("sh")
        .args(["-c", cmd])
        .env("STRAND_QUEUE", &*rec.queue)
        .env("STRAND_PARTITION", rec.partition.to_string())
        .env("STRAND_OFFSET", rec.offset.to_string())
        .env(
            "STRAND_KEY",
            rec.key
                .as_ref()
                // The environment cannot carry NUL bytes.
                .map_or(String::new(), |k| String::from_utf8_lossy(k).replace('\0', "")),
        )
        .env("STRAND_DELIVERY_ATTEMPT", r.attempt.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running sh -c {cmd:?}: {e}"))?;
    // Fed from a thread: a value larger than the pipe holds must not keep
    // this one from renewing the lock. A command that does not read its
    // stdin closes the pipe: fine.
    let feeder = child.stdin.take().map(|mut stdin| {
        let value = rec.value.clone().unwrap_or_default();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&value);
        })
    });
    let mut renewed = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("waiting for {cmd:?}: {e}"))? {
            if let Some(f) = feeder {
                let _ = f.join();
            }
            return Ok(status.code());
        }
        // Renew well before the lock (default 30 s) runs out.
        if renewed.elapsed() >= Duration::from_secs(10) {
            // Lost (its lock ran out, or the partition moved): the command
            // runs on; its settle will say so.
            if let Err(e) = block_on(member.renew(&[rec])) {
                eprintln!("strand: warning: renewing the lock of offset {}: {e}", rec.offset);
            }
            renewed = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Prints records until `--max`, `--idle-exit-ms`, a closed stdout or a
/// signal.
fn print_loop(
    args: &ConsumeArgs,
    json: bool,
    idle: Option<Duration>,
    stop: &AtomicBool,
    source: &mut dyn Source,
) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    let mut clock = IdleClock::new(idle);
    loop {
        if stop.load(Ordering::SeqCst) || args.max.is_some_and(|m| printed >= m) {
            break;
        }
        clock.waiting(source.waiting(), &args.queue);
        if let Some(exit) = clock.expired() {
            return exit;
        }
        let records = match source.poll() {
            Ok(records) => records,
            Err(e) if transient(&e) => {
                clock.failed(e);
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        clock.answered();
        if !records.is_empty() {
            clock.busy_until(Instant::now());
        }
        let take = args
            .max
            .map_or(records.len(), |m| records.len().min((m - printed) as usize));
        for r in &records[..take] {
            let written = if json {
                writeln!(out, "{}", json_line(r))
            } else {
                out.write_all(r.value.as_deref().unwrap_or_default())
                    .and_then(|()| out.write_all(b"\n"))
            };
            // stdout closed (e.g. piped into head): stop, uncommitted.
            if written.is_err() {
                return Ok(());
            }
        }
        if out.flush().is_err() {
            return Ok(());
        }
        source.printed(&records[..take])?;
        printed += take as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_parses() {
        assert_eq!(start("earliest"), Ok(Seek::Earliest));
        assert_eq!(start("latest"), Ok(Seek::Latest));
        assert_eq!(start("offset:42"), Ok(Seek::Offset(42)));
        assert_eq!(start("time:1970-01-01T00:00:01Z"), Ok(Seek::Timestamp(1000)));
        assert_eq!(start("time:1970-01-01T01:00:01+01:00"), Ok(Seek::Timestamp(1000)));
        assert!(start("offset:x").is_err());
        assert!(start("time:yesterday").is_err());
        assert!(start("beginning").is_err());
    }

    #[test]
    fn backoff_doubles_up_to_the_lock() {
        let b = Backoff {
            first: Duration::from_secs(1),
            most: Duration::from_secs(30),
        };
        let waits: Vec<u64> = (1..=7).map(|a| b.after(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(b.after(u32::MAX), Duration::from_secs(30));
        let none = Backoff {
            first: Duration::ZERO,
            ..b
        };
        assert_eq!(none.after(3), Duration::ZERO);
    }

    #[test]
    fn the_idle_clock_counts_from_activity_and_says_why_it_stops() {
        assert_eq!(IdleClock::new(None).expired(), None, "no limit: never idle");
        let mut clock = IdleClock::new(Some(Duration::from_secs(60)));
        assert_eq!(clock.expired(), None);
        let mut clock = IdleClock::new(Some(Duration::ZERO));
        // A redelivery due later keeps it busy until then.
        clock.busy_until(Instant::now() + Duration::from_secs(60));
        assert_eq!(clock.expired(), None);
        let mut clock = IdleClock::new(Some(Duration::ZERO));
        clock.failing = Some(ClientError::Protocol("down".into()));
        // Waiting for partitions does not count as busy while polls fail.
        clock.waiting(true, "q");
        let exit = clock.expired().expect("idle");
        assert!(exit.unwrap_err().contains("while retrying: bad response: down"));
        clock.answered();
        assert_eq!(clock.expired(), Some(Ok(())));
    }

    #[test]
    fn a_handler_that_cannot_run_is_fatal() {
        assert!(handler_failure("./h.sh", Some(127)).1);
        assert!(handler_failure("./h.sh", Some(126)).0.contains("not executable"));
        assert!(!handler_failure("./h.sh", Some(1)).1);
        assert!(!handler_failure("./h.sh", None).1);
    }

    #[test]
    fn json_lines_have_the_contract_fields() {
        let r = ConsumedRecord {
            queue: "q".into(),
            partition: 2,
            offset: 7,
            timestamp_ms: 123,
            key: None,
            value: Some(bytes::Bytes::from_static(b"hi")),
            headers: vec![(bytes::Bytes::from_static(b"h"), None)],
        };
        let v: serde_json::Value = serde_json::from_str(&json_line(&r)).unwrap();
        assert_eq!(v["queue"], "q");
        assert_eq!(v["partition"], 2);
        assert_eq!(v["offset"], 7);
        assert_eq!(v["key"], serde_json::Value::Null);
        assert_eq!(v["value"], "hi");
        assert_eq!(v["timestamp_ms"], 123);
        assert_eq!(v["headers"]["h"], serde_json::Value::Null);
    }
}
