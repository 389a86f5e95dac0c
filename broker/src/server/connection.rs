//! One client connection: read frames, serve them one at a time in order,
//! write the responses.
//!
//! Runs on: the shard whose listener accepted the connection (the kernel
//! spreads connections over the shards' SO_REUSEPORT listeners).
//!
//! A malformed frame (bad length, body past the frame) ends the connection:
//! the stream can no longer be trusted to be in step. Everything else —
//! unknown API, bad version, a body that fails verification, a bad batch —
//! is answered with a typed error and the connection goes on.

use std::rc::Rc;

use bytes::BytesMut;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use strand_net::frame::{self, FrameLimits};

use super::shard::Shard;
use crate::handlers;

/// Bytes read from the socket at a time (at least).
const READ_CHUNK: usize = 64 << 10;
/// Most the read buffer grows by in one read.
const READ_GROW: usize = 1 << 20;

pub async fn serve(shard: Rc<Shard>, mut stream: TcpStream) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let limits = FrameLimits {
        max_frame_bytes: shard.config.max_frame_bytes,
    };
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        match frame::decode_mut(&mut buf, limits) {
            Ok(Some(request)) => {
                shard.in_flight.set(shard.in_flight.get() + 1);
                let response = handlers::dispatch(&shard, request).await;
                shard.in_flight.set(shard.in_flight.get() - 1);
                if let Some(out) = response {
                    if let Err(e) = write_all(&mut stream, &out).await {
                        tracing::debug!(%peer, "write failed: {e}");
                        return;
                    }
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
                    let _ = write_all(&mut stream, &out).await;
                }
                return;
            }
        }
        if shard.stopping.get() {
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

async fn write_all(stream: &mut TcpStream, out: &strand_net::OutFrame) -> std::io::Result<()> {
    stream.write_all(&out.head).await?;
    for piece in &out.tail {
        stream.write_all(piece).await?;
    }
    stream.flush().await
}
