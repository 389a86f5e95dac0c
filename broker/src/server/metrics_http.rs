//! The metrics endpoint: `GET /metrics` (every shard's snapshot, rendered)
//! and `GET /health` (200 when every shard answers, else 503 with the
//! reason). Minimal HTTP/1.x: one request per connection, then close.
//!
//! With `metrics_tls` it serves TLS with the listener's certificate; with
//! `metrics_basic_auth`, `/metrics` needs `Authorization: Basic` of a
//! cluster user (its SCRAM password, checked with one PBKDF2 and then
//! remembered as a SHA-256 for a minute) that is a superuser or allowed
//! `describe` on the cluster: 401 without, 403 for another user, 429 when
//! password checks would take more than a tenth of shard 0's time (an
//! unknown name costs a check too). It needs `metrics_tls`.
//! `/health` stays open (liveness probes).
//!
//! Runs on: shard 0 (every shard answers its part over the mesh:
//! `mesh.rs`). Robust to slow or bad clients: a request head must
//! arrive within 2 s and fit in 8 KiB, at most 64 scrapes are served at
//! once (more wait in the kernel's backlog), and a shard that does not
//! answer within 1 s makes `/health` say so rather than hang the scrape.

use std::rc::Rc;
use std::time::Duration;

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpListener;

use crate::auth::{MetricsRefusal, ServerAuth};
use crate::frame_io::Stream;
use crate::metrics::{render, ShardSnapshot};
use crate::shard::Shard;

/// How long a checked basic-auth password is remembered.
const REMEMBER: Duration = Duration::from_secs(60);

/// Basic-auth passwords checked lately: per user, the SHA-256 of the
/// password, the StoredKey it matched (a changed password misses) and
/// when.
type Checked = RefCell<HashMap<String, (Vec<u8>, Vec<u8>, Instant)>>;

/// Password checks (each a PBKDF2 on shard 0, which also serves clients
/// and the controller) take at most a tenth of the shard's time: after a
/// check that took `t`, none starts for `9 t`; a scrape that comes sooner
/// is answered 429 without one.
const CHECK_DUTY: u32 = 10;

/// When the next password check may start.
#[derive(Default)]
struct Checks {
    remembered: Checked,
    next: std::cell::Cell<Option<Instant>>,
}

const HEAD_MAX: usize = 8 << 10;
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
const SHARD_TIMEOUT: Duration = Duration::from_secs(1);
const CONCURRENT_MAX: usize = 64;

/// Serves the endpoint until the shard stops.
pub fn start(shard: &Rc<Shard>, listener: TcpListener) {
    let shard = shard.clone();
    let slots = Rc::new(glommio::sync::Semaphore::new(CONCURRENT_MAX as u64));
    let checked: Rc<Checks> = Rc::default();
    glommio::spawn_local(async move {
        loop {
            let stream = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("metrics accept failed: {e}");
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            if shard.stopping.get() {
                continue;
            }
            // At most CONCURRENT_MAX at once: the next waits for a slot.
            let Ok(slot) = slots.acquire_static_permit(1).await else {
                return;
            };
            let (s, checked) = (shard.clone(), checked.clone());
            glommio::spawn_local(async move {
                let stream = match (s.config.metrics_tls, super::connection::ListenerTls::of(&s)) {
                    (true, Some(acceptor)) => {
                        match glommio::timer::timeout(HEAD_TIMEOUT, async {
                            acceptor.accept(stream).await.map_err(glommio::GlommioError::IoError)
                        })
                        .await
                        {
                            Ok(tls) => Stream::Accepted(Box::new(tls)),
                            Err(e) => {
                                tracing::debug!("metrics TLS handshake: {e}");
                                return;
                            }
                        }
                    }
                    (true, None) => {
                        tracing::warn!("metrics_tls is set but the listener has no TLS: closing the scrape");
                        return;
                    }
                    (false, _) => Stream::Plain(stream),
                };
                if let Err(e) = serve(&s, stream, &checked).await {
                    tracing::debug!("metrics request: {e}");
                }
                drop(slot);
            })
            .detach();
        }
    })
    .detach();
}

/// Reads the request line (within the limits), answers, closes.
async fn serve(shard: &Rc<Shard>, mut stream: Stream, checked: &Checks) -> Result<(), String> {
    let mut head = Vec::with_capacity(512);
    let read = glommio::timer::timeout(HEAD_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
            if head.len() >= HEAD_MAX {
                break;
            }
            let n = stream.read(&mut buf).await.map_err(glommio::GlommioError::IoError)?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(())
    })
    .await;
    if read.is_err() {
        return respond(&mut stream, 408, "text/plain", "request head too slow\n").await;
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if head.len() >= HEAD_MAX {
        return respond(&mut stream, 431, "text/plain", "request head too large\n").await;
    }
    if method != "GET" {
        return respond(&mut stream, 405, "text/plain", "only GET is served\n").await;
    }
    match path.split('?').next().unwrap_or_default() {
        "/metrics" if shard.config.metrics_basic_auth => match scraper(shard, &head, checked) {
            Err(MetricsRefusal::Unauthenticated) => {
                let body = "log in with a cluster user's name and password (HTTP basic auth)\n";
                respond_with(
                    &mut stream,
                    401,
                    "text/plain",
                    body,
                    "WWW-Authenticate: Basic realm=\"strand\"\r\n",
                )
                .await
            }
            Err(MetricsRefusal::Busy) => {
                respond(
                    &mut stream,
                    429,
                    "text/plain",
                    "too many password checks: try again in a moment\n",
                )
                .await
            }
            Err(MetricsRefusal::Forbidden) => {
                let body =
                    "this user may not read metrics: make it a superuser, or allow it with strand acl add --user NAME \
                     --operation describe --cluster\n";
                respond(&mut stream, 403, "text/plain", body).await
            }
            Ok(()) => metrics(shard, &mut stream).await,
        },
        "/metrics" => metrics(shard, &mut stream).await,
        "/health" => {
            let (_, missing) = gather(shard).await;
            match missing {
                None if !shard.stopping.get() => respond(&mut stream, 200, "text/plain", "ok\n").await,
                None => respond(&mut stream, 503, "text/plain", "shutting down\n").await,
                Some(m) => respond(&mut stream, 503, "text/plain", &format!("{m}\n")).await,
            }
        }
        _ => respond(&mut stream, 404, "text/plain", "not found: try /metrics or /health\n").await,
    }
}

/// This shard's snapshot: its own figures and its group coordinator's.
pub fn snapshot(shard: &Shard) -> ShardSnapshot {
    let mut snap = shard.snapshot();
    snap.request_memory_bytes = super::connection::RequestMemory::in_use(shard);
    crate::groups::add_to_snapshot(shard, &mut snap);
    snap
}

/// Every shard's snapshot (this one's directly, the others' over the mesh);
/// the second value names the shards that did not answer in time.
async fn gather(shard: &Rc<Shard>) -> (Vec<ShardSnapshot>, Option<String>) {
    let mut all = vec![snapshot(shard)];
    let mut missing = Vec::new();
    // All shards at once, under one deadline.
    let asks: Vec<_> = (0..shard.shards)
        .filter(|&peer| peer != shard.id.0)
        .map(|peer| {
            let s = shard.clone();
            let ask = glommio::spawn_local(async move {
                glommio::timer::timeout(SHARD_TIMEOUT, async {
                    s.ask_snapshot(peer)
                        .await
                        .ok_or(glommio::GlommioError::Closed(glommio::ResourceType::Channel(())))
                })
                .await
                .ok()
            });
            (peer, ask)
        })
        .collect();
    for (peer, ask) in asks {
        match ask.await {
            Some(s) => all.push(s),
            None => missing.push(peer),
        }
    }
    let missing = (!missing.is_empty()).then(|| {
        let list: Vec<String> = missing.iter().map(u16::to_string).collect();
        format!("shard(s) {} did not answer within {SHARD_TIMEOUT:?}", list.join(", "))
    });
    (all, missing)
}

/// Whether the request `head`'s basic auth names a user that may read
/// metrics (see the module doc).
fn scraper(shard: &Shard, head: &[u8], checks: &Checks) -> Result<(), MetricsRefusal> {
    use base64::Engine;
    let head = String::from_utf8_lossy(head);
    let given = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, value)| {
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("basic").then_some(token)
        })
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or(MetricsRefusal::Unauthenticated)?;
    let (user, password) = given.split_once(':').ok_or(MetricsRefusal::Unauthenticated)?;
    let table = shard.table();
    let auth = ServerAuth::of(shard);
    let digest = ring::digest::digest(&ring::digest::SHA256, password.as_bytes())
        .as_ref()
        .to_vec();
    let stored = table
        .users
        .get(user)
        .and_then(|u| u.credentials.first())
        .map(|c| c.stored_key.clone())
        .unwrap_or_default();
    let remembered = checks
        .remembered
        .borrow()
        .get(user)
        .is_some_and(|(d, s, at)| *d == digest && *s == stored && at.elapsed() < REMEMBER);
    if !remembered {
        let now = Instant::now();
        if checks.next.get().is_some_and(|next| now < next) {
            return Err(MetricsRefusal::Busy);
        }
        let checked = auth.may_read_metrics(&table, user, password);
        checks.next.set(Some(Instant::now() + now.elapsed() * (CHECK_DUTY - 1)));
        checked?;
        checks
            .remembered
            .borrow_mut()
            .insert(user.to_string(), (digest, stored, Instant::now()));
        return Ok(());
    }
    // The password was checked; the user's rights may have changed.
    auth.may_read_metrics_again(&table, user)
}

/// `GET /metrics`: every shard's snapshot, rendered.
async fn metrics(shard: &Rc<Shard>, stream: &mut Stream) -> Result<(), String> {
    let (snapshots, missing) = gather(shard).await;
    // Without a shard its counters would seem to fall (and then jump):
    // no partial answer.
    if let Some(m) = missing {
        tracing::warn!("metrics scrape failed: {m}");
        return respond(stream, 503, "text/plain", &format!("{m}\n")).await;
    }
    match render(snapshots) {
        Ok(text) => {
            respond(
                stream,
                200,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &text,
            )
            .await
        }
        Err(e) => respond(stream, 500, "text/plain", &format!("{e}\n")).await,
    }
}

async fn respond(stream: &mut Stream, status: u16, content_type: &str, body: &str) -> Result<(), String> {
    respond_with(stream, status, content_type, body, "").await
}

/// An answer with `extra` header lines (each ending in CRLF).
async fn respond_with(
    stream: &mut Stream,
    status: u16,
    content_type: &str,
    body: &str,
    extra: &str,
) -> Result<(), String> {
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.flush().await?;
        stream.close().await
    };
    glommio::timer::timeout(HEAD_TIMEOUT * 5, async {
        write.await.map_err(glommio::GlommioError::IoError)
    })
    .await
    .map_err(|e| e.to_string())
}
