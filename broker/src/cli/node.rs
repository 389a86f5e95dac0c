//! `strand node list | drain ID | undrain ID`: the brokers, and
//! maintenance.
//!
//! `node list --output json`, a contract: a list of `{"id": 1, "address":
//! "HOST:PORT", "alive": true, "draining": false, "leaders": N,
//! "replicas": N, "disk_free_bytes": N}` — the brokers of `cluster status`
//! with their maintenance flag and their data directory's free space as
//! each reports it (`null` for a broker that does not answer).
//!
//! `node drain ID` puts broker ID into maintenance: every leadership it
//! holds moves to another in-sync replica (where one exists), it stays a
//! follower of everything it holds, and placement, failover and leader
//! balancing give it no leadership while another replica can take it; it
//! stays so across its restarts. `node undrain ID` ends it, and leader
//! balancing gives its preferred leaderships back.

use clap::Subcommand;
use strand_client::{block_on, Admin, BrokerDescription};

#[derive(Subcommand, Debug)]
pub enum NodeCommand {
    /// Each broker: address, alive or fenced, draining, partitions led,
    /// replicas held, free space in its data directory.
    List,
    /// Move every leadership off broker ID and keep it a follower
    /// (maintenance mode).
    Drain { id: u32 },
    /// End broker ID's maintenance: it leads its preferred partitions again.
    Undrain { id: u32 },
}

/// Runs a node command; `json` selects machine output.
pub fn run(command: NodeCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
    match command {
        NodeCommand::List => {
            let cluster = block_on(admin.describe_cluster()).map_err(|e| e.to_string())?;
            let nodes: Vec<(BrokerDescription, Option<u64>)> = cluster
                .brokers
                .into_iter()
                .map(|b| {
                    let free = b
                        .alive
                        .then(|| block_on(admin.describe_broker(&b.address)).ok())
                        .flatten()
                        .map(|d| d.free_bytes);
                    (b, free)
                })
                .collect();
            if json {
                out!("{}", list_json(&nodes));
                return Ok(());
            }
            let width = nodes.iter().map(|(b, _)| b.address.len()).max().unwrap_or(7).max(7);
            out!(
                "{:>4}  {:<width$}  {:<8}  {:>7}  {:>8}  {:>10}",
                "ID",
                "ADDRESS",
                "STATE",
                "LEADERS",
                "REPLICAS",
                "DISK FREE"
            );
            for (b, free) in &nodes {
                let state = match (b.alive, b.draining) {
                    (false, _) => "fenced",
                    (true, true) => "draining",
                    (true, false) => "alive",
                };
                let free = free.map_or("-".to_string(), |f| format!("{:.1} GiB", f as f64 / f64::from(1 << 30)));
                out!(
                    "{:>4}  {:<width$}  {:<8}  {:>7}  {:>8}  {:>10}",
                    b.id,
                    b.address,
                    state,
                    b.leaders,
                    b.replicas,
                    free
                );
            }
        }
        NodeCommand::Drain { id } | NodeCommand::Undrain { id } => {
            let draining = matches!(command, NodeCommand::Drain { .. });
            block_on(admin.drain_broker(id, draining)).map_err(|e| e.to_string())?;
            let what = if draining {
                "draining: its leaderships move to other in-sync replicas"
            } else {
                "undrained: it leads its preferred partitions again at the next leader balancing"
            };
            out!("broker {id} {what}");
        }
    }
    Ok(())
}

/// The JSON document of `node list --output json`.
pub fn list_json(nodes: &[(BrokerDescription, Option<u64>)]) -> serde_json::Value {
    nodes
        .iter()
        .map(|(b, free)| {
            serde_json::json!({
                "id": b.id, "address": b.address, "alive": b.alive, "draining": b.draining,
                "leaders": b.leaders, "replicas": b.replicas, "disk_free_bytes": free,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_the_contracted_fields() {
        let b = BrokerDescription {
            id: 2,
            address: "10.0.0.2:9400".into(),
            alive: true,
            draining: true,
            leaders: 0,
            replicas: 6,
            under_replicated: 0,
        };
        let fenced = BrokerDescription {
            id: 3,
            alive: false,
            draining: false,
            ..b.clone()
        };
        assert_eq!(
            list_json(&[(b, Some(1 << 30)), (fenced, None)]),
            serde_json::json!([
                {"id": 2, "address": "10.0.0.2:9400", "alive": true, "draining": true, "leaders": 0,
                 "replicas": 6, "disk_free_bytes": 1073741824u64},
                {"id": 3, "address": "10.0.0.2:9400", "alive": false, "draining": false, "leaders": 0,
                 "replicas": 6, "disk_free_bytes": null}
            ])
        );
    }
}
