//! `strand-bench raw-produce`: produce throughput and latency against a running
//! broker, over the raw protocol (single Produce requests through
//! strand-client's connection, no producer batching), beside
//! the raw O_DIRECT write limit of the machine measured in the same run.
//!
//! `--connections` threads each send 1 MiB batches of 1,000-byte records
//! (acks=1) one request at a time to the queue's partitions in turn; the
//! queue is created with `fsync=always` if it does not exist. Producing and
//! raw writes (1 MiB blocks, queue depth 1, one fdatasync per slice, into
//! `--raw-dir`, which should be on the broker's disk) alternate in
//! `--rounds` slices, so both meet the same conditions.
//!
//! Last stdout line: JSON with `produce_mib_s`, `p50_us`, `p99_us`,
//! `p999_us`, `max_us` (request latency), `raw_mib_s` and `ratio`
//! (produce ÷ raw).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use hdrhistogram::Histogram;
use strand_client::{block_on, requests, Admin, Connection, FsyncSpec, QueueSpec};
use strand_storage::testkit;
use strand_wire::{Api, ErrorCode};

use crate::report::{mib_s, round2, table, Latency};
use crate::storage::{err, mib_batch, raw_write_slice, slices, MIB};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The broker to produce to.
    #[arg(long, default_value = "127.0.0.1:9400")]
    brokers: SocketAddr,
    #[arg(long, default_value = "bench")]
    queue: String,
    /// Partitions of the queue if it is created here.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Producer connections (one request in flight each).
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// MiB produced (and written raw).
    #[arg(long, default_value_t = 512)]
    mib: usize,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Directory for the raw-write file: put it on the broker's disk.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    raw_dir: PathBuf,
}

/// Produces one run of batches and waits for the answer.
fn produce(conn: &Connection, queue: &str, partition: u32, batch: Bytes) -> Result<(), String> {
    let (body, tail) = requests::produce(queue, partition, 1, batch);
    let frame = block_on(conn.request(Api::Produce, &body, tail)).map_err(err)?;
    requests::produced(&frame)
        .map(|_| ())
        .map_err(|e| format!("produce failed: {e}"))
}

/// Creates the queue (fsync=always) unless it exists.
fn create_queue(addr: &str, name: &str, partitions: u32) -> Result<(), String> {
    let admin = Admin::connect(addr).map_err(err)?;
    let spec = QueueSpec {
        partitions: Some(partitions),
        fsync: Some(FsyncSpec::Always),
        ..QueueSpec::default()
    };
    match block_on(admin.create_queue(name, &spec)) {
        Err(e) if e.code() != Some(ErrorCode::QueueAlreadyExists) => Err(format!("creating {name}: {e}")),
        _ => Ok(()),
    }
}

pub fn run(args: Args) -> Result<(), String> {
    if args.mib == 0 || args.connections == 0 || args.partitions == 0 {
        return Err("--mib, --connections and --partitions must be > 0".into());
    }
    let addr = args.brokers.to_string();
    create_queue(&addr, &args.queue, args.partitions)?;
    // Batches are built before the clock starts (client work).
    let batches: Vec<Bytes> = (0..args.mib as u64)
        .map(|tag| mib_batch(tag, 1_700_000_000_000).freeze())
        .collect();
    let bytes_per_batch = batches[0].len() as u64;
    let raw_dir = tempfile::Builder::new()
        .prefix("strand-bench-produce-")
        .tempdir_in(&args.raw_dir)
        .map_err(|e| format!("temporary directory in {}: {e}", args.raw_dir.display()))?;
    let raw_path = raw_dir.path().join("raw.bin");
    let conns: Vec<Connection> = (0..args.connections)
        .map(|_| Connection::connect(&addr).map_err(err))
        .collect::<Result<_, _>>()?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).map_err(err)?;
    let (mut raw_secs, mut produce_secs) = (0.0, 0.0);
    for slice in slices(args.mib, args.rounds) {
        let (path, range) = (raw_path.clone(), slice.clone());
        raw_secs += testkit::run_on_executor(move || async move {
            let raw = glommio::io::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .dma_open(&path)
                .await
                .map_err(err)?;
            let mut block = raw.alloc_dma_buffer(MIB);
            testkit::fill_value(block.as_bytes_mut(), 1, 1);
            let secs = raw_write_slice(&raw, &Rc::new(block), range).await;
            raw.close().await.map_err(err)?;
            secs
        })?;

        let next = Arc::new(Mutex::new(slice.start));
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        std::thread::scope(|scope| -> Result<(), String> {
            let mut handles = Vec::new();
            for (c, conn) in conns.iter().enumerate() {
                let (next, latencies, batches, queue) = (next.clone(), latencies.clone(), &batches, &args.queue);
                let (end, partitions) = (slice.end, args.partitions);
                handles.push(scope.spawn(move || -> Result<(), String> {
                    let mut mine = Vec::new();
                    loop {
                        let i = {
                            let mut n = next.lock().map_err(err)?;
                            if *n >= end {
                                break;
                            }
                            *n += 1;
                            *n - 1
                        };
                        let t = Instant::now();
                        produce(conn, queue, (i as u32 + c as u32) % partitions, batches[i].clone())?;
                        mine.push(t.elapsed().as_nanos() as u64);
                    }
                    latencies.lock().map_err(err)?.extend(mine);
                    Ok(())
                }));
            }
            for h in handles {
                h.join().map_err(|_| "a producer thread panicked".to_string())??;
            }
            Ok(())
        })?;
        produce_secs += start.elapsed().as_secs_f64();
        for l in latencies.lock().map_err(err)?.iter() {
            hist.saturating_record(*l);
        }
    }
    let produce = mib_s(bytes_per_batch * args.mib as u64, produce_secs);
    let raw = mib_s((args.mib * MIB) as u64, raw_secs);
    let lat = Latency::from_nanos(&hist);
    table(
        &format!(
            "produce to {} ({} partitions, {} connections, 1 MiB batches, acks=1, fsync=always)",
            args.brokers, args.partitions, args.connections
        ),
        &[
            ("produce", produce, "MiB/s"),
            ("raw O_DIRECT write (1 MiB, QD1)", raw, "MiB/s"),
            ("  ratio produce / raw", produce / raw, ""),
            ("request p50", lat.p50_us, "us"),
            ("request p99", lat.p99_us, "us"),
            ("request p99.9", lat.p999_us, "us"),
            ("request max", lat.max_us, "us"),
        ],
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "produce",
            "produce_mib_s": round2(produce),
            "p50_us": round2(lat.p50_us),
            "p99_us": round2(lat.p99_us),
            "p999_us": round2(lat.p999_us),
            "max_us": round2(lat.max_us),
            "raw_mib_s": round2(raw),
            "ratio": round2(produce / raw),
        })
    );
    Ok(())
}
