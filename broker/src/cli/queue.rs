//! `strand queue create|list|describe|alter|delete`.

use clap::Subcommand;
use strand_client::{block_on, FsyncSpec, QueueSpec};

use super::parse;

#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[arg(long, default_value_t = 1)]
        replication_factor: u16,
        /// How long records are kept: 7d, 12h, 30m, 45s, 500ms, or forever.
        #[arg(long, default_value = "7d")]
        retention: String,
        /// Most bytes kept per partition (512MiB, 10GiB, …); no limit if absent.
        #[arg(long)]
        retention_bytes: Option<String>,
        /// always: every acknowledged batch is fdatasync'd; interval: every 100 ms.
        #[arg(long, default_value = "always")]
        fsync: String,
        /// Ack-mode deliveries of a message before it goes to QUEUE.dlq [default: 5].
        #[arg(long)]
        max_delivery_attempts: Option<u32>,
    },
    /// List queues.
    List,
    /// Partitions (leader, log start/end, stored bytes) and settings.
    Describe { name: String },
    /// Add partitions or change retention.
    Alter {
        name: String,
        #[arg(long)]
        partitions: Option<u32>,
        #[arg(long)]
        retention: Option<String>,
        #[arg(long)]
        max_delivery_attempts: Option<u32>,
    },
    /// Delete a queue and its data.
    Delete { name: String },
}

/// Runs a queue command; `json` selects machine output.
pub fn run(command: QueueCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    let e = |e: strand_client::ClientError| e.to_string();
    match command {
        QueueCommand::Create {
            name,
            partitions,
            replication_factor,
            retention,
            retention_bytes,
            fsync: mode,
            max_delivery_attempts,
        } => {
            let spec = QueueSpec {
                partitions: Some(partitions),
                replication_factor: Some(replication_factor),
                retention_ms: Some(parse::duration_ms(&retention)?),
                retention_bytes: retention_bytes.as_deref().map(parse::bytes).transpose()?,
                fsync: Some(mode.parse()?),
                max_message_bytes: None,
                max_delivery_attempts,
            };
            block_on(admin.create_queue(&name, &spec)).map_err(e)?;
            if json {
                println!("{}", serde_json::json!({ "created": name }));
            } else {
                println!("created {name}");
            }
        }
        QueueCommand::List => {
            let queues = block_on(admin.list_queues()).map_err(e)?;
            if json {
                let list: Vec<_> = queues
                    .iter()
                    .map(|(n, p)| serde_json::json!({ "name": n, "partitions": p }))
                    .collect();
                println!("{}", serde_json::Value::Array(list));
            } else {
                let width = queues.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
                println!("{:<width$}  PARTITIONS", "NAME");
                for (n, p) in queues {
                    println!("{n:<width$}  {p:>10}");
                }
            }
        }
        QueueCommand::Describe { name } => {
            let d = block_on(admin.describe_queue(&name)).map_err(e)?;
            let fsync = match d.fsync {
                FsyncSpec::Always => "always".to_string(),
                FsyncSpec::Interval { ms, bytes } => format!("interval ({ms} ms, {bytes} bytes)"),
            };
            if json {
                let parts: Vec<_> = d
                    .partitions
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "partition": p.partition, "leader": p.leader, "log_start": p.log_start,
                            "log_end": p.log_end, "high_watermark": p.high_watermark,
                            "stored_bytes": p.stored_bytes, "segments": p.segments,
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "name": d.name, "replication_factor": d.replication_factor,
                        "retention_ms": d.retention_ms, "retention_bytes": d.retention_bytes,
                        "fsync": fsync, "max_message_bytes": d.max_message_bytes,
                        "max_delivery_attempts": d.max_delivery_attempts, "partitions": parts,
                    })
                );
            } else {
                println!(
                    "queue {}  replication {}  retention_ms {}  retention_bytes {}  fsync {}  max_message_bytes {}  \
                     max_delivery_attempts {}",
                    d.name,
                    d.replication_factor,
                    d.retention_ms,
                    d.retention_bytes,
                    fsync,
                    d.max_message_bytes,
                    d.max_delivery_attempts
                );
                println!(
                    "{:>9}  {:>6}  {:>12}  {:>12}  {:>12}  {:>14}  {:>8}",
                    "PARTITION", "LEADER", "LOG_START", "LOG_END", "HIGH_WATER", "STORED_BYTES", "SEGMENTS"
                );
                for p in &d.partitions {
                    println!(
                        "{:>9}  {:>6}  {:>12}  {:>12}  {:>12}  {:>14}  {:>8}",
                        p.partition, p.leader, p.log_start, p.log_end, p.high_watermark, p.stored_bytes, p.segments
                    );
                }
            }
        }
        QueueCommand::Alter {
            name,
            partitions,
            retention,
            max_delivery_attempts,
        } => {
            let spec = QueueSpec {
                partitions,
                max_delivery_attempts,
                retention_ms: retention.as_deref().map(parse::duration_ms).transpose()?,
                ..QueueSpec::default()
            };
            block_on(admin.alter_queue(&name, &spec)).map_err(e)?;
            if json {
                println!("{}", serde_json::json!({ "altered": name }));
            } else {
                println!("altered {name}");
            }
        }
        QueueCommand::Delete { name } => {
            block_on(admin.delete_queue(&name)).map_err(e)?;
            if json {
                println!("{}", serde_json::json!({ "deleted": name }));
            } else {
                println!("deleted {name}");
            }
        }
    }
    Ok(())
}
