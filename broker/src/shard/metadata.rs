//! The shard's link to the controller: applying a new metadata table
//! (partitions opened and closed to match, then the hooks of the layers
//! above), and on shard 0 publishing each table to every shard and
//! committing proposals once all of them applied the result.
//!
//! Runs on: every shard; publishing and proposals on shard 0 (the router
//! forwards proposals there: `Shard::propose`).

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::messages::{Answer, ShardMessage};
use super::Shard;
use crate::controller::{Command, MetadataTable, ProposeError};

impl Shard {
    /// Installs a table here and opens/closes partitions to match (tables
    /// older than the one held are ignored).
    /// Tables apply one at a time; the partitions change first, so a
    /// request that sees a queue in the table finds its partitions open.
    pub async fn apply_table(&self, table: Arc<MetadataTable>) {
        let Ok(_turn) = self.applying.acquire_permit(1).await else {
            return;
        };
        if table.applied_index < self.table.borrow().applied_index {
            return;
        }
        self.partitions.apply(&table).await;
        for hook in self.table_hooks.borrow().iter() {
            hook(self, &table);
        }
        self.metrics.retain_queues(|q| table.queue(q).is_some());
        *self.table.borrow_mut() = table;
    }

    /// Shard 0: waits (up to `limit`) until every shard applied the newest
    /// table published so far.
    pub async fn wait_all_applied(&self, limit: Duration) -> bool {
        let target = self.latest_published.get();
        let deadline = Instant::now() + limit;
        while self.all_applied.get() < target {
            let seen = self.all_applied_event.epoch();
            if self.all_applied.get() >= target {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = glommio::timer::timeout(left.min(Duration::from_millis(100)), async {
                self.all_applied_event.wait(seen).await;
                Ok(())
            })
            .await;
        }
        true
    }

    /// Shard 0: sends `table` to every other shard, applies it here, and
    /// records when all have.
    pub fn publish(self: &Rc<Self>, table: Arc<MetadataTable>) {
        self.latest_published
            .set(self.latest_published.get().max(table.applied_index));
        let shard = self.clone();
        glommio::spawn_local(async move {
            let mut acks = Vec::new();
            for peer in 0..usize::from(shard.shards) {
                if peer == usize::from(shard.id.0) {
                    continue;
                }
                let (tx, rx) = Answer::channel(shard.id.0);
                let msg = ShardMessage::Metadata {
                    table: table.clone(),
                    applied: tx,
                };
                if shard.peers.send_to(peer, msg).await.is_ok() {
                    acks.push(rx);
                }
            }
            shard.apply_table(table.clone()).await;
            for ack in acks {
                let _ = ack.await;
            }
            if table.applied_index > shard.all_applied.get() {
                shard.all_applied.set(table.applied_index);
                shard.all_applied_event.notify_all();
            }
        })
        .detach();
    }

    /// Commits a controller command (on shard 0 directly; from another
    /// shard forwarded there) and resolves once every shard of this node
    /// applied it.
    pub async fn propose(&self, command: Command) -> Result<(), ProposeError> {
        if self.id.0 == 0 {
            return self.commit_proposal(command).await;
        }
        let unavailable = |why: &str| Err(ProposeError::Unavailable(why.into()));
        self.ask_shard_0(|reply| ShardMessage::Propose { command, reply }, unavailable)
            .await
    }

    /// Sends the message `make` builds around an answer to shard 0 over the
    /// mesh and waits for the answer; `unavailable(why)` stands in for one
    /// that cannot come.
    pub(crate) async fn ask_shard_0<T: Send + 'static>(
        &self,
        make: impl FnOnce(Answer<T>) -> ShardMessage,
        unavailable: impl Fn(&str) -> T,
    ) -> T {
        let (tx, rx) = Answer::channel(self.id.0);
        if self.peers.try_send_to(0, make(tx)).is_err() {
            return unavailable("shard 0 is overloaded");
        }
        rx.await.unwrap_or_else(|_| unavailable("shard 0 dropped the request"))
    }

    /// Shard 0: commits a controller command through the controller member
    /// here and resolves once every shard applied it (other shards reach
    /// this through [`Shard::propose`]).
    pub async fn commit_proposal(&self, command: Command) -> Result<(), ProposeError> {
        let controller = self
            .controller
            .borrow()
            .clone()
            .ok_or_else(|| ProposeError::Unavailable("the controller is not running".into()))?;
        let result = controller.propose(command).await;
        // Refused commands change nothing, but still wait: the caller then
        // sees every shard at least as new as this commit.
        self.wait_all_applied(Duration::from_secs(10)).await;
        result
    }
}
