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
//! Metadata across a changing cluster: metadata is asked of any broker the
//! client knows (the bootstrap list, then every broker an answer named), so
//! losing the bootstrap brokers loses nothing once one answer came. An
//! answer never replaces newer knowledge ([`QueueInfo::newer_of`]): a
//! broker that is behind the controller (cut off, or just restarted)
//! answers with an older applied index, and a partition's leader with an
//! older leader epoch than the one held is not taken. A `NotLeader` answer
//! that names the leader moves the partition there at once
//! ([`Cluster::follow_hint`]), without a metadata round trip.
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
use crate::error::{ClientError, LeaderHint};

/// How long queue metadata is trusted without asking again (so a producer
/// notices partitions added by someone else).
pub const METADATA_MAX_AGE: Duration = Duration::from_secs(60);

/// A queue's partitions and settings, as the client last heard them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueInfo {
    pub name: String,
    /// Unique for the cluster's lifetime: a queue deleted and created again
    /// under the same name has another (0 from brokers that do not say).
    pub id: u64,
    /// The leader's node id, per partition.
    pub leaders: Vec<u32>,
    /// Each partition's leader epoch (bumped at every leader change), as
    /// `leaders`.
    pub leader_epochs: Vec<u32>,
    /// The largest record batch the queue accepts.
    pub max_message_bytes: u32,
    /// The controller log index the answering broker's metadata reflected.
    pub applied_index: u64,
}

impl QueueInfo {
    pub fn partitions(&self) -> u32 {
        self.leaders.len() as u32
    }

    /// What to keep of `self` (held) and `answer` (a new metadata answer
    /// for the same name). Of another queue (another id: deleted and
    /// created again), the one from the later controller state. Of the
    /// same queue, the later state's settings and partitions, and for each
    /// partition the leader of the higher leader epoch from either (a
    /// `NotLeader` hint may have put the held one ahead of every table).
    pub fn newer_of(&self, answer: QueueInfo) -> QueueInfo {
        let answer_is_later = answer.applied_index >= self.applied_index;
        if self.id != answer.id {
            return if answer_is_later { answer } else { self.clone() };
        }
        let (mut base, other) = if answer_is_later {
            (answer, self)
        } else {
            (self.clone(), &answer)
        };
        for (p, (&leader, &epoch)) in other.leaders.iter().zip(&other.leader_epochs).enumerate() {
            if base.leader_epochs.get(p).is_some_and(|&e| e < epoch) {
                base.leaders[p] = leader;
                base.leader_epochs[p] = epoch;
            }
        }
        base
    }
}

/// How long the client waits on a broker before it tries another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A TCP connect (a host down or cut off never answers the handshake).
    pub connect: Duration,
    /// A metadata request, and the first answer of a new connection (a
    /// paused broker's kernel completes the handshake, and nothing more):
    /// past it, the next known broker is asked.
    pub metadata: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(2),
            metadata: Duration::from_secs(2),
        }
    }
}

/// Connections and metadata for a list of bootstrap brokers.
pub struct Cluster {
    bootstrap: Vec<String>,
    /// The readers' busy poll (see [`Connection::connect_with`]).
    busy_poll: Duration,
    timeouts: Timeouts,
    state: Mutex<State>,
}

/// Which of a broker's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    /// A numbered connection, served by whichever shard.
    Lane(usize),
    /// The connection served by `shard` of a broker with `shards` shards.
    Shard { shard: u16, shards: u16 },
    /// Metadata and first-answer checks alone: answered at once by a
    /// broker that runs, so a slow answer means a paused or cut-off one —
    /// never a long call queued before it on a shared connection (a broker
    /// answers a connection's requests in order).
    Metadata,
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
    /// Queue metadata, and when it was asked for (`None`: to be asked
    /// again before use; kept until then to weigh the answer against).
    queues: HashMap<String, (Arc<QueueInfo>, Option<Instant>)>,
    /// Where the next metadata attempt starts among the known brokers
    /// (moves on when one fails or answers with stale metadata).
    next_broker: usize,
    /// Connections (by id) that answered once: a broker that accepts a
    /// connection may still be paused, so [`Cluster::live_connection`]
    /// asks a new one first.
    answered: std::collections::HashSet<usize>,
}

/// A broker's metadata answer about one queue.
struct Answered {
    /// The queue, or why the broker has none (`UnknownQueue`).
    queue: Result<QueueInfo, ClientError>,
    /// The brokers it named: node id → (`host:port`, shards).
    brokers: HashMap<u32, (String, u16)>,
    /// The controller log index its metadata reflects.
    applied_index: u64,
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
        Self::with_settings(brokers, busy_poll, Timeouts::default())
    }

    /// The same, with `timeouts` for connects and metadata.
    pub fn with_settings(brokers: &str, busy_poll: Duration, timeouts: Timeouts) -> Result<Arc<Cluster>, ClientError> {
        Ok(Arc::new(Cluster {
            bootstrap: parse_brokers(brokers)?,
            busy_poll,
            timeouts,
            state: Mutex::default(),
        }))
    }

    /// Its connect and metadata timeouts.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
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
        let c = Connection::connect_placed_within(addr, self.busy_poll, placement, self.timeouts.connect)?;
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

    /// Every broker address the client knows: the bootstrap list, then
    /// the brokers metadata answers named (in node id order).
    fn known_brokers(&self) -> Vec<String> {
        let mut all = self.bootstrap.clone();
        let st = self.state();
        let mut named: Vec<(&u32, &(String, u16))> = st.brokers.iter().collect();
        named.sort_unstable_by_key(|(id, _)| **id);
        for (_, (addr, _)) in named {
            if !all.contains(addr) {
                all.push(addr.clone());
            }
        }
        all
    }

    /// A connection to any broker: the known ones in turn
    /// ([`Cluster::known_brokers`]), starting after the last one that
    /// failed.
    pub fn any_connection(&self) -> Result<Connection, ClientError> {
        let known = self.known_brokers();
        let start = self.state().next_broker;
        let mut last = None;
        for i in 0..known.len() {
            let addr = &known[(start + i) % known.len()];
            match self.connection_to(addr) {
                Ok(c) => return Ok(c),
                Err(e) => {
                    self.state().next_broker = start + i + 1;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Invalid("no broker address given".into())))
    }

    /// A connection for metadata (its own route, see `Route::Metadata`) to
    /// a broker that answers: the known ones in turn
    /// ([`Cluster::known_brokers`], from after the last that failed), a new
    /// connection first asked for its API versions within the metadata
    /// timeout — a paused broker (its kernel accepts, it answers nothing)
    /// costs that long, not a request's whole deadline.
    pub async fn live_connection(&self) -> Result<Connection, ClientError> {
        let known = self.known_brokers();
        let start = self.state().next_broker;
        let mut last = None;
        for i in 0..known.len() {
            let addr = &known[(start + i) % known.len()];
            let answered = match self.route_to(addr, Route::Metadata) {
                Ok(c) if self.state().answered.contains(&c.id()) => Ok(c),
                Ok(c) => self.ask_versions(&c).await.map(|()| c),
                Err(e) => Err(e),
            };
            match answered {
                Ok(c) => {
                    self.state().answered.insert(c.id());
                    return Ok(c);
                }
                Err(e) => {
                    self.state().next_broker = start + i + 1;
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Invalid("no broker address given".into())))
    }

    /// The address of a broker that answers ([`Cluster::live_connection`]).
    pub async fn live_broker(&self) -> Result<String, ClientError> {
        self.live_connection().await.map(|c| c.addr().to_string())
    }

    /// One ApiVersions round trip on `conn`, within the metadata timeout;
    /// a broker that does not answer in time has its connection failed.
    async fn ask_versions(&self, conn: &Connection) -> Result<(), ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let root = ApiVersionsRequest::create(&mut fbb, &ApiVersionsRequestArgs { client_name: None });
        fbb.finish_minimal(root);
        let frame = conn
            .request_within(
                Api::ApiVersions,
                fbb.finished_data(),
                TailBuilder::default(),
                self.timeouts.metadata,
            )
            .await
            .inspect_err(|_| conn.abandon("no answer within the metadata timeout (the broker may be paused)"))?;
        let resp = read_body::<ApiVersionsResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        ClientError::check(resp.error())
    }

    /// Fails the open connection `id`, if there is one (see
    /// [`Connection::abandon`]).
    pub fn abandon_connection(&self, id: usize, why: &str) {
        let conn = self.state().connections.values().find(|c| c.id() == id).cloned();
        if let Some(c) = conn {
            c.abandon(why);
        }
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
                // A leader that cannot be reached may have been replaced:
                // the queue's metadata is asked for again before next use.
                self.route_to(&addr, route(placed))
                    .inspect_err(|_| self.forget_queue(&queue.name))
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
            Some((q, Some(at))) if at.elapsed() < METADATA_MAX_AGE => Some(q.clone()),
            _ => None,
        }
    }

    /// After a `NotLeader` answer that named the leader: moves the
    /// partition to it if the hint is newer than what the client holds and
    /// the client knows that broker's address; returns the queue's
    /// metadata then (`None`: ask for metadata instead).
    pub fn follow_hint(&self, name: &str, partition: u32, hint: LeaderHint) -> Option<Arc<QueueInfo>> {
        let mut st = self.state();
        if !st.brokers.contains_key(&hint.node) {
            return None;
        }
        let (held, at) = st.queues.get_mut(name)?;
        let p = partition as usize;
        // Already followed (a second answer of requests sent before).
        let current = (held.leaders.get(p).copied(), held.leader_epochs.get(p).copied());
        if current == (Some(hint.node), Some(hint.leader_epoch)) && at.is_some() {
            return Some(held.clone());
        }
        if held.leader_epochs.get(p).is_none_or(|&e| e >= hint.leader_epoch) {
            return None;
        }
        let moved = Arc::make_mut(held);
        moved.leaders[p] = hint.node;
        moved.leader_epochs[p] = hint.leader_epoch;
        at.get_or_insert_with(Instant::now);
        Some(held.clone())
    }

    /// After an error: if it says the partition's leader moved, goes to
    /// the leader it named ([`Cluster::follow_hint`]) or else has the
    /// queue's metadata asked for again before its next use. Returns the
    /// metadata when a hint was followed.
    pub fn leader_moved(&self, name: &str, partition: u32, e: &ClientError) -> Option<Arc<QueueInfo>> {
        if !e.leader_moved() {
            return None;
        }
        let followed = e.leader_hint().and_then(|h| self.follow_hint(name, partition, h));
        if followed.is_none() {
            self.forget_queue(name);
        }
        followed
    }

    /// Asks a broker for the queue's metadata now (after NOT_LEADER, an
    /// unknown partition or a lost connection). An answer older than what
    /// the client holds does not replace it ([`QueueInfo::newer_of`]), and
    /// the next request goes to another broker.
    pub async fn refresh(&self, name: &str) -> Result<Arc<QueueInfo>, ClientError> {
        validate_queue_name(name).map_err(|e| ClientError::broker(ErrorCode::InvalidQueueName, e))?;
        // Every known broker in turn, each within the metadata timeout,
        // until one answers.
        let mut answer = Err(ClientError::Invalid("no broker address given".into()));
        for _ in 0..self.known_brokers().len() {
            answer = match self.live_connection().await {
                Ok(conn) => {
                    let asked = self.ask_metadata(&conn, name).await;
                    if asked.as_ref().is_err_and(|e| e.is_io()) {
                        let mut st = self.state();
                        st.next_broker = st.next_broker.wrapping_add(1);
                    }
                    asked
                }
                Err(e) => Err(e),
            };
            if !answer.as_ref().is_err_and(|e| e.is_io()) {
                break;
            }
        }
        let Answered {
            queue,
            brokers,
            applied_index,
        } = answer?;
        let mut s = self.state();
        s.brokers.extend(brokers);
        let held = s.queues.get(name).map(|(held, _)| held.clone());
        let behind = held.as_ref().is_some_and(|h| h.applied_index > applied_index);
        if behind {
            s.next_broker = s.next_broker.wrapping_add(1);
        }
        let info = match (queue, held) {
            // A broker behind the controller (restarted, cut off) that has
            // not heard of the queue yet: what is held stands.
            (Err(e), Some(held)) if behind && e.code() == Some(ErrorCode::UnknownQueue) => {
                return Ok(held);
            }
            (Err(e), _) => {
                if e.code() == Some(ErrorCode::UnknownQueue) {
                    s.queues.remove(name);
                }
                return Err(e);
            }
            (Ok(answer), Some(held)) => held.newer_of(answer),
            (Ok(answer), None) => answer,
        };
        let info = Arc::new(info);
        s.queues.insert(name.to_string(), (info.clone(), Some(Instant::now())));
        Ok(info)
    }

    /// One Metadata request for `name` on `conn`: the queue's metadata (or
    /// why the broker has none), the brokers the answer named, and the
    /// controller log index it reflects.
    async fn ask_metadata(&self, conn: &Connection, name: &str) -> Result<Answered, ClientError> {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let list = fbb.create_vector(&[n]);
        let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: Some(list) });
        fbb.finish_minimal(root);
        let frame = conn
            .request_within(
                Api::Metadata,
                fbb.finished_data(),
                TailBuilder::default(),
                self.timeouts.metadata,
            )
            .await
            .inspect_err(|e| {
                if e.is_io() {
                    conn.abandon("no metadata within the metadata timeout (the broker may be paused)");
                }
            })?;
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
        if let Err(e) = ClientError::check(q.error()) {
            return Ok(Answered {
                queue: Err(e),
                brokers,
                applied_index: resp.applied_index(),
            });
        }
        let partitions = q.partitions().unwrap_or_default();
        let info = QueueInfo {
            name: name.to_string(),
            id: q.id(),
            leaders: partitions.iter().map(|p| p.leader()).collect(),
            leader_epochs: partitions.iter().map(|p| p.leader_epoch()).collect(),
            max_message_bytes: q.config().and_then(|c| c.max_message_bytes()).unwrap_or(u32::MAX),
            applied_index: resp.applied_index(),
        };
        if info.leaders.is_empty() {
            return Err(ClientError::Protocol(format!("queue {name:?} has no partitions")));
        }
        Ok(Answered {
            queue: Ok(info),
            brokers,
            applied_index: resp.applied_index(),
        })
    }

    /// Has the queue's metadata asked for again on next use (what is held
    /// stays, to weigh the answer against).
    pub fn forget_queue(&self, name: &str) {
        if let Some((_, at)) = self.state().queues.get_mut(name) {
            *at = None;
        }
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

    fn info(id: u64, applied_index: u64, leaders: &[(u32, u32)]) -> QueueInfo {
        QueueInfo {
            name: "q".into(),
            id,
            leaders: leaders.iter().map(|l| l.0).collect(),
            leader_epochs: leaders.iter().map(|l| l.1).collect(),
            max_message_bytes: 1 << 20,
            applied_index,
        }
    }

    #[test]
    fn an_answer_from_a_broker_behind_never_moves_a_leader_back() {
        let held = info(7, 50, &[(1, 3), (2, 1)]);
        // Later state: taken, and its leaders where their epochs are newer.
        let later = info(7, 60, &[(3, 4), (2, 1)]);
        assert_eq!(held.newer_of(later.clone()), later);
        // A broker behind (lower applied index) keeps what is held.
        let behind = info(7, 40, &[(1, 2), (1, 0)]);
        assert_eq!(held.newer_of(behind), held);
        // Later state, but a partition's leader an older epoch than a hint
        // gave the held copy: that partition keeps the held leader.
        let hinted = info(7, 50, &[(3, 9), (2, 1)]);
        let merged = hinted.newer_of(info(7, 55, &[(1, 3), (2, 2)]));
        assert_eq!((merged.leaders, merged.leader_epochs), (vec![3, 2], vec![9, 2]));
        assert_eq!(merged.applied_index, 55);
        // A partition added later is taken as it comes.
        let grown = info(7, 70, &[(1, 3), (2, 1), (3, 0)]);
        assert_eq!(held.newer_of(grown.clone()), grown);
    }

    #[test]
    fn a_queue_created_again_is_judged_by_the_controller_state_alone() {
        let old = info(7, 50, &[(1, 9)]);
        // Deleted and created again: epochs start over under a new id.
        let recreated = info(8, 80, &[(2, 0)]);
        assert_eq!(old.newer_of(recreated.clone()), recreated);
        // The old queue from a broker behind does not replace the new one.
        assert_eq!(recreated.newer_of(old.clone()), recreated);
    }

    #[test]
    fn a_hint_moves_a_partition_only_forward_and_only_to_a_known_broker() {
        let cluster = Cluster::new("127.0.0.1:1").unwrap();
        let held = Arc::new(info(7, 50, &[(1, 3), (2, 1)]));
        {
            let mut st = cluster.state();
            st.brokers.insert(1, ("127.0.0.1:1".into(), 0));
            st.brokers.insert(3, ("127.0.0.1:3".into(), 0));
            st.queues.insert("q".into(), (held.clone(), None));
        }
        let hint = |node, leader_epoch| LeaderHint { node, leader_epoch };
        // An older or the same epoch: ignored.
        assert!(cluster.follow_hint("q", 0, hint(3, 3)).is_none());
        // A broker the client has no address for: ask for metadata instead.
        assert!(cluster.follow_hint("q", 0, hint(9, 4)).is_none());
        // No such partition, no such queue.
        assert!(cluster.follow_hint("q", 5, hint(3, 4)).is_none());
        assert!(cluster.follow_hint("other", 0, hint(3, 4)).is_none());
        assert!(cluster.cached("q").is_none(), "marked for a refresh");
        // Newer, known: the partition moves, and the metadata is usable.
        let moved = cluster.follow_hint("q", 0, hint(3, 4)).unwrap();
        assert_eq!(
            (moved.leaders.clone(), moved.leader_epochs.clone()),
            (vec![3, 2], vec![4, 1])
        );
        assert_eq!(cluster.cached("q"), Some(moved.clone()));
        // The same hint again (another answer to requests sent before):
        // already followed, no metadata asked for.
        assert_eq!(cluster.follow_hint("q", 0, hint(3, 4)), Some(moved));
        assert_eq!(held.leaders, vec![1, 2], "callers' copies are not changed under them");
    }

    #[test]
    fn metadata_is_asked_of_every_known_broker_not_only_the_bootstrap_list() {
        let cluster = Cluster::new("127.0.0.1:9400,127.0.0.2:9400").unwrap();
        cluster.state().brokers.extend([
            (3, ("127.0.0.3:9400".to_string(), 2)),
            (1, ("127.0.0.1:9400".to_string(), 2)),
            (2, ("127.0.0.9:9400".to_string(), 2)),
        ]);
        assert_eq!(
            cluster.known_brokers(),
            ["127.0.0.1:9400", "127.0.0.2:9400", "127.0.0.9:9400", "127.0.0.3:9400"]
        );
    }
}
