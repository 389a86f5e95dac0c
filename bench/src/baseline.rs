//! `strand-bench baseline`: the physical limits of this host, measured by
//! the project's own code — what every other figure is compared against.
//!
//! 1. Disk write: sequential O_DIRECT writes of one 1 MiB aligned buffer
//!    (queue depth 1) to a fresh file in `--dir`, in 8 slices with one
//!    fdatasync at the end of each. Between the slices, the durable disk
//!    write: the same writes to a second fresh file while another task
//!    fdatasyncs whenever a write completed since its last sync began
//!    (group commit's pattern with nothing else): the most a log can
//!    append durably into new file space here, where each such fdatasync
//!    also commits the file system's journal (bench/README).
//! 2. fdatasync latency: a 4 KiB overwrite then fdatasync, `--syncs` times
//!    (the floor under any `fsync=always` commit).
//! 3. Disk read: the file read back with O_DIRECT, 1 MiB at a time.
//! 4. Loopback TCP: one thread writes 1 MiB buffers to another over
//!    127.0.0.1, each pinned to its own core (cores 0 and 1 where there
//!    are two).
//! 5. CPU stalls under disk load: for `--stall-seconds`, one thread pinned
//!    to core 1 spins reading the clock while the disk thread repeats
//!    step 2's durable 4 KiB writes. A gap of 100 µs or more between two
//!    clock reads is time the thread wanted to run and did not: the host
//!    took the core (a virtual machine's CPU quota, which its disk
//!    emulation also spends, or a busy host), or the kernel did. Nothing
//!    here answers faster than its stalls allow: a machine that stalls
//!    50 ms of every second under disk load delays 5 % of what it serves
//!    meanwhile, so no p99 of a disk-writing workload can be below them.
//!    (Measured on the dev VM, 2026-12-01: a spinning thread alone loses
//!    nothing; with durable writes beside it, it loses 4–18 ms at every
//!    100 ms boundary — the period of a host CPU quota.)
//!
//! Last stdout line: JSON with `disk_write_mib_s`,
//! `disk_durable_write_mib_s`, `disk_read_mib_s`,
//! `fdatasync_p50_us` (and `_p99_us`), `loopback_mib_s`,
//! `cpu_stall_ms_per_s` (step 5's stalled time per second) and
//! `cpu_stall_max_us` (its longest stall).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use strand_storage::shard::ShardStorageConfig;
use strand_storage::{testkit, ShardStorage};

use crate::report::{mib_s, round2, table, Latency};
use crate::storage::{durable_write_slice, err, fresh_file, raw_write_slice, slices, MIB};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Directory on the disk to measure (a temporary file is made there).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// MiB written and read.
    #[arg(long, default_value_t = 1024)]
    pub mib: usize,
    /// fdatasyncs timed.
    #[arg(long, default_value_t = 300)]
    pub syncs: usize,
    /// MiB sent over loopback.
    #[arg(long, default_value_t = 2048)]
    pub loopback_mib: usize,
    /// Seconds of the CPU-stall probe (a thread spinning beside durable writes).
    #[arg(long, default_value_t = 3.0)]
    pub stall_seconds: f64,
}

/// The limits, as the suite uses them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub disk_write_mib_s: f64,
    /// Step 1's durable write: written and made durable as it goes.
    pub disk_durable_write_mib_s: f64,
    pub disk_read_mib_s: f64,
    pub fdatasync: Latency,
    pub loopback_mib_s: f64,
    pub cpu_stalls: CpuStalls,
}

/// Time a spinning thread did not run while durable writes went on beside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuStalls {
    /// Stalled ms per second.
    pub ms_per_s: f64,
    /// The longest stall, µs.
    pub max_us: f64,
}

impl Limits {
    pub fn json(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("disk_write_mib_s".into(), round2(self.disk_write_mib_s).into());
        m.insert(
            "disk_durable_write_mib_s".into(),
            round2(self.disk_durable_write_mib_s).into(),
        );
        m.insert("disk_read_mib_s".into(), round2(self.disk_read_mib_s).into());
        m.insert("fdatasync_p50_us".into(), round2(self.fdatasync.p50_us).into());
        m.insert("fdatasync_p99_us".into(), round2(self.fdatasync.p99_us).into());
        m.insert("loopback_mib_s".into(), round2(self.loopback_mib_s).into());
        m.insert("cpu_stall_ms_per_s".into(), round2(self.cpu_stalls.ms_per_s).into());
        m.insert("cpu_stall_max_us".into(), round2(self.cpu_stalls.max_us).into());
        m
    }

    pub fn print(&self) {
        table(
            "baseline: this host's limits",
            &[
                ("disk write, O_DIRECT 1 MiB QD1", self.disk_write_mib_s, "MiB/s"),
                (
                    "  durable: fdatasync as each write completes",
                    self.disk_durable_write_mib_s,
                    "MiB/s",
                ),
                ("disk read, O_DIRECT 1 MiB QD1", self.disk_read_mib_s, "MiB/s"),
                ("fdatasync after a 4 KiB overwrite, p50", self.fdatasync.p50_us, "us"),
                ("  p99", self.fdatasync.p99_us, "us"),
                ("loopback TCP, 1 MiB writes", self.loopback_mib_s, "MiB/s"),
                ("CPU stalls beside durable writes", self.cpu_stalls.ms_per_s, "ms/s"),
                ("  longest", self.cpu_stalls.max_us, "us"),
            ],
        );
    }
}

pub fn run(args: Args) -> Result<(), String> {
    let limits = measure(&args)?;
    limits.print();
    let mut json = limits.json();
    json.insert("scenario".into(), "baseline".into());
    println!("{}", serde_json::Value::Object(json));
    Ok(())
}

/// Measures every limit.
pub fn measure(args: &Args) -> Result<Limits, String> {
    if args.mib == 0 || args.syncs == 0 || args.loopback_mib == 0 {
        return Err("--mib, --syncs and --loopback-mib must be > 0".into());
    }
    if !(args.stall_seconds > 0.0 && args.stall_seconds <= 600.0) {
        return Err("--stall-seconds must be in (0, 600]".into());
    }
    let tmp = tempfile::Builder::new()
        .prefix("strand-bench-baseline-")
        .tempdir_in(&args.dir)
        .map_err(|e| format!("making a temporary directory in {}: {e}", args.dir.display()))?;
    let path = tmp.path().join("disk.bin");
    let (mib, syncs, stall) = (args.mib, args.syncs, Duration::from_secs_f64(args.stall_seconds));
    let (disk_write_mib_s, disk_durable_write_mib_s, disk_read_mib_s, fdatasync, cpu_stalls) =
        testkit::run_on_executor(move || async move { disk(&path, mib, syncs, stall).await })?;
    Ok(Limits {
        disk_write_mib_s,
        disk_durable_write_mib_s,
        disk_read_mib_s,
        fdatasync,
        loopback_mib_s: loopback(args.loopback_mib)?,
        cpu_stalls,
    })
}

/// Slices the disk writes are cut into, plain and durable alternating.
const WRITE_ROUNDS: usize = 8;

/// Gaps this long or longer between two clock reads of a spinning thread
/// count as stalls (timer ticks and interrupts take a few µs).
const STALL_MIN: Duration = Duration::from_micros(100);

/// Spins on `core` for `run`, reading the clock; returns the share of the
/// time lost to stalls ([`STALL_MIN`] or longer) and the longest one.
fn spin_for_stalls(core: usize, run: Duration) -> (f64, Duration) {
    pin(core);
    let start = Instant::now();
    let (mut last, mut stalled, mut longest) = (start, Duration::ZERO, Duration::ZERO);
    while last - start < run {
        let now = Instant::now();
        let gap = now - last;
        if gap >= STALL_MIN {
            stalled += gap;
            longest = longest.max(gap);
        }
        last = now;
    }
    (stalled.as_secs_f64() / (last - start).as_secs_f64(), longest)
}

async fn disk(
    path: &Path,
    mib: usize,
    syncs: usize,
    stall: Duration,
) -> Result<(f64, f64, f64, Latency, CpuStalls), String> {
    // glommio probes once per device, on the first file it opens, whether
    // polled reads work; an empty file wrongly answers yes. A shard's
    // storage opens its non-empty probe file first (see
    // `strand_storage::shard`), so open one beside the file.
    let dir = path.parent().ok_or("the disk file has no directory")?;
    let _storage = ShardStorage::open(dir.join("probe"), ShardStorageConfig::default())
        .await
        .map_err(err)?;
    let file = fresh_file(path).await?;
    let mut block = file.alloc_dma_buffer(MIB);
    testkit::fill_value(block.as_bytes_mut(), 7, 1);
    let block = Rc::new(block);
    // Plain and durable writes alternate in slices, so that both meet the
    // same conditions of a shared disk.
    let durable_path = dir.join("durable.bin");
    let durable = Rc::new(fresh_file(&durable_path).await?);
    let (mut write_secs, mut durable_secs) = (0.0, 0.0);
    for slice in slices(mib, WRITE_ROUNDS) {
        write_secs += raw_write_slice(&file, &block, slice.clone()).await?;
        durable_secs += durable_write_slice(&durable, &block, slice).await?.0;
    }
    durable.close_rc().await.map_err(err)?;
    std::fs::remove_file(&durable_path).map_err(err)?;
    let mut small = file.alloc_dma_buffer(4096);
    testkit::fill_value(small.as_bytes_mut(), 9, 1);
    let small = Rc::new(small);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(err)?;
    for _ in 0..syncs {
        file.write_rc_at(small.clone(), 0).await.map_err(err)?;
        let t = Instant::now();
        file.fdatasync().await.map_err(err)?;
        hist.saturating_record(t.elapsed().as_nanos() as u64);
    }
    // The same durable 4 KiB writes, back to back, while a thread spins on
    // another core.
    let spinner = std::thread::spawn(move || spin_for_stalls(1, stall));
    while !spinner.is_finished() {
        file.write_rc_at(small.clone(), 0).await.map_err(err)?;
        file.fdatasync().await.map_err(err)?;
    }
    let (share, longest) = spinner.join().map_err(|_| "the stall probe panicked".to_string())?;
    let cpu_stalls = CpuStalls {
        ms_per_s: share * 1000.0,
        max_us: longest.as_secs_f64() * 1e6,
    };
    file.close().await.map_err(err)?;
    drop((block, small));
    let file = glommio::io::DmaFile::open(path)
        .await
        .map_err(|e| format!("reopening: {e}"))?;
    let start = Instant::now();
    for i in 0..mib {
        let got = file
            .read_at_aligned((i * MIB) as u64, MIB)
            .await
            .map_err(|e| format!("reading {i} MiB: {e}"))?;
        if got.len() != MIB {
            return Err(format!("short read at {i} MiB"));
        }
    }
    let read_secs = start.elapsed().as_secs_f64();
    file.close().await.map_err(err)?;
    Ok((
        mib_s((mib * MIB) as u64, write_secs),
        mib_s((mib * MIB) as u64, durable_secs),
        mib_s((mib * MIB) as u64, read_secs),
        Latency::from_nanos(&hist),
        cpu_stalls,
    ))
}

/// Pins the calling thread to core `n` (modulo the cores there are).
fn pin(n: usize) {
    if let Some(cores) = core_affinity::get_core_ids() {
        if !cores.is_empty() {
            core_affinity::set_for_current(cores[n % cores.len()]);
        }
    }
}

/// MiB/s from one pinned thread to another over 127.0.0.1.
fn loopback(mib: usize) -> Result<f64, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    let sender = std::thread::spawn(move || -> Result<(), String> {
        pin(1);
        let mut s = std::net::TcpStream::connect(addr).map_err(err)?;
        let buf = vec![0x5au8; MIB];
        for _ in 0..mib {
            s.write_all(&buf).map_err(err)?;
        }
        Ok(())
    });
    // The receiver pins a thread of its own too: pinning the caller would
    // pin everything it starts later (the suite's broker among them).
    let receiver = std::thread::spawn(move || -> Result<(usize, f64), String> {
        pin(0);
        let (mut conn, _) = listener.accept().map_err(err)?;
        let mut buf = vec![0u8; MIB];
        let mut got = 0usize;
        let start = Instant::now();
        while got < mib * MIB {
            let n = conn.read(&mut buf).map_err(err)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok((got, start.elapsed().as_secs_f64()))
    });
    let (got, secs) = receiver
        .join()
        .map_err(|_| "the loopback receiver panicked".to_string())??;
    sender
        .join()
        .map_err(|_| "the loopback sender panicked".to_string())??;
    if got < mib * MIB {
        return Err(format!("loopback: {got} of {} bytes arrived", mib * MIB));
    }
    Ok(mib_s(got as u64, secs))
}
