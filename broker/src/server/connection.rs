//! One client connection: read frames, serve up to [`MAX_IN_FLIGHT`] of
//! them at once, write the responses in request order.
//!
//! Runs on: the shard its client port picks ([`place`]: a listener that
//! accepts a connection for another shard hands the socket over the mesh;
//! the kernel spreads connections over the shards' SO_REUSEPORT listeners
//! before that). Two tasks
//! per connection: this reader, which decodes frames and spawns one handler
//! task per request, and a writer, which awaits those tasks in the order the
//! requests came and writes each response — with the ones ready right
//! behind it in the same send ([`COALESCE_BYTES`]): a group commit answers
//! all the produce requests it held at once, and at the daily load (issue
//! 27) that took the broker's sends from ~11,000 to ~3,700 a second. So a client may pipeline: a long
//! poll does not hold up a produce behind it, and produce requests for
//! different partitions share group commits. Handler tasks start in arrival
//! order (glommio runs a queue's tasks first in, first out), so two produce
//! requests for one partition on one connection append in the order sent.
//!
//! While the rest of a large frame is on its way, the reader raises the
//! socket's receive low-water mark to what the frame still owes
//! ([`LowWater`]): the shard wakes about twice for a 1 MiB produce rather
//! than at each of its 16 loopback segments. Measured with `strand-bench
//! produce --count 3000000` (1 MiB batches, fsync=always, seven alternating
//! pairs on the 2-core dev VM): broker CPU 124 → 113 ticks (median), 1253 →
//! 1393 MiB/s.
//!
//! What one connection may take (issue 42): at most
//! `connection_in_flight_bytes` of requests received and of answers not yet
//! written (the reader waits past it): a request holds its own bytes until
//! its answer is written, and a fetch, replica fetch or Receive also the
//! largest answer it may get ([`answer_room`]: what a fetch asks for, at
//! most a frame; a Receive a frame), so a client that
//! pipelines fetches and never reads the answers pins its budget, not
//! [`MAX_IN_FLIGHT`] frames. A frame over [`READ_CHUNK`] first
//! reserves its size from its shard's `request_memory_bytes` (the reader
//! waits for room before it reads the frame's bytes: what many
//! half-sent large frames can pin is bounded, and small requests never
//! wait for it). A [`Watch`] closes a connection that serves nothing and
//! sends nothing for `connection_idle_timeout_ms`, or whose frame begun is
//! not whole within `frame_receive_timeout_ms` (a client that sends half a
//! frame and stops), or that does not take the answers written to it for
//! `connection_idle_timeout_ms` (`slow_reader`). Connection counts and rates are `crate::limits`,
//! applied before a connection gets here.
//!
//! A malformed frame (bad length, body past the frame) ends the connection
//! (after the responses before it): the stream can no longer be trusted to
//! be in step. Everything else — unknown API, bad version, a body that fails
//! verification, a bad batch — is answered with a typed error and the
//! connection goes on.

use std::cell::{Cell, OnceCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use glommio::task::JoinHandle;
use strand_net::frame::{self, FrameLimits};
use strand_net::OutFrame;
use tracing::Instrument;

use crate::frame_io::Stream;
use crate::handlers;
use crate::limits::ConnectionSlot;
use crate::shard::messages::ShardMessage;
use crate::shard::Shard;

/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 64 << 10;
/// Most the read buffer grows by in one read.
const READ_GROW: usize = 1 << 20;
/// Responses ready at the same moment are written together up to this
/// many bytes (`gathered` never holds more; a larger response, or one
/// with nothing ready behind it, is written on its own, uncopied).
const COALESCE_BYTES: usize = 64 << 10;
/// Requests of one connection served at once; the reader waits when this
/// many are unanswered (backpressure to the client through TCP).
pub const MAX_IN_FLIGHT: usize = 64;

/// A response in the making, in request order.
enum Pending {
    Task(JoinHandle<Answered>),
    Ready(Answered),
}

/// A request's answer (none: it needs none) and the room its request
/// holds in the connection's budget until the answer is written.
struct Answered {
    out: Option<OutFrame>,
    _room: Option<Reservation>,
}

impl Answered {
    fn now(out: OutFrame) -> Answered {
        Answered {
            out: Some(out),
            _room: None,
        }
    }
}

/// The room a request reserves for its answer besides its own bytes: the
/// largest answer it may get, for the APIs whose answers are large (a
/// fetch: what it asks for, `handlers::fetch::answer_bound`; a replica
/// fetch or a Receive: a frame). Held until the
/// answer is written, so a client that asks and does not read holds at
/// most its budget, not [`MAX_IN_FLIGHT`] answers.
fn answer_room(api: u16, body: &[u8], shard: &Shard) -> usize {
    let config = &shard.config;
    use strand_wire::Api;
    match Api::from_u16(api) {
        Some(Api::Fetch) => {
            // A queue's largest batch: its own limit or the broker's,
            // whichever is larger (a limit lowered since leaves larger
            // batches in the log: the broker's covers those only up to it).
            let table = shard.table();
            let batch_of = |queue: &str| {
                let own = table.queue(queue).map_or(0, |q| q.settings.max_message_bytes);
                own.max(config.max_message_bytes) as usize
            };
            handlers::fetch::answer_bound(body, config.max_frame_bytes, &batch_of)
        }
        // A replica fetch (a broker's, one at a time per link) is answered
        // up to a frame; a Receive's answer depends on records not read yet.
        Some(Api::ReplicaFetch | Api::Receive) => config.max_frame_bytes as usize,
        _ => 0,
    }
}

/// Serves a connection this shard accepted on the shard its client port
/// picks ([`strand_wire::shard_for_port`]): here, or handed over the mesh.
/// A shard-aware client picks its port so that this is the shard owning
/// the partitions it uses, and its requests never cross between cores; for
/// any other client the port is random and so is the shard, as with
/// SO_REUSEPORT alone. If the hand-over fails the connection stays here.
pub fn place(shard: &Rc<Shard>, stream: TcpStream, slot: ConnectionSlot) {
    let _ = stream.set_nodelay(true);
    let target = stream
        .peer_addr()
        .ok()
        .map(|a| strand_wire::shard_for_port(a.port(), shard.shards))
        .filter(|&t| t != shard.id.0);
    let slot = match target {
        Some(target) => match hand_over(shard, &stream, target, slot) {
            // Dropping `stream` closes this shard's descriptor; the target
            // serves the socket through its own.
            Ok(()) => return,
            Err((e, Some(slot))) => {
                tracing::debug!("serving a connection for shard {target} here: {e}");
                slot
            }
            // The message (and the connection's place with it) is gone:
            // closed, as if refused; the client connects again.
            Err((e, None)) => {
                tracing::warn!("closing a connection for shard {target}: handing it over failed: {e}");
                return;
            }
        },
        None => slot,
    };
    glommio::spawn_local(serve(shard.clone(), stream, slot)).detach();
}

/// Sends the connection to shard `target`; on failure, why, and its slot
/// back where the message came back (a full or closed channel).
fn hand_over(
    shard: &Shard,
    stream: &TcpStream,
    target: u16,
    slot: ConnectionSlot,
) -> Result<(), (String, Option<ConnectionSlot>)> {
    use glommio::{GlommioError, ResourceType};
    use std::os::fd::{AsRawFd, BorrowedFd};
    // SAFETY: `stream` owns this open descriptor for the whole borrow, which
    // only duplicates it.
    let fd = match unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) }.try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => return Err((format!("duplicating the socket: {e}"), Some(slot))),
    };
    // On failure the duplicate is dropped with the message.
    shard
        .peers
        .try_send_to(usize::from(target), ShardMessage::Connection(fd, slot))
        .map_err(|e| {
            let why = e.to_string();
            match e {
                GlommioError::WouldBlock(ResourceType::Channel(ShardMessage::Connection(_, slot)))
                | GlommioError::Closed(ResourceType::Channel(ShardMessage::Connection(_, slot))) => (why, Some(slot)),
                _ => (why, None),
            }
        })
}

/// Serves a connection another shard handed over ([`place`]).
pub async fn adopt(shard: Rc<Shard>, fd: std::os::fd::OwnedFd, slot: ConnectionSlot) {
    use std::os::fd::{FromRawFd, IntoRawFd};
    if shard.stopping.get() {
        return; // dropping `fd` closes it
    }
    // SAFETY: `fd` is a connected TCP socket (accepted by glommio on another
    // shard, whose descriptor is closed) whose ownership moves here.
    let stream = unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) };
    serve(shard, stream, slot).await;
}

/// Serves one connection until it ends; `slot` (its place among the
/// node's connections) is given back then.
pub async fn serve(shard: Rc<Shard>, stream: TcpStream, slot: ConnectionSlot) {
    shard.metrics.connection_opened();
    // Until `ConnectionState` says whether it must log in.
    let phase = match ListenerTls::of(&shard) {
        Some(_) => crate::metrics::ConnectionPhase::TlsHandshake,
        None => crate::metrics::ConnectionPhase::Open,
    };
    let phase = handlers::Phase::new(shard.clone(), phase);
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let mut certified_as = None;
    let stream = match ListenerTls::of(&shard) {
        None => Stream::Plain(stream),
        Some(acceptor) => match accept_tls(&shard, &acceptor, stream, &peer).await {
            Some(tls) => {
                // The client certificate's subject CN (`--auth mtls`).
                let certificate = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
                certified_as = certificate.and_then(|c| crate::auth::subject_common_name(c));
                Stream::Accepted(Box::new(tls))
            }
            None => {
                drop(slot);
                shard.metrics.connection_closed();
                return;
            }
        },
    };
    // The mark counts the socket's bytes, which under TLS are not the
    // frame's: only for plaintext.
    let (low_water, tls) = match &stream {
        Stream::Plain(_) => (LowWater::new(fd), false),
        _ => (LowWater::disabled(), true),
    };
    let watch = Rc::new(Watch::new(Instant::now()));
    let timeouts = Timeouts::of(&shard.config);
    let watchdog = glommio::spawn_local(watchdog(shard.clone(), watch.clone(), fd, timeouts, peer.clone()));
    // The socket closes when both halves are gone: `reader` is held here
    // until the watchdog (which may shut the socket down by its number)
    // is cancelled, so it never touches a number reused by another socket.
    let (mut reader, writer) = futures_lite::io::split(stream);
    let (to_writer, responses) = local_channel::new_bounded::<Pending>(MAX_IN_FLIGHT);
    let writer_failed = Rc::new(Cell::new(false));
    let failed = writer_failed.clone();
    let peer_w = peer.clone();
    let writing = glommio::spawn_local(write_responses(writer, responses, failed, peer_w, tls, watch.clone()));
    let budget = Budget {
        connection: Rc::new(Semaphore::new(shard.config.connection_in_flight_bytes)),
        total: shard.config.connection_in_flight_bytes as usize,
        shard: RequestMemory::of(&shard),
    };
    let ends = Ends {
        to_writer: &to_writer,
        writer_failed: &writer_failed,
        peer: &peer,
        auth: crate::auth::ServerAuth::of(&shard),
        certified_as,
        phase,
    };
    read_requests(&shard, &mut reader, low_water, &budget, &watch, ends, tls).await;
    drop(to_writer);
    writing.await;
    drop(watchdog);
    drop(reader);
    drop(slot);
    shard.metrics.connection_closed();
}

/// How long a TLS client has to send its hello and finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listener's TLS (`server::tls`), set on each shard at start when
/// the broker runs with `--tls-cert` (kept in `Shard::ext`).
#[derive(Default)]
pub struct ListenerTls(OnceCell<futures_rustls::TlsAcceptor>);

impl ListenerTls {
    /// Turns TLS on for the connections this shard serves.
    pub fn install(shard: &Shard, acceptor: futures_rustls::TlsAcceptor) {
        let _ = shard.ext.get_or_default::<ListenerTls>().0.set(acceptor);
    }

    pub(crate) fn of(shard: &Shard) -> Option<futures_rustls::TlsAcceptor> {
        shard.ext.get::<ListenerTls>().and_then(|t| t.0.get().cloned())
    }
}

/// Whether the first bytes of a connection are a TLS ClientHello: a
/// handshake record (0x16) of TLS 1.x (0x03) whose first message is a
/// ClientHello (0x01). A frame never starts so: byte 5 is its API
/// number's high byte, 0 for every API.
fn is_client_hello(head: &[u8]) -> bool {
    head.len() >= 6 && head[0] == 0x16 && head[1] == 0x03 && head[5] == 0x01
}

/// The TLS session of a connection the listener accepted, within
/// [`HANDSHAKE_TIMEOUT`]; `None` when it failed (counted, logged at
/// debug). A plaintext client is told in a frame it can read that this
/// listener needs TLS.
async fn accept_tls(
    shard: &Shard,
    acceptor: &futures_rustls::TlsAcceptor,
    stream: TcpStream,
    peer: &str,
) -> Option<futures_rustls::server::TlsStream<TcpStream>> {
    let mut head = [0u8; frame::HEADER_LEN];
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    // The first bytes, without taking them.
    let mut backoff = Duration::from_millis(1);
    let seen = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let peeked = futures_lite::future::or(async { Some(stream.peek(&mut head).await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        match peeked {
            Some(Ok(0)) | Some(Err(_)) => return None,
            Some(Ok(n)) if n >= 6 => break n,
            // A hello in pieces: look again, less and less often.
            Some(Ok(_)) => {
                glommio::timer::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(50));
            }
            None => {
                shard.metrics.connection_closed_by("tls_handshake");
                return None;
            }
        }
    };
    if !is_client_hello(&head[..seen]) {
        shard.metrics.connection_closed_by("plaintext_on_tls");
        tracing::debug!(%peer, "closing a plaintext connection: the listener needs TLS");
        if let Some(header) = frame::peek_header(&head[..seen]) {
            let out = handlers::error_frame(
                header,
                strand_wire::ErrorCode::InvalidRequest,
                "this broker's listener takes TLS only: connect with TLS (strand: --tls-ca FILE or $STRAND_TLS_CA)"
                    .to_string(),
            );
            let (mut reader, mut writer) = futures_lite::io::split(stream);
            let _ = crate::frame_io::write_frame(&mut writer, &out, None).await;
            // Take in what the client sent (a little, briefly) so that
            // closing sends a FIN after the answer rather than a reset
            // that may overtake it.
            let mut sink = vec![0u8; 4 << 10];
            let _ = futures_lite::future::or(
                async {
                    let _ = reader.read(&mut sink).await;
                },
                glommio::timer::sleep(Duration::from_millis(200)),
            )
            .await;
            let _ = writer.close().await;
        }
        return None;
    }
    let left = deadline.saturating_duration_since(Instant::now());
    let accepted = futures_lite::future::or(async { Some(acceptor.accept(stream).await) }, async {
        glommio::timer::sleep(left).await;
        None
    })
    .await;
    match accepted {
        Some(Ok(tls)) => Some(tls),
        Some(Err(e)) => {
            shard.metrics.connection_closed_by("tls_handshake");
            tracing::debug!(%peer, "TLS handshake failed: {e}");
            None
        }
        None => {
            shard.metrics.connection_closed_by("tls_handshake");
            None
        }
    }
}

/// Writes the responses in request order. Those ready at once behind the
/// one awaited (a group commit answers every produce it held together) go
/// out in one send, up to [`COALESCE_BYTES`]: one system call, and one
/// wake-up of the client's reader, instead of one per response.
async fn write_responses(
    mut writer: WriteHalf<Stream>,
    responses: local_channel::LocalReceiver<Pending>,
    failed: Rc<Cell<bool>>,
    peer: String,
    tls: bool,
    watch: Rc<Watch>,
) {
    let mut carried: Option<Pending> = None;
    let mut together: Vec<OutFrame> = Vec::new();
    // The room `together`'s requests hold, given back once written.
    let mut rooms: Vec<Option<Reservation>> = Vec::new();
    let mut gathered: Vec<u8> = Vec::new();
    // Through TLS a response alone is copied too (`frame_io::write_frame`).
    let mut staging: Option<Vec<u8>> = tls.then(Vec::new);
    loop {
        let next = match carried.take() {
            Some(next) => next,
            None => match responses.recv().await {
                Some(next) => next,
                None => return,
            },
        };
        let answered = match next {
            Pending::Task(task) => task.await.unwrap_or(Answered { out: None, _room: None }),
            Pending::Ready(answered) => answered,
        };
        let Answered {
            out: Some(out),
            _room: room,
        } = answered
        else {
            continue;
        };
        if failed.get() {
            continue; // drain the rest so every handler finishes
        }
        // The responses ready right behind it, while they fit.
        let mut size = out.len();
        together.push(out);
        rooms.push(room);
        while size < COALESCE_BYTES {
            let Some(Some(next)) = futures_lite::future::poll_once(responses.recv()).await else {
                break;
            };
            match ready_now(next).await {
                Ok(Answered { out: None, .. }) => {}
                Ok(Answered {
                    out: Some(out),
                    _room: room,
                }) if size + out.len() <= COALESCE_BYTES => {
                    size += out.len();
                    together.push(out);
                    rooms.push(room);
                }
                Ok(answered) => {
                    carried = Some(Pending::Ready(answered));
                    break;
                }
                Err(not_yet) => {
                    carried = Some(not_yet);
                    break;
                }
            }
        }
        // Alone, a response is written as it is (its batches uncopied, but
        // through TLS); several are copied into one buffer, for one send.
        watch.writing_since.set(Some(Instant::now()));
        let result = match together.as_slice() {
            [alone] => crate::frame_io::write_frame(&mut writer, alone, staging.as_mut()).await,
            several => {
                gathered.clear();
                for out in several {
                    out.copy_into(&mut gathered);
                }
                match writer.write_all(&gathered).await {
                    Ok(()) => writer.flush().await,
                    Err(e) => Err(e),
                }
            }
        };
        watch.writing_since.set(None);
        together.clear();
        rooms.clear();
        if let Err(e) = result {
            tracing::debug!(%peer, "write failed: {e}");
            failed.set(true);
            let _ = writer.close().await;
        }
    }
}

/// A pending response if it is ready now, else the pending response back.
async fn ready_now(pending: Pending) -> Result<Answered, Pending> {
    match pending {
        Pending::Ready(answered) => Ok(answered),
        Pending::Task(mut task) => match futures_lite::future::poll_once(&mut task).await {
            Some(answered) => Ok(answered.unwrap_or(Answered { out: None, _room: None })),
            None => Err(Pending::Task(task)),
        },
    }
}

/// Where a connection's reader hands its requests, and what ends it.
struct Ends<'a> {
    to_writer: &'a local_channel::LocalSender<Pending>,
    writer_failed: &'a Cell<bool>,
    peer: &'a str,
    /// The node's authentication settings.
    auth: std::sync::Arc<crate::auth::ServerAuth>,
    /// Its client certificate's subject CN (`--auth mtls`: its principal).
    certified_as: Option<String>,
    /// Where it stands, in the shard's gauge.
    phase: handlers::Phase,
}

async fn read_requests(
    shard: &Rc<Shard>,
    stream: &mut ReadHalf<Stream>,
    mut low_water: LowWater,
    budget: &Budget,
    watch: &Rc<Watch>,
    ends: Ends<'_>,
    tls: bool,
) {
    let Ends {
        to_writer,
        writer_failed,
        peer,
        auth,
        certified_as,
        phase,
    } = ends;
    let limits = FrameLimits {
        max_frame_bytes: shard.config.max_frame_bytes,
    };
    // `buf[..filled]` holds bytes read and not yet decoded; the rest of
    // `buf` is zeroed (or stale) room the next read lands in. Keeping that
    // room between reads zeroes each byte of the buffer once, not once per
    // read (a 1 MiB frame arrives in many reads).
    let mut buf = BytesMut::new();
    let mut filled = 0;
    // The room reserved for the frame at the front of `buf`, taken before
    // its bytes were read (a frame whose header came with the rest has
    // none until it is decoded).
    let mut reserved: Option<Reservation> = None;
    // This connection's fetch chains (pipelined fetches: handlers::fetch)
    // and the producer ids it brought (handlers::produce).
    let principal = auth.certified(certified_as);
    let state = Rc::new(handlers::ConnectionState::new(auth, principal, phase));
    // Until the first frame: a TLS client on this plaintext listener is
    // closed at its hello, not left waiting for a frame that never ends.
    let mut first = !tls;
    loop {
        if first && filled >= 6 {
            first = false;
            if is_client_hello(&buf[..filled]) {
                shard.metrics.connection_closed_by("tls_on_plaintext");
                tracing::info!(%peer, "closing a TLS connection: this listener has no TLS (start it with --tls-cert)");
                return;
            }
        }
        let room = buf.split_off(filled);
        let decoded = frame::decode_mut(&mut buf, limits);
        filled = buf.len();
        // Contiguous again (a decoded frame was split off the front): O(1).
        buf.unsplit(room);
        match decoded {
            Ok(Some(request)) => {
                let size = frame::HEADER_LEN + request.body.len() + request.tail.len();
                let mut held = match reserved.take() {
                    Some(held) => held,
                    None => match watch.waiting_for_room(budget.reserve(size)).await {
                        Some(held) => held,
                        None => return,
                    },
                };
                // And room for a large answer, as long as it is unwritten.
                let room = answer_room(request.header.api, &request.body, shard).min(budget.total.saturating_sub(size));
                if room > 0 {
                    match watch
                        .waiting_for_room(budget.connection.acquire_static_permit(room as u64))
                        .await
                    {
                        Ok(answer) => held._answer = Some(answer),
                        Err(_) => return,
                    }
                }
                watch.frame_since.set(None);
                // Counted from now: shutdown waits for every accepted request.
                shard.in_flight.set(shard.in_flight.get() + 1);
                shard.requests_seen.set(shard.requests_seen.get() + 1);
                watch.in_flight.set(watch.in_flight.get() + 1);
                let (s, state, w) = (shard.clone(), state.clone(), watch.clone());
                let (api, arrived) = (request.header.api, std::time::Instant::now());
                // A span per request at debug level (nothing at info).
                let span = tracing::debug_span!("request", api, correlation_id = request.header.correlation_id);
                let task = glommio::spawn_local(
                    async move {
                        let response = handlers::dispatch(&s, &state, request).await;
                        s.in_flight.set(s.in_flight.get() - 1);
                        s.metrics.request(api, arrived.elapsed());
                        w.answered(Instant::now());
                        // The shard's room goes back now; the connection's
                        // once the answer is written.
                        let mut held = held;
                        held.shard = None;
                        Answered {
                            out: response,
                            _room: Some(held),
                        }
                    }
                    .instrument(span),
                )
                .detach();
                if to_writer.send(Pending::Task(task)).await.is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::info!(%peer, "closing the connection: malformed frame: {e}");
                // Say why, if the frame's fixed fields arrived, then close.
                if let Some(header) = frame::peek_header(&buf[..filled]) {
                    let code = match e {
                        frame::FrameError::TooLarge { .. } => strand_wire::ErrorCode::FrameTooLarge,
                        _ => strand_wire::ErrorCode::MalformedFrame,
                    };
                    let out = handlers::error_frame(header, code, e.to_string());
                    let _ = to_writer.send(Pending::Ready(Answered::now(out))).await;
                }
                return;
            }
        }
        if shard.stopping.get() || writer_failed.get() {
            return;
        }
        // Grow by at most READ_GROW a read: a header claiming a large frame
        // costs memory only as its bytes arrive.
        let needed = frame::needed(&buf[..filled], limits).unwrap_or(READ_CHUNK);
        // The frame's size is known once its fixed fields came: room for
        // it first (the reader waits here while the connection or the
        // shard holds too much), then its bytes.
        if filled >= frame::HEADER_LEN && reserved.is_none() {
            reserved = match watch.waiting_for_room(budget.reserve(needed)).await {
                Some(held) => Some(held),
                None => return,
            };
        }
        // A frame begun must come whole in time (the watch closes it).
        if filled > 0 && watch.frame_since.get().is_none() {
            watch.frame_since.set(Some(Instant::now()));
        }
        let want = needed.saturating_sub(filled).clamp(READ_CHUNK, READ_GROW);
        if buf.len() < filled + want {
            // Too little room: drop the stale room (a reallocation would copy
            // it) and zero a fresh stretch.
            buf.truncate(filled);
            buf.resize(filled + want, 0);
        }
        // The rest of a large frame wakes this reader once it is all there
        // (or a READ_GROW of it), not at every 64 KiB segment that lands.
        if let Err(e) = low_water.set(if needed > filled + READ_CHUNK { want } else { 1 }) {
            tracing::warn!(%peer, "closing the connection: its receive low-water mark cannot be reset: {e}");
            return;
        }
        match stream.read(&mut buf[filled..filled + want]).await {
            Ok(0) => return,
            Ok(n) => {
                filled += n;
                watch.last_activity.set(Instant::now());
            }
            Err(e) => {
                tracing::debug!(%peer, "read failed: {e}");
                return;
            }
        }
    }
}

/// The room requests take: each connection's own bound and, for frames
/// over [`READ_CHUNK`], the shard's.
struct Budget {
    connection: Rc<Semaphore>,
    /// The connection's whole budget (`connection_in_flight_bytes`).
    total: usize,
    shard: Rc<Semaphore>,
}

/// Room held for one request: in the connection's budget until its answer
/// is written, in the shard's until it is answered (its bytes are gone
/// then; a client that does not read its answers pins only its own
/// budget).
struct Reservation {
    _connection: StaticPermit,
    shard: Option<StaticPermit>,
    /// Room for its answer ([`answer_room`]), in the connection's budget.
    _answer: Option<StaticPermit>,
}

impl Budget {
    /// Room for a frame of `size` bytes, waiting for it (`None`: the
    /// semaphores were closed; they never are while the shard runs).
    /// `size` is at most `max_frame_bytes`, which both bounds hold
    /// (`BrokerConfig::validate`, checked by `server::run`).
    async fn reserve(&self, size: usize) -> Option<Reservation> {
        let size = size as u64;
        let connection = self.connection.acquire_static_permit(size).await.ok()?;
        let shard = match size > READ_CHUNK as u64 {
            true => Some(self.shard.acquire_static_permit(size).await.ok()?),
            false => None,
        };
        Some(Reservation {
            _connection: connection,
            shard,
            _answer: None,
        })
    }
}

/// A shard's `request_memory_bytes`, shared by its connections (kept in
/// `Shard::ext`, made on first use).
#[derive(Default)]
pub struct RequestMemory(OnceCell<Rc<Semaphore>>);

impl RequestMemory {
    fn of(shard: &Shard) -> Rc<Semaphore> {
        let memory = shard.ext.get_or_default::<RequestMemory>();
        let semaphore = memory
            .0
            .get_or_init(|| Rc::new(Semaphore::new(shard.config.request_memory_bytes)));
        semaphore.clone()
    }

    /// Bytes of large requests the shard's connections hold now.
    pub fn in_use(shard: &Shard) -> u64 {
        let total = shard.config.request_memory_bytes;
        shard
            .ext
            .get::<RequestMemory>()
            .and_then(|m| m.0.get().map(|s| total.saturating_sub(s.available())))
            .unwrap_or(0)
    }
}

/// The connection timeouts (`None`: off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Timeouts {
    idle: Option<Duration>,
    frame: Option<Duration>,
}

impl Timeouts {
    fn of(config: &crate::config::BrokerConfig) -> Timeouts {
        let ms = |v: u64| (v > 0).then(|| Duration::from_millis(v));
        Timeouts {
            idle: ms(config.connection_idle_timeout_ms),
            frame: ms(config.frame_receive_timeout_ms),
        }
    }
}

/// What the reader and the handlers tell the connection's watchdog.
struct Watch {
    /// When the connection last brought bytes or had its last request
    /// answered.
    last_activity: Cell<Instant>,
    /// When the frame being received began to arrive (its room granted).
    frame_since: Cell<Option<Instant>>,
    /// Requests being served.
    in_flight: Cell<usize>,
    /// The reader waits for room for a frame whose header came (the
    /// client is not idle, and its frame's clock has not started).
    waiting: Cell<bool>,
    /// Since when the writer has been writing answers it has not finished
    /// writing (a client that does not read them stalls it).
    writing_since: Cell<Option<Instant>>,
}

/// What the watchdog does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Close the connection, for this reason (the metric's label).
    Close(&'static str),
    /// Look again after this long.
    Sleep(Duration),
}

/// The longest the watchdog sleeps (with both timeouts off it does not
/// run at all); with a frame timeout it sleeps at most half of that, so a
/// frame begun while it sleeps is timed within half its limit.
const WATCH_MAX_SLEEP: Duration = Duration::from_secs(3600);

impl Watch {
    fn new(now: Instant) -> Watch {
        Watch {
            last_activity: Cell::new(now),
            frame_since: Cell::new(None),
            in_flight: Cell::new(0),
            waiting: Cell::new(false),
            writing_since: Cell::new(None),
        }
    }

    /// Runs `reserve` (the reader waiting for room) as neither idleness nor
    /// a slow frame; the frame's clock starts again once room is granted.
    async fn waiting_for_room<T>(&self, reserve: impl std::future::Future<Output = T>) -> T {
        self.frame_since.set(None);
        self.waiting.set(true);
        let held = reserve.await;
        self.waiting.set(false);
        held
    }

    /// A request was answered.
    fn answered(&self, now: Instant) {
        self.in_flight.set(self.in_flight.get().saturating_sub(1));
        self.last_activity.set(now);
    }

    /// Whether the connection is to be closed at `now`, else when to look
    /// again (pure: the watchdog's rule).
    fn due(&self, now: Instant, t: Timeouts) -> Due {
        let mut sleep = WATCH_MAX_SLEEP;
        if let Some(frame) = t.frame {
            if let Some(since) = self.frame_since.get() {
                let waited = now.saturating_duration_since(since);
                if waited >= frame {
                    return Due::Close("slow_frame");
                }
                sleep = sleep.min(frame - waited);
            }
            // A frame may begin while the watchdog sleeps.
            sleep = sleep.min((frame / 2).max(Duration::from_millis(1)));
        }
        if let Some(idle) = t.idle {
            // Answers the client does not read hold the connection's
            // budget (and so its reader): a whole idle timeout without
            // taking the bytes written to it ends the connection.
            if let Some(since) = self.writing_since.get() {
                let waited = now.saturating_duration_since(since);
                if waited >= idle {
                    return Due::Close("slow_reader");
                }
                sleep = sleep.min(idle - waited);
            }
            let quiet = self.in_flight.get() == 0 && self.frame_since.get().is_none() && !self.waiting.get();
            match quiet {
                true => {
                    let waited = now.saturating_duration_since(self.last_activity.get());
                    if waited >= idle {
                        return Due::Close("idle");
                    }
                    sleep = sleep.min(idle - waited);
                }
                // Busy: idle at the soonest a whole timeout after the
                // answer that ends it.
                false => sleep = sleep.min(idle),
            }
        }
        Due::Sleep(sleep)
    }
}

/// Closes the connection on `fd` when its [`Watch`] says so: a shutdown of
/// both directions, which ends its reader's pending read (nothing is
/// cancelled mid-read) and its writer. Runs until the connection ends
/// (`serve` drops it).
async fn watchdog(shard: Rc<Shard>, watch: Rc<Watch>, fd: std::os::fd::RawFd, t: Timeouts, peer: String) {
    if t.idle.is_none() && t.frame.is_none() {
        return;
    }
    loop {
        match watch.due(Instant::now(), t) {
            Due::Sleep(d) => glommio::timer::sleep(d).await,
            Due::Close(reason) => {
                shard.metrics.connection_closed_by(reason);
                tracing::debug!(%peer, reason, "closing the connection");
                // SAFETY: `fd` is the connection's socket, open while
                // `serve` runs, and this task never outlives `serve`.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                return;
            }
        }
    }
}

/// The socket's receive low-water mark (`SO_RCVLOWAT`): readiness, and so
/// the reader's wake-up, waits until this many bytes have arrived. Raised
/// only to bytes of a frame already on its way (the client sends them
/// whatever else happens; a closed connection wakes the reader regardless),
/// and back to 1 before a frame's header is awaited, so it never waits for
/// bytes that may not come. A 1 MiB produce arrives in 16 loopback segments
/// of 64 KiB: the shard woke for each, and now wakes about twice.
struct LowWater {
    fd: std::os::fd::RawFd,
    current: usize,
    /// A change failed once: the mark stays at 1 from then on.
    disabled: bool,
}

impl LowWater {
    fn new(fd: std::os::fd::RawFd) -> LowWater {
        LowWater {
            fd,
            current: 1,
            disabled: false,
        }
    }

    /// A mark never changed (under TLS).
    fn disabled() -> LowWater {
        LowWater {
            fd: -1,
            current: 1,
            disabled: true,
        }
    }

    /// Sets the mark to `bytes` (a system call only when it changes). If
    /// that fails, the mark goes back to 1 for good — one left above what
    /// is still coming would keep the reader waiting — and only if even
    /// that fails is the error returned (the connection must close).
    fn set(&mut self, bytes: usize) -> std::io::Result<()> {
        if self.disabled || bytes == self.current {
            return Ok(());
        }
        if self.apply(bytes).is_ok() {
            self.current = bytes;
            return Ok(());
        }
        self.disabled = true;
        if self.current != 1 {
            self.apply(1)?;
            self.current = 1;
        }
        Ok(())
    }

    fn apply(&self, bytes: usize) -> std::io::Result<()> {
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: `fd` is this connection's socket, open while `serve` runs
        // (the stream owns it); the option value is a c_int on the stack.
        let rc = unsafe {
            libc::setsockopt(
                self.fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::addr_of!(value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod watch_tests {
    use std::time::{Duration, Instant};

    use super::{Due, Timeouts, Watch};

    const T: Timeouts = Timeouts {
        idle: Some(Duration::from_secs(10)),
        frame: Some(Duration::from_secs(4)),
    };

    #[test]
    fn a_quiet_connection_closes_once_idle_and_a_busy_one_does_not() {
        let start = Instant::now();
        let w = Watch::new(start);
        assert_eq!(w.due(start, T), Due::Sleep(Duration::from_secs(2)));
        assert_eq!(
            w.due(start + Duration::from_secs(9), T),
            Due::Sleep(Duration::from_secs(1))
        );
        assert_eq!(w.due(start + Duration::from_secs(10), T), Due::Close("idle"));
        // A request being served (a long poll) keeps it open however long,
        // and the watchdog does not spin meanwhile.
        w.in_flight.set(1);
        assert_eq!(
            w.due(start + Duration::from_secs(60), T),
            Due::Sleep(Duration::from_secs(2))
        );
        let no_frame = Timeouts { frame: None, ..T };
        assert_eq!(
            w.due(start + Duration::from_secs(60), no_frame),
            Due::Sleep(Duration::from_secs(10))
        );
        // Answered: the idle time counts from the answer.
        w.answered(start + Duration::from_secs(60));
        assert!(matches!(w.due(start + Duration::from_secs(65), T), Due::Sleep(_)));
        assert_eq!(w.due(start + Duration::from_secs(70), T), Due::Close("idle"));
    }

    #[test]
    fn a_frame_begun_must_be_whole_in_time_whatever_else_goes_on() {
        let start = Instant::now();
        let w = Watch::new(start);
        w.in_flight.set(3);
        w.frame_since.set(Some(start + Duration::from_secs(1)));
        assert_eq!(
            w.due(start + Duration::from_secs(4), T),
            Due::Sleep(Duration::from_secs(1))
        );
        assert_eq!(w.due(start + Duration::from_secs(5), T), Due::Close("slow_frame"));
        // Waiting for a frame's bytes is not idleness.
        w.in_flight.set(0);
        let w2 = Watch::new(start);
        w2.frame_since.set(Some(start + Duration::from_secs(20)));
        assert!(matches!(w2.due(start + Duration::from_secs(21), T), Due::Sleep(_)));
        // Nor is waiting for room to read a frame into, however long.
        let w3 = Watch::new(start);
        w3.waiting.set(true);
        assert!(matches!(w3.due(start + Duration::from_secs(600), T), Due::Sleep(_)));
    }

    #[test]
    fn a_client_that_does_not_take_its_answers_is_closed_after_the_idle_timeout() {
        let start = Instant::now();
        let w = Watch::new(start);
        // Waiting for room (its answers hold the budget) while the writer
        // is stuck: not idle, but a slow reader.
        w.waiting.set(true);
        w.writing_since.set(Some(start + Duration::from_secs(1)));
        assert_eq!(
            w.due(start + Duration::from_secs(9), T),
            Due::Sleep(Duration::from_secs(2))
        );
        assert_eq!(w.due(start + Duration::from_secs(11), T), Due::Close("slow_reader"));
        // A write that completes starts nothing.
        w.writing_since.set(None);
        assert!(matches!(w.due(start + Duration::from_secs(60), T), Due::Sleep(_)));
    }

    #[test]
    fn with_no_timeouts_nothing_closes() {
        let start = Instant::now();
        let w = Watch::new(start);
        w.frame_since.set(Some(start));
        let off = Timeouts {
            idle: None,
            frame: None,
        };
        assert!(matches!(w.due(start + Duration::from_secs(86_400), off), Due::Sleep(_)));
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::LowWater;

    /// The mark the kernel holds for `fd`.
    fn mark(fd: std::os::fd::RawFd) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: reads one c_int option of an open socket into `value`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::addr_of_mut!(value).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        value
    }

    #[test]
    fn the_mark_follows_the_reader_on_a_socket() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut low = LowWater::new(stream.as_raw_fd());
        low.set(256 << 10).unwrap();
        assert_eq!(mark(stream.as_raw_fd()), 256 << 10);
        low.set(1).unwrap();
        assert_eq!(mark(stream.as_raw_fd()), 1);
    }

    #[test]
    fn a_mark_that_cannot_be_set_stays_at_one_or_fails_the_connection() {
        // Not a socket: every setsockopt fails.
        let file = tempfile::tempfile().unwrap();
        let mut low = LowWater::new(file.as_raw_fd());
        // Still at the kernel's 1: nothing to put back, so no error.
        low.set(64 << 10).unwrap();
        assert!(low.disabled && low.current == 1);
        low.set(128 << 10).unwrap();
        // Raised before, and now neither the change nor the reset to 1
        // can be made: the caller must close the connection.
        let mut raised = LowWater {
            fd: file.as_raw_fd(),
            current: 64 << 10,
            disabled: false,
        };
        assert!(raised.set(1).is_err());
    }
}
