//! What the client knows of the cluster: the bootstrap addresses, open
//! connections, and each queue's partitions with their leaders (from
//! Metadata), shared by a producer's or consumer's threads.
//!
//! Shard-aware routing: a broker reports its shard count, and the shard
//! that owns a partition is a pure function of (queue, partition, shards)
//! ([`strand_wire::shard_for_partition`]). The client keeps one connection
//! per (broker, shard), each from a local port that has the broker serve it
//! on that shard ([`crate::connection::connect_to_shard`]); a partition's
//! requests go on its shard's connection and never cross between the
//! broker's cores. Brokers that report no shards get plain connections.
//!
//! Runs on: the caller's threads and the producer's sender thread; the state
//! sits behind one mutex held only for map lookups, never across I/O.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use strand_net::message::{read_body, TailBuilder};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use crate::connection::Connection;
use crate::error::ClientError;

/// How long queue metadata is trusted without asking again (so a producer
/// notices partitions added by someone else).
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(60);

/// A queue's partitions and settings, as the client last heard them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    pub name: String,
    /// The leader's node id, per partition.
    pub leaders: Vec<u32>,
    /// The largest record batch the queue accepts.
    pub max_message_bytes: u32,
}

impl QueueInfo {
    pub fn partitions(&self) -> u32 {
        self.leaders.len() as u32
    }
}

/// Connections and metadata for a list of bootstrap brokers.
pub struct Cluster {
    bootstrap: Vec<String>,
    /// The readers' busy poll (see [`Connection::connect_with`]).
    busy_poll: Duration,
    state: Mutex<State>,
}

/// Which of a broker's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    /// A numbered connection, served by whichever shard.
    Lane(usize),
    /// The connection served by `shard` of a broker with `shards` shards.
    Shard { shard: u16, shards: u16 },
    /// A consumer's fetches, apart from everything else: a broker answers
    /// a connection's requests in order, and a fetch may wait in it for
    /// data (a long poll, and a chained one behind it), which a group
    /// commit or an offset lookup must not queue behind. `shards` 0: served
    /// by whichever shard.
    Fetches { shard: u16, shards: u16 },
}

#[derive(Default)]
struct State {
    /// node id → (`host:port`, shards; 0 if it did not say).
    brokers: HashMap<u32, (String, u16)>,
    /// (`host:port`, route) → open connection.
    connections: HashMap<(String, Route), Connection>,
    /// Queue metadata and when it was asked for.
    queues: HashMap<String, (Arc<QueueInfo>, Instant)>,
    /// Where the next bootstrap attempt starts (rotates on failure).
    next_bootstrap: usize,
}

/// Parses `HOST:PORT[,HOST:PORT...]`.
pub fn parse_brokers(list: &str) -> Result<Vec<String>, ClientError> {
    let brokers: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    if brokers.is_empty() {
        return Err(ClientError::Invalid("no broker address given".into()));
    }
    for b in &brokers {
        match b.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return Err(ClientError::Invalid(format!("{b:?} is not HOST:PORT"))),
        }
    }
    Ok(brokers)
}

impl Cluster {
    /// A cluster reached through `brokers` (`HOST:PORT[,HOST:PORT...]`).
    /// Connects lazily.
    pub fn new(brokers: &str) -> Result<Arc<Cluster>, ClientError> {
        Self::with_busy_poll(brokers, Duration::ZERO)
    }

    /// The same, with connections whose readers busy-poll for up to
    /// `busy_poll` while responses are due.
    pub fn with_busy_poll(brokers: &str, busy_poll: Duration) -> Result<Arc<Cluster>, ClientError> {
        Ok(Arc::new(Cluster {
            bootstrap: parse_brokers(brokers)?,
            busy_poll,
            state: Mutex::default(),
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is plain maps: a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An open connection to `addr`, reusing one that is still up.
    pub fn connection_to(&self, addr: &str) -> Result<Connection, ClientError> {
        self.lane_to(addr, 0)
    }

    /// An open connection to `addr` on one of several lanes (separate
    /// connections to one broker, so its shards' listeners share the load).
    pub fn lane_to(&self, addr: &str, lane: usize) -> Result<Connection, ClientError> {
        self.route_to(addr, Route::Lane(lane))
    }

    /// An open connection to `addr` served by its shard `shard` (of
    /// `shards`), reusing one that is still up.
    pub fn shard_connection(&self, addr: &str, shard: u16, shards: u16) -> Result<Connection, ClientError> {
        self.route_to(addr, Route::Shard { shard, shards })
    }

    fn route_to(&self, addr: &str, route: Route) -> Result<Connection, ClientError> {
        let key = (addr.to_string(), route);
        if let Some(c) = self.state().connections.get(&key) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let placement = match route {
            Route::Shard { shard, shards } | Route::Fetches { shard, shards } if shards > 0 => Some((shard, shards)),
            _ => None,
        };
        let c = Connection::connect_placed(addr, self.busy_poll, placement)?;
        let mut st = self.state();
        // Another thread may have connected meanwhile: keep one connection
        // (dropping the other closes it before it carried anything).
        if let Some(existing) = st.connections.get(&key) {
            if !existing.is_closed() {
                return Ok(existing.clone());
            }
        }
        st.connections.insert(key, c.clone());
        Ok(c)
    }

    /// A connection to any broker: the bootstrap list in turn, starting
    /// after the last one that failed.
    pub fn any_connection(&self) -> Result<Connection, ClientError> {
        let start = self.state().next_bootstrap;
        let mut last = None;
        for i in 0..self.bootstrap.len() {
            let addr = &self.bootstrap[(start + i) % self.bootstrap.len()];
            match self.connection_to(addr) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    self.state().next_bootstrap = (start + i + 1) % self.bootstrap.len();
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Invalid("no broker address given".into())))
    }

    /// The connection to the leader of `partition`.
    pub fn leader_connection(&self, queue: &QueueInfo, partition: u32) -> Result<Connection, ClientError> {
        self.leader_lane(queue, partition, 1)
    }

    /// The connection to the leader of `partition`: the one its owning
    /// shard serves when the leader reported its shards, else one of
    /// `lanes` per broker (partition `p` uses lane `p mod lanes`).
    pub fn leader_lane(&self, queue: &QueueInfo, partition: u32, lanes: usize) -> Result<Connection, ClientError> {
        self.to_leader(queue, partition, |placed| match placed {
            Some((shard, shards)) => Route::Shard { shard, shards },
            None => Route::Lane(partition as usize % lanes.max(1)),
        })
    }

    /// The connection for a consumer's fetches of `partition` from its
    /// leader (a route of its own: see `Route::Fetches`), on its owning
    /// shard when the leader reported its shards.
    pub fn fetch_connection(&self, queue: &QueueInfo, partition: u32) -> Result<Connection, ClientError> {
        self.to_leader(queue, partition, |placed| {
            let (shard, shards) = placed.unwrap_or((0, 0));
            Route::Fetches { shard, shards }
        })
    }

    /// A connection to the leader of `partition` by the route `route`
    /// picks from (owning shard, shards) — `None` when the leader did not
    /// report more than one shard; any broker if the leader is unknown.
    fn to_leader(
        &self,
        queue: &QueueInfo,
        partition: u32,
        route: impl FnOnce(Option<(u16, u16)>) -> Route,
    ) -> Result<Connection, ClientError> {
        let leader = queue.leaders.get(partition as usize).copied();
        let broker = leader.and_then(|l| self.state().brokers.get(&l).cloned());
        match broker {
            Some((addr, shards)) => {
                let placed =
                    (shards > 1).then(|| (strand_wire::shard_for_partition(&queue.name, partition, shards), shards));
                self.route_to(&addr, route(placed))
            }
            None => self.any_connection(),
        }
    }

    /// The queue's metadata, from the cache (if younger than
    /// [`METADATA_MAX_AGE`]) or else asked for.
    pub async fn queue(&self, name: &str) -> Result<Arc<QueueInfo>, ClientError> {
        if let Some(q) = self.cached(name) {
            return Ok(q);
        }
        self.refresh(name).await
    }

    /// The queue's cached metadata, if fresh enough.
    pub fn cached(&self, name: &str) -> Option<Arc<QueueInfo>> {
        match self.state().queues.get(name) {
            Some((q, at)) if at.elapsed() < METADATA_MAX_AGE => Some(q.clone()),
            _ => None,
        }
    }

    /// Asks a broker for the queue's metadata now (after NOT_LEADER, an
    /// unknown partition or a lost connection).
    pub async fn refresh(&self, name: &str) -> Result<Arc<QueueInfo>, ClientError> {
        validate_queue_name(name).map_err(|e| ClientError::broker(ErrorCode::InvalidQueueName, e))?;
        let conn = self.any_connection()?;
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let list = fbb.create_vector(&[n]);
        let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: Some(list) });
        fbb.finish_minimal(root);
        let frame = conn
            .request(Api::Metadata, fbb.finished_data(), TailBuilder::default())
            .await?;
        let resp = read_body::<MetadataResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        ClientError::check(resp.error())?;
        // An unspecified advertised host (0.0.0.0) means "the host you reached me on".
        let via_host = conn.addr().rsplit_once(':').map_or("127.0.0.1", |(h, _)| h).to_string();
        let mut brokers = HashMap::new();
        for b in resp.brokers().iter().flatten() {
            let host = b.host().unwrap_or_default();
            let unspecified = host.is_empty() || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified());
            let host = if unspecified { via_host.as_str() } else { host };
            brokers.insert(b.node_id(), (format!("{host}:{}", b.port()), b.shards()));
        }
        let q = resp
            .queues()
            .iter()
            .flatten()
            .find(|q| q.name() == Some(name))
            .ok_or_else(|| ClientError::Protocol(format!("metadata without queue {name:?}")))?;
        ClientError::check(q.error())?;
        let info = Arc::new(QueueInfo {
            name: name.to_string(),
            leaders: q.partitions().iter().flatten().map(|p| p.leader()).collect(),
            max_message_bytes: q.config().and_then(|c| c.max_message_bytes()).unwrap_or(u32::MAX),
        });
        if info.leaders.is_empty() {
            return Err(ClientError::Protocol(format!("queue {name:?} has no partitions")));
        }
        let mut s = self.state();
        s.brokers.extend(brokers);
        s.queues.insert(name.to_string(), (info.clone(), Instant::now()));
        Ok(info)
    }

    /// Forgets the queue's metadata (it is asked for again on next use).
    pub fn forget_queue(&self, name: &str) {
        self.state().queues.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_lists_parse() {
        assert_eq!(
            parse_brokers("a:1, b:2").unwrap(),
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert!(parse_brokers("").is_err());
        assert!(parse_brokers("host").is_err());
        assert!(parse_brokers("host:port").is_err());
        assert!(parse_brokers(":9400").is_err());
    }
}
