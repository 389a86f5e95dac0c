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
//! leader).

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
    serde_json::json!({
        "controller": cluster.controller, "offline_partitions": cluster.offline, "brokers": brokers,
    })
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
            offline: 4,
            partitions: Vec::new(),
        };
        assert_eq!(
            status_json(&cluster),
            serde_json::json!({"controller": 2, "offline_partitions": 4, "brokers": [
                {"id": 1, "address": "10.0.0.1:9400", "alive": false, "leaders": 3, "replicas": 5,
                 "under_replicated": 1}
            ]})
        );
    }
}
