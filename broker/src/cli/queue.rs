//! `strand queue create|list|describe|alter|delete|reassign|elect`.

use clap::{Args, Subcommand};
use strand_client::{block_on, FsyncSpec, QueueSpec};

use super::parse;

/// The settings a queue is created with and `alter` changes.
#[derive(Args, Debug, Default)]
pub struct Settings {
    /// How long records are kept: 7d, 12h, 30m, 45s, 500ms, or forever
    /// [create's default: 7d, or the broker's default_retention_ms].
    #[arg(long, value_name = "DURATION")]
    retention: Option<String>,
    /// Most bytes kept per partition, oldest segments deleted first:
    /// 512MiB, 10GiB, ... or unlimited [create's default: unlimited].
    #[arg(long, value_name = "SIZE")]
    retention_bytes: Option<String>,
    /// always: a batch is acknowledged once fdatasync'd; interval: written
    /// now, fdatasync'd within 100 ms (a crash may lose the last of it)
    /// [create's default: always].
    #[arg(long, value_name = "always|interval")]
    fsync: Option<String>,
    /// Largest record batch a producer may send to the queue: 64KiB,
    /// 1MiB, ... [create's default: the broker's max_message_bytes, 1MiB].
    #[arg(long, value_name = "SIZE")]
    max_message_bytes: Option<String>,
    /// Ack-mode deliveries of a message before it goes to the dead-letter
    /// queue QUEUE.dlq [create's default: 5].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_delivery_attempts: Option<u32>,
    /// In-sync replicas an acks=all produce needs, 1 to the replication
    /// factor (fewer: refused with NotEnoughReplicas) [create's default: 2
    /// with three replicas or more, else 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    min_insync_replicas: Option<u16>,
}

impl Settings {
    /// The spec these flags give; `None` where a flag is absent.
    fn spec(&self) -> Result<QueueSpec, String> {
        Ok(QueueSpec {
            retention_ms: self.retention.as_deref().map(parse::duration_ms).transpose()?,
            retention_bytes: self.retention_bytes.as_deref().map(parse::bytes).transpose()?,
            fsync: self.fsync.as_deref().map(str::parse).transpose()?,
            max_message_bytes: self
                .max_message_bytes
                .as_deref()
                .map(|text| {
                    parse::bytes(text)?
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| format!("--max-message-bytes {text:?} must be a size below 4 GiB"))
                })
                .transpose()?,
            max_delivery_attempts: self.max_delivery_attempts,
            min_insync_replicas: self.min_insync_replicas,
            ..QueueSpec::default()
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        /// The queue's name: 1 to 200 of A-Z a-z 0-9 . _ - (names starting
        /// with __ are the broker's own).
        name: String,
        /// Partitions: the unit of ordering (per key) and of parallelism.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
        /// Copies of each partition on distinct brokers.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        replication_factor: u16,
        #[command(flatten)]
        settings: Settings,
    },
    /// List queues (the broker's own, such as __groups, with --all).
    List {
        /// Also the broker's internal queues (names starting with __).
        #[arg(long)]
        all: bool,
    },
    /// A queue's settings, and per partition its leader, log start and end,
    /// high watermark, stored bytes and segments.
    Describe {
        /// The queue to describe.
        name: String,
    },
    /// Change a queue: add partitions, or change its retention, fsync
    /// policy, message limit, delivery attempts or minimum ISR (at least
    /// one flag).
    Alter {
        /// The queue to change.
        name: String,
        /// The new partition count (it can only grow; records already
        /// stored keep their partition, so new records of a key may land
        /// elsewhere).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: Option<u32>,
        #[command(flatten)]
        settings: Settings,
    },
    /// Delete a queue and its data.
    Delete {
        /// The queue to delete.
        name: String,
    },
    /// Move a partition's replicas to other brokers, without stopping
    /// produce or consume: new replicas catch up as followers, then the
    /// ones left out are removed (`node describe` shows the move until it
    /// completes).
    Reassign {
        /// The queue.
        name: String,
        /// The partition to move.
        #[arg(long)]
        partition: u32,
        /// The broker ids it ends on, comma-separated (as many as the
        /// replication factor; the first is the preferred leader).
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<u32>,
    },
    /// Give offline partitions a leader although no alive replica is known
    /// to hold every record they acknowledged (an unclean election: what
    /// only the missing replicas held is lost for good). For a partition
    /// whose last in-sync replica died, or came back with a wiped disk;
    /// `queue describe` says why a partition is offline.
    Elect {
        /// The queue.
        name: String,
        /// Only this partition [default: every offline partition].
        #[arg(long)]
        partition: Option<u32>,
        /// The broker to lead [default: the first alive replica that did
        /// not lose its data].
        #[arg(long)]
        replica: Option<u32>,
        /// Required: says you accept losing records.
        #[arg(long, required = true)]
        unclean: bool,
    },
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
            settings,
        } => {
            let spec = QueueSpec {
                partitions: Some(partitions),
                replication_factor: Some(replication_factor),
                ..settings.spec()?
            };
            block_on(admin.create_queue(&name, &spec)).map_err(e)?;
            if json {
                out!("{}", serde_json::json!({ "created": name }));
            } else {
                out!("created {name}");
            }
        }
        QueueCommand::List { all } => {
            let mut queues = block_on(admin.list_queues()).map_err(e)?;
            queues.retain(|(n, _)| all || !crate::groups::is_internal(n));
            if json {
                let list: Vec<_> = queues
                    .iter()
                    .map(|(n, p)| serde_json::json!({ "name": n, "partitions": p }))
                    .collect();
                out!("{}", serde_json::Value::Array(list));
            } else {
                let width = queues.iter().map(|(n, _)| n.len()).max().unwrap_or(4).max(4);
                out!("{:<width$}  PARTITIONS", "NAME");
                for (n, p) in queues {
                    out!("{n:<width$}  {p:>10}");
                }
            }
        }
        QueueCommand::Describe { name } => {
            let d = block_on(admin.describe_queue(&name)).map_err(e)?;
            let fsync = match d.fsync {
                FsyncSpec::Always => "always".to_string(),
                FsyncSpec::Interval { ms, bytes: 0 } => {
                    format!("interval ({})", parse::show_duration_ms(u64::from(ms)))
                }
                FsyncSpec::Interval { ms, bytes } => format!(
                    "interval ({} or {})",
                    parse::show_duration_ms(u64::from(ms)),
                    parse::show_bytes(bytes)
                ),
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
                            "replicas": p.replicas, "isr": p.isr, "leader_epoch": p.leader_epoch,
                            "lost_replica": p.lost_replica, "offline_reason": p.offline_reason(),
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    serde_json::json!({
                        "name": d.name, "replication_factor": d.replication_factor,
                        "retention_ms": d.retention_ms, "retention_bytes": d.retention_bytes,
                        "fsync": fsync, "max_message_bytes": d.max_message_bytes,
                        "max_delivery_attempts": d.max_delivery_attempts,
                        "min_insync_replicas": d.min_insync_replicas, "partitions": parts,
                    })
                );
            } else {
                let limit = |v: i64, unit: fn(u64) -> String, none: &str| {
                    u64::try_from(v).map_or_else(|_| none.to_string(), unit)
                };
                let rows = [
                    ("queue", d.name.clone()),
                    ("partitions", d.partitions.len().to_string()),
                    ("replication factor", d.replication_factor.to_string()),
                    ("retention", limit(d.retention_ms, parse::show_duration_ms, "forever")),
                    (
                        "retention bytes",
                        limit(d.retention_bytes, parse::show_bytes, "unlimited"),
                    ),
                    ("fsync", fsync),
                    ("max message bytes", parse::show_bytes(u64::from(d.max_message_bytes))),
                    ("max delivery attempts", d.max_delivery_attempts.to_string()),
                    ("min insync replicas", d.min_insync_replicas.to_string()),
                ];
                for (k, v) in rows {
                    out!("{k:<22} {v}");
                }
                out!("");
                let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let width = d
                    .partitions
                    .iter()
                    .map(|p| ids(&p.replicas).len().max(ids(&p.isr).len()))
                    .max()
                    .unwrap_or(3)
                    .max(8);
                out!(
                    "{:>9}  {:>6}  {:>5}  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>12}  {:>14}  {:>8}",
                    "PARTITION",
                    "LEADER",
                    "EPOCH",
                    "REPLICAS",
                    "ISR",
                    "LOG_START",
                    "LOG_END",
                    "HIGH_WATER",
                    "STORED_BYTES",
                    "SEGMENTS"
                );
                for p in &d.partitions {
                    out!(
                        "{:>9}  {:>6}  {:>5}  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>12}  {:>14}  {:>8}",
                        p.partition,
                        p.leader,
                        p.leader_epoch,
                        ids(&p.replicas),
                        ids(&p.isr),
                        p.log_start,
                        p.log_end,
                        p.high_watermark,
                        p.stored_bytes,
                        p.segments
                    );
                }
                for p in &d.partitions {
                    if let Some(why) = p.offline_reason() {
                        out!("partition {}: {why}", p.partition);
                    }
                }
            }
        }
        QueueCommand::Elect {
            name,
            partition,
            replica,
            unclean,
        } => {
            if !unclean {
                return Err("only unclean elections: give --unclean".into());
            }
            block_on(admin.elect_unclean(&name, partition, replica)).map_err(e)?;
            let which = partition.map_or_else(|| "every offline partition".to_string(), |p| format!("partition {p}"));
            if json {
                out!(
                    "{}",
                    serde_json::json!({"queue": name, "partition": partition, "elected": true, "unclean": true})
                );
            } else {
                out!(
                    "{name}: {which} has a leader again (an unclean election: records only the missing replicas \
                     held are lost); `strand queue describe {name}` shows which"
                );
            }
        }
        QueueCommand::Reassign {
            name,
            partition,
            replicas,
        } => {
            block_on(admin.reassign_partition(&name, partition, &replicas)).map_err(e)?;
            let to = replicas.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            if json {
                out!(
                    "{}",
                    serde_json::json!({"queue": name, "partition": partition, "target": replicas})
                );
            } else {
                out!("moving {name}/{partition} to brokers {to}: new replicas catch up, then the others are removed");
            }
        }
        QueueCommand::Alter {
            name,
            partitions,
            settings,
        } => {
            let spec = QueueSpec {
                partitions,
                ..settings.spec()?
            };
            if spec == QueueSpec::default() {
                return Err(format!(
                    "nothing to change on {name}: give at least one of --partitions, --retention, \
                     --retention-bytes, --fsync, --max-message-bytes, --max-delivery-attempts, \
                     --min-insync-replicas"
                ));
            }
            block_on(admin.alter_queue(&name, &spec)).map_err(e)?;
            if json {
                out!("{}", serde_json::json!({ "altered": name }));
            } else {
                out!("altered {name}");
            }
        }
        QueueCommand::Delete { name } => {
            block_on(admin.delete_queue(&name)).map_err(e)?;
            if json {
                out!("{}", serde_json::json!({ "deleted": name }));
            } else {
                out!("deleted {name}");
            }
        }
    }
    Ok(())
}
