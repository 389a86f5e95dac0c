//! A broker process and a tiny protocol client for the integration tests:
//! the real `strand` binary on an ephemeral loopback port, spoken to over
//! std TCP with strand-net's codec.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cluster;
pub mod pki;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use strand_net::frame::{self, FrameLimits};
use strand_net::message::{body, TailBuilder};
use strand_net::{Frame, OutFrame};
use strand_storage::batch::RecordBatch;
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

pub const TS: i64 = 1_700_000_000_000;

/// A finished command's stdout, asserting it succeeded.
pub fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `run` every `every` until its command succeeds, failing with its
/// last stderr once `within` has passed; returns its stdout.
pub fn until_ok(within: Duration, every: Duration, mut run: impl FnMut() -> std::process::Output) -> String {
    let deadline = Instant::now() + within;
    loop {
        let out = run();
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(Instant::now() < deadline, "{}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(every);
    }
}

/// A finished command's stderr, asserting it failed.
pub fn failed(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A running `strand serve`; killed (SIGKILL) if still running when dropped.
pub struct Broker {
    pub child: Child,
    pub addr: SocketAddr,
    /// The metrics endpoint (`--metrics-listen 127.0.0.1:0`).
    pub metrics: SocketAddr,
    pub data_dir: PathBuf,
}

impl Broker {
    pub fn start(data_dir: &Path) -> Broker {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra: &[&str]) -> Broker {
        Self::start_at(data_dir, "127.0.0.1:0", extra)
    }

    /// A broker listening on `listen` (to restart one on the same port).
    pub fn start_at(data_dir: &Path, listen: &str, extra: &[&str]) -> Broker {
        let mut command = serve_command(listen, extra);
        command.arg("--data-dir").arg(data_dir);
        // Two shards unless the test says otherwise.
        if !extra.contains(&"--cores") {
            command.args(["--cores", "2"]);
        }
        Self::spawn(command, data_dir)
    }

    /// Runs `command` (a `strand serve …`, with its arguments and working
    /// directory) and waits for its ready line; `data_dir` is where it keeps
    /// its data.
    pub fn spawn(command: Command, data_dir: &Path) -> Broker {
        Starting::spawn(command, data_dir).ready()
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// SIGTERM, then the exit status (bounded wait).
    pub fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "strand did not stop within 15 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal (SIGSTOP / SIGCONT to pause and resume it).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill sends a signal to our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// A `strand serve` started and not yet ready (the nodes of a cluster
/// start together: none is ready before the others run).
pub struct Starting {
    child: Option<Child>,
    lines: std::sync::mpsc::Receiver<String>,
    /// A line [`Starting::ready_within`] read.
    early: Option<String>,
    data_dir: PathBuf,
}

impl Starting {
    /// Runs `command` (a `strand serve …`); `data_dir` is where it keeps its data.
    pub fn spawn(mut command: Command, data_dir: &Path) -> Starting {
        let mut child = command
            .env(
                "RUST_LOG",
                std::env::var("STRAND_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting strand");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
        });
        Starting {
            child: Some(child),
            lines: rx,
            early: None,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// Whether it printed its ready line within `wait` (then `ready`
    /// returns at once).
    pub fn ready_within(&mut self, wait: Duration) -> bool {
        match self.lines.recv_timeout(wait) {
            Ok(line) => {
                self.early = Some(line);
                true
            }
            Err(_) => false,
        }
    }

    /// Waits (up to 60 s) for the ready line.
    pub fn ready(mut self) -> Broker {
        let line = match self.early.take() {
            Some(line) => line,
            None => self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .expect("strand printed no ready line"),
        };
        assert!(line.contains("ready"), "{line}");
        let addr = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        let metrics = line
            .split("http://")
            .nth(1)
            .and_then(|m| m.split('/').next())
            .unwrap()
            .parse()
            .unwrap();
        Broker {
            child: self.child.take().unwrap(),
            addr,
            metrics,
            data_dir: self.data_dir.clone(),
        }
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `strand serve --listen LISTEN --metrics-listen 127.0.0.1:0 EXTRA…`
/// logging warnings only, not started: a test adds `--data-dir`, a
/// working directory or pipes as it needs.
pub fn serve_command(listen: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
    command
        .args(["serve", "--listen", listen, "--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "warn");
    command
}

/// A blocking protocol client on one connection.
pub struct Client {
    pub stream: TcpStream,
    next_id: u32,
    buf: BytesMut,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            next_id: 1,
            buf: BytesMut::new(),
        }
    }

    pub fn send(&mut self, api: Api, fbb: &FlatBufferBuilder<'_>, tail: TailBuilder) -> u32 {
        self.send_body(api, fbb.finished_data(), tail)
    }

    pub fn send_body(&mut self, api: Api, body: &[u8], tail: TailBuilder) -> u32 {
        let (id, frame) = self.frame(api, body, tail);
        self.stream.write_all(&frame).unwrap();
        id
    }

    /// The next request's correlation id and its frame's bytes, unsent (a
    /// test that writes them its own way).
    pub fn frame(&mut self, api: Api, body: &[u8], tail: TailBuilder) -> (u32, Vec<u8>) {
        let id = self.next_id;
        self.next_id += 1;
        let out = OutFrame::request(api, id, body, tail);
        (id, out.to_bytes().to_vec())
    }

    pub fn recv(&mut self) -> Frame {
        loop {
            if let Some(f) = frame::decode(&mut self.buf, FrameLimits::default()).unwrap() {
                return f;
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the broker closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn call(&mut self, api: Api, fbb: &FlatBufferBuilder<'_>, tail: TailBuilder) -> Frame {
        self.call_body(api, fbb.finished_data(), tail)
    }

    pub fn call_body(&mut self, api: Api, body: &[u8], tail: TailBuilder) -> Frame {
        let id = self.send_body(api, body, tail);
        let f = self.recv();
        assert_eq!(f.header.correlation_id, id);
        assert_eq!(f.header.api, api as u16);
        f
    }

    pub fn create_queue(&mut self, name: &str, partitions: u32) -> ErrorCode {
        self.create_queue_rf(name, partitions, 1)
    }

    pub fn create_queue_rf(&mut self, name: &str, partitions: u32, rf: u16) -> ErrorCode {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let config = QueueConfig::create(
            &mut fbb,
            &QueueConfigArgs {
                partitions,
                replication_factor: rf,
                ..Default::default()
            },
        );
        let root = CreateQueueRequest::create(
            &mut fbb,
            &CreateQueueRequestArgs {
                name: Some(n),
                config: Some(config),
            },
        );
        fbb.finish_minimal(root);
        let f = self.call(Api::CreateQueue, &fbb, TailBuilder::default());
        error_code(body::<CreateQueueResponse>(&f).unwrap().error())
    }

    pub fn delete_queue(&mut self, name: &str) -> ErrorCode {
        let mut fbb = FlatBufferBuilder::new();
        let n = fbb.create_string(name);
        let root = DeleteQueueRequest::create(&mut fbb, &DeleteQueueRequestArgs { name: Some(n) });
        fbb.finish_minimal(root);
        let f = self.call(Api::DeleteQueue, &fbb, TailBuilder::default());
        error_code(body::<DeleteQueueResponse>(&f).unwrap().error())
    }

    /// Produces `batch` to one partition; returns (base, last) or the error.
    pub fn produce(
        &mut self,
        queue: &str,
        partition: u32,
        batch: Bytes,
        acks: i8,
    ) -> Result<(u64, u64), (ErrorCode, String)> {
        let (body, tail) = strand_client::requests::produce(queue, partition, acks, batch);
        if acks == 0 {
            self.send_body(Api::Produce, &body, tail);
            return Ok((0, 0));
        }
        let f = self.call_body(Api::Produce, &body, tail);
        strand_client::requests::produced(&f).map_err(|e| (e.code().unwrap_or(ErrorCode::Internal), e.to_string()))
    }

    /// Fetches from one partition: the batches, and the high watermark.
    pub fn fetch(
        &mut self,
        queue: &str,
        partition: u32,
        offset: u64,
        max_wait_ms: u32,
        min_bytes: u32,
    ) -> Result<(Vec<RecordBatch>, u64), ErrorCode> {
        let id = self.send_fetch(queue, &[(partition, offset)], 1 << 20, max_wait_ms, min_bytes, false);
        let f = self.recv();
        assert_eq!(f.header.correlation_id, id);
        fetched(&f)
    }

    /// Sends a fetch of `queue`'s `parts` (partition, offset), each at most
    /// `max_bytes`, plain or chained; returns its correlation id.
    pub fn send_fetch(
        &mut self,
        queue: &str,
        parts: &[(u32, u64)],
        max_bytes: u32,
        max_wait_ms: u32,
        min_bytes: u32,
        chained: bool,
    ) -> u32 {
        let config = strand_client::ConsumerConfig {
            max_wait: Duration::from_millis(u64::from(max_wait_ms)),
            min_bytes,
            partition_max_bytes: max_bytes,
            max_bytes: 4 << 20,
            ..strand_client::ConsumerConfig::default()
        };
        let body = strand_client::requests::fetch_parts(queue, parts, &config, chained);
        self.send_body(Api::Fetch, &body, TailBuilder::default())
    }

    /// Every record of a partition from `from`: (offset, value).
    pub fn fetch_all(&mut self, queue: &str, partition: u32, from: u64) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut offset = from;
        loop {
            let (batches, hw) = self.fetch(queue, partition, offset, 0, 0).unwrap();
            for b in &batches {
                for r in b.records() {
                    if r.offset.0 >= offset {
                        out.push((r.offset.0, r.value.unwrap().to_vec()));
                    }
                }
            }
            match batches.last() {
                Some(b) => offset = b.next_offset().0,
                None => return out,
            }
            if offset >= hw {
                return out;
            }
        }
    }

    pub fn list_offset(&mut self, queue: &str, partition: u32, spec: OffsetSpec, timestamp_ms: i64) -> (u64, bool) {
        let request = strand_client::requests::list_offset(queue, partition, spec, timestamp_ms);
        let f = self.call_body(Api::ListOffsets, &request, TailBuilder::default());
        strand_client::requests::listed(&f).unwrap()
    }
}

/// The batches and high watermark of the first partition of a Fetch
/// response, or its error.
pub fn fetched(f: &Frame) -> Result<(Vec<RecordBatch>, u64), ErrorCode> {
    let resp = body::<FetchResponse>(f).unwrap();
    let q = resp.queues().unwrap().get(0);
    let p = q.partitions().unwrap().get(0);
    if let Some(e) = p.error() {
        return Err(e.code());
    }
    let batches = strand_client::requests::fetched(f, q.name().unwrap())
        .unwrap()
        .into_iter()
        .map(|b| RecordBatch::new(b, 1 << 24).expect("fetched batches are valid"))
        .collect();
    Ok((batches, p.high_watermark()))
}

pub fn error_code(e: Option<Error<'_>>) -> ErrorCode {
    e.map_or(ErrorCode::None, |e| e.code())
}

/// A batch of `n` records with values `"<tag>-<i>"`, all at `ts`.
pub fn batch(tag: &str, n: u32, ts: i64) -> Bytes {
    let mut b = strand_storage::batch::BatchBuilder::new();
    for i in 0..n {
        let v = format!("{tag}-{i}");
        b.push(Some(tag.as_bytes()), Some(v.as_bytes()), &[], ts);
    }
    b.build().freeze()
}

/// One HTTP request; (status, body).
pub fn http(addr: SocketAddr, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

pub fn scrape(broker: &Broker) -> String {
    let (status, body) = http(broker.metrics, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the series whose line starts with `series ` (name and labels).
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}
