//! A shard's figures for a metrics scrape: its counters, and per
//! partition the log's gauges and fdatasync statistics.
//!
//! Runs on: the shard itself (the metrics endpoint on shard 0 asks the
//! others over the mesh).

use super::messages::{Answer, ShardMessage};
use super::partitions::Role;
use super::Shard;
use crate::controller::NO_LEADER;
use crate::metrics::BrokerGauges;

/// How many in-sync replicas a partition should have: its replicas, or
/// during a move its target's count (the replication factor) — a
/// reassignment adds replicas before it removes others, and is not under
/// replication while as many as the factor are in sync (Kafka leaves the
/// adding replicas out the same way).
fn wanted_in_sync(record: &crate::controller::PartitionRecord) -> usize {
    record.target.as_ref().unwrap_or(&record.replicas).len()
}

impl Shard {
    /// This shard's counters and partitions, for a scrape (the group
    /// positions are the coordinator's to add: `groups::add_to_snapshot`).
    pub fn snapshot(&self) -> crate::metrics::ShardSnapshot {
        let mut snap = crate::metrics::ShardSnapshot {
            shard: self.id.0,
            fsync_buckets: vec![0; strand_storage::log::SYNC_BUCKETS_SECS.len() + 1],
            ..Default::default()
        };
        // One pass over the partitions: their gauges and fdatasync stats.
        let table = self.table();
        for ((queue, partition), part) in self.partitions.all() {
            let log = &part.log;
            let record = table.queue(&queue).and_then(|q| q.partitions.get(partition as usize));
            let led = match &*part.role.borrow() {
                Role::Leader { state, .. } => Some(crate::metrics::LeaderGauges {
                    replicas: record.map_or(state.replica_count(), wanted_in_sync) as u32,
                    isr: state.isr().len() as u32,
                    min_insync: state.min_insync() as u32,
                    follower_lags: state.follower_lags(),
                }),
                Role::Follower { .. } => None,
            };
            snap.partitions.push(crate::metrics::PartitionGauges {
                queue,
                partition,
                log_start: log.log_start().0,
                log_end: log.log_end().0,
                high_watermark: log.high_watermark().0,
                stored_bytes: log.size_bytes(),
                leader_epoch: part.leader_epoch(),
                led,
            });
            let stats = log.stats();
            for (b, n) in snap.fsync_buckets.iter_mut().zip(stats.sync_buckets) {
                *b += n;
            }
            snap.fsync_sum_secs += stats.sync_ns as f64 / 1e9;
            snap.fsync_count += stats.syncs;
            snap.write_through_writes += stats.write_through_writes;
            snap.rolls += stats.rolls;
            snap.recycled += stats.recycled;
        }
        if self.id.0 == 0 {
            snap.disk = self.disk.space().map(|s| (self.config.node_id, s.free, s.threshold));
            let table = self.table();
            // One pass over the partitions (not one per broker): the
            // replicas a move in progress removes, per broker.
            let mut leaving: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
            for p in table.queues.values().flat_map(|q| &q.partitions) {
                if let Some(target) = &p.target {
                    for r in p.replicas.iter().filter(|r| !target.contains(r)) {
                        *leaving.entry(*r).or_default() += 1;
                    }
                }
            }
            snap.brokers = table
                .brokers
                .values()
                .map(|b| BrokerGauges {
                    id: b.id,
                    draining: b.draining,
                    decommissioning: b.decommissioning,
                    moving_off: leaving.get(&b.id).copied().unwrap_or(0),
                })
                .collect();
            snap.offline = table
                .queues
                .values()
                .map(|q| {
                    let offline = q.partitions.iter().filter(|p| p.leader == NO_LEADER).count();
                    (q.name.clone(), offline as u64)
                })
                .collect();
            snap.unclean_elections = Some(table.unclean_elections);
        }
        let storage = self.partitions.storage();
        snap.tail_cache_bytes = storage.tail_cache_bytes() as u64;
        snap.readahead_bytes = storage.readahead_bytes() as u64;
        snap.readahead_refused = storage.readahead_refused();
        if let Some(journal) = storage.journal() {
            let stats = journal.stats();
            (snap.journal_frames, snap.journal_bytes) = (stats.frames, stats.bytes);
        }
        self.metrics.fill(&mut snap);
        snap.busy_ratio = self
            .metrics
            .busy_ratio(glommio::executor().executor_stats().total_runtime());
        snap.requests_in_flight = self.in_flight.get() as u64;
        snap
    }

    /// Asks shard `peer` for its snapshot over the mesh; `None` if it has
    /// stopped.
    pub async fn ask_snapshot(&self, peer: u16) -> Option<crate::metrics::ShardSnapshot> {
        let (tx, rx) = Answer::channel(self.id.0);
        self.peers
            .send_to(usize::from(peer), ShardMessage::Stats { reply: tx })
            .await
            .ok()?;
        rx.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::PartitionRecord;

    #[test]
    fn a_move_in_progress_is_under_replicated_only_below_its_replication_factor() {
        let mut p = PartitionRecord {
            replicas: vec![1, 2, 3],
            leader: 1,
            leader_epoch: 0,
            isr: vec![1, 2, 3],
            partition_epoch: 0,
            target: None,
            lost: None,
            decommission_moves: Vec::new(),
        };
        assert_eq!(wanted_in_sync(&p), 3);
        // Moving 3 off to 4: four replicas while 4 catches up, three wanted.
        p.target = Some(vec![1, 2, 4]);
        p.replicas = vec![1, 2, 4, 3];
        assert_eq!(
            wanted_in_sync(&p),
            3,
            "the adding replica does not count against the ISR"
        );
    }
}
