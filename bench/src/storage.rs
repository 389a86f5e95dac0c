//! `strand-bench storage`: how close the partition log gets to the disk.
//!
//! Runs in one process, on one glommio executor, in a temporary directory
//! (removed at the end). Raw and log phases alternate in `--rounds` slices
//! so that both meet the same conditions on a shared, noisy disk:
//! 1. raw write: sequential O_DIRECT writes of one 1 MiB aligned buffer
//!    (queue depth 1) to a fresh file, one fdatasync at the end — the
//!    physical limit (of a new file: see bench/README on overwrites);
//! 2. durable raw write: the same writes to another fresh file while a
//!    second task fdatasyncs whenever a write completed since its last
//!    sync began (group commit without a log) — the limit of appends made
//!    durable as they go, on this file system: an fdatasync after extending
//!    writes also commits the journal (see bench/README);
//! 3. append: the log appends 1,000-byte records in ~1 MiB batches with
//!    `fsync=always`, from `--producers` concurrent producer tasks (each
//!    awaits durability before its next batch; group commit merges them);
//! 4. steady state: the same appends to a log with 64 MiB segments and
//!    192 MiB of size retention, filled past it before the clock starts,
//!    so every roll writes its new segment into the file retention frees
//!    (recycled: overwrites instead of extending writes) — a busy partition
//!    once its retention is reached;
//! 5. small batches: one producer appends 16 KiB batches and waits for each
//!    to be durable: commits per second and commit latency;
//! 6. read-back: the append log reopened (cold tail cache) and read from
//!    start to end in 1 MiB fetches, against a raw O_DIRECT sequential read
//!    of the raw file.
//! 7. with `--spare-segments` (an experiment, not run by default): could a
//!    spare next segment, prepared in the background, lift fresh-log
//!    appends to the overwrite rate? Durable raw writes (as in 2) into
//!    64 MiB segment files, alternating two ways of getting each next
//!    file: a new empty one (what a fresh log does), or a spare that a
//!    background task zero-filled and fdatasync'd while the previous
//!    segment was written (the first one before the clock starts), so the
//!    data's fdatasyncs are overwrites. The disk writes every byte twice
//!    in the second way; the question is whether overwrites' cheaper
//!    fdatasyncs pay for that.
//!
//! Last stdout line: a JSON object with `raw_mib_s`, `append_mib_s`,
//! `ratio` (append / raw), `durable_raw_mib_s`, `durable_ratio` (durable
//! raw / raw: what durability costs the disk alone), `append_vs_durable`
//! (append / durable raw: what the log costs beyond it),
//! `steady_append_mib_s`, `steady_ratio` (steady
//! append / raw), `small_batch_commits_s`, `small_batch_p50_us`,
//! `small_batch_p99_us`, `small_batch_p999_us`, `raw_read_mib_s`,
//! `read_mib_s`, `read_ratio`, and with `--spare-segments`
//! `spare_new_files_mib_s`, `spare_prepared_mib_s` and `spare_ratio`
//! (prepared ÷ new) — medians when `--runs` > 1.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use glommio::io::OpenOptions;
use hdrhistogram::Histogram;
use strand_storage::shard::ShardStorageConfig;
use strand_storage::{testkit, FsyncPolicy, LeaderEpoch, LogConfig, Offset, ShardStorage};

use crate::report::{median, mib_s, round2, table, Latency};

pub const MIB: usize = 1 << 20;
pub const RECORD_BYTES: usize = 1000;
/// Records per "1 MiB" batch: 1,000-byte values plus ~14 bytes of framing each.
pub const RECORDS_PER_MIB_BATCH: u32 = 1034;
/// A "1 MiB" batch of [`RECORDS_PER_MIB_BATCH`] 1,000-byte records, tagged
/// `tag`. The records' keys are `k{tag}` ([`testkit::batch`]), so a batch
/// grows a KiB per digit of the tag; the tag is taken modulo 1,000 so that
/// every batch stays within a broker's default 1 MiB message limit (with
/// four digits it is 1,049,444 bytes and the broker refuses it).
pub fn mib_batch(tag: u64, timestamp_ms: i64) -> BytesMut {
    testkit::batch(tag % 1000, RECORDS_PER_MIB_BATCH, RECORD_BYTES, timestamp_ms)
}

/// Records per 16 KiB batch.
const RECORDS_PER_SMALL_BATCH: u32 = 16;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Directory on the disk to measure; a temporary directory is made inside.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// MiB written by the raw and append phases each.
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Concurrent producers in the append phase.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Commits measured in the small-batch phase.
    #[arg(long, default_value_t = 3000)]
    small_commits: usize,
    /// Slices each phase is cut into, raw and log alternating, so both see
    /// the same conditions of a shared disk.
    #[arg(long, default_value_t = 8)]
    rounds: usize,
    /// Repeat the whole scenario and report medians.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Also run the spare-segment experiment (phase 7), `--mib` MiB each way.
    #[arg(long)]
    spare_segments: bool,
}

/// What [`write_phases`] measured (MiB/s).
struct WriteFigures {
    raw_mib_s: f64,
    durable_raw_mib_s: f64,
    append_mib_s: f64,
    steady_mib_s: f64,
}

/// One run's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    raw_mib_s: f64,
    durable_raw_mib_s: f64,
    append_mib_s: f64,
    steady_mib_s: f64,
    small_commits_s: f64,
    small: Latency,
    raw_read_mib_s: f64,
    read_mib_s: f64,
    /// Phase 7: (new files, prepared spares) MiB/s.
    spare: Option<(f64, f64)>,
}

pub fn run(args: Args) -> Result<(), String> {
    if args.mib == 0 || args.producers == 0 || args.small_commits == 0 || args.runs == 0 {
        return Err("--mib, --producers, --small-commits and --runs must be > 0".into());
    }
    let mut all = Vec::new();
    for i in 0..args.runs {
        let tmp = tempfile::Builder::new()
            .prefix("strand-bench-storage-")
            .tempdir_in(&args.dir)
            .map_err(|e| format!("making a temporary directory in {}: {e}", args.dir.display()))?;
        let path = tmp.path().to_path_buf();
        let a = args.clone();
        let figures = testkit::run_on_executor(move || async move { one_run(&path, &a).await })?;
        print_run(i + 1, &args, &figures);
        all.push(figures);
    }
    let med = |f: fn(&Figures) -> f64| round2(median(all.iter().map(f).collect()));
    let raw = med(|f| f.raw_mib_s);
    let append = med(|f| f.append_mib_s);
    let raw_read = med(|f| f.raw_read_mib_s);
    let read = med(|f| f.read_mib_s);
    let json = serde_json::json!({
        "scenario": "storage",
        "runs": args.runs,
        "raw_mib_s": raw,
        "append_mib_s": append,
        "ratio": round2(med(|f| f.append_mib_s / f.raw_mib_s) * 100.0) / 100.0,
        "durable_raw_mib_s": med(|f| f.durable_raw_mib_s),
        "durable_ratio": round2(med(|f| f.durable_raw_mib_s / f.raw_mib_s) * 100.0) / 100.0,
        "append_vs_durable": round2(med(|f| f.append_mib_s / f.durable_raw_mib_s) * 100.0) / 100.0,
        "steady_append_mib_s": med(|f| f.steady_mib_s),
        "steady_ratio": round2(med(|f| f.steady_mib_s / f.raw_mib_s) * 100.0) / 100.0,
        "small_batch_commits_s": med(|f| f.small_commits_s),
        "small_batch_p50_us": med(|f| f.small.p50_us),
        "small_batch_p99_us": med(|f| f.small.p99_us),
        "small_batch_p999_us": med(|f| f.small.p999_us),
        "raw_read_mib_s": raw_read,
        "read_mib_s": read,
        "read_ratio": round2(med(|f| f.read_mib_s / f.raw_read_mib_s) * 100.0) / 100.0,
    });
    let mut json = json;
    if args.spare_segments {
        let new = med(|f| f.spare.map_or(0.0, |s| s.0));
        let prepared = med(|f| f.spare.map_or(0.0, |s| s.1));
        json["spare_new_files_mib_s"] = new.into();
        json["spare_prepared_mib_s"] = prepared.into();
        json["spare_ratio"] = (round2(med(|f| f.spare.map_or(0.0, |s| s.1 / s.0)) * 100.0) / 100.0).into();
    }
    println!(
        "append_vs_durable {} (the log's fresh-segment appends / durable raw writes, median of {} runs)",
        json["append_vs_durable"], args.runs
    );
    println!("{json}");
    Ok(())
}

fn print_run(n: usize, args: &Args, f: &Figures) {
    table(
        &format!("run {n}: {} MiB per phase, {} producers", args.mib, args.producers),
        &[
            ("log append, 1 MiB batches, fsync=always", f.append_mib_s, "MiB/s"),
            (
                "  ratio append / durable raw (headline)",
                f.append_mib_s / f.durable_raw_mib_s,
                "",
            ),
            ("raw writes, fdatasync as each completes", f.durable_raw_mib_s, "MiB/s"),
            ("raw O_DIRECT write (1 MiB, QD1)", f.raw_mib_s, "MiB/s"),
            ("  ratio append / raw", f.append_mib_s / f.raw_mib_s, ""),
            ("  ratio durable raw / raw", f.durable_raw_mib_s / f.raw_mib_s, ""),
            ("steady state: segments recycled", f.steady_mib_s, "MiB/s"),
            ("  ratio steady append / raw", f.steady_mib_s / f.raw_mib_s, ""),
            ("16 KiB batch commits", f.small_commits_s, "commits/s"),
            ("  commit p50", f.small.p50_us, "us"),
            ("  commit p99", f.small.p99_us, "us"),
            ("  commit p99.9", f.small.p999_us, "us"),
            ("  commit max", f.small.max_us, "us"),
            ("raw O_DIRECT read (1 MiB, QD1)", f.raw_read_mib_s, "MiB/s"),
            ("log read-back, 1 MiB fetches", f.read_mib_s, "MiB/s"),
            ("  ratio read / raw read", f.read_mib_s / f.raw_read_mib_s, ""),
        ],
    );
    if let Some((new, prepared)) = f.spare {
        table(
            &format!("run {n}: spare segments (durable raw writes, {SPARE_SEGMENT_MIB} MiB segments)"),
            &[
                ("into new files", new, "MiB/s"),
                ("into spares prepared in the background", prepared, "MiB/s"),
                ("  ratio prepared / new", prepared / new, ""),
            ],
        );
    }
}

async fn one_run(dir: &Path, args: &Args) -> Result<Figures, String> {
    let shard = ShardStorage::open(dir.join("shard"), ShardStorageConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let raw_path = dir.join("raw.bin");
    let w = write_phases(&shard, &raw_path, &dir.join("durable.bin"), args).await?;
    let (small_commits_s, small) = small_batch_phase(&shard, args.small_commits).await?;
    let (raw_read_mib_s, read_mib_s) = read_phases(&shard, &raw_path, args).await?;
    let spare = match args.spare_segments {
        true => Some(spare_phase(dir, args.mib).await?),
        false => None,
    };
    Ok(Figures {
        raw_mib_s: w.raw_mib_s,
        durable_raw_mib_s: w.durable_raw_mib_s,
        append_mib_s: w.append_mib_s,
        steady_mib_s: w.steady_mib_s,
        small_commits_s,
        small,
        raw_read_mib_s,
        read_mib_s,
        spare,
    })
}

pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Segment size of the steady-state log: small, so that it rolls (and
/// recycles) every few dozen batches.
const STEADY_SEGMENT_BYTES: u64 = 64 << 20;
/// What the steady-state log keeps (size retention, applied at each roll).
const STEADY_RETENTION_BYTES: u64 = 192 << 20;

/// A log that appends and the batches it is fed, with its running totals.
struct AppendPhase {
    log: Rc<strand_storage::Log>,
    batches: Rc<Vec<Cell<Option<BytesMut>>>>,
    bytes: u64,
    secs: f64,
    cpu_secs: f64,
    faults: i64,
    /// The log's I/O counters when the totals last restarted.
    stats_from: strand_storage::log::LogStats,
}

impl AppendPhase {
    /// Opens the log at `name` with `config`; `batches` "1 MiB" batches are
    /// built before any clock starts (building them is the client's work,
    /// not the broker's).
    async fn open(shard: &ShardStorage, name: &str, config: LogConfig, batches: usize) -> Result<AppendPhase, String> {
        let log = shard.open_log(shard.data_dir().join(name), config).await.map_err(err)?;
        Ok(AppendPhase {
            log: Rc::new(log),
            batches: Rc::new(
                (0..batches as u64)
                    .map(|tag| Cell::new(Some(mib_batch(tag, 0))))
                    .collect(),
            ),
            bytes: 0,
            secs: 0.0,
            cpu_secs: 0.0,
            faults: 0,
            stats_from: Default::default(),
        })
    }

    /// Appends batches `slice` from `producers` concurrent tasks, each
    /// awaiting durability before its next batch (group commit merges
    /// them), and adds what it took to the totals.
    async fn run(&mut self, slice: std::ops::Range<usize>, producers: usize) -> Result<(), String> {
        let start = Instant::now();
        let cpu_start = strand_storage::shard::thread_cpu_time().as_secs_f64();
        let faults_start = minor_faults();
        let next = Rc::new(Cell::new(slice.start));
        let mut tasks = Vec::new();
        for _ in 0..producers {
            let (log, batches, next, end) = (self.log.clone(), self.batches.clone(), next.clone(), slice.end);
            tasks.push(glommio::spawn_local(async move {
                let mut bytes = 0u64;
                while next.get() < end {
                    let i = next.get();
                    next.set(i + 1);
                    let Some(batch) = batches[i].take() else { break };
                    let info = log.append(batch, LeaderEpoch(1)).await.map_err(err)?;
                    log.wait_durable(info.last_offset).await.map_err(err)?;
                    bytes += info.bytes as u64;
                }
                Ok::<u64, String>(bytes)
            }));
        }
        for t in tasks {
            self.bytes += t.await?;
        }
        self.secs += start.elapsed().as_secs_f64();
        self.cpu_secs += strand_storage::shard::thread_cpu_time().as_secs_f64() - cpu_start;
        self.faults += minor_faults() - faults_start;
        Ok(())
    }

    /// Starts the totals again (after a warm-up), the report's I/O
    /// counters included.
    fn restart_totals(&mut self) {
        (self.bytes, self.secs, self.cpu_secs, self.faults) = (0, 0.0, 0.0, 0);
        self.stats_from = self.log.stats();
    }

    /// One stderr line on the log's I/O since the totals started; closes
    /// the log.
    async fn report(self, what: &str, mib: usize) -> Result<(), String> {
        let stats = self.log.stats().since(&self.stats_from);
        eprintln!(
            "{what}: {} writes ({:.0} us avg; {} of them write-through), {} fdatasyncs ({:.0} us avg), {:.2} MiB per fdatasync, {} rolls ({} into recycled files), shard thread busy {:.0}% of the time, {:.0} page faults per MiB",
            stats.writes,
            stats.write_ns as f64 / 1e3 / stats.writes.max(1) as f64,
            stats.write_through_writes,
            stats.syncs,
            stats.sync_ns as f64 / 1e3 / stats.syncs.max(1) as f64,
            mib_s(stats.bytes_written, stats.syncs.max(1) as f64),
            stats.rolls,
            stats.recycled,
            100.0 * self.cpu_secs / self.secs,
            self.faults as f64 / mib as f64
        );
        self.log.close().await.map_err(err)
    }
}

/// A new (emptied) file for raw direct writes.
pub async fn fresh_file(path: &Path) -> Result<glommio::io::DmaFile, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(path)
        .await
        .map_err(|e| format!("creating {}: {e}", path.display()))
}

/// Raw writes, durable raw writes, appends to a fresh log and appends to a
/// log in its steady state, interleaved in `--rounds` slices so that all
/// four see the same disk conditions on a shared machine. The steady-state
/// log has small segments and size retention and is filled past its
/// retention before the clock starts, so each of its rolls writes the new
/// segment into the file of the segment retention frees (recycling:
/// overwrites, not extending writes), as a busy partition does once its
/// retention is reached.
async fn write_phases(
    shard: &ShardStorage,
    raw_path: &Path,
    durable_path: &Path,
    args: &Args,
) -> Result<WriteFigures, String> {
    let raw = fresh_file(raw_path).await?;
    let durable = Rc::new(fresh_file(durable_path).await?);
    let mut block = raw.alloc_dma_buffer(MIB);
    testkit::fill_value(block.as_bytes_mut(), 1, 1);
    let block = Rc::new(block);
    let mut fresh = AppendPhase::open(shard, "append", always(), args.mib).await?;
    let steady_config = LogConfig {
        segment_bytes_max: STEADY_SEGMENT_BYTES,
        retention_bytes: Some(STEADY_RETENTION_BYTES),
        ..always()
    };
    let warm_up = (STEADY_RETENTION_BYTES + 2 * STEADY_SEGMENT_BYTES) as usize / MIB;
    let mut steady = AppendPhase::open(shard, "steady", steady_config, warm_up + args.mib).await?;
    steady.run(0..warm_up, args.producers).await?;
    steady.restart_totals();
    let (mut raw_secs, mut durable_secs, mut durable_syncs) = (0.0, 0.0, 0);
    for slice in slices(args.mib, args.rounds) {
        raw_secs += raw_write_slice(&raw, &block, slice.clone()).await?;
        let (secs, syncs) = durable_write_slice(&durable, &block, slice.clone()).await?;
        (durable_secs, durable_syncs) = (durable_secs + secs, durable_syncs + syncs);
        fresh.run(slice.clone(), args.producers).await?;
        steady
            .run(warm_up + slice.start..warm_up + slice.end, args.producers)
            .await?;
    }
    let (fresh_mib_s, steady_mib_s) = (mib_s(fresh.bytes, fresh.secs), mib_s(steady.bytes, steady.secs));
    fresh.report("append", args.mib).await?;
    steady.report("steady-state append", args.mib).await?;
    println!(
        "durable raw write: {durable_syncs} fdatasyncs, {:.2} MiB per fdatasync",
        args.mib as f64 / durable_syncs.max(1) as f64
    );
    raw.close().await.map_err(err)?;
    durable.close_rc().await.map_err(err)?;
    std::fs::remove_file(durable_path).map_err(err)?;
    Ok(WriteFigures {
        raw_mib_s: mib_s((args.mib * MIB) as u64, raw_secs),
        durable_raw_mib_s: mib_s((args.mib * MIB) as u64, durable_secs),
        append_mib_s: fresh_mib_s,
        steady_mib_s,
    })
}

/// Writes 1 MiB blocks `slice` of the raw file sequentially (queue depth 1),
/// then one fdatasync; returns the seconds it took.
pub async fn raw_write_slice(
    raw: &glommio::io::DmaFile,
    block: &Rc<glommio::io::DmaBuffer>,
    slice: std::ops::Range<usize>,
) -> Result<f64, String> {
    let start = Instant::now();
    for i in slice {
        raw.write_rc_at(block.clone(), (i * MIB) as u64).await.map_err(err)?;
    }
    raw.fdatasync().await.map_err(err)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Writes 1 MiB blocks `slice` of `file` as [`raw_write_slice`] does, while
/// a second task fdatasyncs whenever a write has completed since its last
/// fdatasync began — group commit's pattern, with nothing else. Returns the
/// seconds until the last write is durable, and the fdatasyncs made.
pub async fn durable_write_slice(
    file: &Rc<glommio::io::DmaFile>,
    block: &Rc<glommio::io::DmaBuffer>,
    slice: std::ops::Range<usize>,
) -> Result<(f64, u64), String> {
    let written = Rc::new(Cell::new(0usize));
    let finished = Rc::new(Cell::new(false));
    let wake = Rc::new(strand_storage::notify::Notify::default());
    let start = Instant::now();
    // Dropped (so cancelled) if a write fails.
    let syncer = {
        let (file, written, finished, wake) = (file.clone(), written.clone(), finished.clone(), wake.clone());
        glommio::spawn_local(async move {
            let (mut synced, mut syncs) = (0, 0u64);
            loop {
                let seen = wake.epoch();
                let now = written.get();
                if now > synced {
                    file.fdatasync().await.map_err(err)?;
                    (synced, syncs) = (now, syncs + 1);
                } else if finished.get() {
                    return Ok::<u64, String>(syncs);
                } else {
                    wake.wait(seen).await;
                }
            }
        })
    };
    for i in slice {
        file.write_rc_at(block.clone(), (i * MIB) as u64).await.map_err(err)?;
        written.set(written.get() + 1);
        wake.notify_all();
    }
    finished.set(true);
    wake.notify_all();
    let syncs = syncer.await?;
    Ok((start.elapsed().as_secs_f64(), syncs))
}

/// Segment size of the spare-segment experiment (phase 7).
const SPARE_SEGMENT_MIB: usize = 64;

/// Phase 7 (see the module doc): `mib` MiB of durable raw writes each way,
/// in [`SPARE_SEGMENT_MIB`] segments, alternating segment by segment so
/// that both ways meet the same disk. Returns (into new files, into
/// prepared spares) in MiB/s. The files are removed as it goes.
async fn spare_phase(dir: &Path, mib: usize) -> Result<(f64, f64), String> {
    let segments = (mib / SPARE_SEGMENT_MIB).max(1);
    let block = {
        let probe = fresh_file(&dir.join("spare-probe")).await?;
        let mut block = probe.alloc_dma_buffer(MIB);
        testkit::fill_value(block.as_bytes_mut(), 3, 1);
        probe.close().await.map_err(err)?;
        std::fs::remove_file(dir.join("spare-probe")).map_err(err)?;
        Rc::new(block)
    };
    let path = |way: &str, i: usize| dir.join(format!("spare-{way}-{i}"));
    // The first spare is ready before the clock starts, as one prepared
    // while the disk had room would be.
    prepare_spare(path("prepared", 0)).await?;
    let (mut new_secs, mut prepared_secs) = (0.0, 0.0);
    for i in 0..segments {
        let file = Rc::new(fresh_file(&path("new", i)).await?);
        new_secs += durable_write_slice(&file, &block, 0..SPARE_SEGMENT_MIB).await?.0;
        file.close_rc().await.map_err(err)?;
        std::fs::remove_file(path("new", i)).map_err(err)?;

        let start = Instant::now();
        let next = glommio::spawn_local(prepare_spare(path("prepared", i + 1)));
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(path("prepared", i))
            .await
            .map_err(err)?;
        let file = Rc::new(file);
        durable_write_slice(&file, &block, 0..SPARE_SEGMENT_MIB).await?;
        // The next segment cannot start before its spare is ready (else
        // it would be a new file after all): waiting counts.
        next.await?;
        prepared_secs += start.elapsed().as_secs_f64();
        file.close_rc().await.map_err(err)?;
        std::fs::remove_file(path("prepared", i)).map_err(err)?;
    }
    std::fs::remove_file(path("prepared", segments)).map_err(err)?;
    let bytes = (segments * SPARE_SEGMENT_MIB * MIB) as u64;
    Ok((mib_s(bytes, new_secs), mib_s(bytes, prepared_secs)))
}

/// A spare segment file at `path`: [`SPARE_SEGMENT_MIB`] MiB of zeros
/// written with O_DIRECT and fdatasync'd, so later writes into it are
/// overwrites.
async fn prepare_spare(path: PathBuf) -> Result<(), String> {
    let file = fresh_file(&path).await?;
    let mut zeros = file.alloc_dma_buffer(MIB);
    zeros.as_bytes_mut().fill(0);
    let zeros = Rc::new(zeros);
    for i in 0..SPARE_SEGMENT_MIB {
        file.write_rc_at(zeros.clone(), (i * MIB) as u64).await.map_err(err)?;
    }
    file.fdatasync().await.map_err(err)?;
    file.close().await.map_err(err)
}

/// Minor page faults of the process so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes into the struct we pass and nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_minflt
}

/// `0..n` cut into `rounds` consecutive ranges.
pub fn slices(n: usize, rounds: usize) -> Vec<std::ops::Range<usize>> {
    let rounds = rounds.clamp(1, n);
    (0..rounds).map(|r| r * n / rounds..(r + 1) * n / rounds).collect()
}

/// `fsync=always`; no time retention (the batches are stamped 1970).
fn always() -> LogConfig {
    LogConfig {
        fsync: FsyncPolicy::Always,
        retention_ms: None,
        ..LogConfig::default()
    }
}

async fn small_batch_phase(shard: &ShardStorage, commits: usize) -> Result<(f64, Latency), String> {
    let log = shard
        .open_log(shard.data_dir().join("small"), always())
        .await
        .map_err(err)?;
    let batches: Vec<BytesMut> = (0..commits as u64)
        .map(|tag| testkit::batch(tag, RECORDS_PER_SMALL_BATCH, RECORD_BYTES, 0))
        .collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).map_err(err)?;
    let start = Instant::now();
    for batch in batches {
        let t = Instant::now();
        let info = log.append(batch, LeaderEpoch(1)).await.map_err(err)?;
        log.wait_durable(info.last_offset).await.map_err(err)?;
        hist.saturating_record(t.elapsed().as_nanos() as u64);
    }
    let secs = start.elapsed().as_secs_f64();
    log.close().await.map_err(err)?;
    Ok((commits as f64 / secs, Latency::from_nanos(&hist)))
}

/// Raw sequential reads of the raw file and the log's read-back (reopened,
/// so nothing comes from the tail cache), interleaved like the writes.
/// Returns (raw read MiB/s, log read MiB/s).
async fn read_phases(shard: &ShardStorage, raw_path: &Path, args: &Args) -> Result<(f64, f64), String> {
    let raw = glommio::io::DmaFile::open(raw_path).await.map_err(err)?;
    let log = shard
        .open_log(shard.data_dir().join("append"), always())
        .await
        .map_err(err)?;
    let end = log.log_end();
    let total = log.size_bytes();
    let mut from = Offset(0);
    let (mut raw_secs, mut raw_bytes, mut log_secs, mut log_bytes) = (0.0, 0u64, 0.0, 0u64);
    for slice in slices(args.mib, args.rounds) {
        let start = Instant::now();
        for i in slice.clone() {
            let got = raw.read_at_aligned((i * MIB) as u64, MIB).await.map_err(err)?;
            raw_bytes += got.len() as u64;
        }
        raw_secs += start.elapsed().as_secs_f64();

        let target = total * slice.end as u64 / args.mib as u64;
        let start = Instant::now();
        while from < end && log_bytes < target {
            let got = log.read(from, MIB).await.map_err(err)?;
            if got.batches.is_empty() {
                return Err(format!("read-back stopped at offset {from} before the log end {end}"));
            }
            log_bytes += got.bytes as u64;
            from = got.next_offset;
        }
        log_secs += start.elapsed().as_secs_f64();
    }
    if from < end {
        return Err(format!("read-back ended at offset {from}, before the log end {end}"));
    }
    log.close().await.map_err(err)?;
    raw.close().await.map_err(err)?;
    Ok((mib_s(raw_bytes, raw_secs), mib_s(log_bytes, log_secs)))
}
