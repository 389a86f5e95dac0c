//! `strand group list|describe|reset|delete`.

use clap::Subcommand;
use strand_client::{block_on, GroupStart, ResetTarget, Seek, Strategy};

#[derive(Subcommand, Debug)]
pub enum GroupCommand {
    /// List consumer groups.
    List,
    /// Members, and per queue and partition: member, position, log end, lag.
    Describe {
        /// The group to describe.
        group: String,
    },
    /// Move the group's positions on a queue (replay or skip); only while
    /// the group has no active members.
    Reset {
        /// The group whose positions move.
        group: String,
        /// The queue whose positions move (a group may read several).
        #[arg(long)]
        queue: String,
        /// Only these partitions, comma-separated (0,3) [default: every
        /// partition of the queue].
        #[arg(long, value_delimiter = ',', value_name = "P[,P...]")]
        partitions: Vec<u32>,
        /// Where to: earliest, latest, offset:N (within each partition's
        /// log) or time:RFC3339 (the first record at or after it).
        #[arg(long, value_name = "WHERE")]
        to: String,
    },
    /// Delete a group and its positions; only while it has no active members.
    Delete {
        /// The group to delete.
        group: String,
    },
}

fn target(text: &str) -> Result<ResetTarget, String> {
    Ok(
        match super::consume::start(text).map_err(|e| e.replace("--from", "--to"))? {
            Seek::Earliest => ResetTarget::Earliest,
            Seek::Latest => ResetTarget::Latest,
            Seek::Offset(o) => ResetTarget::Offset(o),
            Seek::Timestamp(t) => ResetTarget::Timestamp(t),
        },
    )
}

fn strategy(s: Strategy) -> &'static str {
    match s {
        Strategy::Range => "range",
        Strategy::RoundRobin => "round-robin",
        Strategy::Sticky => "sticky",
    }
}

fn dash(v: Option<u64>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

/// Runs a group command; `json` selects machine output.
pub fn run(command: GroupCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    let e = |e: strand_client::ClientError| e.to_string();
    match command {
        GroupCommand::List => {
            let groups = block_on(admin.list_groups()).map_err(e)?;
            if json {
                let list: Vec<_> = groups
                    .iter()
                    .map(|g| serde_json::json!({ "name": g.name, "members": g.members, "generation": g.generation }))
                    .collect();
                out!("{}", serde_json::Value::Array(list));
            } else {
                let width = groups.iter().map(|g| g.name.len()).max().unwrap_or(4).max(4);
                out!("{:<width$}  {:>7}  {:>10}", "NAME", "MEMBERS", "GENERATION");
                for g in groups {
                    out!("{:<width$}  {:>7}  {:>10}", g.name, g.members, g.generation);
                }
            }
        }
        GroupCommand::Describe { group } => {
            let d = block_on(admin.describe_group(&group)).map_err(e)?;
            let start = if d.start == GroupStart::Earliest {
                "earliest"
            } else {
                "latest"
            };
            if json {
                let members: Vec<_> = d
                    .members
                    .iter()
                    .map(|m| {
                        let owned: Vec<_> = m
                            .owned
                            .iter()
                            .map(|(q, p)| serde_json::json!({ "queue": &**q, "partition": p }))
                            .collect();
                        serde_json::json!({
                            "member_id": m.member_id, "client_name": m.client_name,
                            "queues": m.queues, "partitions": owned,
                        })
                    })
                    .collect();
                let parts: Vec<_> = d
                    .partitions
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "queue": p.queue, "partition": p.partition, "member_id": p.member_id,
                            "position": p.position, "log_end": p.log_end, "lag": p.lag, "error": p.error,
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    serde_json::json!({
                        "name": d.name, "strategy": strategy(d.strategy), "start": start,
                        "generation": d.generation, "members": members, "partitions": parts,
                    })
                );
            } else {
                out!(
                    "group {}  strategy {}  start {}  generation {}  members {}",
                    d.name,
                    strategy(d.strategy),
                    start,
                    d.generation,
                    d.members.len()
                );
                let qw = d.partitions.iter().map(|p| p.queue.len()).max().unwrap_or(5).max(5);
                let mw = d
                    .partitions
                    .iter()
                    .filter_map(|p| p.member_id.as_ref().map(String::len))
                    .max()
                    .unwrap_or(6)
                    .max(6);
                out!(
                    "{:<qw$}  {:>9}  {:<mw$}  {:>12}  {:>12}  {:>10}",
                    "QUEUE",
                    "PARTITION",
                    "MEMBER",
                    "POSITION",
                    "LOG_END",
                    "LAG"
                );
                for p in &d.partitions {
                    out!(
                        "{:<qw$}  {:>9}  {:<mw$}  {:>12}  {:>12}  {:>10}{}",
                        p.queue,
                        p.partition,
                        p.member_id.as_deref().unwrap_or("-"),
                        dash(p.position),
                        dash(p.log_end),
                        dash(p.lag),
                        p.error.as_ref().map_or(String::new(), |e| format!("  ({e})"))
                    );
                }
            }
        }
        GroupCommand::Reset {
            group,
            queue,
            partitions,
            to,
        } => {
            let positions = block_on(admin.reset_group(&group, &queue, &partitions, target(&to)?)).map_err(e)?;
            if json {
                let list: Vec<_> = positions
                    .iter()
                    .map(|(p, o)| serde_json::json!({ "queue": queue, "partition": p, "position": o }))
                    .collect();
                out!("{}", serde_json::Value::Array(list));
            } else {
                out!("{:>9}  {:>12}", "PARTITION", "POSITION");
                for (p, o) in positions {
                    out!("{p:>9}  {o:>12}");
                }
            }
        }
        GroupCommand::Delete { group } => {
            block_on(admin.delete_group(&group)).map_err(e)?;
            if json {
                out!("{}", serde_json::json!({ "deleted": group }));
            } else {
                out!("deleted {group}");
            }
        }
    }
    Ok(())
}
