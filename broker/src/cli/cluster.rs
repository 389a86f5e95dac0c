//! `strand cluster status`: the controller leader and every broker, with
//! its liveness and the partitions it leads and holds, as the node asked
//! knows them.
//!
//! JSON (`--output json`), a contract:
//! `{"controller": ID, "offline_partitions": N, "brokers": [{"id": 1,
//! "address": "HOST:PORT", "alive": true, "leaders": N, "replicas": N,
//! "under_replicated": N}]}` (`controller` 0: the node knows no leader
//! now; `under_replicated`: partitions the broker leads with fewer in-sync
//! replicas than replicas; `offline_partitions`: partitions with no
//! leader), plus, only while some partition is offline, `"offline":
//! [{"queue": Q, "partition": N, "reason": TEXT, "lost_replica":
//! ID|null}]`, each partition without a leader and why.
//!
//! `strand cluster health [--wait SECONDS]`: exits 0 only when the cluster
//! has a controller leader, every broker is alive and every partition has
//! a leader and all its replicas in sync (like `rpk cluster health
//! --exit-when-healthy`); with `--wait`, it asks again every half second
//! until then or until SECONDS pass. JSON, a contract: `{"healthy": BOOL,
//! "controller": ID, "brokers_down": [ID], "offline": [{"queue": Q,
//! "partition": N, "reason": TEXT}], "under_replicated": [{"queue": Q,
//! "partition": N, "replicas": [ID], "isr": [ID]}]}`.

use clap::Subcommand;
use strand_client::{block_on, ClusterDescription};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The controller leader and each broker: address, alive or fenced,
    /// partitions led, replicas held, led partitions under-replicated.
    Status,
    /// Exit 0 only when every broker is alive and every partition has a
    /// leader and all its replicas in sync; else say what is not and exit
    /// 1.
    Health {
        /// Ask again every half second until healthy, at most this long.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
    },
}

/// What keeps a cluster from being healthy (none: healthy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// No controller leader known to the node asked.
    NoController,
    /// A broker the controller fenced (its lease expired).
    BrokerDown { id: u32, address: String },
    /// A partition without a leader, and why.
    Offline {
        queue: String,
        partition: u32,
        reason: String,
    },
    /// A partition with replicas out of sync.
    UnderReplicated {
        queue: String,
        partition: u32,
        replicas: Vec<u32>,
        isr: Vec<u32>,
    },
}

/// Everything that keeps `cluster` from being healthy.
pub fn problems(cluster: &ClusterDescription) -> Vec<Problem> {
    let mut out = Vec::new();
    if cluster.controller == 0 {
        out.push(Problem::NoController);
    }
    for b in cluster.brokers.iter().filter(|b| !b.alive) {
        out.push(Problem::BrokerDown {
            id: b.id,
            address: b.address.clone(),
        });
    }
    for p in &cluster.partitions {
        if let Some(reason) = p.offline_reason() {
            out.push(Problem::Offline {
                queue: p.queue.clone(),
                partition: p.partition,
                reason,
            });
        } else if p.under_replicated() {
            out.push(Problem::UnderReplicated {
                queue: p.queue.clone(),
                partition: p.partition,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
            });
        }
    }
    out
}

/// The JSON document of `cluster health --output json`.
pub fn health_json(controller: u32, problems: &[Problem]) -> serde_json::Value {
    let mut down = Vec::new();
    let mut offline = Vec::new();
    let mut under = Vec::new();
    for p in problems {
        match p {
            Problem::NoController => {}
            Problem::BrokerDown { id, .. } => down.push(serde_json::json!(id)),
            Problem::Offline {
                queue,
                partition,
                reason,
            } => offline.push(serde_json::json!({ "queue": queue, "partition": partition, "reason": reason })),
            Problem::UnderReplicated {
                queue,
                partition,
                replicas,
                isr,
            } => under.push(serde_json::json!({
                "queue": queue, "partition": partition, "replicas": replicas, "isr": isr,
            })),
        }
    }
    serde_json::json!({
        "healthy": problems.is_empty(), "controller": controller, "brokers_down": down,
        "offline": offline, "under_replicated": under,
    })
}

/// One line for people.
fn describe(p: &Problem) -> String {
    match p {
        Problem::NoController => {
            "no controller leader (a majority of the voters is not up, or an election is on)".into()
        }
        Problem::BrokerDown { id, address } => format!("broker {id} ({address}) is fenced: not alive"),
        Problem::Offline {
            queue,
            partition,
            reason,
        } => format!("{queue}/{partition} has no leader: {reason}"),
        Problem::UnderReplicated {
            queue,
            partition,
            replicas,
            isr,
        } => {
            let missing: Vec<String> = replicas
                .iter()
                .filter(|r| !isr.contains(r))
                .map(u32::to_string)
                .collect();
            format!(
                "{queue}/{partition}: {} of {} replicas in sync (not {})",
                isr.len(),
                replicas.len(),
                missing.join(", ")
            )
        }
    }
}

/// `cluster health`: asks until healthy or `wait` passes, then reports.
fn health(admin: &strand_client::Admin, wait: std::time::Duration, json: bool) -> Result<(), String> {
    let deadline = std::time::Instant::now() + wait;
    let (controller, found) = loop {
        let answer = block_on(admin.describe_cluster()).map_err(|e| e.to_string());
        let done = std::time::Instant::now() >= deadline;
        match answer {
            Ok(cluster) => {
                let found = problems(&cluster);
                if found.is_empty() || done {
                    break (cluster.controller, found);
                }
            }
            Err(e) if done => return Err(e),
            Err(_) => {}
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(500).min(left));
    };
    if json {
        out!("{}", health_json(controller, &found));
    } else if found.is_empty() {
        out!("healthy: every broker alive, every partition led with all its replicas in sync");
    } else {
        out!("not healthy:");
        for p in &found {
            out!("  {}", describe(p));
        }
    }
    match found.len() {
        0 => Ok(()),
        n => Err(format!("the cluster is not healthy ({n} problems)")),
    }
}

/// Runs a cluster command; `json` selects machine output.
pub fn run(command: ClusterCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    match command {
        ClusterCommand::Health { wait } => return health(&admin, std::time::Duration::from_secs(wait), json),
        ClusterCommand::Status => {
            let cluster = block_on(admin.describe_cluster()).map_err(|e| e.to_string())?;
            if json {
                out!("{}", status_json(&cluster));
            } else {
                let controller = match cluster.controller {
                    0 => "none (no leader known; retry in a few seconds)".to_string(),
                    id => id.to_string(),
                };
                out!("controller leader: {controller}");
                if cluster.offline > 0 {
                    out!("offline partitions (no leader): {}", cluster.offline);
                    for p in &cluster.partitions {
                        if let Some(why) = p.offline_reason() {
                            out!("  {}/{}: {why}", p.queue, p.partition);
                        }
                    }
                }
                let width = cluster
                    .brokers
                    .iter()
                    .map(|b| b.address.len())
                    .max()
                    .unwrap_or(7)
                    .max(7);
                out!(
                    "{:>4}  {:<width$}  {:<6}  {:>7}  {:>8}  {:>16}",
                    "ID",
                    "ADDRESS",
                    "STATE",
                    "LEADERS",
                    "REPLICAS",
                    "UNDER-REPLICATED"
                );
                for b in &cluster.brokers {
                    let state = if b.alive { "alive" } else { "fenced" };
                    out!(
                        "{:>4}  {:<width$}  {:<6}  {:>7}  {:>8}  {:>16}",
                        b.id,
                        b.address,
                        state,
                        b.leaders,
                        b.replicas,
                        b.under_replicated
                    );
                }
            }
        }
    }
    Ok(())
}

/// The JSON document of `cluster status --output json`.
pub fn status_json(cluster: &ClusterDescription) -> serde_json::Value {
    let brokers: Vec<_> = cluster
        .brokers
        .iter()
        .map(|b| {
            serde_json::json!({
                "id": b.id, "address": b.address, "alive": b.alive,
                "leaders": b.leaders, "replicas": b.replicas, "under_replicated": b.under_replicated,
            })
        })
        .collect();
    let offline: Vec<_> = cluster
        .partitions
        .iter()
        .filter_map(|p| {
            let reason = p.offline_reason()?;
            Some(serde_json::json!({
                "queue": p.queue, "partition": p.partition, "reason": reason, "lost_replica": p.lost_replica,
            }))
        })
        .collect();
    let mut doc = serde_json::json!({
        "controller": cluster.controller, "offline_partitions": cluster.offline, "brokers": brokers,
    });
    // Only while some partition is offline: a healthy cluster's document
    // stays as it was.
    if !offline.is_empty() {
        doc["offline"] = serde_json::Value::Array(offline);
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use strand_client::BrokerDescription;

    #[test]
    fn the_json_has_the_contracted_fields() {
        let cluster = ClusterDescription {
            controller: 2,
            brokers: vec![BrokerDescription {
                id: 1,
                address: "10.0.0.1:9400".into(),
                alive: false,
                draining: false,
                decommissioning: false,
                leaders: 3,
                replicas: 5,
                under_replicated: 1,
                moving_off: 0,
            }],
            offline: 1,
            partitions: vec![
                strand_client::PartitionPlacement {
                    queue: "orders".into(),
                    partition: 3,
                    leader: 0,
                    replicas: vec![1, 2],
                    isr: vec![],
                    target: None,
                    lost_replica: Some(1),
                },
                strand_client::PartitionPlacement {
                    queue: "orders".into(),
                    partition: 4,
                    leader: 2,
                    replicas: vec![2, 1],
                    isr: vec![2],
                    target: None,
                    lost_replica: None,
                },
            ],
        };
        let mut healthy = cluster.clone();
        healthy.offline = 0;
        healthy.partitions.remove(0);
        assert!(
            status_json(&healthy).get("offline").is_none(),
            "no key while none is offline"
        );
        let reason = cluster.partitions[0].offline_reason().unwrap();
        assert!(
            reason.starts_with("offline: waiting for a replica with the data"),
            "{reason}"
        );
        assert!(
            reason.ends_with("or `strand queue elect --unclean` to accept loss"),
            "{reason}"
        );
        assert_eq!(
            status_json(&cluster),
            serde_json::json!({"controller": 2, "offline_partitions": 1, "brokers": [
                {"id": 1, "address": "10.0.0.1:9400", "alive": false, "leaders": 3, "replicas": 5,
                 "under_replicated": 1}
            ], "offline": [{"queue": "orders", "partition": 3, "reason": reason, "lost_replica": 1}]})
        );
    }

    #[test]
    fn health_names_every_problem_and_none_when_healthy() {
        let broker = |id: u32, alive: bool| BrokerDescription {
            id,
            address: format!("10.0.0.{id}:9400"),
            alive,
            draining: false,
            decommissioning: false,
            leaders: 0,
            replicas: 0,
            under_replicated: 0,
            moving_off: 0,
        };
        let partition = |n: u32, leader: u32, isr: Vec<u32>| strand_client::PartitionPlacement {
            queue: "q".into(),
            partition: n,
            leader,
            replicas: vec![1, 2, 3],
            isr,
            target: None,
            lost_replica: None,
        };
        let healthy = ClusterDescription {
            controller: 1,
            brokers: vec![broker(1, true), broker(2, true), broker(3, true)],
            offline: 0,
            partitions: vec![partition(0, 1, vec![1, 2, 3]), partition(1, 2, vec![3, 2, 1])],
        };
        assert_eq!(problems(&healthy), vec![]);
        assert_eq!(health_json(1, &[])["healthy"], true);
        let sick = ClusterDescription {
            controller: 0,
            brokers: vec![broker(1, true), broker(2, true), broker(3, false)],
            offline: 1,
            partitions: vec![partition(0, 1, vec![1, 2]), partition(1, 0, vec![])],
        };
        let found = problems(&sick);
        assert_eq!(found.len(), 4, "{found:?}");
        assert_eq!(found[0], Problem::NoController);
        assert!(
            describe(&found[2]).contains("2 of 3 replicas in sync (not 3)"),
            "{}",
            describe(&found[2])
        );
        let doc = health_json(0, &found);
        assert_eq!(doc["healthy"], false);
        assert_eq!(doc["brokers_down"], serde_json::json!([3]));
        assert_eq!(doc["under_replicated"][0]["isr"], serde_json::json!([1, 2]));
        assert_eq!(doc["offline"][0]["partition"], 1);
    }
}
