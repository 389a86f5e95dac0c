//! `strand-bench suite [--quick] [--save]`: the standard scenarios on a
//! broker of its own, with a report to plan capacity by.
//!
//! Starts `strand serve` (the binary beside this one, or `--strand`) on
//! 127.0.0.1 with a fresh data directory in `--dir`, measures `baseline`,
//! then runs (every producer with the client's defaults: idempotent, up to
//! 5 requests in flight per partition):
//! 1. one producer, 1,000-byte records, 1 MiB batches (linger 5 ms:
//!    [`THROUGHPUT_LINGER_MS`]), acks=1, fsync=always, one partition:
//!    throughput;
//! 2. the same with 8 partitions and 4 producers;
//! 3. 100-byte records, linger 0, acks=1, 5,000 records/s (open loop),
//!    fsync=interval: latency;
//! 4. one consumer catching up on a backlog (2 GiB; 256 MiB with `--quick`)
//!    written like (1), then the broker's RSS; (4b) one consumer reading
//!    the first 9 MiB of a 12 MiB backlog 20 times over (`consume
//!    --passes`), which the partition's tail cache holds: the rate the
//!    broker serves from memory;
//! 5. produce → consume latency at half of (1)'s throughput;
//! 6. the daily load (issue 27): a billion 1 KB records a day, 11,600/s
//!    open loop, keyed (10,000 uniform keys) over 100 partitions of an
//!    `fsync=always` queue, 2 producers, linger 0, acks=all, for 60 s (30 s
//!    with `--quick`); then the same at five times the rate (`s6x5`), and
//!    at the daily rate with a linger of [`DAILY_LINGER_MS`] (Kafka 4's
//!    default: each connection's lingering batches ride in one request,
//!    `s6L`);
//!
//! and, first of all, the broker's RSS before and after creating 1,000
//! partitions. Each scenario's row also gives the average produce request
//! the broker stored meanwhile (`strand_produce_bytes_total` ÷
//! `strand_produce_requests_total`: whether the batches reached their
//! size; `sN_produce_request_kib` in the JSON), the broker's reactor stalls
//! per second while it ran (`strand_reactor_stalls_total`: a shard's 10 ms
//! timer woke more than 500 µs late, because a task or the host held the
//! shard), and in brackets those its thread spent mostly off the CPU
//! (`strand_reactor_stalls_off_cpu_total`: the OS or the host held it):
//! where those are frequent, the latency tail is the machine's (see
//! `baseline`'s CPU stalls); the records per produce request; the broker
//! process's own busy cores (`/proc/PID/stat`, `sN_broker_cores`) beside
//! the machine's; and its flushes per second: fdatasyncs, write-through
//! writes and shard journal frames (`strand_fsync_latency_seconds_count` +
//! `strand_write_through_writes_total` + `strand_journal_frames_total`,
//! `sN_fsyncs_per_s`). It stops
//! the broker, removes its data, prints a markdown report and, last, one
//! JSON line: `produce_vs_durable_limit` (= (1) MiB/s ÷ min(durable disk
//! write, loopback): what the disk can take durably into new file space,
//! the limit an `fsync=always` queue can reach), `produce_vs_limit` (= (1)
//! MiB/s ÷ min(disk write, loopback)),
//! `consume_vs_limit` (= (4) MiB/s ÷ min(disk read, loopback)),
//! `small_p50_us`, `small_p99_us`, `small_p999_us`, `e2e_p99_us`,
//! `tail_consume_mib_s`, and every
//! scenario's figures. `--save` also writes the report to
//! `bench/results/<date>-<host>.md` (`-2`, `-3`, ... when that exists).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::baseline::{self, Limits};
use crate::load::{self, Keys, Outcome};
use crate::report::round2;
use crate::storage::err;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Smaller sizes and shorter runs (about two minutes in all).
    #[arg(long)]
    quick: bool,
    /// Also write the report to bench/results/<date>-<host>.md.
    #[arg(long)]
    save: bool,
    /// The `strand` binary [default: the one beside strand-bench].
    #[arg(long)]
    strand: Option<PathBuf>,
    /// Where the broker's data and the baseline's file go.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// Shards of the broker [default: every core].
    #[arg(long)]
    cores: Option<usize>,
}

/// A broker this run started; stopped (and its data removed) when dropped.
pub(crate) struct OwnBroker {
    child: Child,
    pub(crate) addr: String,
    /// Where its Prometheus metrics are served (host:port).
    metrics: String,
    _data: tempfile::TempDir,
}

impl OwnBroker {
    pub(crate) fn start(strand: &PathBuf, dir: &PathBuf, cores: Option<usize>) -> Result<OwnBroker, String> {
        let data = tempfile::Builder::new()
            .prefix("strand-bench-suite-")
            .tempdir_in(dir)
            .map_err(|e| format!("making a data directory in {}: {e}", dir.display()))?;
        let mut cmd = Command::new(strand);
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data.path());
        if let Some(c) = cores {
            cmd.args(["--cores", &c.to_string()]);
        }
        let mut child = cmd
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                format!(
                    "starting {}: {e} (build it first: cargo build --release -p strand-broker)",
                    strand.display()
                )
            })?;
        let stdout = child.stdout.take().ok_or("no stdout from strand")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut broker = OwnBroker {
            child,
            addr: String::new(),
            metrics: String::new(),
            _data: data,
        };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "the broker printed no ready line within 60 s".to_string())?;
        broker.addr = line
            .split_whitespace()
            .nth(3)
            .filter(|_| line.contains("ready"))
            .ok_or_else(|| format!("unexpected first line from the broker: {line}"))?
            .to_string();
        broker.metrics = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .ok_or_else(|| format!("no metrics address in the broker's ready line: {line}"))?
            .to_string();
        Ok(broker)
    }

    /// The broker's counters so far that the report shows per scenario.
    pub(crate) fn counters(&self) -> Result<Counters, String> {
        use std::io::{Read, Write};
        let mut conn =
            std::net::TcpStream::connect(&self.metrics).map_err(|e| format!("scraping {}: {e}", self.metrics))?;
        conn.set_read_timeout(Some(Duration::from_secs(10))).map_err(err)?;
        write!(conn, "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n", self.metrics).map_err(err)?;
        let mut text = String::new();
        conn.read_to_string(&mut text)
            .map_err(|e| format!("scraping {}: {e}", self.metrics))?;
        Ok(Counters::from_metrics(&text))
    }

    /// Runs `scenario`, and says what the broker counted meanwhile.
    fn measure_during<T>(&self, scenario: impl FnOnce() -> Result<T, String>) -> Result<(T, BrokerSide), String> {
        let (before, start) = (self.counters_and_cpu()?, Instant::now());
        let out = scenario()?;
        let after = self.counters_and_cpu()?;
        Ok((out, BrokerSide::between(&before, &after, start.elapsed().as_secs_f64())))
    }

    /// This broker's counters, with the CPU its process has used.
    fn counters_and_cpu(&self) -> Result<Counters, String> {
        let cpu_s = crate::report::process_cpu_s(self.child.id()).ok_or("the broker's /proc/PID/stat is gone")?;
        Ok(Counters {
            cpu_s,
            ..self.counters()?
        })
    }

    /// Resident memory of the broker process, MiB.
    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        // SAFETY: kill sends SIGTERM to the child this run started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The linger of the throughput scenarios (1) and (2) and of the backlog
/// written for (4). With 0, a request slot that frees takes whatever has
/// gathered: (2)'s "1 MiB" batches averaged 0.5 MiB and it ran at 910–1006
/// MiB/s, against full batches and 1154–1192 MiB/s with 5 ms (two pairs of
/// `strand-bench produce --seconds 5 --partitions 8 --producers 4
/// --linger-ms 0|5`). (1)'s one partition has its batches full either way
/// (its producer is held by backpressure); the linger makes sure of it.
const THROUGHPUT_LINGER_MS: u64 = 5;

fn load_args(addr: &str) -> load::Args {
    load::Args {
        brokers: addr.to_string(),
        queue: None,
        queues: 1,
        partitions: 1,
        producers: 1,
        consumers: 1,
        message_bytes: 1000,
        keys: Keys::None,
        batch_bytes: 1 << 20,
        linger_ms: 0,
        acks: "1".into(),
        fsync: "always".into(),
        seconds: 10,
        count: None,
        rate: None,
        max_in_flight: strand_client::IDEMPOTENT_MAX_IN_FLIGHT,
        max_requests_per_connection: strand_client::DEFAULT_MAX_REQUESTS_PER_CONNECTION,
        in_flight: None,
        broker_pid: None,
        passes: 1,
    }
}

/// The daily load of scenario (6): a billion 1 KB records a day.
const DAILY_RATE: u64 = 11_600;
/// Scenario (6L)'s linger: Kafka 4's default `linger.ms`.
const DAILY_LINGER_MS: u64 = 5;

/// Scenario (6)'s load at `rate` records/s: 100 partitions of a fresh
/// `fsync=always` queue, 2 producers, 10,000 uniform keys, linger 0,
/// acks=all, open loop.
fn daily_load_args(addr: &str, rate: u64) -> load::Args {
    load::Args {
        partitions: 100,
        producers: 2,
        keys: Keys::Uniform(10_000),
        rate: Some(rate),
        acks: "all".into(),
        ..load_args(addr)
    }
}

/// Records of the tail-cache scenario (4b): 12 MiB of ~1 KiB records, well
/// inside a partition's 16 MiB tail cache, of which each pass reads the
/// first 9 MiB (so that no pass ends in long polls at the tail).
const TAIL_RECORDS: u64 = 12 << 10;
const TAIL_PASS_RECORDS: u64 = 9 << 10;
/// Passes over it (after one warm-up pass).
const TAIL_PASSES: u32 = 20;
/// Issue target for serving from the tail cache, MiB/s.
const TAIL_TARGET_MIB_S: f64 = 1536.0;

/// A fresh one-partition queue holding `records` records written like (1);
/// its name.
fn filled_queue(admin: &strand_client::Admin, addr: &str, prefix: &str, records: u64) -> Result<String, String> {
    let queue = load::fresh_queue(admin, prefix, 1, strand_client::FsyncSpec::Always)?;
    load::produce(&load::Args {
        queue: Some(queue.clone()),
        count: Some(records),
        seconds: 3600,
        linger_ms: THROUGHPUT_LINGER_MS,
        ..load_args(addr)
    })?;
    Ok(queue)
}

/// The date (UTC) as YYYY-MM-DD, from the system clock.
fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The sum of every sample of metric `name` in a Prometheus text page.
fn sum_of(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Counters the broker exports, summed over shards and queues.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Counters {
    /// `strand_reactor_stalls_total`.
    stalls: f64,
    /// `strand_reactor_stalls_off_cpu_total`.
    stalls_off_cpu: f64,
    /// `strand_produce_requests_total`.
    pub(crate) produce_requests: f64,
    /// `strand_produce_bytes_total`.
    produce_bytes: f64,
    /// Every flush: fdatasyncs, write-through writes and shard journal
    /// frames (`strand_fsync_latency_seconds_count`,
    /// `strand_write_through_writes_total`, `strand_journal_frames_total`).
    fsyncs: f64,
    /// The broker process's CPU seconds (not from its metrics: set by
    /// `OwnBroker::counters_and_cpu`).
    cpu_s: f64,
}

impl Counters {
    fn from_metrics(text: &str) -> Counters {
        Counters {
            stalls: sum_of(text, "strand_reactor_stalls_total"),
            stalls_off_cpu: sum_of(text, "strand_reactor_stalls_off_cpu_total"),
            produce_requests: sum_of(text, "strand_produce_requests_total"),
            produce_bytes: sum_of(text, "strand_produce_bytes_total"),
            fsyncs: sum_of(text, "strand_fsync_latency_seconds_count")
                + sum_of(text, "strand_write_through_writes_total")
                + sum_of(text, "strand_journal_frames_total"),
            cpu_s: 0.0,
        }
    }
}

/// What the broker saw during a scenario: its reactor stalls per second —
/// all, and those its shards' threads spent mostly off the CPU (the
/// machine's doing) — and the average produce request it stored (whether
/// the producers' batches reached their size), if it got any.
#[derive(Clone, Copy)]
struct BrokerSide {
    stalls_per_s: f64,
    stalls_off_cpu_per_s: f64,
    produce_request_kib: Option<f64>,
    /// Produce requests the broker served.
    produce_requests: f64,
    /// The broker process's busy cores (its own CPU, not the machine's).
    cores: f64,
    fsyncs_per_s: f64,
}

impl BrokerSide {
    fn between(before: &Counters, after: &Counters, secs: f64) -> BrokerSide {
        let secs = secs.max(1e-9);
        let requests = after.produce_requests - before.produce_requests;
        BrokerSide {
            stalls_per_s: (after.stalls - before.stalls) / secs,
            stalls_off_cpu_per_s: (after.stalls_off_cpu - before.stalls_off_cpu) / secs,
            produce_request_kib: (requests > 0.0)
                .then(|| (after.produce_bytes - before.produce_bytes) / requests / 1024.0),
            produce_requests: requests,
            cores: (after.cpu_s - before.cpu_s) / secs,
            fsyncs_per_s: (after.fsyncs - before.fsyncs) / secs,
        }
    }
}

fn row(name: &str, o: &Outcome, broker: BrokerSide) -> String {
    let request = match broker.produce_request_kib {
        Some(k) if k < 10.0 => format!("{k:.2}"),
        Some(k) => format!("{k:.0}"),
        None => "—".to_string(),
    };
    let per_request = if broker.produce_requests > 0.0 {
        format!("{:.1}", o.records as f64 / broker.produce_requests)
    } else {
        "—".to_string()
    };
    format!(
        "| {name} | {:.0} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {request} | {per_request} | {:.1} ({:.1}) | {:.2} | {:.0} | {:.2} | {:.2} |",
        o.msgs_s(),
        o.mib_s(),
        o.latency.p50_us,
        o.latency.p99_us,
        o.latency.p999_us,
        o.latency.max_us,
        broker.stalls_per_s,
        broker.stalls_off_cpu_per_s,
        broker.cores,
        broker.fsyncs_per_s,
        o.cores_busy(),
        o.cpu_s_per_gib()
    )
}

pub fn run(args: Args) -> Result<(), String> {
    let strand = match &args.strand {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(err)?.with_file_name("strand"),
    };
    let daily_secs = if args.quick { 30 } else { 60 };
    let (secs, backlog_mib, base) = if args.quick {
        (
            3,
            256,
            baseline::Args {
                dir: args.dir.clone(),
                mib: 256,
                syncs: 100,
                loopback_mib: 512,
                stall_seconds: 1.0,
            },
        )
    } else {
        (
            10,
            2048,
            baseline::Args {
                dir: args.dir.clone(),
                mib: 1024,
                syncs: 300,
                loopback_mib: 2048,
                stall_seconds: 3.0,
            },
        )
    };
    eprintln!("suite: baseline");
    let limits: Limits = baseline::measure(&base)?;
    let broker = OwnBroker::start(&strand, &args.dir, args.cores)?;
    let addr = broker.addr.clone();
    let rss_start = broker.rss_mib();
    // First, while the heap holds nothing freed that new partitions could
    // reuse unseen.
    let admin = strand_client::Admin::connect(&addr).map_err(err)?;
    eprintln!("suite: 1,000 partitions");
    let before = broker.rss_mib();
    load::fresh_queue(&admin, "bench-partitions", 1000, strand_client::FsyncSpec::Always)?;
    std::thread::sleep(Duration::from_secs(1));
    let after = broker.rss_mib();
    let per_partition_kib = (after - before).max(0.0) * 1024.0 / 1000.0;

    eprintln!("suite: (1) one producer, 1 MiB batches, fsync=always");
    let (one, one_broker) = broker.measure_during(|| {
        load::produce(&load::Args {
            seconds: secs,
            linger_ms: THROUGHPUT_LINGER_MS,
            ..load_args(&addr)
        })
    })?;
    eprintln!("suite: (2) 8 partitions, 4 producers");
    let (two, two_broker) = broker.measure_during(|| {
        load::produce(&load::Args {
            seconds: secs,
            partitions: 8,
            producers: 4,
            linger_ms: THROUGHPUT_LINGER_MS,
            ..load_args(&addr)
        })
    })?;
    eprintln!("suite: (3) small records at 5,000/s");
    let (three, three_broker) = broker.measure_during(|| {
        load::produce(&load::Args {
            seconds: secs,
            message_bytes: 100,
            rate: Some(5000),
            fsync: "interval".into(),
            ..load_args(&addr)
        })
    })?;
    eprintln!("suite: (4) a consumer catching up on {backlog_mib} MiB");
    let records = (backlog_mib as u64) << 20 >> 10; // ~1 KiB each
    let backlog = filled_queue(&admin, &addr, "bench-backlog", records)?;
    let (four, four_broker) = broker.measure_during(|| {
        load::consume(&load::Args {
            queue: Some(backlog),
            count: Some(records),
            seconds: 600,
            ..load_args(&addr)
        })
    })?;
    let rss_after_backlog = broker.rss_mib();
    eprintln!("suite: (4b) a consumer re-reading 9 MiB from the tail cache");
    let tail = filled_queue(&admin, &addr, "bench-tail", TAIL_RECORDS)?;
    let (four_tail, four_tail_broker) = broker.measure_during(|| {
        load::consume(&load::Args {
            queue: Some(tail),
            count: Some(TAIL_PASS_RECORDS),
            passes: TAIL_PASSES,
            seconds: 600,
            ..load_args(&addr)
        })
    })?;
    eprintln!("suite: (5) produce → consume at half of (1)");
    let rate = ((one.msgs_s() / 2.0) as u64).max(1);
    let (five, five_broker) = broker.measure_during(|| {
        load::e2e(&load::Args {
            seconds: secs,
            rate: Some(rate),
            ..load_args(&addr)
        })
    })?;
    let daily = |rate: u64, linger_ms: u64| {
        broker.measure_during(|| {
            load::produce(&load::Args {
                seconds: daily_secs,
                linger_ms,
                ..daily_load_args(&addr, rate)
            })
        })
    };
    eprintln!("suite: (6) the daily load: {DAILY_RATE}/s over 100 partitions, acks=all, fsync=always");
    let (six, six_broker) = daily(DAILY_RATE, 0)?;
    eprintln!("suite: (6×5) the same at {}/s", 5 * DAILY_RATE);
    let (six_x5, six_x5_broker) = daily(5 * DAILY_RATE, 0)?;
    eprintln!("suite: (6L) the daily load with linger {DAILY_LINGER_MS} ms");
    let (six_linger, six_linger_broker) = daily(DAILY_RATE, DAILY_LINGER_MS)?;
    drop(broker);

    let produce_limit = limits.disk_write_mib_s.min(limits.loopback_mib_s);
    let consume_limit = limits.disk_read_mib_s.min(limits.loopback_mib_s);
    let produce_vs_limit = one.mib_s() / produce_limit.max(1e-9);
    let durable_limit = limits.disk_durable_write_mib_s.min(limits.loopback_mib_s);
    let produce_vs_durable_limit = one.mib_s() / durable_limit.max(1e-9);
    let consume_vs_limit = four.mib_s() / consume_limit.max(1e-9);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    let cpus = core_affinity::get_core_ids().map_or(1, |c| c.len());
    let mut md = String::new();
    md.push_str(&format!(
        "# strand-bench suite{} — {} on {host} ({cpus} cores)\n\n",
        if args.quick { " --quick" } else { "" },
        today()
    ));
    md.push_str("## Limits of this host (baseline)\n\n| measure | value |\n|---|---|\n");
    md.push_str(&format!(
        "| disk write, O_DIRECT 1 MiB QD1 | {:.0} MiB/s |\n\
         | durable disk write (fdatasync as each write completes) | {:.0} MiB/s |\n| disk read, O_DIRECT 1 MiB QD1 | {:.0} MiB/s |\n\
         | fdatasync after a 4 KiB overwrite | p50 {:.0} µs, p99 {:.0} µs |\n| loopback TCP | {:.0} MiB/s |\n\
         | CPU stalls beside durable 4 KiB writes | {:.1} ms per s, longest {:.0} µs |\n\n",
        limits.disk_write_mib_s,
        limits.disk_durable_write_mib_s,
        limits.disk_read_mib_s,
        limits.fdatasync.p50_us,
        limits.fdatasync.p99_us,
        limits.loopback_mib_s,
        limits.cpu_stalls.ms_per_s,
        limits.cpu_stalls.max_us
    ));
    // Every scenario: its JSON key prefix, its row's name, what it measured
    // and what the broker counted meanwhile.
    let one_label = format!(
        "(1) 1 producer (idempotent, 5 in flight), 1 KB records, 1 MiB batches (linger {THROUGHPUT_LINGER_MS} ms), \
         acks=1, fsync=always, 1 partition"
    );
    let six_label = format!(
        "(6) daily load: 1 KB records keyed uniform:10,000 at {DAILY_RATE}/s (open loop) over 100 partitions, \
         2 producers, linger 0, acks=all, fsync=always"
    );
    let six_linger_label = format!("(6L) as (6), linger {DAILY_LINGER_MS} ms");
    let scenarios = [
        ("s1", one_label.as_str(), &one, one_broker),
        ("s2", "(2) as (1), 8 partitions, 4 producers", &two, two_broker),
        (
            "s3",
            "(3) 100 B records, linger 0, 5,000/s, acks=1, fsync=interval",
            &three,
            three_broker,
        ),
        (
            "s4",
            "(4) 1 consumer catching up on the backlog (latency: per poll)",
            &four,
            four_broker,
        ),
        (
            "s4b",
            "(4b) 1 consumer re-reading 9 MiB from the tail cache, 20 passes (latency: per poll)",
            &four_tail,
            four_tail_broker,
        ),
        (
            "s5",
            "(5) produce → consume at half of (1)'s rate (latency: end to end)",
            &five,
            five_broker,
        ),
        ("s6", six_label.as_str(), &six, six_broker),
        ("s6x5", "(6×5) as (6) at five times the rate", &six_x5, six_x5_broker),
        ("s6L", six_linger_label.as_str(), &six_linger, six_linger_broker),
    ];
    md.push_str(
        "## Scenarios\n\n| scenario | msg/s | MiB/s | p50 µs | p99 µs | p99.9 µs | max µs | KiB per produce request \
         | records per produce request | broker stalls/s (off CPU) | broker cores | broker fsyncs/s | machine cores busy \
         | CPU s/GiB |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (_, name, o, broker) in &scenarios {
        md.push_str(&row(name, o, *broker));
        md.push('\n');
    }
    md.push_str(&format!(
        "\n## Against the limits\n\n\
         - produce_vs_durable_limit = (1) ÷ min(durable disk write, loopback) = {:.2}\n\
         - produce_vs_limit = (1) ÷ min(disk write, loopback) = {:.2}\n\
         - consume_vs_limit = (4) ÷ min(disk read, loopback) = {:.2}\n\
         - tail_consume_mib_s = (4b) = {:.0} MiB/s (target {TAIL_TARGET_MIB_S:.0})\n\n## Memory (broker RSS)\n\n\
         - at start: {rss_start:.0} MiB; after the backlog and its catch-up: {rss_after_backlog:.0} MiB\n\
         - 1,000 more partitions: {before:.1} → {after:.1} MiB ({per_partition_kib:.1} KiB per partition)\n\n\
         Reproduce: `cargo build --release -p strand-broker -p strand-bench && target/release/strand-bench suite{}`\n",
        produce_vs_durable_limit,
        produce_vs_limit,
        consume_vs_limit,
        four_tail.mib_s(),
        if args.quick { " --quick" } else { "" }
    ));
    println!("{md}");
    if args.save {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // A second suite the same day on the same host gets `-2`, `-3`, ...:
        // a saved report is never overwritten.
        let stem = format!("{}-{host}", today());
        let mut path = dir.join(format!("{stem}.md"));
        for n in 2.. {
            if !path.exists() {
                break;
            }
            path = dir.join(format!("{stem}-{n}.md"));
        }
        std::fs::write(&path, &md).map_err(|e| format!("writing {}: {e}", path.display()))?;
        eprintln!("suite: saved {}", path.display());
    }
    let mut json = limits.json();
    json.insert("scenario".into(), "suite".into());
    json.insert("quick".into(), args.quick.into());
    json.insert(
        "produce_vs_durable_limit".into(),
        round2(produce_vs_durable_limit).into(),
    );
    json.insert("produce_vs_limit".into(), round2(produce_vs_limit).into());
    json.insert("consume_vs_limit".into(), round2(consume_vs_limit).into());
    json.insert("small_p50_us".into(), round2(three.latency.p50_us).into());
    json.insert("small_p99_us".into(), round2(three.latency.p99_us).into());
    json.insert("small_p999_us".into(), round2(three.latency.p999_us).into());
    json.insert("e2e_p99_us".into(), round2(five.latency.p99_us).into());
    json.insert("tail_consume_mib_s".into(), round2(four_tail.mib_s()).into());
    json.insert("rss_after_backlog_mib".into(), round2(rss_after_backlog).into());
    json.insert("rss_per_partition_kib".into(), round2(per_partition_kib).into());
    for (name, _, o, broker) in scenarios {
        json.insert(format!("{name}_msgs_s"), round2(o.msgs_s()).into());
        json.insert(format!("{name}_mib_s"), round2(o.mib_s()).into());
        json.insert(format!("{name}_p50_us"), round2(o.latency.p50_us).into());
        json.insert(format!("{name}_p99_us"), round2(o.latency.p99_us).into());
        json.insert(format!("{name}_p999_us"), round2(o.latency.p999_us).into());
        json.insert(format!("{name}_broker_cores"), round2(broker.cores).into());
        json.insert(format!("{name}_fsyncs_per_s"), round2(broker.fsyncs_per_s).into());
        json.insert(format!("{name}_stalls_per_s"), round2(broker.stalls_per_s).into());
        json.insert(
            format!("{name}_stalls_off_cpu_per_s"),
            round2(broker.stalls_off_cpu_per_s).into(),
        );
        if let Some(kib) = broker.produce_request_kib {
            json.insert(format!("{name}_produce_request_kib"), round2(kib).into());
        }
        json.insert(format!("{name}_cpu_s_per_gib"), round2(o.cpu_s_per_gib()).into());
    }
    println!("{}", serde_json::Value::Object(json));
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_a_metric_over_its_series_only() {
        let text = "# TYPE strand_reactor_stalls counter\n\
                    strand_reactor_stalls_total{shard=\"0\"} 3\n\
                    strand_reactor_stalls_total{shard=\"1\"} 4.5\n\
                    strand_reactor_stalls_totally_else 100\n\
                    strand_reactor_stalls_created{shard=\"0\"} 7\n";
        assert_eq!(super::sum_of(text, "strand_reactor_stalls_total"), 7.5);
        assert_eq!(super::sum_of(text, "strand_absent_total"), 0.0);
    }

    #[test]
    fn the_broker_side_of_a_scenario_is_the_difference_of_its_counters() {
        use super::{BrokerSide, Counters};
        let text = "strand_produce_requests_total{queue=\"a\"} 10\n\
                    strand_produce_requests_total{queue=\"b\"} 6\n\
                    strand_produce_bytes_total{queue=\"a\"} 8388608\n\
                    strand_reactor_stalls_total{shard=\"1\"} 9\n\
                    strand_reactor_stalls_off_cpu_total{shard=\"1\"} 4\n\
                    strand_fsync_latency_seconds_count 30\n\
                    strand_fsync_latency_seconds_sum 0.5\n";
        let mut after = Counters::from_metrics(text);
        assert_eq!(
            after,
            Counters {
                stalls: 9.0,
                stalls_off_cpu: 4.0,
                produce_requests: 16.0,
                produce_bytes: 8388608.0,
                fsyncs: 30.0,
                cpu_s: 0.0,
            }
        );
        after.cpu_s = 3.0;
        let before = Counters {
            produce_requests: 8.0,
            produce_bytes: 0.0,
            stalls: 1.0,
            fsyncs: 10.0,
            cpu_s: 2.0,
            ..Counters::default()
        };
        let side = BrokerSide::between(&before, &after, 2.0);
        assert_eq!((side.stalls_per_s, side.stalls_off_cpu_per_s), (4.0, 2.0));
        assert_eq!(side.produce_request_kib, Some(1024.0));
        assert_eq!((side.produce_requests, side.cores, side.fsyncs_per_s), (8.0, 0.5, 10.0));
        // A consume-only scenario stored no produce request.
        assert_eq!(BrokerSide::between(&after, &after, 1.0).produce_request_kib, None);
    }

    #[test]
    fn today_is_a_date() {
        let d = super::today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"), "{d}");
        assert_eq!(&d[4..5], "-");
    }
}
