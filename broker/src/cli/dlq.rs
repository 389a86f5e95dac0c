//! `strand dlq list QUEUE` and `strand dlq replay QUEUE [--max N]`: the
//! dead-letter queue `<QUEUE>.dlq`, where ack-mode consumers' poison
//! messages go (see `crate::groups`).
//!
//! Each DLQ record keeps the original key, value and headers and adds
//! `strand.source.queue`, `strand.source.partition`, `strand.source.offset`,
//! `strand.attempts` and `strand.last_error`. `replay` appends records back
//! to the source queue (same key, value and headers, without the `strand.`
//! ones) and remembers how far it got in the group `strand.dlq-replay`, so
//! a record is replayed once however often `replay` runs.

use std::time::{Duration, Instant};

use clap::Subcommand;
use strand_client::{
    block_on, Acks, ConsumedRecord, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, GroupStart, Producer,
    ProducerConfig, Seek,
};

use strand_wire::ErrorCode;

use crate::groups::{dlq_name, DLQ_HEADERS};

/// The group `replay` keeps its position in.
pub const REPLAY_GROUP: &str = "strand.dlq-replay";

#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// Dead-lettered messages of QUEUE: offset, key, attempts, last error,
    /// source partition/offset, and the start of the value.
    List {
        /// The queue whose dead letters to list (not its .dlq name).
        queue: String,
    },
    /// Append dead-lettered messages back to QUEUE (each once).
    Replay {
        /// The queue to replay into (its dead letters come from its DLQ).
        queue: String,
        /// Replay at most this many [default: all not yet replayed].
        #[arg(long)]
        max: Option<u64>,
    },
}

fn header(r: &ConsumedRecord, name: &str) -> Option<String> {
    r.headers
        .iter()
        .find(|(k, _)| &k[..] == name.as_bytes())
        .and_then(|(_, v)| v.as_ref())
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

fn text(b: &Option<bytes::Bytes>) -> Option<String> {
    b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned())
}

/// The name of `queue`'s dead-letter queue if it was made (something was
/// dead-lettered), `None` if not; an error if `queue` itself does not
/// exist.
fn existing_dlq(brokers: &str, queue: &str) -> Result<Option<String>, String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    let dlq = dlq_name(queue);
    match block_on(admin.describe_queue(&dlq)) {
        Ok(_) => Ok(Some(dlq)),
        Err(e) if e.code() == Some(ErrorCode::UnknownQueue) => {
            // The source's own error (it does not exist) if it is missing.
            block_on(admin.describe_queue(queue)).map_err(|e| e.to_string())?;
            Ok(None)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A consumer of `queue`'s DLQ from its start; `None` if it was not made.
fn open_dlq(brokers: &str, queue: &str) -> Result<Option<Consumer>, String> {
    let Some(dlq) = existing_dlq(brokers, queue)? else {
        return Ok(None);
    };
    let config = ConsumerConfig {
        start: Seek::Earliest,
        max_wait: Duration::from_millis(200),
        ..ConsumerConfig::default()
    };
    let mut c = Consumer::new(brokers, config).map_err(|e| e.to_string())?;
    block_on(c.assign_all(&dlq)).map_err(|e| e.to_string())?;
    Ok(Some(c))
}

/// Hands every record of the DLQ, oldest first, to `each` as it is read
/// (nothing is held: a DLQ may be large), until two polls in a row find
/// nothing new.
fn each_record(dlq: Option<Consumer>, mut each: impl FnMut(&ConsumedRecord)) -> Result<(), String> {
    let Some(mut c) = dlq else {
        return Ok(());
    };
    let mut empty = 0;
    while empty < 2 {
        let got = block_on(c.poll()).map_err(|e| e.to_string())?;
        empty = if got.is_empty() { empty + 1 } else { 0 };
        got.iter().for_each(&mut each);
    }
    Ok(())
}

/// `text` cut to `width` characters (the last one an ellipsis) and padded
/// to it: a column that stays aligned whatever its values.
fn column(text: &str, width: usize) -> String {
    let flat = text.replace(['\n', '\r', '\t'], " ");
    if flat.chars().count() <= width {
        format!("{flat:<width$}")
    } else {
        let cut: String = flat.chars().take(width - 1).collect();
        format!("{cut}…")
    }
}

pub fn run(command: DlqCommand, brokers: &str, json: bool) -> Result<(), String> {
    match command {
        DlqCommand::List { queue } => {
            let number = |r: &ConsumedRecord, h: &str| header(r, h).and_then(|a| a.parse::<u64>().ok());
            let dlq = open_dlq(brokers, &queue)?;
            if json {
                // One JSON array, written element by element.
                let mut first = true;
                out_part!("[");
                each_record(dlq, |r| {
                    let item = serde_json::json!({
                        "offset": r.offset, "key": text(&r.key), "value": text(&r.value),
                        "attempts": number(r, "strand.attempts"),
                        "last_error": header(r, "strand.last_error"),
                        "source_partition": number(r, "strand.source.partition"),
                        "source_offset": number(r, "strand.source.offset"),
                        "timestamp_ms": r.timestamp_ms,
                    });
                    out_part!("{}{item}", if first { "" } else { "," });
                    first = false;
                })?;
                out!("]");
            } else {
                // Fixed widths (rows are printed as they are read): longer
                // keys, sources and errors are cut, in full with --output json.
                out!(
                    "{:>12}  {}  {:>8}  {}  {}  VALUE",
                    "OFFSET",
                    column("KEY", 20),
                    "ATTEMPTS",
                    column("SOURCE", 16),
                    column("LAST_ERROR", 40)
                );
                each_record(dlq, |r| {
                    let source = format!(
                        "{}/{}",
                        header(r, "strand.source.partition").unwrap_or_default(),
                        header(r, "strand.source.offset").unwrap_or_default()
                    );
                    let preview: String = text(&r.value).unwrap_or_default().chars().take(40).collect();
                    out!(
                        "{:>12}  {}  {:>8}  {}  {}  {}",
                        r.offset,
                        column(&text(&r.key).unwrap_or_else(|| "-".into()), 20),
                        header(r, "strand.attempts").unwrap_or_default(),
                        column(&source, 16),
                        column(&header(r, "strand.last_error").unwrap_or_default(), 40),
                        preview.replace(['\n', '\r'], " ")
                    );
                })?;
            }
        }
        DlqCommand::Replay { queue, max } => {
            let replayed = replay(brokers, &queue, max)?;
            if json {
                out!("{}", serde_json::json!({ "replayed": replayed }));
            } else {
                out!("replayed {replayed}");
            }
        }
    }
    Ok(())
}

/// Appends DLQ records back to `queue` (acks=all), committing the replay
/// group's position after each; returns how many.
fn replay(brokers: &str, queue: &str, max: Option<u64>) -> Result<u64, String> {
    let config = GroupConfig {
        start: GroupStart::Earliest,
        auto_commit: false,
        client_name: "strand-dlq-replay".into(),
        consumer: ConsumerConfig {
            max_wait: Duration::from_millis(200),
            ..ConsumerConfig::default()
        },
        ..GroupConfig::default()
    };
    // Nothing was dead-lettered yet: nothing to replay.
    let Some(dlq) = existing_dlq(brokers, queue)? else {
        return Ok(0);
    };
    let mut member =
        block_on(GroupConsumer::subscribe(brokers, REPLAY_GROUP, &[&dlq], config)).map_err(|e| e.to_string())?;
    let producer = Producer::new(
        brokers,
        ProducerConfig {
            acks: Acks::All,
            ..ProducerConfig::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let mut replayed = 0;
    let mut last = Instant::now();
    // Done once nothing came for a second (the DLQ is read to its end).
    while max.is_none_or(|m| replayed < m) && last.elapsed() < Duration::from_secs(1) {
        let records = block_on(member.poll()).map_err(|e| e.to_string())?;
        for r in records {
            if max.is_some_and(|m| replayed >= m) {
                break;
            }
            let names: Vec<(String, &[u8])> = r
                .headers
                .iter()
                .filter(|(k, _)| !DLQ_HEADERS.iter().any(|h| h.as_bytes() == &k[..]))
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        v.as_deref().unwrap_or_default(),
                    )
                })
                .collect();
            let headers: Vec<(&str, &[u8])> = names.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            let value = r.value.as_deref().unwrap_or_default();
            block_on(producer.send(queue, r.key.as_deref(), value, &headers))
                .map_err(|e| format!("replaying DLQ offset {}: {e}", r.offset))?;
            block_on(member.commit_record(&r)).map_err(|e| e.to_string())?;
            replayed += 1;
            last = Instant::now();
        }
    }
    block_on(member.close()).map_err(|e| e.to_string())?;
    Ok(replayed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_keep_their_width() {
        assert_eq!(column("k", 4), "k   ");
        assert_eq!(column("a\nb", 4), "a b ");
        assert_eq!(column("abcdefgh", 4), "abc…");
        assert_eq!(column("abcdefgh", 4).chars().count(), 4);
    }
}
