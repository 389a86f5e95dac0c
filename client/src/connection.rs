//! One broker connection with its own reader thread.
//!
//! Runs on: the caller's threads (writes, under a mutex) and one reader
//! thread per connection, which matches each response to its request by
//! correlation id and completes that request's future. Requests are
//! pipelined: many may be in flight on one connection.
//!
//! # Why std sockets and not io_uring
//! An io_uring core was built and measured against this one (ninth
//! session, 2026-12-02; the patch is
//! `bench/results/experiments/2026-12-02-client-io-uring.patch`): each
//! writer under its mutex with a small ring submitting one `WRITEV` and
//! waiting for it, the reader thread receiving with `RECV` on a ring of
//! its own (a 1 s wait timeout for overdue requests, the socket a
//! registered file, busy poll spinning on the completion queue). Same
//! broker, the two cores alternating: `strand-bench client --seconds 5
//! --mib 256`, six runs each, medians std / io_uring: small records p50
//! 315 / 231 µs and p99 7.5 / 4.8 ms (open loop; the runs spread 169–1182
//! and 168–322 µs), producer 770 / 754 MiB/s, `producer_vs_raw` 0.95 /
//! 1.02, machine CPU per GiB 2.13 / 2.21 (producer) and 1.68 / 1.68 (raw
//! protocol); closed loop (`strand-bench produce --message-bytes 100
//! --in-flight 1 --seconds 4|5`), eight runs each: p50 151 / 148 µs,
//! 5,930 / 6,240 records/s. Within this VM's noise on every figure: one
//! `io_uring_enter` per receive or write costs what one `recv` or
//! `writev` costs, and the work a ring could save (batching many
//! operations into one call) does not arise on a connection whose writes
//! come from the callers' threads. So the simpler core stays: no ring per
//! connection, no `unsafe` buffer lifetimes across the kernel, and a
//! client that runs where io_uring is blocked (container seccomp
//! profiles). Worth measuring again if the client grows an I/O thread
//! that owns many connections (one ring, many sockets per
//! `io_uring_enter`).

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_channel::oneshot;
use strand_net::frame::{self, FrameLimits};
use strand_net::message::TailBuilder;
use strand_net::{Frame, OutFrame};
use strand_wire::Api;

use crate::error::ClientError;

type Pending = Arc<Mutex<PendingState>>;

/// A request unanswered past its deadline fails its connection (and so
/// every request on it, which producers then retry on a new one): a broker
/// that does not answer one request in time (paused, cut off, overloaded)
/// answers none. The deadline is the request's own timeout (a produce's
/// `timeout_ms`, a fetch's `max_wait_ms`) plus [`RESPONSE_GRACE`]
/// ([`Connection::request_within`]); this for requests that carry none.
/// Above the broker's longest long poll (30 s) and its produce timeout (30 s).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// What a request's deadline adds to the timeout the request gives the
/// broker: the broker's answer at its timeout must still arrive.
pub const RESPONSE_GRACE: Duration = Duration::from_secs(5);
/// The largest response frame accepted: a corrupt length fails the
/// connection instead of growing its buffer to 4 GiB. (Brokers cap fetch
/// responses at their frame limit, 16 MiB by default.)
pub const MAX_RESPONSE_BYTES: u32 = 256 << 20;
/// How long connecting to a broker may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the reader looks for overdue requests while the socket is quiet.
const OVERDUE_CHECK: Duration = Duration::from_secs(1);
/// How long a login (`crate::sasl`) may take at most after connecting.
const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Most local ports tried for a shard-placed connection before settling
/// for any port (about one in `shards` places it; the rest are skipped
/// without a system call).
const PLACED_PORT_TRIES: u32 = 4096;

/// Connects to `sock` from a local port for which
/// [`strand_wire::shard_for_port`] gives `shard`: the broker hands each
/// connection to the shard its client port picks, so requests for that
/// shard's partitions never cross between cores. Ports come from the
/// system's ephemeral range, starting at a random one; a port in use is
/// skipped. If none is free (or a NAT rewrites the port) the connection is
/// an ordinary one, served by whichever shard — slower, never wrong.
pub fn connect_to_shard(sock: SocketAddr, shard: u16, shards: u16) -> std::io::Result<TcpStream> {
    connect_to_shard_within(sock, shard, shards, CONNECT_TIMEOUT)
}

/// [`connect_to_shard`], each connect attempt bounded by `timeout`.
pub fn connect_to_shard_within(
    sock: SocketAddr,
    shard: u16,
    shards: u16,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (low, high) = ephemeral_ports();
    let span = u32::from(high.saturating_sub(low)) + 1;
    let start = (crate::random_u64() % u64::from(span)) as u32;
    for i in 0..span.min(PLACED_PORT_TRIES) {
        let port = low + ((start + i) % span) as u16;
        if strand_wire::shard_for_port(port, shards) != shard {
            continue;
        }
        let socket = Socket::new(Domain::for_address(sock), Type::STREAM, Some(Protocol::TCP))?;
        let local = match sock {
            SocketAddr::V4(_) => SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port)),
            SocketAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)),
        };
        if socket.bind(&local.into()).is_err() {
            continue; // in use
        }
        match socket.connect_timeout(&sock.into(), timeout) {
            Ok(()) => return Ok(socket.into()),
            // This 4-tuple is taken (a closing connection): the next port.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                ) => {}
            Err(e) => return Err(e),
        }
    }
    TcpStream::connect_timeout(&sock, timeout)
}

/// The system's ephemeral port range (Linux's default if unreadable).
fn ephemeral_ports() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            match (it.next()?, it.next()?) {
                (Ok(low), Ok(high)) if low > 0 && low <= high => Some((low, high)),
                _ => None,
            }
        })
        .unwrap_or((32_768, 60_999))
}

/// What to do with a response (or the failure that replaces it); runs on
/// the connection's reader thread, so it must be quick.
pub type OnResponse = Box<dyn FnOnce(Result<Frame, ClientError>) + Send>;

#[derive(Default)]
struct PendingState {
    /// Requests awaiting a response: by when it is due, and its handler.
    waiting: HashMap<u32, (Instant, OnResponse)>,
    /// Set when the reader stops: every later request fails at once.
    closed: Option<ClientError>,
}

/// A connection to one broker. Cheap to clone; closes when the last clone
/// goes (the reader thread then ends).
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

/// A connection's TLS session (`crate::tls`), shared by its writers and
/// its reader thread; each holds it only to encrypt or decrypt.
type Session = Arc<Mutex<rustls::ClientConnection>>;

struct Inner {
    addr: String,
    /// The socket, the next correlation id, and (with TLS) the buffer a
    /// frame is encrypted into, kept between frames.
    writer: Mutex<(TcpStream, u32, Vec<u8>)>,
    /// With TLS: the session every write is encrypted through.
    tls: Option<Session>,
    /// A second handle on the socket, to shut it down while a writer holds
    /// `writer` (blocked on a broker that reads nothing).
    shutter: TcpStream,
    pending: Pending,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            let _ = w.0.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`).
    pub fn connect(addr: &str) -> Result<Connection, ClientError> {
        Self::connect_with(addr, Duration::ZERO)
    }

    /// Connects; while requests are unanswered, the reader thread polls the
    /// socket for up to `busy_poll` before it sleeps in `read` — trading a
    /// core's time for not waiting on a thread wake-up (tens of µs on
    /// virtual machines) per response.
    pub fn connect_with(addr: &str, busy_poll: Duration) -> Result<Connection, ClientError> {
        Self::connect_placed(addr, busy_poll, None)
    }

    /// Connects as [`Connection::connect_with`]; with `Some((shard,
    /// shards))`, from a local port that has the broker serve the
    /// connection on that shard (see [`connect_to_shard`]).
    pub fn connect_placed(
        addr: &str,
        busy_poll: Duration,
        placement: Option<(u16, u16)>,
    ) -> Result<Connection, ClientError> {
        Self::connect_placed_within(addr, busy_poll, placement, CONNECT_TIMEOUT)
    }

    /// [`Connection::connect_placed`], giving up on the connect after
    /// `connect_timeout` (a host that is down or cut off drops the
    /// handshake; a paused broker's kernel still completes it).
    pub fn connect_placed_within(
        addr: &str,
        busy_poll: Duration,
        placement: Option<(u16, u16)>,
        connect_timeout: Duration,
    ) -> Result<Connection, ClientError> {
        let io = |e: std::io::Error| ClientError::Io {
            addr: addr.to_string(),
            message: e.to_string(),
        };
        let sock: SocketAddr = addr
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| ClientError::Invalid(format!("{addr} resolves to no address")))?;
        let stream = match placement {
            Some((shard, shards)) if shards > 1 => connect_to_shard_within(sock, shard, shards, connect_timeout),
            _ => TcpStream::connect_timeout(&sock, connect_timeout),
        }
        .map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let tls = match crate::tls::default_config() {
            Some(config) => Some(handshake(addr, &stream, config, connect_timeout)?),
            None => None,
        };
        stream.set_read_timeout(Some(OVERDUE_CHECK)).map_err(io)?;
        let reader = stream.try_clone().map_err(io)?;
        let shutter = stream.try_clone().map_err(io)?;
        let pending: Pending = Arc::default();
        let p = pending.clone();
        let name = addr.to_string();
        let session = tls.clone();
        std::thread::Builder::new()
            .name(format!("strand-client {addr}"))
            .spawn(move || read_loop(reader, p, name, busy_poll, session))
            .map_err(io)?;
        let conn = Connection {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                writer: Mutex::new((stream, 1, Vec::new())),
                tls,
                shutter,
                pending,
            }),
        };
        // Logged in before anything else is sent (`crate::sasl`).
        if let Some(credentials) = crate::sasl::default_credentials() {
            let due = connect_timeout.max(LOGIN_TIMEOUT);
            let login = crate::sasl::exchange(&credentials, async |api: Api, body: Vec<u8>| {
                conn.request_within(api, &body, TailBuilder::default(), due).await
            });
            if let Err(e) = crate::block_on(login) {
                conn.abandon("the login failed");
                return Err(e);
            }
        }
        Ok(conn)
    }

    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Tells connections apart (one broker may have one per shard); the
    /// same for every clone.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// This end's address (its port says which shard serves it).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.writer.lock().ok()?.0.local_addr().ok()
    }

    /// Fails the connection now, and with it every request waiting on it
    /// (their handlers get an I/O error saying `why`): a client that learnt
    /// the broker is paused or no longer leads stops waiting for it. Later
    /// requests fail at once; the next use opens a new connection.
    pub fn abandon(&self, why: &str) {
        let err = ClientError::Io {
            addr: self.inner.addr.clone(),
            message: why.to_string(),
        };
        let waiting: Vec<OnResponse> = match self.inner.pending.lock() {
            Ok(mut p) => {
                p.closed.get_or_insert(err.clone());
                p.waiting.drain().map(|(_, (_, w))| w).collect()
            }
            Err(_) => Vec::new(),
        };
        let _ = self.inner.shutter.shutdown(std::net::Shutdown::Both);
        for w in waiting {
            w(Err(err.clone()));
        }
    }

    /// Whether the connection has ended (its reader stopped).
    pub fn is_closed(&self) -> bool {
        self.inner.pending.lock().map_or(true, |p| p.closed.is_some())
    }

    /// Sends a request (a finished flatbuffer body and its tail) and returns
    /// the future of its response frame; due within [`RESPONSE_TIMEOUT`].
    pub fn request(
        &self,
        api: Api,
        body: &[u8],
        tail: TailBuilder,
    ) -> impl std::future::Future<Output = Result<Frame, ClientError>> + Send + 'static {
        self.request_within(api, body, tail, RESPONSE_TIMEOUT)
    }

    /// [`Connection::request`] for a request due within `due` (its own
    /// timeout plus [`RESPONSE_GRACE`]).
    pub fn request_within(
        &self,
        api: Api,
        body: &[u8],
        tail: TailBuilder,
        due: Duration,
    ) -> impl std::future::Future<Output = Result<Frame, ClientError>> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let sent = self.send_within(
            api,
            body,
            tail,
            Some(Box::new(move |r| {
                let _ = tx.send(r);
            })),
            due,
        );
        async move {
            sent?;
            rx.await.unwrap_or_else(|_| {
                Err(ClientError::Protocol(
                    "the connection closed before the response".into(),
                ))
            })
        }
    }

    /// Sends a request; `on_response` runs on the reader thread with its
    /// response, or with the error that ended the connection. `None`: no
    /// response is expected (a produce with acks=0), and `Ok` means written.
    /// Due within [`RESPONSE_TIMEOUT`].
    pub fn send(
        &self,
        api: Api,
        body: &[u8],
        tail: TailBuilder,
        on_response: Option<OnResponse>,
    ) -> Result<(), ClientError> {
        self.send_within(api, body, tail, on_response, RESPONSE_TIMEOUT)
    }

    /// [`Connection::send`] for a request due within `due`: unanswered by
    /// then, it fails the connection.
    pub fn send_within(
        &self,
        api: Api,
        body: &[u8],
        tail: TailBuilder,
        on_response: Option<OnResponse>,
        due: Duration,
    ) -> Result<(), ClientError> {
        let mut w = self
            .inner
            .writer
            .lock()
            .map_err(|_| ClientError::Protocol("connection lock poisoned".into()))?;
        let id = w.1;
        w.1 = w.1.wrapping_add(1);
        let mut expects_response = false;
        {
            let mut p = self
                .inner
                .pending
                .lock()
                .map_err(|_| ClientError::Protocol("connection lock poisoned".into()))?;
            if let Some(e) = &p.closed {
                return Err(e.clone());
            }
            if let Some(f) = on_response {
                expects_response = true;
                p.waiting.insert(id, (Instant::now() + due, f));
            }
        }
        let out = OutFrame::request(api, id, body, tail);
        let (stream, _, sealed) = &mut *w;
        let written = match &self.inner.tls {
            None => write_frame(stream, &out),
            Some(tls) => write_frame_tls(stream, tls, sealed, &out),
        };
        if let Err(e) = written {
            let err = ClientError::Io {
                addr: self.inner.addr.clone(),
                message: e.to_string(),
            };
            let still_waiting = match self.inner.pending.lock() {
                Ok(mut p) => p.waiting.remove(&id).is_some(),
                Err(_) => true,
            };
            // If the reader already failed the request, it has been told.
            if still_waiting || !expects_response {
                return Err(err);
            }
        }
        Ok(())
    }
}

/// Writes a frame's head and tail pieces with as few `writev` calls as the
/// socket takes (usually one), copying nothing.
fn write_frame<W: Write>(stream: &mut W, out: &OutFrame) -> std::io::Result<()> {
    let mut slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&out.head)
        .chain(out.tail.iter())
        .filter(|b| !b.is_empty())
        .map(|b| std::io::IoSlice::new(b))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match stream.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// TLS's handshake with the broker at `addr` over `stream`, within
/// `timeout`: the session, or a [`ClientError::Tls`] that says what was
/// wrong (the broker's certificate, most often).
fn handshake(
    addr: &str,
    stream: &TcpStream,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<Session, ClientError> {
    let tls_error = |message: String| ClientError::Tls {
        addr: addr.to_string(),
        message,
    };
    let name = crate::tls::server_name(addr).map_err(tls_error)?;
    let mut session = rustls::ClientConnection::new(config, name).map_err(|e| tls_error(e.to_string()))?;
    let io = |e: std::io::Error| ClientError::Io {
        addr: addr.to_string(),
        message: e.to_string(),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    // A connection closed or silent during the handshake is an I/O
    // failure, retried like any other (a stopping broker, one over its
    // connection limits, a paused one), with what it may also mean; what
    // rustls refuses (a certificate, an alert) is a TLS error, not retried.
    let closed = || ClientError::Io {
        addr: addr.to_string(),
        message: "the broker closed the connection during the TLS handshake (is it stopping or over a \
                  connection limit? does it listen with TLS? does it require a client certificate: \
                  --tls-cert/--tls-key?)"
            .into(),
    };
    let mut sock = stream;
    while session.is_handshaking() {
        match session.complete_io(&mut sock) {
            Ok((0, 0)) if session.is_handshaking() => return Err(closed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(ClientError::Io {
                    addr: addr.to_string(),
                    message: format!("no TLS handshake within {timeout:?} (paused? listening without TLS?)"),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let certificate = e
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|tls| matches!(tls, rustls::Error::InvalidCertificate(_)));
                let hint = match certificate {
                    true => {
                        " (is the CA given the one that signed the broker's certificate, and does the \
                             certificate name the host or IP address connected to?)"
                    }
                    false => "",
                };
                return Err(tls_error(format!("handshake failed: {e}{hint}")));
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(closed()),
            Err(e) => return Err(io(e)),
        }
    }
    stream.set_write_timeout(None).map_err(io)?;
    // Frames of any size are encrypted whole into the writer's buffer and
    // written at once (`write_frame_tls`): no limit on what rustls holds.
    session.set_buffer_limit(None);
    Ok(Arc::new(Mutex::new(session)))
}

/// [`write_frame`] through TLS: encrypted under the session's lock into
/// `sealed` (the connection's, reused), then written with the lock
/// released (the reader thread needs it to decrypt what arrives
/// meanwhile; a writer blocked on a full socket while holding it could
/// stall both ends). The caller's writer lock keeps records in order.
/// The head and tail pieces go to rustls as one vectored write, so they
/// fill whole records (16 KiB each) rather than one record per piece.
fn write_frame_tls(stream: &mut TcpStream, tls: &Session, sealed: &mut Vec<u8>, out: &OutFrame) -> std::io::Result<()> {
    /// What each TLS 1.3 record adds: header, content type and tag.
    const RECORD_OVERHEAD: usize = 22;
    /// A buffer grown past this by a large frame is let go afterwards.
    const KEEP: usize = 4 << 20;
    sealed.clear();
    sealed.reserve(out.len() + (out.len() / (16 << 10) + 1) * RECORD_OVERHEAD);
    {
        let mut session = tls
            .lock()
            .map_err(|_| std::io::Error::other("the TLS session's lock is poisoned"))?;
        write_frame(&mut session.writer(), out)?;
        while session.wants_write() {
            session.write_tls(sealed)?;
        }
    }
    let written = stream.write_all(sealed);
    if sealed.capacity() > KEEP {
        *sealed = Vec::new();
    }
    written
}

/// Bytes a read asks the socket for at least.
const READ_CHUNK: usize = 64 << 10;
/// Most the buffer grows by for one read (a response larger than this
/// arrives over several reads and one reallocation each).
const READ_GROW: usize = 16 << 20;

/// Receives into `buf`'s spare capacity (the bytes land where the frame will
/// be decoded from: no second copy); `None` when nothing was read and there
/// is nothing to report (interrupted, or nothing there with
/// `MSG_DONTWAIT`). A blocking receive's timeout is `WouldBlock`.
fn recv_into(stream: &TcpStream, buf: &mut BytesMut, flags: libc::c_int) -> Option<std::io::Result<usize>> {
    use std::os::fd::AsRawFd;
    let room = buf.spare_capacity_mut();
    // SAFETY: recv writes at most `room.len()` bytes into memory `buf` owns
    // and has reserved; only the `n` bytes it reports written are then
    // counted as initialised by `set_len`.
    let n = unsafe { libc::recv(stream.as_raw_fd(), room.as_mut_ptr().cast(), room.len(), flags) };
    if n >= 0 {
        // SAFETY: the first `n` bytes of the spare capacity were written above.
        unsafe { buf.set_len(buf.len() + n as usize) };
        return Some(Ok(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock if flags & libc::MSG_DONTWAIT != 0 => None,
        std::io::ErrorKind::Interrupted => None,
        _ => Some(Err(e)),
    }
}

/// Why the reader stops: the connection failed, or TLS refused it (an
/// alert from the broker, a bad record: a [`ClientError::Tls`], not
/// retried).
enum Stop {
    Io(String),
    Tls(String),
}

/// Decrypts `sealed` (TLS records as they came) through the session and
/// appends the plaintext to `buf`, straight from rustls's buffer.
fn open_sealed(tls: &Session, sealed: &[u8], buf: &mut BytesMut) -> Result<(), Stop> {
    use std::io::BufRead;
    let mut session = tls
        .lock()
        .map_err(|_| Stop::Io("the TLS session's lock is poisoned".into()))?;
    let mut rest = sealed;
    while !rest.is_empty() {
        match session.read_tls(&mut rest) {
            // Nothing taken from bytes that are there: the session ended.
            Ok(0) => return Err(Stop::Io("the broker closed the TLS session".into())),
            Ok(_) => {}
            Err(e) => return Err(Stop::Io(format!("TLS: {e}"))),
        }
        session.process_new_packets().map_err(|e| Stop::Tls(e.to_string()))?;
        let mut reader = session.reader();
        loop {
            match reader.fill_buf() {
                Ok([]) => return Err(Stop::Io("the broker closed the TLS session".into())),
                Ok(plain) => {
                    let n = plain.len();
                    buf.extend_from_slice(plain);
                    reader.consume(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(Stop::Io(format!("TLS: {e}"))),
            }
        }
    }
    Ok(())
}

/// Why the connection fails, if a request is past its deadline.
fn overdue(pending: &Pending) -> Option<String> {
    let now = Instant::now();
    let p = pending.lock().ok()?;
    let late = p.waiting.values().filter(|(due, _)| *due < now).count();
    (late > 0)
        .then(|| format!("{late} request(s) unanswered past their deadline (the broker may be paused or cut off)"))
}

fn read_loop(stream: TcpStream, pending: Pending, addr: String, busy_poll: Duration, tls: Option<Session>) {
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // With TLS, what the socket gives lands here first.
    let mut sealed = BytesMut::with_capacity(if tls.is_some() { READ_CHUNK } else { 0 });
    // Whether TLS itself ended the connection (an alert, a bad record):
    // a [`ClientError::Tls`], not retried.
    let mut tls_refused = false;
    let limits = FrameLimits {
        max_frame_bytes: MAX_RESPONSE_BYTES,
    };
    let mut next_overdue_check = Instant::now() + OVERDUE_CHECK;
    let failure = loop {
        match frame::decode(&mut buf, limits) {
            Ok(Some(f)) => {
                let waiter = pending
                    .lock()
                    .ok()
                    .and_then(|mut p| p.waiting.remove(&f.header.correlation_id));
                if let Some((_, w)) = waiter {
                    w(Ok(f));
                }
                continue;
            }
            Ok(None) => {}
            // An HTTP server's answer read as a frame length is a frame of
            // a gigabyte or so: say what it is instead.
            Err(_) if buf.starts_with(b"HTTP/") => {
                break "it answered with HTTP: is it the metrics port? A broker's client address is the one its \
                       ready line names (`strand ready on HOST:PORT`; 127.0.0.1:9400 by default)"
                    .to_string()
            }
            Err(e) => break format!("malformed frame from the broker: {e}"),
        }
        // Every answer received is handed out first; then, also while
        // other answers keep arriving, a request stuck behind a broker that
        // answers the rest fails the connection.
        if Instant::now() >= next_overdue_check {
            if let Some(late) = overdue(&pending) {
                break late;
            }
            next_overdue_check = Instant::now() + OVERDUE_CHECK;
        }
        // Room for the rest of the frame under way, so that a large
        // response is read in few calls into one allocation and handed out
        // from there.
        let needed = frame::needed(&buf, limits).unwrap_or(READ_CHUNK);
        buf.reserve(needed.saturating_sub(buf.len()).clamp(READ_CHUNK, READ_GROW));
        // Busy-poll while a response is due, then sleep in recv.
        let mut got = None;
        let into = match tls {
            Some(_) => {
                // The frame's rest is on its way sealed (a little more,
                // with the records' overhead): as few reads as plaintext.
                sealed.clear();
                sealed.reserve(needed.saturating_sub(buf.len()).clamp(READ_CHUNK, READ_GROW));
                &mut sealed
            }
            None => &mut buf,
        };
        if !busy_poll.is_zero() && pending.lock().is_ok_and(|p| !p.waiting.is_empty()) {
            let until = Instant::now() + busy_poll;
            while got.is_none() && Instant::now() < until {
                got = recv_into(&stream, into, libc::MSG_DONTWAIT);
                if got.is_none() {
                    std::hint::spin_loop();
                }
            }
        }
        match got.or_else(|| recv_into(&stream, into, 0)) {
            Some(Ok(0)) => break "the broker closed the connection".to_string(),
            Some(Ok(_)) => {
                if let Some(tls) = &tls {
                    match open_sealed(tls, &sealed, &mut buf) {
                        Ok(()) => {}
                        Err(Stop::Io(e)) => break e,
                        Err(Stop::Tls(e)) => {
                            tls_refused = true;
                            break format!("TLS: {e}");
                        }
                    }
                }
            }
            // Quiet for `OVERDUE_CHECK`: the check above runs next.
            Some(Err(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Some(Err(e)) => break e.to_string(),
            None => {}
        }
    };
    // Writers fail from now on too.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let err = match tls_refused {
        true => ClientError::Tls { addr, message: failure },
        false => ClientError::Io { addr, message: failure },
    };
    let waiting: Vec<OnResponse> = match pending.lock() {
        Ok(mut p) => {
            // (Abandoned: the reason given then stands.)
            p.closed.get_or_insert(err.clone());
            p.waiting.drain().map(|(_, (_, w))| w).collect()
        }
        Err(_) => Vec::new(),
    };
    // Outside the lock: a callback may send on a new connection.
    for w in waiting {
        w(Err(err.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's own deadline fails the connection when the broker keeps
    /// quiet (paused, cut off), long before [`RESPONSE_TIMEOUT`]; a request
    /// sent with the default deadline on the same connection fails with it.
    #[test]
    fn a_request_unanswered_past_its_deadline_fails_the_connection() {
        let (addr, silent) = silent_server();
        let conn = Connection::connect(&addr).unwrap();
        let patient = conn.request(Api::Metadata, b"", TailBuilder::default());
        let started = Instant::now();
        let hasty = conn.request_within(Api::Metadata, b"", TailBuilder::default(), Duration::from_millis(200));
        let err = crate::block_on(hasty).unwrap_err();
        assert!(err.is_io(), "{err}");
        assert!(err.to_string().contains("past their deadline"), "{err}");
        assert!(started.elapsed() < RESPONSE_TIMEOUT / 2, "{:?}", started.elapsed());
        assert!(crate::block_on(patient).unwrap_err().is_io());
        assert!(conn.is_closed());
        drop(conn);
        silent.join().unwrap();
    }

    /// A server that accepts one connection and reads, never answering;
    /// it ends when the client closes.
    fn silent_server() -> (String, std::thread::JoinHandle<()>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let silent = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut sink);
        });
        (addr, silent)
    }

    /// A connection abandoned (its broker paused, or no longer the
    /// leader) fails what waits on it at once, with the reason given, and
    /// takes nothing more.
    #[test]
    fn an_abandoned_connection_fails_its_requests_at_once() {
        let (addr, silent) = silent_server();
        let conn = Connection::connect(&addr).unwrap();
        let waiting = conn.request(Api::Metadata, b"", TailBuilder::default());
        let started = Instant::now();
        conn.abandon("the leader moved");
        let err = crate::block_on(waiting).unwrap_err();
        assert!(err.is_io() && err.to_string().contains("the leader moved"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        let later = crate::block_on(conn.request(Api::Metadata, b"", TailBuilder::default())).unwrap_err();
        assert!(later.to_string().contains("the leader moved"), "{later}");
        assert!(conn.is_closed());
        drop(conn);
        silent.join().unwrap();
    }
}
