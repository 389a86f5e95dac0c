//! `strand serve`: one process, one glommio executor per core (a shard),
//! pinned, each with its own io_uring, storage, partitions and listener on
//! the shared client port (SO_REUSEPORT: the kernel spreads connections).
//!
//! Runs on: the main thread starts the shards, prints the ready line, waits
//! for SIGTERM/SIGINT; everything else runs on the shards.
//!
//! Start-up: shard 0 binds the port first (so an ephemeral `:0` port is
//! shared), opens the controller, applies the metadata and pushes it to the
//! other shards; once every shard has applied it and listens, one line
//! containing `ready` goes to stdout. Shutdown: on SIGTERM/SIGINT each shard
//! stops accepting, lets in-flight requests finish (up to 5 s), flushes and
//! closes its logs; shard 0 stops the controller; the process exits 0.

pub mod connection;
pub mod data_dir;
pub mod host;
mod mesh;
pub mod metrics_http;
pub mod tls;

use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use strand_storage::ShardStorage;

use crate::config::BrokerConfig;
use crate::controller::{Controller, MetadataTable, Settings as ControllerSettings};
use crate::limits::{ConnectionLimiter, ConnectionLimits};
use crate::routing::ShardId;
use crate::shard::partitions::Partitions;
use crate::shard::{self, Mesh, Shard};
use data_dir::DataDir;

/// Why the broker stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Startup(String),
    #[error("a shard failed: {0}")]
    Shard(String),
    /// SIGTERM or SIGINT before the broker was ready.
    #[error("stopped by a signal during start-up")]
    Interrupted,
}

/// Process-wide shutdown state shared by the shards.
struct Lifecycle {
    /// Set by SIGTERM/SIGINT.
    stop: Arc<AtomicBool>,
    /// Shards that have finished their in-flight requests.
    drained: Arc<AtomicUsize>,
    /// Set by shard 0 once every shard holds all the controller's log had:
    /// before that a shard may hold a table from the middle of the replay
    /// and would call existing queues unknown.
    metadata_ready: Arc<AtomicBool>,
    /// Shard 0: the metrics endpoint's listening socket, to serve.
    metrics_fd: Option<std::os::fd::RawFd>,
    /// The controller leader shard 0's member knows of (0: none).
    controller_leader: Arc<AtomicU64>,
    /// This broker's lease: shard 0's member renews it, every shard's
    /// leaders check it.
    lease: crate::lease::OwnLease,
    /// Set by shard 0 once a stopping broker has handed its leaderships
    /// over (or found nothing to hand over); the other shards serve until
    /// then.
    handed_off: Arc<AtomicBool>,
    /// The data directory's id (`data_dir.rs`), registered with the
    /// controller.
    directory_id: u64,
    /// The node's connections, counted across its shards.
    connections: Arc<ConnectionLimiter>,
    /// With `--tls-cert`: the listener's and the peer links' TLS.
    tls: Option<tls::ServerTls>,
    /// `--auth` and the inter-broker login (`crate::auth`).
    auth: Arc<crate::auth::ServerAuth>,
    /// The producer ids each user brought lately, counted across shards.
    principal_producers: Arc<crate::limits::PrincipalProducers>,
}

impl Lifecycle {
    /// How this node's peer links secure themselves.
    fn peer_security(&self) -> crate::frame_io::PeerSecurity {
        crate::frame_io::PeerSecurity {
            tls: self.tls.as_ref().map(|t| t.connector.clone()),
            login: self.auth.login.clone(),
            required: self.auth.mode == crate::auth::AuthMode::Scram,
        }
    }
}

enum Event {
    Bound(SocketAddr),
    Ready,
    Failed(String),
}

/// How long shutdown waits for in-flight requests.
const DRAIN: Duration = Duration::from_secs(5);

/// Runs the broker until SIGTERM or SIGINT.
pub fn run(mut config: BrokerConfig) -> Result<(), ServeError> {
    // What the shards rely on (a frame fits the request budgets, ...),
    // whoever built the settings.
    config.validate().map_err(|e| ServeError::Startup(e.to_string()))?;
    // First, so that a signal at any later moment of the start is seen
    // (and the directory a failed start made is removed).
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| ServeError::Startup(format!("installing the signal handler: {e}")))?;
    }
    let machine = host::Host::read();
    let shards = match config.cores {
        Some(cores) => cores,
        None => {
            let fit = host::default_shards(&config, &machine);
            if fit < machine.cpus {
                tracing::info!(
                    "{fit} shards, not one per CPU ({}): the machine's memory holds {fit} (set cores to choose)",
                    machine.cpus
                );
            }
            fit
        }
    };
    let shards = u16::try_from(shards).map_err(|_| ServeError::Startup("too many cores".into()))?;
    match host::check(&config, usize::from(shards), &machine).map_err(ServeError::Startup)? {
        host::Verdict::Fits => {}
        host::Verdict::Warn(w) => tracing::warn!("{w}"),
    }
    check_port_free(config.listen)?;
    // The metrics endpoint's socket, bound here so a busy address is a clear
    // start-up error and port 0 resolves before the ready line; shard 0
    // serves it.
    let metrics = std::net::TcpListener::bind(config.metrics_listen)
        .map_err(|e| ServeError::Startup(format!("binding the metrics address {}: {e}", config.metrics_listen)))?;
    let metrics_addr = metrics.local_addr().map_err(|e| ServeError::Startup(e.to_string()))?;
    metrics
        .set_nonblocking(true)
        .map_err(|e| ServeError::Startup(e.to_string()))?;
    // Last of the checks: from here on the directory is ours, and a failed
    // start removes it if it made it.
    let data_dir = DataDir::open(&config.data_dir).map_err(|e| ServeError::Startup(e.to_string()))?;
    config.data_dir = data_dir.path().to_path_buf();
    run_locked(config, shards, metrics, metrics_addr, stop, data_dir)
}

/// The shards bind with SO_REUSEPORT, which would quietly share the port
/// with another broker already listening there. A plain bind cannot tell
/// (a killed broker's closing connections hold the port for a while), so
/// knock: if something answers, the port is taken.
fn check_port_free(listen: SocketAddr) -> Result<(), ServeError> {
    // An address that is not this machine's (or a port it may not use)
    // fails here, before the data directory is touched. A port in use is
    // the knock's to judge (a broker that just exited holds it a moment).
    match std::net::TcpListener::bind(listen) {
        Err(e) if e.kind() != std::io::ErrorKind::AddrInUse => {
            return Err(ServeError::Startup(format!("binding {listen}: {e}")))
        }
        _ => {}
    }
    if listen.port() == 0 {
        return Ok(());
    }
    let probe = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => SocketAddr::from(([127, 0, 0, 1], listen.port())),
        ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listen.port())),
        _ => listen,
    };
    let answers = || std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(500)).is_ok();
    // A broker that has just exited can leave its listening socket up
    // for a moment (the kernel tears down its io_uring, which holds a
    // pending accept, after the process is gone): knock again for up to
    // 2 s before calling the port taken.
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut taken = answers();
    while taken && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        taken = answers();
    }
    if taken {
        return Err(ServeError::Startup(format!(
            "listening on {listen}: address in use (something already listens there: another broker?)"
        )));
    }
    Ok(())
}

/// The start and the run, once the data directory is locked.
fn run_locked(
    config: BrokerConfig,
    shards: u16,
    metrics: std::net::TcpListener,
    metrics_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    data_dir: DataDir,
) -> Result<(), ServeError> {
    let metrics_fd = Some(std::os::fd::IntoRawFd::into_raw_fd(metrics));
    let config = Arc::new(config);
    let drained = Arc::new(AtomicUsize::new(0));
    let metadata_ready = Arc::new(AtomicBool::new(false));
    let controller_leader = Arc::new(AtomicU64::new(0));
    let lease = crate::lease::OwnLease::default();
    let handed_off = Arc::new(AtomicBool::new(false));
    let directory_id = data_dir.id();
    let server_tls = match config.tls_files() {
        Some(files) => Some(tls::ServerTls::load(&files).map_err(ServeError::Startup)?),
        None => None,
    };
    reload_on_sighup(server_tls.clone())?;
    let auth = Arc::new(crate::auth::ServerAuth::from_settings(&config).map_err(ServeError::Startup)?);
    let connections = ConnectionLimiter::new(ConnectionLimits {
        max_total: config.max_connections,
        max_per_ip: config.max_connections_per_ip,
        rate_per_ip: config.max_connection_rate_per_ip,
    });
    let principal_producers = Arc::new(crate::limits::PrincipalProducers::new(
        config.max_producer_ids_per_principal,
    ));
    let mesh = Mesh::full(usize::from(shards), config.shard_channel_capacity);
    let (events_tx, events) = mpsc::channel();
    let cpus = host::usable_cpu_ids();
    let spawn = |id: u16, listen: SocketAddr| {
        let (config, mesh, events_tx) = (config.clone(), mesh.clone(), events_tx.clone());
        let lifecycle = Lifecycle {
            stop: stop.clone(),
            drained: drained.clone(),
            metadata_ready: metadata_ready.clone(),
            metrics_fd: metrics_fd.filter(|_| id == 0),
            controller_leader: controller_leader.clone(),
            lease: lease.clone(),
            handed_off: handed_off.clone(),
            directory_id,
            connections: connections.clone(),
            tls: server_tls.clone(),
            auth: auth.clone(),
            principal_producers: principal_producers.clone(),
        };
        LocalExecutorBuilder::new(Placement::Fixed(cpus[usize::from(id) % cpus.len()]))
            .name(&format!("shard-{id}"))
            // Idle executors poll before parking: cross-shard round trips
            // drop from ≈ 53 µs to ≈ 12 µs p50 (DESIGN.md §5); see the setting.
            .spin_before_park(Duration::from_micros(config.spin_before_park_us))
            .io_memory(config.io_memory_bytes)
            .spawn(move || async move {
                let result = shard_main(ShardId(id), shards, config, mesh, listen, &events_tx, lifecycle).await;
                if let Err(e) = &result {
                    let _ = events_tx.send(Event::Failed(format!("shard {id}: {e}")));
                }
                result
            })
            .map_err(|e| ServeError::Startup(format!("starting shard {id}: {e}")))
    };
    // A start that fails before any shard ran leaves no directory it made;
    // once one runs, the directory stays (see `data_dir`).
    let first = match spawn(0, config.listen) {
        Ok(handle) => handle,
        Err(e) => {
            data_dir.discard_if_new();
            return Err(e);
        }
    };
    // Held (and the directory locked) until the process exits.
    let _data_dir = data_dir;
    let mut handles = vec![first];
    // A shard that dies in start-up may leave others waiting for it: give
    // up after a while rather than hang (returning ends the process).
    let startup = Instant::now() + Duration::from_secs(120);
    let addr = match next_startup_event(&events, &stop, startup)? {
        Event::Bound(addr) => addr,
        Event::Failed(e) => return Err(ServeError::Startup(e)),
        Event::Ready => return Err(ServeError::Startup("shard 0 was ready before it bound".into())),
    };
    for id in 1..shards {
        handles.push(spawn(id, addr)?);
    }
    drop(events_tx);
    let mut ready = 0;
    while ready < shards {
        match next_startup_event(&events, &stop, startup)? {
            Event::Ready => ready += 1,
            Event::Bound(_) => {}
            // Other shards may be stuck waiting for the failed one: do not
            // join them; returning ends the process.
            Event::Failed(e) => return Err(ServeError::Startup(e)),
        }
    }
    println!("strand ready on {addr} with {shards} shards; metrics on http://{metrics_addr}/metrics");
    let mut failure = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(format!("{e:?}")),
        }
    }
    failure.map_or(Ok(()), |e| Err(ServeError::Shard(e)))
}

/// The next start-up event from the shards, or why there is none: a
/// SIGTERM/SIGINT (`stop`) ends the wait at once, whatever the shards are
/// doing, and so does the deadline or the shards' channel closing.
fn next_startup_event(
    events: &mpsc::Receiver<Event>,
    stop: &AtomicBool,
    deadline: Instant,
) -> Result<Event, ServeError> {
    loop {
        if stop.load(Ordering::SeqCst) {
            return Err(ServeError::Interrupted);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ServeError::Startup("a shard hung during start-up (120 s)".into()));
        }
        match events.recv_timeout(left.min(Duration::from_millis(50))) {
            Ok(event) => return Ok(event),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(ServeError::Startup("a shard stopped during start-up".into()))
            }
        }
    }
}

/// Replays every shard journal in the data directory into the logs
/// (`strand_storage::replay`), on shard 0 before the shards join: a
/// partition may have moved shards since (another `cores`), and journals
/// of shards that no longer run, or all of them with `journal = false`,
/// are removed once replayed.
async fn replay_journals(storage: &ShardStorage, config: &BrokerConfig, shards: u16) -> Result<(), String> {
    let root = config.data_dir.join("__journal");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(());
    };
    let mut found: Vec<u16> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    found.sort();
    for shard in found {
        let dir = config.journal_dir(shard);
        crate::shard::recover::replay_journal(
            storage,
            &dir,
            config.journal_config(),
            &config.log_base(),
            "at start-up",
        )
        .await?;
        if shard >= shards || !config.journal {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
        }
    }
    Ok(())
}

async fn shard_main(
    id: ShardId,
    shards: u16,
    config: Arc<BrokerConfig>,
    mesh: Mesh,
    listen: SocketAddr,
    events: &mpsc::Sender<Event>,
    lifecycle: Lifecycle,
) -> Result<(), String> {
    let listener = TcpListener::bind(listen).map_err(|e| format!("binding {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if id.0 == 0 {
        let _ = events.send(Event::Bound(addr));
    }
    let storage = ShardStorage::open(&config.data_dir, config.shard_storage())
        .await
        .map_err(|e| e.to_string())?;
    if id.0 == 0 {
        // Before any shard serves (the others wait in the join below).
        replay_journals(&storage, &config, shards).await?;
    }
    let (senders, receivers) = mesh.join().await.map_err(|_| "joining the shard mesh".to_string())?;
    if config.journal {
        storage
            .start_journal(&config.journal_dir(id.0), config.journal_config())
            .await
            .map_err(|e| format!("starting the shard journal: {e}"))?;
    }
    let partitions = Partitions::new(storage, &config, id, shards, lifecycle.lease.clone());
    let shard = Rc::new(Shard::new(
        id,
        shards,
        config.clone(),
        partitions,
        senders,
        lifecycle.controller_leader.clone(),
        lifecycle.peer_security(),
    ));
    shard::set_current(&shard);
    if let Some(tls) = &lifecycle.tls {
        connection::ListenerTls::install(&shard, tls.acceptor.clone());
    }
    crate::auth::ServerAuth::install(&shard, lifecycle.auth.clone());
    crate::handlers::install_principal_producers(&shard, lifecycle.principal_producers.clone());
    mesh::start_receivers(&shard, receivers);
    crate::groups::start(&shard);
    // Accepting from now on: the other nodes' controller members must
    // reach this one for the controller to elect a leader; clients are
    // answered only once `serving` is set (`handlers::dispatch`).
    start_accepting(&shard, listener, lifecycle.connections.clone());
    if id.0 == 0 {
        let weak: Weak<Shard> = Rc::downgrade(&shard);
        let publish = Rc::new(move |table: &MetadataTable| {
            if let Some(shard) = weak.upgrade() {
                shard.publish(Arc::new(table.clone()));
            }
        });
        let advertised = config.advertised(addr);
        let settings = ControllerSettings {
            node_id: config.node_id,
            advertised,
            voters: config.voters(advertised),
            shards,
            directory: lifecycle.directory_id,
            heartbeat_ms: config.controller_heartbeat_ms,
            election_min_ms: config.controller_election_min_ms,
            election_max_ms: config.controller_election_max_ms,
            broker_heartbeat_ms: config.broker_heartbeat_ms,
            broker_session_ms: config.broker_session_ms,
            leader_balance_interval_ms: config.leader_balance_interval_ms,
            max_frame_bytes: config.max_frame_bytes,
            peer: lifecycle.peer_security(),
        };
        let member = ControllerMember {
            dir: config.data_dir.join("__controller"),
            settings,
            publish,
            leader: lifecycle.controller_leader.clone(),
            lease: lifecycle.lease.clone(),
        };
        let controller = member.start(&shard).await?;
        glommio::spawn_local(member.supervise(shard.clone(), controller, lifecycle.stop.clone())).detach();
        // Ready only once every shard holds everything the log had.
        if !shard.wait_all_applied(Duration::from_secs(30)).await {
            return Err("the shards did not apply the metadata within 30 s".into());
        }
        // Every shard holds the whole table: what it no longer gives this
        // node (changed while it was down) can go.
        let swept = shard.partitions.sweep_leftovers(&shard.table());
        if swept > 0 {
            tracing::info!("removed {swept} replica directories left behind while this broker was down");
        }
        lifecycle.metadata_ready.store(true, Ordering::SeqCst);
        let (s, auth) = (shard.clone(), lifecycle.auth.clone());
        glommio::spawn_local(async move { crate::auth::bootstrap_superusers(&s, &auth).await }).detach();
    }
    // Serve only once this shard holds the metadata (and its partitions).
    let deadline = Instant::now() + Duration::from_secs(30);
    while shard.table().applied_index == 0 || !lifecycle.metadata_ready.load(Ordering::SeqCst) {
        if Instant::now() > deadline {
            return Err("no metadata from shard 0 within 30 s".into());
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    start_timers(&shard);
    crate::replication::start(&shard);
    if let Some(fd) = lifecycle.metrics_fd {
        // SAFETY: the fd is a bound, listening, non-blocking TCP socket that
        // `run` gave up ownership of (into_raw_fd) for this shard alone.
        let listener = unsafe { <TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        metrics_http::start(&shard, listener);
    }
    shard.serving.set(true);
    let _ = events.send(Event::Ready);
    wait_for_stop(&shard, &lifecycle).await;
    shutdown(&shard, &lifecycle.drained).await;
    // Tasks left over are dropped after this returns, outside the executor.
    shard::mark_torn_down();
    Ok(())
}

/// Shard 0's member of the controller: where it lives and how it runs.
struct ControllerMember {
    dir: std::path::PathBuf,
    settings: ControllerSettings,
    publish: crate::controller::Publish,
    leader: Arc<AtomicU64>,
    lease: crate::lease::OwnLease,
}

impl ControllerMember {
    /// Opens the member from its directory (it serves the other voters from
    /// then on: they elect a leader together), follows its leader, and
    /// joins: the log applied, this broker registered.
    async fn start(&self, shard: &Rc<Shard>) -> Result<Rc<Controller>, String> {
        let controller = Controller::open(&self.dir, &self.settings, self.publish.clone(), self.lease.clone())
            .await
            .map_err(|e| format!("starting the controller: {e}"))?;
        let controller = Rc::new(controller);
        shard.controller.borrow_mut().replace(controller.clone());
        let follower = controller.clone();
        let leader = self.leader.clone();
        glommio::spawn_local(async move { follower.follow_leader(&leader).await }).detach();
        controller
            .join(&self.settings)
            .await
            .map_err(|e| format!("starting the controller: {e}"))?;
        Ok(controller)
    }

    /// Renews this broker's lease for the life of the broker. openraft
    /// stops a member for good on a storage error (a full disk under
    /// `__controller/raft.log`: found by strand-chaos's disk-full nemesis);
    /// the broker would then renew its lease no more and stay fenced, its
    /// shards serving a table that no longer changes. Instead the process
    /// exits ([`crate::shard::EXIT_TO_RESTART`]) and its supervisor (systemd's
    /// `Restart=`) starts it again: a restart is the well-trodden path
    /// back (a new run, fenced and re-registered), where starting the
    /// member again inside this process left the stopped member's tasks
    /// and files beside the new one's — a 30-minute strand-chaos run saw
    /// the controller's partition epochs go back after such a restart.
    async fn supervise(self, shard: Rc<Shard>, controller: Rc<Controller>, stop: Arc<AtomicBool>) {
        controller.keep_alive(self.settings.clone()).await;
        if stop.load(Ordering::SeqCst) || shard.stopping.get() {
            return;
        }
        tracing::error!(
            dir = %self.dir.display(),
            "the controller member stopped (the error before this says why): exiting, to be started again once the \
             cause (a full disk) is fixed"
        );
        std::process::exit(crate::shard::EXIT_TO_RESTART);
    }
}

/// Accepts connections (for the whole life of the shard).
///
/// The accept itself runs in its own task and is never cancelled while
/// pending: glommio accepts through an io_uring operation, and dropping one
/// (say, on a timeout) can lose a connection the kernel had already
/// accepted — the client would wait forever on a socket nobody reads. The
/// stop flag (set from the signal thread) is looked at every 250 ms instead.
///
/// A connection over one of the node's limits (`crate::limits`) is closed
/// as it comes: counted in `strand_connections_refused_total` by reason,
/// and logged at most every 10 s per shard with the count since.
fn start_accepting(shard: &Rc<Shard>, listener: TcpListener, connections: Arc<ConnectionLimiter>) {
    let s = shard.clone();
    glommio::spawn_local(async move {
        let mut refusals = RefusalLog::default();
        loop {
            match listener.accept().await {
                Ok(stream) if !s.stopping.get() => {
                    let ip = match stream.peer_addr() {
                        Ok(a) => a.ip(),
                        Err(_) => continue, // gone already: closed
                    };
                    match connections.admit(ip, Instant::now()) {
                        Ok(slot) => connection::place(&s, stream, slot),
                        Err(refusal) => {
                            s.metrics.connection_refused(refusal.name());
                            refusals.note(ip, refusal, Instant::now());
                        }
                    }
                }
                Ok(_) => {} // stopping: closed at once
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    })
    .detach();
}

/// Re-reads the TLS certificate and key on every SIGHUP, on a thread of
/// its own (new handshakes take the new pair; a bad pair is logged and
/// the old one kept). Without TLS a SIGHUP is logged and changes nothing
/// (it never stops the broker: `systemctl reload` is safe either way).
fn reload_on_sighup(tls: Option<tls::ServerTls>) -> Result<(), ServeError> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])
        .map_err(|e| ServeError::Startup(format!("listening for SIGHUP: {e}")))?;
    std::thread::Builder::new()
        .name("strand-sighup".into())
        .spawn(move || {
            for _ in signals.forever() {
                match tls.as_ref().map(tls::ServerTls::reload) {
                    Some(Ok(())) => tracing::info!("SIGHUP: the TLS certificate and key were read again"),
                    Some(Err(e)) => tracing::error!("SIGHUP: keeping the TLS certificate in use: {e}"),
                    None => tracing::info!("SIGHUP: nothing to read again (the broker runs without TLS)"),
                }
            }
        })
        .map_err(|e| ServeError::Startup(format!("starting the SIGHUP thread: {e}")))?;
    Ok(())
}

/// The accept loop's log of refused connections: the first at once, then
/// at most one line every [`RefusalLog::EVERY`] with how many since (a
/// flood of connections must not become a flood of log lines).
#[derive(Default)]
struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    const EVERY: Duration = Duration::from_secs(10);

    fn note(&mut self, ip: std::net::IpAddr, refusal: crate::limits::Refusal, now: Instant) {
        self.unlogged += 1;
        if self.last.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            return;
        }
        tracing::warn!(
            %ip,
            limit = refusal.name(),
            refused = self.unlogged,
            "closing new connections over a limit (refused: the count since the last such line)"
        );
        self.last = Some(now);
        self.unlogged = 0;
    }
}

/// Waits until the broker is told to stop, hands its leaderships over
/// (shard 0; the others serve meanwhile), then marks the shard stopping
/// (the accept loop closes new connections at once from then on).
async fn wait_for_stop(shard: &Rc<Shard>, lifecycle: &Lifecycle) {
    while !lifecycle.stop.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(250)).await;
    }
    if shard.id.0 == 0 {
        hand_off_leaderships(shard).await;
        lifecycle.handed_off.store(true, Ordering::SeqCst);
    }
    let deadline = Instant::now() + HAND_OFF_LIMIT + Duration::from_secs(1);
    while !lifecycle.handed_off.load(Ordering::SeqCst) && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    shard.stopping.set(true);
    // Long polls and acks=all waits end now instead of at their deadline.
    shard.partitions.new_data.notify_all();
    for part in shard.partitions.logs() {
        part.acks.notify_all();
    }
}

/// The longest a stopping broker waits for its hand-over to commit.
const HAND_OFF_LIMIT: Duration = Duration::from_secs(10);

/// A controlled shutdown: while other brokers are alive and this one holds
/// replicas, it stops renewing its lease and commits `ShutdownBroker`, so
/// its leaderships move to other in-sync replicas and it leaves the ISRs
/// before it stops serving; producers then find the new leaders at once
/// rather than after its lease expires. The proposal returns once every
/// shard here applied the result (this node's replicas follow). A
/// hand-over that cannot commit within `HAND_OFF_LIMIT` (no controller
/// quorum) is logged; the lease then expires as after a crash.
async fn hand_off_leaderships(shard: &Rc<Shard>) {
    let table = shard.table();
    let me = shard.config.node_id;
    let others = table.brokers.values().any(|b| b.id != me && b.alive);
    let holds = table
        .queues
        .values()
        .any(|q| q.partitions.iter().any(|p| p.replicas.contains(&me)));
    if !others || !holds || !table.brokers.get(&me).is_some_and(|b| b.alive) {
        return;
    }
    let controller = shard.controller.borrow().clone();
    let Some(controller) = controller else { return };
    // A renewal takes at most two beats.
    let incarnation = controller
        .leave(Duration::from_millis(2 * shard.config.broker_heartbeat_ms))
        .await;
    let started = Instant::now();
    let command = crate::controller::Command::ShutdownBroker { id: me, incarnation };
    match glommio::timer::timeout(HAND_OFF_LIMIT, async { Ok(shard.propose(command).await) }).await {
        Ok(Ok(())) => tracing::info!(
            "stopping: leaderships handed over to the other in-sync replicas in {:?}",
            started.elapsed()
        ),
        Ok(Err(e)) => tracing::warn!("stopping: the hand-over did not commit ({e}); the lease will expire instead"),
        Err(_) => tracing::warn!(
            "stopping: the hand-over did not commit within {HAND_OFF_LIMIT:?}; the lease will expire instead"
        ),
    }
}

/// Runs `round` on `shard` every `period` (after each round ends) until
/// the shard stops.
fn every<R, F>(shard: &Rc<Shard>, period: Duration, round: R)
where
    R: Fn(Rc<Shard>) -> F + 'static,
    F: std::future::Future<Output = ()>,
{
    let s = shard.clone();
    glommio::spawn_local(async move {
        while !s.stopping.get() {
            glommio::timer::sleep(period).await;
            round(s.clone()).await;
        }
    })
    .detach();
}

/// Retention on every partition every 10 s; interval-fsync ticks every 5 ms
/// while an `fsync=interval` partition has something to write or sync (an
/// append wakes it); consumer-group sessions checked every 100 ms (every
/// second on a shard that coordinates no group); the reactor-stall probe
/// (a 10 ms timer that notes how late it wakes, while the shard serves
/// requests: an idle shard's stalls delay nobody, and probing them would
/// cost the idle broker a wake-up every 10 ms).
fn start_timers(shard: &Rc<Shard>) {
    let s = shard.clone();
    glommio::spawn_local(async move {
        const TICK: Duration = Duration::from_millis(10);
        // A shard quiet this long probes no more, and looks for requests
        // every IDLE_TICK.
        const IDLE_AFTER: Duration = Duration::from_secs(1);
        const IDLE_TICK: Duration = Duration::from_millis(250);
        let mut last_log = Instant::now();
        let mut logged = (0, 0);
        // Idle: no request in flight at the last look, nor since.
        let mut quiet_since = Instant::now();
        let mut seen = s.requests_seen.get();
        while !s.stopping.get() {
            if s.in_flight.get() > 0 || s.requests_seen.get() != seen {
                quiet_since = Instant::now();
                seen = s.requests_seen.get();
            }
            if quiet_since.elapsed() >= IDLE_AFTER {
                glommio::timer::sleep(IDLE_TICK).await;
                continue;
            }
            let (asked, cpu) = (Instant::now(), strand_storage::shard::thread_cpu_time());
            glommio::timer::sleep(TICK).await;
            let elapsed = asked.elapsed();
            let late = elapsed.saturating_sub(TICK);
            if late > crate::metrics::STALL {
                let on_cpu = strand_storage::shard::thread_cpu_time().saturating_sub(cpu);
                let (total, off_cpu) = s.metrics.stalled(crate::metrics::Stall::of(elapsed, on_cpu));
                if last_log.elapsed() >= Duration::from_secs(10) {
                    tracing::warn!(
                        shard = s.id.0,
                        late_us = late.as_micros() as u64,
                        stalls = total - logged.0,
                        off_cpu = off_cpu - logged.1,
                        "reactor stalls: the shard's timer woke late (off_cpu: the OS or the host kept the \
                         thread off the CPU; the rest, a task held the shard)"
                    );
                    (last_log, logged) = (Instant::now(), (total, off_cpu));
                }
            }
        }
    })
    .detach();
    let s = shard.clone();
    glommio::spawn_local(async move {
        while !s.stopping.get() {
            s.disk.refresh(&s.config.data_dir, s.config.min_free_bytes);
            glommio::timer::sleep(crate::shard::disk::CHECK_EVERY).await;
        }
    })
    .detach();
    glommio::spawn_local(shard.clone().watch_lease()).detach();
    // Apart: a round of one waiting on the controller must not hold up
    // the other.
    every(shard, crate::shard::RECOVER_EVERY, |s| async move {
        s.recover_logs_after_full_disk().await
    });
    every(shard, crate::shard::RECOVER_EVERY, |s| async move {
        s.report_damaged_replicas().await
    });
    let s = shard.clone();
    glommio::spawn_local(async move {
        while !s.stopping.get() {
            glommio::timer::sleep(Duration::from_secs(10)).await;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            for ((queue, p), part) in s.partitions.all() {
                part.log.release_idle_readahead(10_000);
                if let Err(e) = part.log.enforce_retention(part.log.retention_policy(), now).await {
                    tracing::warn!(queue = %queue, partition = p, "retention: {e}");
                }
            }
        }
    })
    .detach();
    let s = shard.clone();
    glommio::spawn_local(async move {
        // Appends since `seen` (read as a pass starts) wake a sleeping timer.
        let mut seen = s.partitions.interval_appends.epoch();
        let mut unsettled = true;
        while !s.stopping.get() {
            // The last pass left nothing of an fsync=interval queue to
            // write, sync or publish: sleep until the next such append (or
            // a second, to look at `stopping`), not every 5 ms for nothing.
            if !unsettled {
                futures_lite::future::or(
                    s.partitions.interval_appends.wait(seen),
                    glommio::timer::sleep(Duration::from_secs(1)),
                )
                .await;
            }
            // Then as before: appends gather for 5 ms, one write takes them.
            glommio::timer::sleep(Duration::from_millis(5)).await;
            seen = s.partitions.interval_appends.epoch();
            let (mut moved, mut left) = (false, false);
            for part in s.partitions.logs() {
                if matches!(part.log.config().fsync, strand_storage::FsyncPolicy::Interval { .. }) {
                    let _ = part.log.tick().await;
                    moved |= part.note_local();
                    left |= part.log.unsettled();
                }
            }
            unsettled = left;
            if moved {
                s.partitions.new_data.notify_all();
            }
        }
    })
    .detach();
}

/// Two phases: every shard first finishes its own in-flight requests
/// (which include the ones it forwarded), then waits until all shards have;
/// only then are logs closed, so no shard closes a partition another shard
/// still has a request for.
async fn shutdown(shard: &Rc<Shard>, drained: &AtomicUsize) {
    let deadline = Instant::now() + DRAIN;
    while shard.in_flight.get() > 0 && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    drained.fetch_add(1, Ordering::SeqCst);
    while drained.load(Ordering::SeqCst) < usize::from(shard.shards) && Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    shard.partitions.close_all().await;
    let controller = shard.controller.borrow_mut().take();
    if let Some(c) = controller {
        c.shutdown().await;
    }
}
