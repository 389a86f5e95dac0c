//! One pipelined connection to one peer, every call bounded by a deadline.
//!
//! Runs on: the shard that made the link (it is `!Send`); calls may be
//! made from any number of that shard's tasks at once.
//!
//! - **Connection.** Opened on the first call, and again by the first
//!   call after it failed or was closed. A call that finds none connects
//!   within its own deadline.
//! - **Pipelining.** Each call gets the next correlation id, writes its
//!   frame whole under the link's write lock (frames never interleave), and
//!   waits for the response with that id; a reader task on the same
//!   executor takes responses in any order and hands each to its waiter.
//! - **Deadlines.** The deadline covers the wait for the write lock,
//!   connecting, writing and the response. A peer that is paused (SIGSTOP),
//!   overloaded or cut off makes calls fail with [`PeerError::Timeout`]; no
//!   call outlives its deadline. A write cut short leaves part of a frame on
//!   the stream, so the connection is then closed (its other waiters fail
//!   at once with [`PeerError::Unreachable`]) — also when the call itself is
//!   dropped mid-write; a response that comes after its call gave up is
//!   dropped, and the connection stays.
//! - **Failure.** A connection that fails (refused, reset, closed by the
//!   peer, a malformed frame) fails every call waiting on it.
//!
//! The link does not retry: what is safe to repeat is the caller's to know.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_channel::oneshot;
use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::AsyncReadExt;
use glommio::net::TcpStream;

use crate::frame_io::Stream;
use strand_net::frame::{self, Frame, FrameLimits};
use strand_net::message::TailBuilder;
use strand_net::OutFrame;
use strand_wire::Api;

/// Why a call to a peer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// No answer within the call's deadline (the peer may be paused,
    /// overloaded or cut off; the request may or may not have been served).
    #[error("peer {addr}: no answer within {after:?}")]
    Timeout { addr: SocketAddr, after: Duration },
    /// The connection could not be made or broke.
    #[error("peer {addr}: {message}")]
    Unreachable { addr: SocketAddr, message: String },
}

/// Waiters by correlation id.
type Waiting = RefCell<HashMap<u32, oneshot::Sender<Result<Frame, PeerError>>>>;

/// A connection to a peer (cheap to clone: clones share it).
#[derive(Clone)]
pub struct PeerLink {
    inner: Rc<Inner>,
}

struct Inner {
    addr: SocketAddr,
    limits: FrameLimits,
    /// With TLS: the session each connection opens over its socket,
    /// verified for the peer's IP address. With a login: each connection
    /// logs in as the inter-broker user before its first call.
    security: crate::frame_io::PeerSecurity,
    /// One writer at a time (and one connect).
    write_lock: glommio::sync::Semaphore,
    conn: RefCell<Option<Rc<Conn>>>,
    next_id: Cell<u32>,
}

/// One TCP connection and its reader task.
struct Conn {
    /// Taken out while a call writes (under the write lock).
    writer: RefCell<Option<WriteHalf<Stream>>>,
    /// Through TLS: where a frame is gathered to be written at once
    /// (`frame_io::write_frame`); taken out with the writer.
    staging: RefCell<Option<Vec<u8>>>,
    waiting: Rc<Waiting>,
    /// Cleared by the reader when the connection fails.
    alive: Rc<Cell<bool>>,
    /// Dropping it (with the connection) cancels the reader.
    _reader: glommio::Task<()>,
}

impl Conn {
    /// Fails every waiting call; the connection is done for.
    fn fail_all(&self, addr: SocketAddr, message: &str) {
        self.alive.set(false);
        fail_waiters(&self.waiting, addr, message);
    }
}

fn fail_waiters(waiting: &Waiting, addr: SocketAddr, message: &str) {
    let waiters = std::mem::take(&mut *waiting.borrow_mut());
    for (_, tx) in waiters {
        let _ = tx.send(Err(PeerError::Unreachable {
            addr,
            message: message.to_string(),
        }));
    }
}

/// `fut`'s output if it comes before `deadline`.
async fn before<T>(deadline: Instant, fut: impl Future<Output = T>) -> Option<T> {
    let left = deadline.saturating_duration_since(Instant::now());
    futures_lite::future::or(async { Some(fut.await) }, async {
        glommio::timer::sleep(left).await;
        None
    })
    .await
}

impl PeerLink {
    /// A link to the broker at `addr`, taking responses up to `limits`.
    /// Nothing connects until the first call.
    pub fn new(addr: SocketAddr, limits: FrameLimits, security: crate::frame_io::PeerSecurity) -> PeerLink {
        PeerLink {
            inner: Rc::new(Inner {
                addr,
                limits,
                security,
                write_lock: glommio::sync::Semaphore::new(1),
                conn: RefCell::new(None),
                next_id: Cell::new(1),
            }),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Sends a request (`body`, a finished flatbuffer, and `tail`) and
    /// waits for its response, for at most `timeout` in all. A call
    /// dropped before it ends (its caller gave up) cleans up as one that
    /// timed out: its waiter goes, and a write it cut short closes the
    /// connection.
    pub async fn call(&self, api: Api, body: &[u8], tail: TailBuilder, timeout: Duration) -> Result<Frame, PeerError> {
        let deadline = Instant::now() + timeout;
        let addr = self.inner.addr;
        let timed_out = || PeerError::Timeout { addr, after: timeout };
        let (_waiter, answer) = {
            let _turn = before(deadline, self.inner.write_lock.acquire_permit(1))
                .await
                .ok_or_else(timed_out)?
                .map_err(|e| PeerError::Unreachable {
                    addr,
                    message: format!("the link is closed: {e}"),
                })?;
            // The lock came, but too late to send anything.
            if Instant::now() >= deadline {
                return Err(timed_out());
            }
            let conn = self.connected(deadline, timeout).await?;
            let id = self.inner.next_id.get();
            self.inner.next_id.set(id.wrapping_add(1));
            let (tx, answer) = oneshot::channel();
            conn.waiting.borrow_mut().insert(id, tx);
            let waiter = Waiter { conn, id };
            let out = OutFrame::request(api, id, body, tail);
            // Until the frame is all written, a stop (deadline, failure or
            // the call dropped) leaves the stream out of step: the guard
            // closes the connection then.
            let mut write = UnfinishedWrite {
                link: self,
                conn: &waiter.conn,
                writer: waiter.conn.writer.borrow_mut().take(),
            };
            let Some(writer) = write.writer.as_mut() else {
                return Err(PeerError::Unreachable {
                    addr,
                    message: "the connection's writer is gone".into(),
                });
            };
            let mut staging = waiter.conn.staging.borrow_mut().take();
            let written = before(deadline, crate::frame_io::write_frame(writer, &out, staging.as_mut())).await;
            *waiter.conn.staging.borrow_mut() = staging;
            match written {
                Some(Ok(())) => write.finish(),
                None => return Err(timed_out()),
                Some(Err(e)) => {
                    return Err(PeerError::Unreachable {
                        addr,
                        message: format!("writing: {e}"),
                    })
                }
            }
            (waiter, answer)
        };
        match before(deadline, answer).await {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(PeerError::Unreachable {
                addr,
                message: "the connection closed".into(),
            }),
            // (The waiter's guard removes it.)
            None => Err(timed_out()),
        }
        // `_waiter` drops here: an answer that comes later finds nobody.
    }

    /// The live connection, connecting first if there is none (the caller
    /// holds the write lock).
    async fn connected(&self, deadline: Instant, timeout: Duration) -> Result<Rc<Conn>, PeerError> {
        let addr = self.inner.addr;
        if let Some(conn) = self.inner.conn.borrow().as_ref().filter(|c| c.alive.get()) {
            return Ok(conn.clone());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(PeerError::Timeout { addr, after: timeout });
        }
        let stream = match before(deadline, TcpStream::connect_timeout(addr, left)).await {
            Some(Ok(stream)) => stream,
            Some(Err(e)) => {
                return Err(PeerError::Unreachable {
                    addr,
                    message: format!("connecting: {e}"),
                })
            }
            None => return Err(PeerError::Timeout { addr, after: timeout }),
        };
        let _ = stream.set_nodelay(true);
        let mut stream = match &self.inner.security.tls {
            None => Stream::Plain(stream),
            Some(connector) => {
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                match before(deadline, connector.0.connect(name, stream)).await {
                    Some(Ok(tls)) => Stream::Opened(Box::new(tls)),
                    Some(Err(e)) => {
                        return Err(PeerError::Unreachable {
                            addr,
                            message: format!("TLS handshake: {e}"),
                        })
                    }
                    None => return Err(PeerError::Timeout { addr, after: timeout }),
                }
            }
        };
        let mut read = BytesMut::with_capacity(READ_CHUNK);
        if let Some(login) = &self.inner.security.login {
            let failed = |message: String| PeerError::Unreachable {
                addr,
                message: format!("logging in as {:?}: {message}", login.user),
            };
            match before(deadline, log_in(&mut stream, login, self.inner.limits, &mut read)).await {
                Some(Ok(())) => {}
                // While this broker requires no login, a peer that takes
                // none yet (authentication being turned on, one broker at a
                // time) is served unauthenticated, as before.
                Some(Err(LoginFailed::Refused(message))) if !self.inner.security.required => {
                    tracing::debug!(%addr, "the peer refused this broker's login, going on without: {message}");
                }
                Some(Err(LoginFailed::Refused(message) | LoginFailed::Broken(message))) => return Err(failed(message)),
                None => return Err(PeerError::Timeout { addr, after: timeout }),
            }
        }
        let (reader, writer) = futures_lite::io::split(stream);
        let waiting: Rc<Waiting> = Rc::default();
        let alive = Rc::new(Cell::new(true));
        let task = glommio::spawn_local(read_responses(
            reader,
            read,
            waiting.clone(),
            alive.clone(),
            self.inner.limits,
            addr,
        ));
        let conn = Rc::new(Conn {
            writer: RefCell::new(Some(writer)),
            staging: RefCell::new(self.inner.security.tls.as_ref().map(|_| Vec::new())),
            waiting,
            alive,
            _reader: task,
        });
        *self.inner.conn.borrow_mut() = Some(conn.clone());
        Ok(conn)
    }

    /// Closes `conn` (if it is still the link's) and fails its waiters.
    fn close(&self, conn: &Rc<Conn>, why: &str) {
        conn.fail_all(self.inner.addr, why);
        let mut current = self.inner.conn.borrow_mut();
        if current.as_ref().is_some_and(|c| Rc::ptr_eq(c, conn)) {
            *current = None;
        }
    }
}

/// A call's place among a connection's waiters, removed when the call ends
/// however it ends (answered, timed out, or dropped).
struct Waiter {
    conn: Rc<Conn>,
    id: u32,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.conn.waiting.borrow_mut().remove(&self.id);
    }
}

/// A frame being written: unless [`UnfinishedWrite::finish`]ed, dropping
/// it closes the connection (part of a frame may be on the stream, which
/// is then out of step) and fails its waiters.
struct UnfinishedWrite<'a> {
    link: &'a PeerLink,
    conn: &'a Rc<Conn>,
    /// The connection's writer, taken for the write; put back by `finish`.
    writer: Option<WriteHalf<Stream>>,
}

impl UnfinishedWrite<'_> {
    fn finish(mut self) {
        *self.conn.writer.borrow_mut() = self.writer.take();
    }
}

impl Drop for UnfinishedWrite<'_> {
    fn drop(&mut self) {
        if self.writer.is_some() || self.conn.writer.borrow().is_none() {
            self.link.close(self.conn, "a write did not finish");
        }
    }
}

/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 64 << 10;

/// Logs in as the inter-broker user on a new connection, before its first
/// call (`crate::auth`): `strand_client::sasl::exchange`, each request
/// answered before the next. What was read past the last answer stays in
/// `buf` for the connection's reader.
async fn log_in(
    stream: &mut Stream,
    credentials: &strand_client::sasl::Credentials,
    limits: FrameLimits,
    buf: &mut BytesMut,
) -> Result<(), LoginFailed> {
    use strand_client::ClientError;
    let mut chunk = vec![0u8; 4096];
    let mut id = 0;
    // A broken connection is `Io`; anything else the peer answered.
    let broken = |message: String| ClientError::Io {
        addr: String::new(),
        message,
    };
    let call = async |api: Api, body: Vec<u8>| -> Result<Frame, ClientError> {
        id += 1;
        let out = OutFrame::request(api, id, &body, TailBuilder::default());
        crate::frame_io::write_frame(stream, &out, None)
            .await
            .map_err(|e| broken(format!("writing: {e}")))?;
        next_frame(stream, buf, &mut chunk, limits).await.map_err(broken)
    };
    strand_client::sasl::exchange(credentials, call)
        .await
        .map_err(|e| match e {
            ClientError::Io { message, .. } => LoginFailed::Broken(message),
            // The peer answered, and refused (a wrong password, a peer that
            // does not know the API or has no inter-broker keys): the
            // stream is still in step.
            refused => LoginFailed::Refused(refused.to_string()),
        })
}

/// Why a peer link's login failed.
#[derive(Debug)]
enum LoginFailed {
    /// The peer answered and refused: the connection is still usable.
    Refused(String),
    /// The connection broke or fell out of step.
    Broken(String),
}

/// The next whole frame from `stream`; `buf` holds what was read past it.
/// `Err` says why there is none (the connection is done for).
async fn next_frame<R: futures_lite::AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
    chunk: &mut [u8],
    limits: FrameLimits,
) -> Result<Frame, String> {
    loop {
        match frame::decode(buf, limits) {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(format!("a malformed frame: {e}")),
        }
        match stream.read(chunk).await {
            Ok(0) => return Err("the peer closed the connection".to_string()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("reading: {e}")),
        }
    }
}

/// Reads responses until the connection fails, handing each to the call
/// waiting for its correlation id (none waits for a call that gave up);
/// `buf` holds what was read before (past the login).
async fn read_responses(
    mut reader: ReadHalf<Stream>,
    mut buf: BytesMut,
    waiting: Rc<Waiting>,
    alive: Rc<Cell<bool>>,
    limits: FrameLimits,
    addr: SocketAddr,
) {
    let mut chunk = vec![0u8; READ_CHUNK];
    let why = loop {
        match next_frame(&mut reader, &mut buf, &mut chunk, limits).await {
            Ok(f) => {
                let waiter = waiting.borrow_mut().remove(&f.header.correlation_id);
                if let Some(tx) = waiter {
                    let _ = tx.send(Ok(f));
                }
            }
            Err(why) => break why,
        }
    };
    tracing::debug!(%addr, "peer link closed: {why}");
    alive.set(false);
    fail_waiters(&waiting, addr, &why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::AsyncWriteExt;
    use glommio::net::TcpListener;
    use glommio::LocalExecutorBuilder;

    /// Runs `f` on a glommio executor of its own.
    fn run<F, Fut>(f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        LocalExecutorBuilder::default()
            .io_memory(1 << 20)
            .spawn(f)
            .expect("an executor")
            .join()
            .expect("the test's executor");
    }

    /// What a test peer does with a batch of requests: (frames to send
    /// back, whether to close the connection afterwards).
    type Answer = Rc<dyn Fn(Vec<Frame>) -> (Vec<Frame>, bool)>;

    /// A peer on this executor: reads frames, `batch` at a time, and does
    /// what `answer` says with them.
    fn serve(listener: TcpListener, batch: usize, answer: Answer) {
        glommio::spawn_local(async move {
            while let Ok(stream) = listener.accept().await {
                let answer = answer.clone();
                glommio::spawn_local(async move {
                    let (mut r, mut w) = futures_lite::io::split(stream);
                    let mut buf = BytesMut::new();
                    let mut chunk = vec![0u8; 1 << 16];
                    let mut got = Vec::new();
                    loop {
                        while let Ok(Some(f)) = frame::decode(&mut buf, FrameLimits::default()) {
                            got.push(f);
                        }
                        if got.len() >= batch {
                            let (out, close) = answer(std::mem::take(&mut got));
                            for f in out {
                                let o = OutFrame::new(f.header, &f.body, TailBuilder::default());
                                if crate::frame_io::write_frame(&mut w, &o, None).await.is_err() {
                                    return;
                                }
                            }
                            if close {
                                let _ = w.close().await;
                                return;
                            }
                        }
                        match r.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                })
                .detach();
            }
        })
        .detach();
    }

    /// A peer that accepts connections and never reads them: the socket
    /// buffers fill, and a large write cannot finish.
    fn never_reading_peer() -> SocketAddr {
        let (l, addr) = listener();
        glommio::spawn_local(async move {
            let mut held = Vec::new();
            while let Ok(s) = l.accept().await {
                held.push(s);
            }
        })
        .detach();
        addr
    }

    /// A small call that must fail at its 200 ms deadline.
    async fn times_out(link: &PeerLink) {
        let err = link
            .call(
                Api::ApiVersions,
                b"x",
                TailBuilder::default(),
                Duration::from_millis(200),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, PeerError::Timeout { .. }), "{err}");
    }

    fn listener() -> (TcpListener, SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        (l, addr)
    }

    #[test]
    fn pipelined_calls_get_their_own_answers_in_any_order() {
        run(|| async {
            let (l, addr) = listener();
            // Answers ten requests at a time, last first, echoing bodies.
            serve(
                l,
                10,
                Rc::new(|mut frames: Vec<Frame>| {
                    frames.reverse();
                    (frames, false)
                }),
            );
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let calls = (0..10u8).map(|i| {
                let link = link.clone();
                async move {
                    let f = link
                        .call(
                            Api::ApiVersions,
                            &[i; 5],
                            TailBuilder::default(),
                            Duration::from_secs(10),
                        )
                        .await
                        .unwrap();
                    assert_eq!(&f.body[..], &[i; 5]);
                }
            });
            let tasks: Vec<_> = calls.map(glommio::spawn_local).collect();
            for t in tasks {
                t.await;
            }
        });
    }

    #[test]
    fn a_silent_peer_times_out_and_the_link_goes_on() {
        run(|| async {
            let (l, addr) = listener();
            // Answers nothing until it has 1000 requests.
            serve(l, 1000, Rc::new(|_| (Vec::new(), false)));
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let mut first: Option<Rc<Conn>> = None;
            for _ in 0..2 {
                let started = Instant::now();
                times_out(&link).await;
                let took = started.elapsed();
                assert!(
                    took >= Duration::from_millis(200) && took < Duration::from_secs(5),
                    "{took:?}"
                );
                // The same connection: a late answer is no reason to drop it,
                // and the waiter that gave up is gone.
                let conn = link.inner.conn.borrow().clone().expect("still connected");
                assert!(conn.waiting.borrow().is_empty() && conn.alive.get());
                assert!(Rc::ptr_eq(first.get_or_insert_with(|| conn.clone()), &conn));
            }
        });
    }

    #[test]
    fn a_peer_that_does_not_read_cannot_hold_a_writer() {
        run(|| async {
            let addr = never_reading_peer();
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let big = vec![7u8; 32 << 20];
            let started = Instant::now();
            let err = link
                .call(Api::Produce, &big, TailBuilder::default(), Duration::from_millis(300))
                .await
                .unwrap_err();
            assert!(matches!(err, PeerError::Timeout { .. }), "{err}");
            assert!(started.elapsed() < Duration::from_secs(5));
            // The stream was cut mid-frame: the next call has a new one.
            assert!(link.inner.conn.borrow().is_none());
        });
    }

    #[test]
    fn a_call_dropped_mid_write_closes_the_connection() {
        run(|| async {
            let addr = never_reading_peer();
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let caller = link.clone();
            let call = glommio::spawn_local(async move {
                let big = vec![7u8; 32 << 20];
                let _ = caller
                    .call(Api::Produce, &big, TailBuilder::default(), Duration::from_secs(60))
                    .await;
            });
            glommio::timer::sleep(Duration::from_millis(300)).await;
            assert!(link.inner.conn.borrow().is_some(), "connected and writing");
            // The caller gives up: dropping a glommio task cancels it, and
            // the executor drops its future at its next turn.
            drop(call);
            glommio::timer::sleep(Duration::from_millis(50)).await;
            assert!(
                link.inner.conn.borrow().is_none(),
                "the half-written connection is closed"
            );
            // The next call starts a new connection (and, this peer never
            // reading, times out on it).
            times_out(&link).await;
        });
    }

    #[test]
    fn a_closed_connection_fails_its_calls_and_the_next_call_reconnects() {
        run(|| async {
            let (l, addr) = listener();
            let first = Rc::new(Cell::new(true));
            let f = first.clone();
            // The first connection closes without answering; later ones echo.
            serve(
                l,
                1,
                Rc::new(move |frames: Vec<Frame>| {
                    if f.replace(false) {
                        (Vec::new(), true)
                    } else {
                        (frames, false)
                    }
                }),
            );
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let started = Instant::now();
            let err = link
                .call(Api::ApiVersions, b"a", TailBuilder::default(), Duration::from_secs(10))
                .await
                .unwrap_err();
            assert!(matches!(err, PeerError::Unreachable { .. }), "{err}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "failed at once, not at the deadline"
            );
            let f = link
                .call(Api::ApiVersions, b"b", TailBuilder::default(), Duration::from_secs(10))
                .await
                .unwrap();
            assert_eq!(&f.body[..], b"b");
        });
    }

    #[test]
    fn nobody_listening_is_unreachable() {
        run(|| async {
            let (l, addr) = listener();
            drop(l);
            let link = PeerLink::new(addr, FrameLimits::default(), Default::default());
            let err = link
                .call(Api::ApiVersions, b"a", TailBuilder::default(), Duration::from_secs(2))
                .await
                .unwrap_err();
            assert!(matches!(err, PeerError::Unreachable { .. }), "{err}");
        });
    }
}
