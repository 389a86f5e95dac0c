//! Frames on this broker's glommio sockets: how an [`OutFrame`] is written
//! (its head, then each tail piece as it is: record batches are never
//! copied together). Client connections (`server::connection`) and peer
//! links (`peer::link`) both write this way.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::io::{AsyncRead, AsyncWrite};
use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;
use strand_net::OutFrame;

/// How a peer link opens its TLS session (`server::tls`).
#[derive(Clone)]
pub struct PeerTls(pub futures_rustls::TlsConnector);

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

/// How a peer link secures itself: TLS (with `--tls-cert`) and the
/// inter-broker login (with `$STRAND_INTER_BROKER_PASSWORD`: SASL SCRAM
/// right after connecting, `peer::link`).
#[derive(Clone, Debug, Default)]
pub struct PeerSecurity {
    pub tls: Option<PeerTls>,
    /// The inter-broker user and its password.
    pub login: Option<strand_client::sasl::Credentials>,
    /// This broker requires logins (`--auth scram`): a link whose login the
    /// peer refuses fails. Otherwise it goes on unauthenticated.
    pub required: bool,
}

/// A broker's socket: plain, or a TLS session over it (`server::tls`) as
/// the listener accepted it or a peer link opened it.
pub enum Stream {
    Plain(TcpStream),
    Accepted(Box<futures_rustls::server::TlsStream<TcpStream>>),
    Opened(Box<futures_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::Opened(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::Opened(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::Opened(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Accepted(s) => Pin::new(s.as_mut()).poll_close(cx),
            Stream::Opened(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}

/// Writes `out` whole, then flushes. With `staging` (a TLS stream) the
/// frame goes through it in chunks of [`STAGING_CHUNK`]: rustls makes a
/// record of each write and the stream sends it, so a fetch answer of many
/// small batches written piece by piece would cost a record and a send per
/// batch; gathered, it costs one per 64 KiB (the copy costs little beside
/// the encryption, which reads every byte anyway), and the buffer never
/// holds more than a chunk, whatever the frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    stream: &mut W,
    out: &OutFrame,
    staging: Option<&mut Vec<u8>>,
) -> std::io::Result<()> {
    match staging {
        None => {
            stream.write_all(&out.head).await?;
            for piece in &out.tail {
                stream.write_all(piece).await?;
            }
        }
        Some(staging) => {
            staging.clear();
            staging.reserve_exact(STAGING_CHUNK);
            let pieces = std::iter::once(&out.head[..]).chain(out.tail.iter().map(|p| &p[..]));
            for mut rest in pieces {
                while !rest.is_empty() {
                    let take = (STAGING_CHUNK - staging.len()).min(rest.len());
                    staging.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if staging.len() == STAGING_CHUNK {
                        stream.write_all(staging).await?;
                        staging.clear();
                    }
                }
            }
            if !staging.is_empty() {
                stream.write_all(staging).await?;
                staging.clear();
            }
        }
    }
    stream.flush().await
}

/// The most a TLS staging buffer holds: a frame is written through it in
/// chunks of this size.
pub const STAGING_CHUNK: usize = 64 << 10;
