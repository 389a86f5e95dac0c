//! This broker's lease with the controller (`crate::lease`) on a shard:
//! the produce path's check, and a look every [`LOOK_EVERY`] that moves on
//! the high watermarks held back while the lease did not hold (also those
//! of partitions adopted at start-up, before the first renewal).
//!
//! Runs on: every shard (its own timer, started by `server`).

use std::rc::Rc;
use std::time::Duration;

use strand_wire::ErrorCode;

use super::messages::WireError;
use super::Shard;
use crate::lease::mono_ms;

/// How often a shard looks at the lease.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

impl Shard {
    /// `NotLeader` while this broker does not hold its lease: its
    /// leaderships may have moved.
    pub(crate) fn check_lease(&self) -> Result<(), WireError> {
        let lease = &self.partitions.lease;
        let now = mono_ms();
        if lease.holds_at(now) {
            return Ok(());
        }
        let since = match lease.until_ms() {
            0 => "it has not renewed it since it started".to_string(),
            until => format!("it ran out {} ms ago", now.saturating_sub(until)),
        };
        Err(WireError::new(
            ErrorCode::NotLeader,
            format!(
                "broker {} does not hold its lease with the controller ({since}): its leaderships may have moved, \
                 and it takes and acknowledges no records until it renews; retry",
                self.config.node_id
            ),
        ))
    }

    /// Every [`LOOK_EVERY`] until the shard stops: moves on the high
    /// watermarks held back while the lease did not hold, once it holds;
    /// shard 0 says when the lease runs out and when it holds again.
    pub async fn watch_lease(self: Rc<Self>) {
        let mut held = self.partitions.lease.holds();
        while !self.stopping.get() {
            let holds = self.partitions.lease.holds();
            if holds != held && self.id.0 == 0 && self.serving.get() {
                if holds {
                    tracing::info!("this broker's lease with the controller holds again: its leaders take records");
                } else {
                    tracing::warn!(
                        "this broker's lease with the controller ran out (no renewal within broker_session_ms): \
                         its leaders take and acknowledge no records until it renews"
                    );
                }
            }
            held = holds;
            self.partitions.release_held_back();
            glommio::timer::sleep(LOOK_EVERY).await;
        }
    }
}
