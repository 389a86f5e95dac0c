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

use clap::Subcommand;
use strand_client::{block_on, ClusterDescription};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The controller leader and each broker: address, alive or fenced,
    /// partitions led, replicas held, led partitions under-replicated.
    Status,
}

/// Runs a cluster command; `json` selects machine output.
pub fn run(command: ClusterCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = strand_client::Admin::connect(brokers).map_err(|e| e.to_string())?;
    match command {
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
}
