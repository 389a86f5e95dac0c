//! Peer links: this broker's connections to the other brokers of its
//! cluster, for what crosses nodes (controller RPCs, replica fetches,
//! requests forwarded to a partition's leader).
//!
//! Runs on: the shard that owns the link. A call completes on that shard:
//! a reader task on the same executor hands each response to its waiter,
//! never through another thread. (Not `strand-client`: its futures
//! complete from its own I/O threads, and glommio 0.9's cross-thread wake
//! path has deadlocked a shard here.)
//!
//! - [`link::PeerLink`]: one pipelined connection to one peer, the same
//!   frames as clients speak (`net/src/frame.rs`), every call bounded by a
//!   deadline.
//! - [`Peers`]: a shard's links, one per peer address, made on first use.

pub mod link;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;

pub use link::{PeerError, PeerLink};
use strand_net::frame::FrameLimits;

/// One shard's links to the other nodes, by address.
pub struct Peers {
    links: RefCell<HashMap<SocketAddr, PeerLink>>,
    limits: FrameLimits,
    /// TLS (`server::tls`) and the inter-broker login, when on.
    security: crate::frame_io::PeerSecurity,
}

impl Peers {
    /// Links that take answers up to `max_frame_bytes`, secured as
    /// `security` says.
    pub fn new(max_frame_bytes: u32, security: crate::frame_io::PeerSecurity) -> Peers {
        Peers {
            links: RefCell::default(),
            limits: FrameLimits { max_frame_bytes },
            security,
        }
    }

    /// The link to `addr` (made on first use; it connects on its first call).
    pub fn get(&self, addr: SocketAddr) -> PeerLink {
        self.links
            .borrow_mut()
            .entry(addr)
            .or_insert_with(|| PeerLink::new(addr, self.limits, self.security.clone()))
            .clone()
    }
}
