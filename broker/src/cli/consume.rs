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
use strand_client::{block_on, ConsumedRecord, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, GroupStart, Seek};

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

impl Source for GroupConsumer {
    fn poll(&mut self) -> Result<Vec<ConsumedRecord>, String> {
        let records = block_on(GroupConsumer::poll(self)).map_err(|e| e.to_string());
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
        block_on(self.commit_record(record)).map_err(|e| format!("committing the position: {e}"))
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
            let result = print_loop(&args, json, idle, &mut consumer);
            block_on(consumer.close()).map_err(|e| e.to_string())?;
            result
        }
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
