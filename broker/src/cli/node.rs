//! `strand node list | describe ID | drain ID | undrain ID | decommission
//! ID`: the brokers, maintenance, and moving a broker's replicas away.
//!
//! `node list --output json`, a contract: a list of `{"id": 1, "address":
//! "HOST:PORT", "alive": true, "draining": false, "leaders": N,
//! "replicas": N, "disk_free_bytes": N}` — the brokers of `cluster status`
//! with their maintenance flag and their data directory's free space as
//! each reports it (`null` for a broker that does not answer); also
//! `"decommissioning"` and `"moving_off"` (replicas a move in progress
//! removes from it).
//!
//! `node describe ID [--output json]`: the same for one broker, and every
//! partition it holds or is gaining, with its replicas, ISR and the target
//! of a move in progress — how a decommission's progress shows.
//!
//! `node decommission ID` moves every replica the broker holds to other
//! brokers (one reassignment each: the new replica catches up as a
//! follower, then the old one is removed and deleted) and hands its
//! leaderships over at once; it returns once the moves began, and `node
//! describe ID` shows them until the broker holds nothing. Refused when
//! the other brokers cannot hold some partition's replication factor.
//! `node decommission ID --cancel` stops it: the moves still in progress
//! go back to where each partition was, the completed ones stay, and the
//! broker takes new replicas and (at the next leader balancing) its
//! preferred leaderships again.
//!
//! `node drain ID` puts broker ID into maintenance: every leadership it
//! holds moves to another in-sync replica (where one exists), it stays a
//! follower of everything it holds, and placement, failover and leader
//! balancing give it no leadership while another replica can take it; it
//! stays so across its restarts. `node undrain ID` ends it, and leader
//! balancing gives its preferred leaderships back.

use clap::Subcommand;
use strand_client::{block_on, Admin, BrokerDescription, PartitionPlacement};

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
    /// Broker ID and every partition it holds or is gaining, with moves in
    /// progress (a decommission's progress).
    Describe { id: u32 },
    /// Move every replica off broker ID onto the others (then it holds
    /// nothing and can be switched off); with --cancel, stop that: moves in
    /// progress go back, completed ones stay.
    Decommission {
        id: u32,
        /// Cancel broker ID's decommission instead.
        #[arg(long)]
        cancel: bool,
    },
}

/// Runs a node command; `json` selects machine output.
pub fn run(command: NodeCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
    let free_space = |b: &BrokerDescription| {
        b.alive
            .then(|| block_on(admin.describe_broker(&b.address)).ok())
            .flatten()
            .map(|d| d.free_bytes)
    };
    match command {
        NodeCommand::List => {
            let cluster = block_on(admin.describe_cluster()).map_err(|e| e.to_string())?;
            let nodes: Vec<(BrokerDescription, Option<u64>)> = cluster
                .brokers
                .into_iter()
                .map(|b| {
                    let free = free_space(&b);
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
                let state = state(b);
                let free = show_free(*free);
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
        NodeCommand::Decommission { id, cancel: true } => {
            block_on(admin.cancel_decommission(id)).map_err(|e| e.to_string())?;
            out!(
                "broker {id} no longer decommissioning: moves in progress go back, completed ones stay; it takes \
                 replicas again"
            );
        }
        NodeCommand::Decommission { id, cancel: false } => {
            block_on(admin.decommission_broker(id)).map_err(|e| e.to_string())?;
            out!(
                "broker {id} decommissioning: its leaderships moved, its replicas are moving to the other brokers \
                 (strand node describe {id} shows the progress)"
            );
        }
        NodeCommand::Describe { id } => {
            let cluster = block_on(admin.describe_cluster()).map_err(|e| e.to_string())?;
            let b = cluster
                .brokers
                .iter()
                .find(|b| b.id == id)
                .ok_or_else(|| format!("no broker {id} in the cluster (strand node list shows the brokers)"))?;
            let free = free_space(b);
            let parts: Vec<&PartitionPlacement> = cluster
                .partitions
                .iter()
                .filter(|p| p.replicas.contains(&id) || p.target.as_ref().is_some_and(|t| t.contains(&id)))
                .collect();
            if json {
                out!("{}", describe_json(b, free, &parts));
                return Ok(());
            }
            let rows = [
                ("broker", b.id.to_string()),
                ("address", b.address.clone()),
                ("state", state(b).to_string()),
                ("leaders", b.leaders.to_string()),
                ("replicas", b.replicas.to_string()),
                ("moving off", b.moving_off.to_string()),
                ("disk free", show_free(free)),
            ];
            for (k, v) in rows {
                out!("{k:<12} {v}");
            }
            out!("");
            let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let width = parts.iter().map(|p| p.queue.len()).max().unwrap_or(5).max(5);
            out!(
                "{:<width$}  {:>9}  {:>6}  {:<12}  {:<12}  {:<12}  STATE",
                "QUEUE",
                "PARTITION",
                "LEADER",
                "REPLICAS",
                "ISR",
                "TARGET"
            );
            for p in parts {
                let target = p.target.as_deref().map_or("-".to_string(), ids);
                out!(
                    "{:<width$}  {:>9}  {:>6}  {:<12}  {:<12}  {:<12}  {}",
                    p.queue,
                    p.partition,
                    p.leader,
                    ids(&p.replicas),
                    ids(&p.isr),
                    target,
                    move_state(p, id)
                );
            }
        }
    }
    Ok(())
}

/// A broker's state in one word.
fn state(b: &BrokerDescription) -> &'static str {
    match (b.alive, b.decommissioning, b.draining) {
        (false, _, _) => "fenced",
        (true, true, _) => "decommissioning",
        (true, false, true) => "draining",
        (true, false, false) => "alive",
    }
}

fn show_free(free: Option<u64>) -> String {
    free.map_or("-".to_string(), |f| format!("{:.1} GiB", f as f64 / f64::from(1 << 30)))
}

/// Where broker `id` stands with partition `p`: in sync, catching up,
/// or (in a move) gaining or losing its replica.
fn move_state(p: &PartitionPlacement, id: u32) -> &'static str {
    let in_sync = p.isr.contains(&id);
    match p.target.as_ref().map(|t| t.contains(&id)) {
        None if in_sync => "in sync",
        None => "catching up",
        Some(false) => "moving off",
        Some(true) if in_sync => "joined, waiting for the others",
        Some(true) => "moving on, catching up",
    }
}

/// The JSON document of `node describe ID --output json`.
pub fn describe_json(b: &BrokerDescription, free: Option<u64>, parts: &[&PartitionPlacement]) -> serde_json::Value {
    let parts: Vec<serde_json::Value> = parts
        .iter()
        .map(|p| {
            serde_json::json!({
                "queue": p.queue, "partition": p.partition, "leader": p.leader, "replicas": p.replicas,
                "isr": p.isr, "target": p.target,
            })
        })
        .collect();
    serde_json::json!({
        "id": b.id, "address": b.address, "alive": b.alive, "draining": b.draining,
        "decommissioning": b.decommissioning, "leaders": b.leaders, "replicas": b.replicas,
        "moving_off": b.moving_off, "disk_free_bytes": free, "partitions": parts,
    })
}

/// The JSON document of `node list --output json`.
pub fn list_json(nodes: &[(BrokerDescription, Option<u64>)]) -> serde_json::Value {
    nodes
        .iter()
        .map(|(b, free)| {
            serde_json::json!({
                "id": b.id, "address": b.address, "alive": b.alive, "draining": b.draining,
                "decommissioning": b.decommissioning, "leaders": b.leaders, "replicas": b.replicas,
                "moving_off": b.moving_off, "disk_free_bytes": free,
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
            decommissioning: false,
            leaders: 0,
            replicas: 6,
            under_replicated: 0,
            moving_off: 0,
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
                {"id": 2, "address": "10.0.0.2:9400", "alive": true, "draining": true,
                 "decommissioning": false, "leaders": 0, "replicas": 6, "moving_off": 0,
                 "disk_free_bytes": 1073741824u64},
                {"id": 3, "address": "10.0.0.2:9400", "alive": false, "draining": false,
                 "decommissioning": false, "leaders": 0, "replicas": 6, "moving_off": 0,
                 "disk_free_bytes": null}
            ])
        );
    }

    #[test]
    fn a_move_shows_from_each_replica_s_side() {
        let p = PartitionPlacement {
            queue: "q".into(),
            partition: 0,
            leader: 1,
            replicas: vec![2, 3, 4, 1],
            isr: vec![2, 3, 1],
            target: Some(vec![2, 3, 4]),
            lost_replica: None,
        };
        assert_eq!(move_state(&p, 1), "moving off");
        assert_eq!(move_state(&p, 2), "joined, waiting for the others");
        assert_eq!(move_state(&p, 4), "moving on, catching up");
        let settled = PartitionPlacement {
            replicas: vec![2, 3, 4],
            isr: vec![2, 3],
            target: None,
            ..p.clone()
        };
        assert_eq!(
            (move_state(&settled, 2), move_state(&settled, 4)),
            ("in sync", "catching up")
        );
        let b = BrokerDescription {
            id: 4,
            address: "10.0.0.4:9400".into(),
            alive: true,
            draining: false,
            decommissioning: false,
            leaders: 0,
            replicas: 1,
            under_replicated: 0,
            moving_off: 0,
        };
        assert_eq!(
            describe_json(&b, None, &[&p]),
            serde_json::json!({"id": 4, "address": "10.0.0.4:9400", "alive": true, "draining": false,
                "decommissioning": false, "leaders": 0, "replicas": 1, "moving_off": 0,
                "disk_free_bytes": null, "partitions": [{"queue": "q", "partition": 0, "leader": 1,
                "replicas": [2, 3, 4, 1], "isr": [2, 3, 1], "target": [2, 3, 4]}]})
        );
    }
}
