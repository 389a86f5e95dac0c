//! `strand consume QUEUE`: print messages as they arrive, from every
//! partition of the queue — or, with `--group G`, from the partitions the
//! group's coordinator assigns this member, committing the position after
//! each printed message (at-least-once: a message printed but not yet
//! committed when the process dies is printed again by the next member).
//!
//! `--format value` prints each value and a newline; `--format json` prints
//! one object per line: `queue`, `partition`, `offset`, `key` (string or
//! null), `value` (string or null; bytes that are not UTF-8 are replaced by
//! U+FFFD), `timestamp_ms` and `headers` (an object). Exits after `--max`
//! messages, or after `--idle-exit-ms` without any, or when stdout closes.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use strand_client::{
    block_on, is_fenced, ClientError, ConsumedRecord, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, GroupStart,
    Seek,
};
use strand_wire::ErrorCode;

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    pub queue: String,
    /// earliest, latest, offset:N (every partition) or time:RFC3339; with
    /// --group: earliest or latest, used when the group is new.
    #[arg(long, default_value = "latest")]
    pub from: String,
    /// Read as a member of this consumer group (positions are the group's).
    #[arg(long)]
    pub group: Option<String>,
    /// With --group: run `sh -c CMD` per message (value on stdin, STRAND_QUEUE,
    /// STRAND_PARTITION, STRAND_OFFSET, STRAND_KEY, STRAND_DELIVERY_ATTEMPT in
    /// the environment); exit 0 acknowledges, anything else asks for
    /// redelivery (dead-lettered after the queue's max attempts).
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,
    /// Exit after this many messages.
    #[arg(long)]
    pub max: Option<u64>,
    /// Exit after this long without a message.
    #[arg(long)]
    pub idle_exit_ms: Option<u64>,
    /// value or json.
    #[arg(long, default_value = "value")]
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
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, String>;
    /// Called once `record` is printed.
    fn printed(&mut self, record: &ConsumedRecord) -> Result<(), String>;
}

impl Source for Consumer {
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, String> {
        block_on(Consumer::poll(self)).map_err(|e| e.to_string())
    }

    fn printed(&mut self, _: &ConsumedRecord) -> Result<(), String> {
        Ok(())
    }
}

/// Whether a group member should wait and go on after `e` (the broker
/// restarted or is busy, or the member is re-joining) rather than exit.
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
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, String> {
        let records = match block_on(GroupConsumer::poll(self)) {
            Err(e) if transient(&e) => {
                warn_and_wait(&e);
                Ok(Vec::new())
            }
            other => other.map_err(|e| e.to_string()),
        };
        for r in self.take_resets() {
            eprintln!(
                "strand: warning: {}/{}: position {} was below the log start {} (retention removed the records); \
                 reset to {:?}",
                r.queue, r.partition, r.position, r.log_start, r.to
            );
        }
        records
    }

    fn printed(&mut self, record: &ConsumedRecord) -> Result<(), String> {
        match block_on(self.commit_record(record)) {
            // Not this member's any more (or it re-joins): the record goes
            // to the partition's next reader again (at-least-once).
            Err(e) if transient(&e) => {
                eprintln!("strand: warning: committing offset {}: {e}", record.offset);
                Ok(())
            }
            other => other.map_err(|e| format!("committing the position: {e}")),
        }
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
            let config = ConsumerConfig {
                start: start(&args.from)?,
                ..config
            };
            let mut consumer = Consumer::new(brokers, config).map_err(|e| e.to_string())?;
            block_on(consumer.assign_all(&args.queue)).map_err(|e| e.to_string())?;
            print_loop(&args, json, idle, &mut consumer)
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
            let mut consumer = block_on(GroupConsumer::subscribe(brokers, group, &[&args.queue], config))
                .map_err(|e| e.to_string())?;
            let result = match &args.exec {
                Some(cmd) => exec_loop(&args, cmd, idle, &mut consumer),
                None => print_loop(&args, json, idle, &mut consumer),
            };
            block_on(consumer.close()).map_err(|e| e.to_string())?;
            result
        }
    }
}

/// Runs `cmd` per received message until `--max` messages or
/// `--idle-exit-ms` without any.
fn exec_loop(args: &ConsumeArgs, cmd: &str, idle: Option<Duration>, member: &mut GroupConsumer) -> Result<(), String> {
    let mut handled = 0u64;
    let mut last_message = Instant::now();
    loop {
        if args.max.is_some_and(|m| handled >= m) || idle.is_some_and(|d| last_message.elapsed() >= d) {
            return Ok(());
        }
        let received = match block_on(member.receive(1)) {
            Err(e) if transient(&e) => {
                warn_and_wait(&e);
                continue;
            }
            other => other.map_err(|e| e.to_string())?,
        };
        for r in received {
            let status = run_one(cmd, &r, member)?;
            let settled = match status {
                Some(0) => block_on(member.ack(&r.record)),
                other => {
                    let why = match other {
                        Some(code) => format!("`{cmd}` exited with status {code}"),
                        None => format!("`{cmd}` was killed by a signal"),
                    };
                    block_on(member.nack(&r.record, Duration::ZERO, &why))
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
            handled += 1;
            last_message = Instant::now();
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

/// Prints records until `--max`, `--idle-exit-ms` or a closed stdout.
fn print_loop(args: &ConsumeArgs, json: bool, idle: Option<Duration>, source: &mut dyn Source) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0u64;
    let mut last_message = Instant::now();
    loop {
        if args.max.is_some_and(|m| printed >= m) {
            break;
        }
        if idle.is_some_and(|d| last_message.elapsed() >= d) {
            break;
        }
        let records = source.poll()?;
        if !records.is_empty() {
            last_message = Instant::now();
        }
        for r in &records {
            if args.max.is_some_and(|m| printed >= m) {
                break;
            }
            let written = if json {
                writeln!(out, "{}", json_line(r))
            } else {
                out.write_all(r.value.as_deref().unwrap_or_default())
                    .and_then(|()| out.write_all(b"\n"))
            };
            // stdout closed (e.g. piped into head): stop, uncommitted.
            if written.is_err() || out.flush().is_err() {
                return Ok(());
            }
            source.printed(r)?;
            printed += 1;
        }
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
