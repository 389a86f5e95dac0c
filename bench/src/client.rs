//! `strand-bench client`: what an application gets through strand-client's
//! [`Producer`], against a running broker.
//!
//! 1. **Small-message latency.** One producer (acks=1, linger 0) sends
//!    `--small-bytes` records at a fixed `--rate` for `--seconds`; the
//!    sending thread awaits each, and each latency runs from the moment the
//!    record was *due* to its acknowledgement, so a stall counts against
//!    every record it delayed (no coordinated omission). The same records
//!    as bare produce requests give the floor. Run once on a queue with `fsync=interval`
//!    (acknowledged when stored in the page cache's path, like Kafka's
//!    acks=1) and once with `fsync=always` (acknowledged when fdatasync'd).
//! 2. **Batched throughput.** `--mib` MiB of 1,000-byte keyless records
//!    through the producer (batch bytes 1 MiB, linger `--linger-ms`, acks=1,
//!    fsync=always, `--partitions` partitions), after an untimed warm-up of
//!    128 MiB, alternating in `--rounds` slices with the
//!    raw-protocol figure: pre-built 1 MiB batches sent as produce requests
//!    over one connection each per partition, one request in flight each —
//!    the same pattern the producer uses, without its per-record work.
//!
//! Last stdout line: JSON with `small_p50_us`, `small_p99_us`,
//! `small_p999_us`, `small_max_us` (fsync=interval), `small_raw_p50_us`,
//! `small_raw_p99_us`, `small_raw_p999_us` (the same records as bare
//! single-record requests on one connection: the floor),
//! `round_trip_p50_us`, `round_trip_p99_us` (ApiVersions: no log at all), the same with
//! `small_always_` prefixes, `producer_mib_s`, `raw_mib_s`,
//! `producer_vs_raw`, the machine's CPU per GiB on each side
//! (`producer_cpu_s_per_gib`, `raw_cpu_s_per_gib`), the enqueuing
//! thread's share of the producer's (`producer_enqueue_cpu_s_per_gib`: the
//! client library's per-record work) and the average batch the producer
//! sent (`producer_avg_batch_kib`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use strand_client::{
    block_on, requests, Acks, Admin, ClientError, Connection, Delivery, FsyncSpec, Producer, ProducerConfig,
};
use strand_wire::Api;

use crate::load::fresh_queue;
use crate::report::{cpu_s_per_gib, machine_cpu_s, mib_s, round2, table, Latency};
use crate::storage::{err, mib_batch, slices, RECORDS_PER_MIB_BATCH, RECORD_BYTES};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The broker.
    #[arg(long, default_value = "127.0.0.1:9400")]
    brokers: String,
    /// Small records per second.
    #[arg(long, default_value_t = 5000)]
    rate: u64,
    /// Seconds of small records, per fsync policy.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Bytes per small record's value.
    #[arg(long, default_value_t = 100)]
    small_bytes: usize,
    /// MiB through the producer (and as many raw).
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Partitions of the throughput queue.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Producer connections to the broker (partitions spread over them).
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// The producer's linger in the throughput phase (ms). With 0, a
    /// request slot that frees takes whatever records have gathered, and
    /// the "1 MiB" batches averaged 0.3–0.6 MiB here (1.7–3.6× the
    /// requests of the raw side); 5 ms (Kafka 4's default) fills them.
    #[arg(long, default_value_t = 5)]
    linger_ms: u64,
    /// Producer requests in flight per partition (throughput phase).
    #[arg(long, default_value_t = strand_client::IDEMPOTENT_MAX_IN_FLIGHT)]
    max_in_flight: usize,
    /// The client readers' busy poll while responses are due (µs; 0: none)
    /// for the latency phases.
    #[arg(long, default_value_t = 0)]
    busy_poll_us: u64,
}

/// Latencies recorded where each acknowledgement is learnt (a callback on
/// the client's reader thread), so no extra thread hand-off is measured.
struct Recorder {
    hist: Mutex<Histogram<u64>>,
    done: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl Recorder {
    fn record(&self, due: Instant, result: Result<(), String>) {
        let nanos = due.elapsed().as_nanos() as u64;
        match result {
            Ok(()) => {
                if let Ok(mut h) = self.hist.lock() {
                    h.saturating_record(nanos);
                }
            }
            Err(e) => {
                if let Ok(mut f) = self.failure.lock() {
                    f.get_or_insert(e);
                }
            }
        }
        self.done.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits (bounded) until `n` sends are acknowledged.
    fn wait_for(&self, n: u64) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.done.load(Ordering::SeqCst) < n {
            if Instant::now() > deadline {
                return Err("acknowledgements stopped coming".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match self.failure.lock().map_err(err)?.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Sends at a fixed rate (open loop: a send never waits for the one before);
/// `send(due, recorder)` must arrange for `recorder.record(due, result)` when
/// its acknowledgement comes. Each latency runs from the send's due time, so
/// a stall counts against every send it delayed (no coordinated omission).
fn paced(args: &Args, mut send: impl FnMut(Instant, Arc<Recorder>) -> Result<(), String>) -> Result<Latency, String> {
    crate::report::precise_sleeps();
    let recorder = Arc::new(Recorder {
        hist: Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(err)?),
        done: AtomicU64::new(0),
        failure: Mutex::new(None),
    });
    // Warm up (metadata, connection, first segment writes), then start over.
    for i in 0..200 {
        send(Instant::now(), recorder.clone())?;
        recorder.wait_for(i + 1)?;
    }
    recorder.hist.lock().map_err(err)?.reset();
    recorder.done.store(0, Ordering::SeqCst);
    let total = args.rate * args.seconds;
    let interval = Duration::from_nanos(1_000_000_000 / args.rate.max(1));
    let start = Instant::now();
    for i in 0..total {
        let due = start + interval * i as u32;
        // Sleep, never spin (on a small machine the broker and the client's
        // threads need the cores): sends leave within microseconds of their
        // due time (see wait_until).
        crate::report::wait_until(due);
        send(due, recorder.clone())?;
    }
    recorder.wait_for(total)?;
    let hist = recorder.hist.lock().map_err(err)?;
    Ok(Latency::from_nanos(&hist))
}

fn busy_poll(args: &Args) -> Duration {
    Duration::from_micros(args.busy_poll_us)
}

/// Small records through the producer (acks=1, linger 0).
fn small_latency(args: &Args, queue: &str) -> Result<Latency, String> {
    let producer = Producer::new(
        &args.brokers,
        ProducerConfig {
            acks: Acks::Leader,
            linger: Duration::ZERO,
            busy_poll: busy_poll(args),
            ..ProducerConfig::default()
        },
    )
    .map_err(err)?;
    let value = vec![b'v'; args.small_bytes];
    paced(args, |due, rec| {
        let d = block_on(producer.enqueue(queue, None, &value, &[])).map_err(err)?;
        d.on_done(move |r| rec.record(due, r.map(|_| ()).map_err(err)));
        Ok(())
    })
}

/// Sends one request whose response `check` reads, recording its latency.
fn timed_request(
    conn: &Connection,
    api: Api,
    body: &[u8],
    tail: strand_net::message::TailBuilder,
    due: Instant,
    rec: Arc<Recorder>,
    check: fn(&strand_net::Frame) -> Result<(), String>,
) -> Result<(), String> {
    conn.send(
        api,
        body,
        tail,
        Some(Box::new(move |r| {
            rec.record(due, r.map_err(err).and_then(|f| check(&f)))
        })),
    )
    .map_err(err)
}

/// ApiVersions round trips at the same rate: the network, the broker's
/// dispatch and the client's thread hand-offs, without the log.
fn round_trip_latency(args: &Args, addr: &str) -> Result<Latency, String> {
    let conn = Connection::connect_with(addr, busy_poll(args)).map_err(err)?;
    let mut fbb = strand_wire::flatbuffers::FlatBufferBuilder::new();
    let root =
        strand_wire::ApiVersionsRequest::create(&mut fbb, &strand_wire::ApiVersionsRequestArgs { client_name: None });
    fbb.finish_minimal(root);
    let body = fbb.finished_data().to_vec();
    paced(args, |due, rec| {
        timed_request(&conn, Api::ApiVersions, &body, Default::default(), due, rec, |_| Ok(()))
    })
}

/// The same records as single-record produce requests on a bare connection:
/// the floor the producer is measured against.
fn small_latency_raw(args: &Args, addr: &str, queue: &str) -> Result<Latency, String> {
    let conn = Connection::connect_with(addr, busy_poll(args)).map_err(err)?;
    let mut b = strand_wire::batch::BatchBuilder::new();
    b.push(None, Some(&vec![b'v'; args.small_bytes]), &[], 1_700_000_000_000);
    let batch = b.build().freeze();
    paced(args, |due, rec| {
        let (body, tail) = requests::produce(queue, 0, 1, batch.clone());
        timed_request(&conn, Api::Produce, &body, tail, due, rec, |f| {
            requests::produced(f).map(|_| ()).map_err(err)
        })
    })
}

/// Seconds to push `mib` MiB of 1,000-byte records through the producer.
fn producer_slice(producer: &Producer, queue: &str, mib: usize) -> Result<f64, ClientError> {
    let value = vec![b'p'; RECORD_BYTES];
    let records = mib * RECORDS_PER_MIB_BATCH as usize;
    let start = Instant::now();
    let mut waiting: VecDeque<Delivery> = VecDeque::new();
    for i in 0..records {
        waiting.push_back(block_on(producer.enqueue(queue, None, &value, &[]))?);
        // Now and then, drop what is acknowledged (checking after every
        // record cost more than the producer's own bookkeeping).
        if i % 256 != 0 {
            continue;
        }
        while let Some(d) = waiting.front_mut() {
            match block_on(futures_lite::future::poll_once(d)) {
                Some(r) => {
                    r?;
                    waiting.pop_front();
                }
                None => break,
            }
        }
    }
    block_on(producer.flush());
    for d in waiting {
        block_on(d)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds to send `batches` as raw produce requests, one connection per
/// partition with one request in flight each.
fn raw_slice(conns: &[Connection], queue: &str, batches: &[Bytes]) -> Result<f64, String> {
    let start = Instant::now();
    std::thread::scope(|scope| -> Result<(), String> {
        let handles: Vec<_> = conns
            .iter()
            .enumerate()
            .map(|(p, conn)| {
                scope.spawn(move || -> Result<(), String> {
                    for b in batches.iter().skip(p).step_by(conns.len()) {
                        let (body, tail) = requests::produce(queue, p as u32, 1, b.clone());
                        let frame = block_on(conn.request(Api::Produce, &body, tail)).map_err(err)?;
                        requests::produced(&frame).map_err(err)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a raw sender panicked".to_string())??;
        }
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64())
}

pub fn run(args: Args) -> Result<(), String> {
    if args.rate == 0 || args.seconds == 0 || args.mib == 0 || args.partitions == 0 {
        return Err("--rate, --seconds, --mib and --partitions must be > 0".into());
    }
    let first = strand_client::parse_brokers(&args.brokers).map_err(err)?[0].clone();
    let admin = Admin::connect(&first).map_err(err)?;

    let q = fresh_queue(&admin, "bench-small", 1, FsyncSpec::Interval { ms: 100, bytes: 0 })?;
    let small = small_latency(&args, &q)?;
    let small_raw = small_latency_raw(&args, &first, &q)?;
    let round_trip = round_trip_latency(&args, &first)?;
    let q = fresh_queue(&admin, "bench-small-always", 1, FsyncSpec::Always)?;
    let small_always = small_latency(&args, &q)?;

    let queue = fresh_queue(&admin, "bench-batched", args.partitions, FsyncSpec::Always)?;
    let config = ProducerConfig {
        acks: Acks::Leader,
        batch_bytes: 1 << 20,
        linger: Duration::from_millis(args.linger_ms),
        connections_per_broker: args.connections,
        max_in_flight_per_partition: args.max_in_flight,
        ..ProducerConfig::default()
    };
    // Twice the producer's buffer goes through it before the clock starts,
    // so that its memory is in use by then.
    let warm_up_mib = (2 * config.buffer_bytes) >> 20;
    let producer = Producer::new(&args.brokers, config).map_err(err)?;
    block_on(producer.send(&queue, None, b"warm-up", &[])).map_err(err)?;
    // Untimed, as building the raw side's batches is: a new producer's
    // first buffer-fulls of records page-fault its memory in (here its
    // first 128 MiB went at 598 MiB/s and 0.73 CPU s/GiB on the enqueuing
    // thread, the timed slices after it at 877 and 0.49: seventh session in
    // bench/results/history.md) — once per producer, not per GiB.
    producer_slice(&producer, &queue, warm_up_mib).map_err(err)?;
    let stats_before = producer.stats();
    let conns: Vec<Connection> = (0..args.partitions)
        .map(|_| Connection::connect(&first).map_err(err))
        .collect::<Result<_, _>>()?;
    let (mut producer_secs, mut raw_secs, mut raw_bytes) = (0.0, 0.0, 0u64);
    let (mut producer_bytes, mut producer_cpu, mut raw_cpu, mut enqueue_cpu) = (0u64, 0.0, 0.0, 0.0);
    // Odd rounds go raw first, even rounds producer first: neither side
    // always meets the disk (or the segment's pre-zeroing) in the same state.
    for (round, slice) in slices(args.mib, args.rounds).into_iter().enumerate() {
        let mib = slice.len();
        // Batches are built before the clock starts (client work the raw
        // figure leaves out).
        let batches: Vec<Bytes> = slice
            .map(|tag| mib_batch(tag as u64, 1_700_000_000_000).freeze())
            .collect();
        for side in [round % 2, 1 - round % 2] {
            let cpu = machine_cpu_s();
            if side == 0 {
                let thread_cpu = strand_storage::shard::thread_cpu_time();
                producer_secs += producer_slice(&producer, &queue, mib).map_err(err)?;
                enqueue_cpu += strand_storage::shard::thread_cpu_time()
                    .saturating_sub(thread_cpu)
                    .as_secs_f64();
                producer_bytes += (mib * RECORDS_PER_MIB_BATCH as usize * RECORD_BYTES) as u64;
                producer_cpu += machine_cpu_s() - cpu;
            } else {
                raw_secs += raw_slice(&conns, &queue, &batches)?;
                raw_bytes += (batches.len() * RECORDS_PER_MIB_BATCH as usize * RECORD_BYTES) as u64;
                raw_cpu += machine_cpu_s() - cpu;
            }
        }
    }
    let producer_mib = mib_s(producer_bytes, producer_secs);
    let raw_mib = mib_s(raw_bytes, raw_secs);
    // What the producer costs beyond the raw protocol shows here: on a
    // machine the bench shares with the broker, the client's CPU is the
    // broker's loss.
    let enqueue_cpu_gib = cpu_s_per_gib(enqueue_cpu, producer_bytes);
    let average_batch_kib = producer.stats().average_batch_bytes_since(&stats_before) as f64 / 1024.0;
    let (producer_cpu_gib, raw_cpu_gib) = (
        cpu_s_per_gib(producer_cpu, producer_bytes),
        cpu_s_per_gib(raw_cpu, raw_bytes),
    );
    table(
        &format!(
            "strand-client against {} ({} B records at {}/s for {} s; {} MiB of 1,000 B records over {} partitions)",
            args.brokers, args.small_bytes, args.rate, args.seconds, args.mib, args.partitions
        ),
        &[
            small.rows("small, fsync=interval: p50").as_slice(),
            &small_raw.rows("raw protocol, same records: p50"),
            &round_trip.rows("no-op round trip (ApiVersions): p50"),
            &small_always.rows("small, fsync=always: p50"),
            &[
                ("producer, 1 MiB batches (record values)", producer_mib, "MiB/s"),
                ("  machine CPU per GiB", producer_cpu_gib, "CPU s"),
                ("    of which the enqueuing thread", enqueue_cpu_gib, "CPU s"),
                ("  average batch sent", average_batch_kib, "KiB"),
                ("raw protocol, 1 MiB batches (record values)", raw_mib, "MiB/s"),
                ("  machine CPU per GiB", raw_cpu_gib, "CPU s"),
                ("  ratio producer / raw", producer_mib / raw_mib, ""),
            ],
        ]
        .concat(),
    );
    let mut summary = serde_json::json!({
        "scenario": "client",
        "producer_mib_s": round2(producer_mib),
        "raw_mib_s": round2(raw_mib),
        "producer_vs_raw": round2(producer_mib / raw_mib),
        "producer_cpu_s_per_gib": round2(producer_cpu_gib),
        "producer_enqueue_cpu_s_per_gib": round2(enqueue_cpu_gib),
        "producer_avg_batch_kib": round2(average_batch_kib),
        "raw_cpu_s_per_gib": round2(raw_cpu_gib),
    });
    if let Some(fields) = summary.as_object_mut() {
        for (prefix, latency) in [
            ("small_", &small),
            ("small_raw_", &small_raw),
            ("round_trip_", &round_trip),
            ("small_always_", &small_always),
        ] {
            fields.extend(latency.json(prefix));
        }
    }
    println!("{summary}");
    Ok(())
}
