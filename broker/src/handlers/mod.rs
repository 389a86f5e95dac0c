//! Request handlers, one file per API. Each reads its request table from
//! the frame (verified), does the work on this shard or the owning shards,
//! and builds its response table.
//!
//! Runs on: the shard that holds the connection.
//!
//! Every response table's first field is `error: Error`. A request that
//! fails before its API's handler can read it (unknown API, unsupported
//! version, a body that fails verification) is answered with a body that
//! has only that field set, which reads as any API's response with the
//! error filled in.

mod acls;
mod alter_queue;
mod api_versions;
mod authorize;
mod brokers;
mod controller;
mod create_queue;
mod delete_queue;
mod describe_queue;
pub(crate) mod fetch;
mod groups;
mod list_offsets;
mod metadata;
mod produce;
pub(crate) mod replica_fetch;
mod sasl;
mod users;

use std::rc::Rc;

use strand_net::frame::FrameHeader;
use strand_net::message::{check_api, read_body, MessageError, TailBuilder};
use strand_net::{FrameMut, OutFrame};
use strand_wire::flatbuffers::{FlatBufferBuilder, WIPOffset};
use strand_wire::{Api, ApiVersionsResponse, ApiVersionsResponseArgs, Error, ErrorArgs, ErrorCode};

use crate::controller::{ControllerError, NodeId, ProposeError};
use crate::shard::messages::WireError;
use crate::shard::Shard;

/// What one client connection remembers between its requests.
pub struct ConnectionState {
    /// The node's authentication settings (taken once per connection, not
    /// looked up per request).
    auth: std::sync::Arc<crate::auth::ServerAuth>,
    /// Its pipelined fetches (`fetch.rs`).
    pub fetch: fetch::FetchChains,
    /// The producer ids it brought to each partition (`produce.rs`).
    pub producers: produce::NewProducers,
    /// Who it logged in as, or how far it got (`sasl.rs`).
    pub login: std::cell::RefCell<sasl::Login>,
    /// Where it stands, in the shard's gauge.
    phase: Phase,
}

/// The node's count of each user's new producer ids, on a shard (set at
/// start).
#[derive(Default)]
struct PrincipalProducers(std::cell::OnceCell<std::sync::Arc<crate::limits::PrincipalProducers>>);

/// Installs the node's count of each user's new producer ids on a shard.
pub fn install_principal_producers(shard: &Shard, counts: std::sync::Arc<crate::limits::PrincipalProducers>) {
    let _ = shard.ext.get_or_default::<PrincipalProducers>().0.set(counts);
}

/// Where a connection stands (`strand_connections_by_state`), counted in
/// its shard's gauge until it closes.
pub struct Phase {
    shard: Rc<Shard>,
    now: std::cell::Cell<crate::metrics::ConnectionPhase>,
}

impl Phase {
    /// A connection that opened at `now`.
    pub fn new(shard: Rc<Shard>, now: crate::metrics::ConnectionPhase) -> Phase {
        shard.metrics.connection_phase(None, Some(now));
        Phase {
            shard,
            now: std::cell::Cell::new(now),
        }
    }

    pub fn set(&self, to: crate::metrics::ConnectionPhase) {
        let from = self.now.replace(to);
        self.shard.metrics.connection_phase(Some(from), Some(to));
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        self.shard.metrics.connection_phase(Some(self.now.get()), None);
    }
}

impl ConnectionState {
    /// A connection's state under `auth`; its principal already known from
    /// its certificate (`--auth mtls`) when `principal` is given.
    /// `phase` moves on from here: to `login` while the listener requires
    /// one, else to `open`.
    pub fn new(
        auth: std::sync::Arc<crate::auth::ServerAuth>,
        principal: Option<crate::auth::Principal>,
        phase: Phase,
    ) -> ConnectionState {
        use crate::metrics::ConnectionPhase;
        let must_log_in = principal.is_none() && auth.mode == crate::auth::AuthMode::Scram;
        phase.set(if must_log_in {
            ConnectionPhase::Login
        } else {
            ConnectionPhase::Open
        });
        let state = ConnectionState {
            auth,
            fetch: fetch::FetchChains::default(),
            producers: produce::NewProducers::default(),
            login: std::cell::RefCell::new(sasl::Login::new(principal)),
            phase,
        };
        state.logged_in();
        state
    }

    /// Once the connection has its principal (its SASL login, or its
    /// certificate): it is served, and a user's new producer ids count for
    /// it over all its connections to this node (`crate::limits`).
    fn logged_in(&self) {
        let login = self.login.borrow();
        let Some(principal) = &login.principal else {
            return;
        };
        if let crate::auth::Principal::User(name) = principal {
            let shard = &self.phase.shard;
            if let Some(counts) = shard.ext.get::<PrincipalProducers>().and_then(|c| c.0.get().cloned()) {
                self.producers.count_for(counts, name.clone());
            }
        }
        self.phase.set(crate::metrics::ConnectionPhase::Open);
    }

    /// The user whose ACLs decide its requests, if any (a copy: a group
    /// request carries it to the coordinator, where members are their
    /// joiner's and answers are checked queue by queue).
    fn acl_user(&self) -> Option<String> {
        let login = self.login.borrow();
        self.auth.acl_user(login.principal.as_ref()).map(str::to_string)
    }
}

/// Serves one request; `None` when no response is due (produce, acks=0).
pub async fn dispatch(shard: &Rc<Shard>, conn: &ConnectionState, frame: FrameMut) -> Option<OutFrame> {
    let header = frame.header;
    let api = match check_api(&header) {
        Ok(api) => api,
        Err(e) => return Some(error_response(header, &WireError::new(e.code(), e.to_string()))),
    };
    // Who may call what (`crate::auth`; a user's ACLs, `authorize.rs`):
    // before the handler reads anything.
    let auth = &conn.auth;
    let (allowed, caller) = {
        let login = conn.login.borrow();
        let principal = login.principal.as_ref();
        // The broker it is, for the internal APIs' checks that a broker
        // speaks only for itself (none: `--auth none`, nothing checked).
        let caller = principal.and_then(crate::auth::Principal::node);
        let acl_user = auth.acl_user(principal);
        // A user's: one look at the table for its session and its ACLs.
        let allowed = auth.check(principal, api).and_then(|()| match principal {
            Some(crate::auth::Principal::User(_)) => {
                let table = shard.table();
                still_a_user(&table, auth, &login)?;
                match acl_user {
                    Some(user) => authorize::check(&table.acls, user, api, &frame.body),
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        });
        (allowed, caller)
    };
    if let Err(e) = allowed {
        if e.code == ErrorCode::NotAuthorized {
            shard.metrics.denied(api.name());
        }
        return Some(error_response(header, &e));
    }
    // Until the node serves (its ready line), the listener is open for the
    // other nodes' controller members (and their login) only.
    let starting_ok = matches!(
        api,
        Api::ApiVersions | Api::Controller | Api::SaslHandshake | Api::SaslAuthenticate
    );
    if !shard.serving.get() && !starting_ok {
        let e = WireError::new(ErrorCode::ControllerUnavailable, "the broker is starting; retry");
        return Some(error_response(header, &e));
    }
    let result = match api {
        Api::ApiVersions => api_versions::handle(header),
        Api::Controller => controller::handle(shard, header, &frame.body, caller).await,
        Api::Metadata => metadata::handle(shard, header, &frame.body, conn.acl_user()),
        Api::CreateQueue => create_queue::handle(shard, header, &frame.body).await,
        Api::DeleteQueue => delete_queue::handle(shard, header, &frame.body).await,
        Api::AlterQueue => alter_queue::handle(shard, header, &frame.body).await,
        Api::DescribeQueue => describe_queue::handle(shard, header, &frame.body).await,
        Api::Produce => {
            return produce::handle(shard, &conn.producers, header, frame)
                .await
                .unwrap_or_else(|e| Some(error_response(header, &e)))
        }
        Api::Fetch => fetch::handle(shard, &conn.fetch, header, &frame.body).await,
        Api::ListOffsets => list_offsets::handle(shard, header, &frame.body).await,
        Api::ReplicaFetch => replica_fetch::handle(shard, header, &frame.body, caller).await,
        Api::DrainBroker => brokers::drain(shard, header, &frame.body).await,
        Api::DescribeBroker => brokers::describe(shard, header, &frame.body),
        Api::DecommissionBroker => brokers::decommission(shard, header, &frame.body).await,
        Api::ReassignPartition => brokers::reassign(shard, header, &frame.body).await,
        Api::ElectLeaders => brokers::elect(shard, header, &frame.body).await,
        Api::SaslHandshake => sasl::handshake(shard, &conn.login, header, &frame.body).await,
        Api::SaslAuthenticate => {
            let before = conn.login.borrow().principal.is_some();
            let answer = sasl::authenticate(shard, &conn.login, header, &frame.body).await;
            // A login just made (one per connection: `sasl.rs` refuses a
            // second) takes effect.
            if !before {
                conn.logged_in();
            }
            answer
        }
        Api::PutUser => users::put(shard, header, &frame.body).await,
        Api::DeleteUser => users::delete(shard, header, &frame.body).await,
        Api::ListUsers => users::list(shard, header, &frame.body),
        Api::AlterAcls => acls::alter(shard, header, &frame.body).await,
        Api::ListAcls => acls::list(shard, header, &frame.body),
        Api::JoinGroup
        | Api::Heartbeat
        | Api::LeaveGroup
        | Api::CommitOffsets
        | Api::FetchOffsets
        | Api::ListGroups
        | Api::DescribeGroup
        | Api::ResetGroup
        | Api::DeleteGroup
        | Api::Receive
        | Api::Settle => groups::handle(shard, api, header, &frame.body, conn.acl_user()).await,
    };
    Some(result.unwrap_or_else(|e| {
        if e.code == ErrorCode::NotAuthorized {
            shard.metrics.denied(api.name());
        }
        error_response(header, &e)
    }))
}

/// Refuses a connection's requests once the user it logged in as (SASL
/// SCRAM) is deleted, re-created or given another password: its session
/// ends with the credentials it logged in with (`AuthenticationFailed`;
/// a new login tells). Certificate users (`--auth mtls`) are not in the
/// table.
fn still_a_user(
    table: &crate::controller::MetadataTable,
    auth: &crate::auth::ServerAuth,
    login: &sasl::Login,
) -> Result<(), WireError> {
    match &login.principal {
        Some(crate::auth::Principal::User(name)) if auth.mode == crate::auth::AuthMode::Scram => {
            match (table.users.get(name), login.record.as_ref()) {
                (Some(now), Some(then)) if now == then => Ok(()),
                _ => Err(WireError::new(
                    ErrorCode::AuthenticationFailed,
                    format!(
                        "user {name:?} was deleted or given another password since this connection logged in: \
                         connect and log in again"
                    ),
                )),
            }
        }
        _ => Ok(()),
    }
}

/// Runs `futures` at once on this shard and returns their outputs in
/// order (one runs in place, without a task).
async fn all_of<T: 'static, F: std::future::Future<Output = T> + 'static>(futures: Vec<F>) -> Vec<T> {
    if futures.len() == 1 {
        let mut out = Vec::with_capacity(1);
        for f in futures {
            out.push(f.await);
        }
        return out;
    }
    let tasks: Vec<_> = futures.into_iter().map(glommio::spawn_local).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// What an answer's records may take of a frame of `max_frame_bytes`: all
/// but 1 MiB, kept for the rest of the answer (at least 1 MiB).
fn frame_room(max_frame_bytes: u32) -> usize {
    (max_frame_bytes as usize).saturating_sub(1 << 20).max(1 << 20)
}

/// Most (queue, partition) entries one request may name.
pub const PARTITIONS_PER_REQUEST_MAX: usize = 10_000;

/// A queue name a request carries, refused when longer than any queue's
/// may be (before it is copied once per partition of the request).
fn named_queue(name: Option<&str>) -> Result<String, WireError> {
    let name = name.unwrap_or_default();
    if name.len() > strand_wire::QUEUE_NAME_MAX {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a queue name of {} bytes; no queue's is over {}",
                name.len(),
                strand_wire::QUEUE_NAME_MAX
            ),
        ));
    }
    Ok(name.to_string())
}

/// How many partitions a request's `queues` vector names, from the body's
/// vector lengths (nothing built): for [`check_entries`]. The request
/// tables differ in type but share the shape `queues[].partitions[]`.
macro_rules! partitions_named {
    ($req:expr) => {
        $req.queues()
            .iter()
            .flatten()
            .map(|q| q.partitions().map_or(0, |p| p.len()))
            .sum::<usize>()
    };
}
pub(crate) use partitions_named;

/// Refuses a request naming more partitions than [`PARTITIONS_PER_REQUEST_MAX`]
/// (counted from the body's vector lengths, before anything is built).
fn check_entries(n: usize) -> Result<(), WireError> {
    if n > PARTITIONS_PER_REQUEST_MAX {
        return Err(WireError::new(
            ErrorCode::InvalidRequest,
            format!("{n} partitions in one request; at most {PARTITIONS_PER_REQUEST_MAX}"),
        ));
    }
    Ok(())
}

/// Reads a request body, turning a verification failure into the error to
/// answer with.
fn request<'a, T>(body: &'a [u8]) -> Result<T::Inner, WireError>
where
    T: strand_wire::flatbuffers::Follow<'a> + strand_wire::flatbuffers::Verifiable + 'a,
{
    read_body::<T>(body).map_err(|e: MessageError| WireError::new(e.code(), e.to_string()))
}

/// An `Error` table, or none for success.
fn error_table<'b>(fbb: &mut FlatBufferBuilder<'b>, err: Option<&WireError>) -> Option<WIPOffset<Error<'b>>> {
    let err = err?;
    let message = fbb.create_string(&err.message);
    Some(Error::create(
        fbb,
        &ErrorArgs {
            code: err.code,
            message: Some(message),
            leader: err.leader.map(|(node, _)| node as u32),
            leader_epoch: err.leader.map(|(_, epoch)| epoch),
        },
    ))
}

/// The error an `Error` table carries (another node's answer), if any.
fn error_from_table(err: Option<Error<'_>>) -> Option<WireError> {
    let err = err.filter(|e| e.code() != ErrorCode::None)?;
    Some(WireError {
        leader: err.leader().zip(err.leader_epoch()).map(|(n, e)| (NodeId::from(n), e)),
        ..WireError::new(err.code(), err.message().unwrap_or_default())
    })
}

/// A response carrying only an error (see the module doc).
fn error_response(header: FrameHeader, err: &WireError) -> OutFrame {
    let mut fbb = FlatBufferBuilder::new();
    let error = error_table(&mut fbb, Some(err));
    let root = ApiVersionsResponse::create(&mut fbb, &ApiVersionsResponseArgs { error, apis: None });
    fbb.finish_minimal(root);
    OutFrame::new(header, fbb.finished_data(), TailBuilder::default())
}

/// A response carrying only `code` and `message` (for frames the
/// connection cannot serve).
pub fn error_frame(header: FrameHeader, code: ErrorCode, message: String) -> OutFrame {
    error_response(header, &WireError::new(code, message))
}

/// Frames a finished body.
fn respond(header: FrameHeader, fbb: &FlatBufferBuilder<'_>, tail: TailBuilder) -> OutFrame {
    OutFrame::new(header, fbb.finished_data(), tail)
}

/// The wire error for a failed proposal.
fn propose_error(e: ProposeError) -> WireError {
    match e {
        ProposeError::Refused(c) => WireError::new(c.code(), c.to_string()),
        ProposeError::Unavailable(m) => WireError::new(ErrorCode::ControllerUnavailable, m),
    }
}

/// Checks the name of a queue a request would create, delete or alter:
/// `__`-prefixed names are the broker's own queues (`__groups`).
fn user_queue_name(name: Option<&str>) -> Result<String, WireError> {
    let name = queue_name(name)?;
    if crate::groups::is_internal(&name) {
        let e = ControllerError::InvalidName(format!(
            "queue names starting with \"__\" are reserved for the broker's own queues ({name:?})"
        ));
        return Err(WireError::new(e.code(), e.to_string()));
    }
    Ok(name)
}

/// Checks a queue name from a request.
fn queue_name(name: Option<&str>) -> Result<String, WireError> {
    let name = name.ok_or_else(|| WireError::new(ErrorCode::InvalidRequest, "queue name missing"))?;
    strand_wire::validate_queue_name(name).map_err(|m| {
        let e = ControllerError::InvalidName(m);
        WireError::new(e.code(), e.to_string())
    })?;
    Ok(name.to_string())
}

/// A queue's settings as a `QueueConfig` table.
fn config_table<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    s: &crate::controller::QueueSettings,
) -> WIPOffset<strand_wire::QueueConfig<'b>> {
    use crate::controller::FsyncSetting;
    let (fsync, fsync_interval_ms, fsync_interval_bytes) = match s.fsync {
        FsyncSetting::Always => (strand_wire::FsyncMode::Always, 0, 0),
        FsyncSetting::Interval { ms, bytes } => (
            strand_wire::FsyncMode::Interval,
            ms.min(u64::from(u32::MAX)) as u32,
            bytes,
        ),
    };
    let unlimited = |v: Option<u64>| Some(v.map_or(-1, |v| v.min(i64::MAX as u64) as i64));
    strand_wire::QueueConfig::create(
        fbb,
        &strand_wire::QueueConfigArgs {
            partitions: s.partitions,
            replication_factor: s.replication_factor,
            retention_ms: unlimited(s.retention_ms),
            retention_bytes: unlimited(s.retention_bytes),
            fsync,
            fsync_interval_ms,
            fsync_interval_bytes,
            max_message_bytes: Some(s.max_message_bytes),
            max_delivery_attempts: Some(s.max_delivery_attempts),
            min_insync_replicas: Some(s.min_insync() as u16),
        },
    )
}

/// A retention limit from the wire: absent → `default`, -1 → none, > 0 →
/// that; anything else is refused.
fn retention(value: Option<i64>, default: Option<u64>, what: &str) -> Result<Option<u64>, WireError> {
    match value {
        None => Ok(default),
        Some(-1) => Ok(None),
        Some(v) if v > 0 => Ok(Some(v as u64)),
        Some(v) => Err(WireError::new(
            ErrorCode::InvalidConfig,
            format!("{what} must be -1 (no limit) or positive, not {v}"),
        )),
    }
}
