//! Moving replicas: a partition's (`strand queue reassign`) and all of a
//! broker's (`strand node decommission`). Part of the state machine: sans
//! I/O, deterministic.
//!
//! A reassignment of a partition to `target` (Kafka's KIP-455 shape):
//! 1. **Start**: `replicas` becomes `target` followed by the current
//!    replicas not in it, and `target` is recorded. The new replicas open
//!    an empty log and fetch from the leader like any follower (one whose
//!    log ends before the leader's log start starts there).
//! 2. **Catch up**: the leader adds each to the ISR once it holds the high
//!    watermark and the start of the leader's epoch (`AlterIsr`, the usual
//!    rule).
//! 3. **Complete**, in the same apply as the `AlterIsr` that puts the last
//!    of `target` into the ISR: `replicas` becomes `target`, the others
//!    leave the ISR and close (and delete) their copy, and a leader that is
//!    not in `target` hands over to the first alive in-sync one of it (a new
//!    leader epoch; clients follow the `NotLeader` hint).
//!
//! Nothing acknowledged can be lost: the ISR only ever shrinks to members
//! of `target`, every one of which holds the high watermark, and
//! `target` has as many replicas as the queue's replication factor.

use std::collections::{BTreeMap, BTreeSet};

use super::{successor, ControllerError, MetadataStm};
use crate::controller::table::{BrokerRecord, DecommissionMove, NodeId, PartitionRecord, NO_LEADER};

impl MetadataStm {
    /// [`super::Command::ReassignPartition`].
    pub(super) fn reassign(&mut self, queue: &str, partition: u32, replicas: &[NodeId]) -> Result<(), ControllerError> {
        let q = self
            .table
            .queues
            .get_mut(queue)
            .ok_or_else(|| ControllerError::UnknownQueue(queue.to_string()))?;
        let rf = usize::from(q.settings.replication_factor);
        let bad = |why: String| {
            Err(ControllerError::InvalidReassignment(format!(
                "{queue}/{partition}: {why}"
            )))
        };
        let Some(p) = q.partitions.get_mut(partition as usize) else {
            return bad(format!("the queue has {} partitions", q.partitions.len()));
        };
        if replicas.len() != rf {
            return bad(format!(
                "the queue's replication factor is {rf}: name {rf} replicas, not {}",
                replicas.len()
            ));
        }
        let distinct: BTreeSet<&NodeId> = replicas.iter().collect();
        if distinct.len() != replicas.len() {
            return bad(format!("{replicas:?} names a broker twice"));
        }
        for r in replicas {
            let Some(b) = self.table.brokers.get(r) else {
                return Err(ControllerError::UnknownBroker(*r));
            };
            if b.decommissioning {
                return bad(format!("broker {r} is being decommissioned"));
            }
            if !b.alive && !p.replicas.contains(r) {
                return bad(format!("broker {r} is fenced: a new replica must be alive to catch up"));
            }
        }
        // An operator's move replaces whatever a decommission planned.
        p.decommission_moves.clear();
        start(p, replicas.to_vec(), &self.table.brokers);
        Ok(())
    }

    /// [`super::Command::DecommissionBroker`].
    pub(super) fn decommission(&mut self, id: NodeId) -> Result<(), ControllerError> {
        if !self.table.brokers.contains_key(&id) {
            return Err(ControllerError::UnknownBroker(id));
        }
        // Replicas held and preferred leaderships (first replicas) of the
        // brokers that may take replicas over, counting the targets of
        // moves in progress.
        let mut load: BTreeMap<NodeId, (bool, usize, usize)> = self
            .table
            .brokers
            .values()
            .filter(|b| b.alive && !b.decommissioning && b.id != id)
            .map(|b| (b.id, (b.draining, 0, 0)))
            .collect();
        for p in self.table.queues.values().flat_map(|q| &q.partitions) {
            let ends_with = p.target.as_ref().unwrap_or(&p.replicas);
            for (i, r) in ends_with.iter().enumerate() {
                if let Some(l) = load.get_mut(r) {
                    l.1 += 1;
                    l.2 += usize::from(i == 0);
                }
            }
        }
        // Plan every move before changing anything: refused as a whole.
        let mut moves: Vec<(String, usize, Vec<NodeId>, NodeId)> = Vec::new();
        for (name, q) in &self.table.queues {
            for (i, p) in q.partitions.iter().enumerate() {
                let ends_with = p.target.as_ref().unwrap_or(&p.replicas);
                let Some(at) = ends_with.iter().position(|r| *r == id) else {
                    continue;
                };
                // The least loaded broker that is not a replica already
                // (non-draining first; ties to the lowest id).
                let pick = load
                    .iter()
                    .filter(|(b, _)| !p.replicas.contains(b) && !ends_with.contains(b))
                    .min_by_key(|(b, l)| (l.0, l.1, **b))
                    .map(|(b, _)| *b)
                    .ok_or_else(|| ControllerError::CannotDecommission {
                        id,
                        queue: name.clone(),
                        partition: i as u32,
                        wanted: ends_with.len(),
                    })?;
                let mut target: Vec<NodeId> = ends_with.iter().copied().filter(|r| *r != id).collect();
                target.push(pick);
                if at == 0 {
                    // The preferred leader left: the member preferred by
                    // fewest partitions takes its place, so leaderships
                    // stay spread once balancing runs.
                    let first = (0..target.len())
                        .min_by_key(|j| (load.get(&target[*j]).map_or(usize::MAX, |l| l.2), target[*j]))
                        .unwrap_or(0);
                    let preferred = target.remove(first);
                    target.insert(0, preferred);
                }
                if let Some(l) = load.get_mut(&pick) {
                    l.1 += 1;
                }
                if at == 0 {
                    if let Some(l) = load.get_mut(&target[0]) {
                        l.2 += 1;
                    }
                }
                moves.push((name.clone(), i, target, pick));
            }
        }
        if let Some(b) = self.table.brokers.get_mut(&id) {
            b.decommissioning = true;
        }
        self.move_to_preferred_leaders(Some(id));
        for (name, i, target, replacement) in moves {
            if let Some(p) = self.table.queues.get_mut(&name).and_then(|q| q.partitions.get_mut(i)) {
                let before = p.target.clone().unwrap_or_else(|| p.replicas.clone());
                p.decommission_moves.push(DecommissionMove {
                    leaving: id,
                    replacement,
                    before,
                });
                start(p, target, &self.table.brokers);
            }
        }
        Ok(())
    }

    /// [`super::Command::CancelDecommission`].
    pub(super) fn cancel_decommission(&mut self, id: NodeId) -> Result<(), ControllerError> {
        let b = self
            .table
            .brokers
            .get_mut(&id)
            .ok_or(ControllerError::UnknownBroker(id))?;
        if !b.decommissioning {
            return Ok(());
        }
        b.decommissioning = false;
        for p in self.table.queues.values_mut().flat_map(|q| q.partitions.iter_mut()) {
            let Some(k) = p.decommission_moves.iter().position(|m| m.leaving == id) else {
                continue;
            };
            let undo = p.decommission_moves.remove(k);
            let Some(target) = p.target.as_ref() else {
                continue;
            };
            if !target.contains(&undo.replacement) || target.contains(&id) {
                continue;
            }
            // The broker back in its replacement's place; in its old order
            // where the move changed nothing else.
            let swapped: Vec<NodeId> = target
                .iter()
                .map(|r| if *r == undo.replacement { id } else { *r })
                .collect();
            let same_set = swapped.len() == undo.before.len() && swapped.iter().all(|r| undo.before.contains(r));
            let back = if same_set { undo.before } else { swapped };
            let others = std::mem::take(&mut p.decommission_moves);
            start(p, back, &self.table.brokers);
            // Other brokers' decommissions still move it (unless the move
            // just completed).
            if p.target.is_some() {
                p.decommission_moves = others;
            }
        }
        Ok(())
    }
}

/// Starts moving `p` to `target` (replacing a move in progress): the
/// replicas are `target` then the current ones not in it; completes at once
/// if every one of `target` is in the ISR already.
fn start(p: &mut PartitionRecord, target: Vec<NodeId>, brokers: &BTreeMap<NodeId, BrokerRecord>) {
    let mut replicas = target.clone();
    replicas.extend(p.replicas.iter().copied().filter(|r| !target.contains(r)));
    p.isr = replicas.iter().copied().filter(|r| p.isr.contains(r)).collect();
    p.replicas = replicas;
    p.target = Some(target);
    p.partition_epoch += 1;
    complete_if_caught_up(p, brokers);
}

/// Ends `p`'s reassignment once every replica of its target is in the ISR:
/// the others leave, and a leader not in the target hands over (a new
/// leader epoch). Returns whether it did.
pub(super) fn complete_if_caught_up(p: &mut PartitionRecord, brokers: &BTreeMap<NodeId, BrokerRecord>) -> bool {
    let Some(target) = p.target.as_ref() else {
        return false;
    };
    if !target.iter().all(|r| p.isr.contains(r)) {
        return false;
    }
    let target = p.target.take().unwrap_or_default();
    p.decommission_moves.clear();
    p.isr = target.clone();
    p.replicas = target;
    if p.leader != NO_LEADER && !p.replicas.contains(&p.leader) {
        p.leader = successor(p, brokers, p.leader).unwrap_or(NO_LEADER);
        p.leader_epoch += 1;
    }
    p.partition_epoch += 1;
    true
}
