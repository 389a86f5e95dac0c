//! Frames on this broker's glommio sockets: how an [`OutFrame`] is written
//! (its head, then each tail piece as it is: record batches are never
//! copied together). Client connections (`server::connection`) and peer
//! links (`peer::link`) both write this way.

use futures_lite::io::WriteHalf;
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use strand_net::OutFrame;

/// Writes `out` whole, then flushes.
pub async fn write_frame(stream: &mut WriteHalf<TcpStream>, out: &OutFrame) -> std::io::Result<()> {
    stream.write_all(&out.head).await?;
    for piece in &out.tail {
        stream.write_all(piece).await?;
    }
    stream.flush().await
}
