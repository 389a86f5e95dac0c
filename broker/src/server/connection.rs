//! One client connection: read frames, serve up to [`MAX_IN_FLIGHT`] of
//! them at once, write the responses in request order.
//!
//! Runs on: the shard whose listener accepted the connection (the kernel
//! spreads connections over the shards' SO_REUSEPORT listeners). Two tasks
//! per connection: this reader, which decodes frames and spawns one handler
//! task per request, and a writer, which awaits those tasks in the order the
//! requests came and writes each response. So a client may pipeline: a long
//! poll does not hold up a produce behind it, and produce requests for
//! different partitions share group commits. Handler tasks start in arrival
//! order (glommio runs a queue's tasks first in, first out), so two produce
//! requests for one partition on one connection append in the order sent.
//!
//! A malformed frame (bad length, body past the frame) ends the connection
//! (after the responses before it): the stream can no longer be trusted to
//! be in step. Everything else — unknown API, bad version, a body that fails
//! verification, a bad batch — is answered with a typed error and the
//! connection goes on.

use std::cell::Cell;
use std::rc::Rc;

use bytes::BytesMut;
use futures_lite::io::{ReadHalf, WriteHalf};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::channels::local_channel;
use glommio::net::TcpStream;
use glommio::task::JoinHandle;
use strand_net::frame::{self, FrameLimits};
use strand_net::OutFrame;
use tracing::Instrument;

use super::shard::Shard;
use crate::handlers;

/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 64 << 10;
/// Most the read buffer grows by in one read.
const READ_GROW: usize = 1 << 20;
/// Requests of one connection served at once; the reader waits when this
/// many are unanswered (backpressure to the client through TCP).
pub const MAX_IN_FLIGHT: usize = 64;

/// A response in the making, in request order.
enum Pending {
    Task(JoinHandle<Option<OutFrame>>),
    Ready(OutFrame),
}

pub async fn serve(shard: Rc<Shard>, stream: TcpStream) {
    shard.metrics.connection_opened();
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let (reader, writer) = futures_lite::io::split(stream);
    let (to_writer, responses) = local_channel::new_bounded::<Pending>(MAX_IN_FLIGHT);
    let writer_failed = Rc::new(Cell::new(false));
    let failed = writer_failed.clone();
    let peer_w = peer.clone();
    let writing = glommio::spawn_local(async move {
        let mut writer = writer;
        while let Some(next) = responses.recv().await {
            let out = match next {
                Pending::Task(task) => task.await.flatten(),
                Pending::Ready(out) => Some(out),
            };
            if let Some(out) = out {
                if failed.get() {
                    continue; // drain the rest so every handler finishes
                }
                if let Err(e) = write_all(&mut writer, &out).await {
                    tracing::debug!(peer = %peer_w, "write failed: {e}");
                    failed.set(true);
                    let _ = writer.close().await;
                }
            }
        }
    });
    read_requests(&shard, reader, &to_writer, &writer_failed, &peer).await;
    drop(to_writer);
    writing.await;
    shard.metrics.connection_closed();
}

async fn read_requests(
    shard: &Rc<Shard>,
    mut stream: ReadHalf<TcpStream>,
    to_writer: &local_channel::LocalSender<Pending>,
    writer_failed: &Cell<bool>,
    peer: &str,
) {
    let limits = FrameLimits {
        max_frame_bytes: shard.config.max_frame_bytes,
    };
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        match frame::decode_mut(&mut buf, limits) {
            Ok(Some(request)) => {
                // Counted from now: shutdown waits for every accepted request.
                shard.in_flight.set(shard.in_flight.get() + 1);
                let s = shard.clone();
                let (api, arrived) = (request.header.api, std::time::Instant::now());
                // A span per request at debug level (nothing at info).
                let span = tracing::debug_span!("request", api, correlation_id = request.header.correlation_id);
                let task = glommio::spawn_local(
                    async move {
                        let response = handlers::dispatch(&s, request).await;
                        s.in_flight.set(s.in_flight.get() - 1);
                        s.metrics.request(api, arrived.elapsed());
                        response
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
                if let Some(header) = frame::peek_header(&buf) {
                    let code = match e {
                        frame::FrameError::TooLarge { .. } => strand_wire::ErrorCode::FrameTooLarge,
                        _ => strand_wire::ErrorCode::MalformedFrame,
                    };
                    let out = handlers::error_frame(header, code, e.to_string());
                    let _ = to_writer.send(Pending::Ready(out)).await;
                }
                return;
            }
        }
        if shard.stopping.get() || writer_failed.get() {
            return;
        }
        // Grow by at most READ_GROW a read: a header claiming a large frame
        // costs memory only as its bytes arrive.
        let needed = frame::needed(&buf, limits).unwrap_or(READ_CHUNK);
        let want = needed.saturating_sub(buf.len()).clamp(READ_CHUNK, READ_GROW);
        let start = buf.len();
        buf.resize(start + want, 0);
        match stream.read(&mut buf[start..]).await {
            Ok(0) => return,
            Ok(n) => buf.truncate(start + n),
            Err(e) => {
                tracing::debug!(%peer, "read failed: {e}");
                return;
            }
        }
    }
}

async fn write_all(stream: &mut WriteHalf<TcpStream>, out: &OutFrame) -> std::io::Result<()> {
    stream.write_all(&out.head).await?;
    for piece in &out.tail {
        stream.write_all(piece).await?;
    }
    stream.flush().await
}
