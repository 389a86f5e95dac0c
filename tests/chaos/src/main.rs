//! `strand-chaos`: runs a Strand cluster under faults while a workload
//! writes and reads, heals it, reads everything back, and checks that
//! nothing acknowledged was lost (issue 23; DESIGN.md §7).
//!
//! ```sh
//! strand-chaos run --nodes 3 --seed 7 --duration 120s --nemesis kill,pause
//! ```
//!
//! - `schedule.rs`: the seeded fault schedule (pure);
//! - `cluster.rs`: the `strand serve` processes and the faults on them;
//! - `workload.rs`: producers, a consumer group, the read-back;
//! - `jobs.rs`: the second workload, ack mode with poison records;
//! - `checker.rs`: the verdict (pure).
//!
//! - `network.rs`: a network namespace per node, and the link faults;
//! - `disk.rs`: a file system per node, and filling it;
//! - `lazyfs.rs`: a FUSE pass-through per node that forgets unsynced
//!   writes on a power loss.
//!
//! Run as root, each node is its own host: a network namespace with its
//! own address on a private subnet the run creates and removes
//! (`network.rs`). Otherwise (or with `--loopback`) the nodes run on
//! 127.0.0.1–N of this machine, and only the process faults can be used.
//! The nemeses:
//! - `kill`: kill -9 of a node or, one time in six, of every node, then a
//!   restart (the page cache keeps every write: nothing unsynced is lost);
//! - `pause`: SIGSTOP, then SIGCONT;
//! - `partition`: one of five shapes (a node isolated, the leader
//!   isolated, a minority split off, one-way loss, a bridge node seeing
//!   both sides), iptables DROP rules inside the node namespaces;
//! - `netem`: one node's link slowed and lossy (see `network.rs`);
//! - `disk-full`: one node's data file system filled (`disk.rs`).
//! - `wipe`: kill -9 of one node, its data directory deleted, started
//!   again (a replaced disk). A partition left waiting for it (it was the
//!   last in-sync replica) gets an unclean election before the final read,
//!   as an operator would (`unclean_elections` in the JSON); what that
//!   loses, the checker reports.
//! - `corrupt`: kill -9 of one node, one of its partition files damaged
//!   (bits flipped or cut short), started again.
//! - `power-loss`: kill -9 of one node or, one time in three, of every
//!   node, then every write its data directory took since that file's
//!   last fsync/fdatasync/O_DSYNC write taken back (`lazyfs.rs`), started
//!   again. Nothing acknowledged on the fsync=always queue may be lost;
//!   what the fsync=interval acks=1 queue loses is `acks1_lost`.
//! - `clock`: one node's wall clock 10 s to 5 min ahead or back for the
//!   fault, then right again (libfaketime preloaded into every node, which
//!   reads its offset from `node-N/faketime`; the monotonic clock stays
//!   true). Leases, sessions and locks must not notice.
//!
//! `--broker-setting KEY=VALUE` (repeatable) adds a line to every node's
//! config file: `--broker-setting journal=true` runs the schedule on the
//! shard journal.
//!
//! The last line of stdout is one JSON object (a contract): `seed`,
//! `nodes`, `duration_s`, `nemeses` (faults applied, by name), `acked`,
//! `failed`, `failed_by_kind` (error kind → count), `stored`, `lost`, `misplaced`, `duplicates`, `reordered`,
//! `phantoms`, `commits_backwards`, `unconsumed`, `inconsistent_offsets`,
//! `truncated_reads`, `gaps`, `unavailable_s`, `unclean_elections`, for
//! the acks=1 queue `acks1_acked`, `acks1_lost` (allowed) and
//! `acks1_violations`, `violations` (of both workloads), and with the jobs workload `jobs_acked`,
//! `jobs_poison`, `jobs_dead_lettered`, `jobs_good_dead_lettered`,
//! `jobs_poison_live`, `jobs_unsettled`, `jobs_dead_duplicates`,
//! `jobs_dead_wrong`, `jobs_over_delivered`, `jobs_dead_phantoms`,
//! `jobs_counts_back` (`checker::JobsVerdict`). The exit status is 1 on any violation, 2 when the run
//! itself could not be carried out.

mod checker;
mod cluster;
mod disk;
mod jobs;
mod lazyfs;
mod network;
mod schedule;
mod workload;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use schedule::{Fault, Nemesis};

#[derive(Parser)]
#[command(
    name = "strand-chaos",
    about = "Fault injection against a Strand cluster, and a checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One run: cluster, workload, faults, heal, read back, check.
    Run(RunArgs),
}

#[derive(Parser, Clone)]
struct RunArgs {
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(3..=9))]
    nodes: u8,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long faults go on: `120s`, `2m`, or seconds.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    duration: Duration,
    /// Comma-separated: kill, pause, partition, netem, disk-full, wipe,
    /// corrupt, power-loss, clock.
    #[arg(long, default_value = "kill,pause")]
    nemesis: String,
    /// The `strand` binary (default: the one next to this one).
    #[arg(long)]
    strand: Option<PathBuf>,
    /// Where the nodes keep their data and logs (default: a new directory
    /// under /var/tmp, removed after a clean run unless --keep; kept after
    /// a violation, an error, a stretch of over 15 s without an ack, or a
    /// node that exited by itself).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the run directory (node logs, data) afterwards.
    #[arg(long)]
    keep: bool,
    /// Producer threads (each with 8 keys of its own).
    #[arg(long, default_value_t = 3)]
    producers: usize,
    /// Each record's size in bytes (the `KEY:SEQ` it carries, padded).
    #[arg(long, default_value_t = 1000)]
    record_bytes: usize,
    /// Members of the consumer group.
    #[arg(long, default_value_t = 2)]
    consumers: usize,
    /// Leave out the second workload (ack mode with poison records: see
    /// `jobs.rs`).
    #[arg(long)]
    no_jobs: bool,
    /// Run the nodes on 127.0.0.1–N instead of network namespaces (the
    /// default when not root); only `kill` and `pause` then.
    #[arg(long)]
    loopback: bool,
    /// A broker setting for every node, `KEY=VALUE` as a line of its
    /// config file (a TOML value: `journal=true`); repeatable.
    #[arg(long = "broker-setting", value_name = "KEY=VALUE", value_parser = parse_setting)]
    broker_settings: Vec<String>,
}

/// `KEY=VALUE` as a TOML line `KEY = VALUE`.
fn parse_setting(s: &str) -> Result<String, String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || value.is_empty() {
        return Err(format!("{s:?} is not KEY=VALUE"));
    }
    Ok(format!("{key} = {value}"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = match s.strip_suffix('s') {
        Some(n) => (n, 1),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 60),
            None => (s, 1),
        },
    };
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration (120s, 2m)"))?;
    Ok(Duration::from_secs(n * unit))
}

const QUEUE: &str = "chaos";
/// The acks=1 queue (fsync every second): a record its leader acknowledged
/// may be lost when that leader fails before a follower fetched it, so
/// losses there are counted apart; every other check holds.
const FAST_QUEUE: &str = "chaos-fast";
/// A run with a longer stretch without an ack keeps its directory.
const LONG_STRETCH_MS: u64 = 15_000;
const GROUP: &str = "chaos-readers";

fn main() {
    let Cli {
        command: Command::Run(args),
    } = Cli::parse();
    match run(&args) {
        Ok(violations) => std::process::exit(i32::from(violations > 0)),
        Err(e) => {
            eprintln!("strand-chaos: {e}");
            std::process::exit(2);
        }
    }
}

/// A port free on 127.0.0.1 to 127.0.0.n, below the ephemeral range.
fn free_port(n: u8, seed: u64) -> Result<u16, String> {
    let mut rng = schedule::Rng::new(seed ^ u64::from(std::process::id()));
    for _ in 0..1000 {
        let port = 20_000 + (rng.next() % 12_000) as u16;
        if (1..=n).all(|id| TcpListener::bind(SocketAddr::from(([127, 0, 0, id], port))).is_ok()) {
            return Ok(port);
        }
    }
    Err("no port free on every node's address".into())
}

/// Sleeps `d` in steps, stopping early once `interrupted`.
fn sleep_unless(d: Duration, interrupted: &AtomicBool) {
    let end = Instant::now() + d;
    while Instant::now() < end && !interrupted.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50).min(end.saturating_duration_since(Instant::now())));
    }
}

fn run(args: &RunArgs) -> Result<usize, String> {
    let nemeses = Nemesis::parse_list(&args.nemesis)?;
    let loopback = args.loopback || !network::is_root();
    if let Some(n) = nemeses.iter().find(|n| {
        loopback
            && matches!(
                n,
                Nemesis::Partition | Nemesis::Netem | Nemesis::DiskFull | Nemesis::PowerLoss
            )
    }) {
        return Err(format!(
            "nemesis {} needs each node in its own network namespace and file system: run as root, without \
             --loopback (or with --nemesis kill,pause)",
            n.name()
        ));
    }
    let strand = match &args.strand {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("strand"),
    };
    if !strand.exists() {
        return Err(format!(
            "no strand binary at {} (cargo build --release --workspace, or --strand PATH)",
            strand.display()
        ));
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone()).map_err(|e| e.to_string())?;
    }
    // A directory of our own is removed after a clean run; after a failed
    // one (or with --keep) it stays, with the node logs the error names.
    let (dir, remove_after) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
            (d.clone(), false)
        }
        None => {
            let made = tempfile::Builder::new()
                .prefix("strand-chaos.")
                .tempdir_in("/var/tmp")
                .map_err(|e| e.to_string())?;
            (made.keep(), !args.keep)
        }
    };
    let duration_ms = args.duration.as_millis() as u64;
    let faults = schedule::schedule(args.seed, &nemeses, args.nodes, duration_ms);
    let names: Vec<&str> = nemeses.iter().map(|n| n.name()).collect();
    println!(
        "replay: strand-chaos run --nodes {} --seed {} --duration {}s --nemesis {} --record-bytes {} --producers {} \
         --consumers {}{}{}",
        args.nodes,
        args.seed,
        args.duration.as_secs(),
        names.join(","),
        args.record_bytes,
        args.producers,
        args.consumers,
        if loopback { " --loopback" } else { "" },
        args.broker_settings
            .iter()
            .map(|s| format!(" --broker-setting {}", s.replace(" = ", "=")))
            .collect::<String>()
    );
    println!("run directory: {}; {} faults scheduled", dir.display(), faults.len());

    let (port, network) = match loopback {
        true => (free_port(args.nodes, args.seed)?, None),
        false => (9092, Some(network::Network::create(args.nodes)?)),
    };
    let disks = nemeses.contains(&Nemesis::DiskFull);
    let lazy = nemeses.contains(&Nemesis::PowerLoss);
    let faketime = match nemeses.contains(&Nemesis::Clock) {
        true => Some(cluster::faketime_library()?),
        false => None,
    };
    let mut cluster = cluster::Cluster::start(
        &strand,
        &dir,
        args.nodes,
        port,
        network,
        disks,
        lazy,
        faketime,
        &args.broker_settings,
    )?;
    let bootstrap = cluster.bootstrap();
    let admin = strand_client::Admin::connect(&bootstrap).map_err(|e| e.to_string())?;
    let spec = strand_client::QueueSpec {
        partitions: Some(3),
        replication_factor: Some(3),
        ..strand_client::QueueSpec::default()
    };
    strand_client::block_on(admin.create_queue(QUEUE, &spec)).map_err(|e| format!("creating {QUEUE}: {e}"))?;
    let with_jobs = !args.no_jobs;
    if with_jobs {
        jobs::create(&admin)?;
    }

    let fast_spec = strand_client::QueueSpec {
        fsync: Some(strand_client::FsyncSpec::Interval {
            ms: 1000,
            bytes: 1 << 20,
        }),
        ..spec.clone()
    };
    strand_client::block_on(admin.create_queue(FAST_QUEUE, &fast_spec))
        .map_err(|e| format!("creating {FAST_QUEUE}: {e}"))?;

    let shared = workload::Shared::new();
    let fast = workload::Shared::new();
    let (one_at_a_time, pipelined, acks_one) = (
        workload::Sending::ONE_AT_A_TIME,
        workload::Sending {
            acks: strand_client::Acks::All,
            in_flight: 5,
            prefix: "q",
        },
        workload::Sending {
            acks: strand_client::Acks::Leader,
            in_flight: 5,
            prefix: "f",
        },
    );
    let (bytes, n) = (args.record_bytes, args.producers);
    let mut producing = workload::producers(&bootstrap, QUEUE, n, bytes, &shared, one_at_a_time);
    producing.extend(workload::producers(&bootstrap, QUEUE, 1, bytes, &shared, pipelined));
    producing.extend(workload::producers(&bootstrap, FAST_QUEUE, 1, bytes, &fast, acks_one));
    let mut consuming = workload::consumers(&bootstrap, QUEUE, GROUP, args.consumers, &shared);
    let sampling = workload::sampler(&bootstrap, GROUP, &shared);
    let job_history = Arc::new(std::sync::Mutex::new(checker::JobsHistory {
        max_attempts: jobs::MAX_ATTEMPTS,
        ..checker::JobsHistory::default()
    }));
    if with_jobs {
        producing.push(jobs::producer(&bootstrap, args.record_bytes, &shared, &job_history));
        consuming.extend(jobs::workers(&bootstrap, 2, &shared, &job_history));
    }

    let mut applied: BTreeMap<&'static str, usize> = BTreeMap::new();
    for f in &faults {
        let wait = Duration::from_millis(f.at_ms.saturating_sub(shared.ms()));
        sleep_unless(wait, &interrupted);
        if interrupted.load(Ordering::SeqCst) {
            break;
        }
        // As a supervisor would: a node that exited by itself starts again.
        cluster.heal()?;
        apply(&mut cluster, f, &bootstrap, &interrupted)?;
        *applied.entry(f.nemesis.name()).or_default() += 1;
    }
    sleep_unless(
        Duration::from_millis(duration_ms.saturating_sub(shared.ms())),
        &interrupted,
    );
    shared.stop_producing.store(true, Ordering::SeqCst);
    fast.stop_producing.store(true, Ordering::SeqCst);
    for p in producing {
        let _ = p.join();
    }
    let ended_ms = shared.ms();
    println!("healing: every node running and continued");
    cluster.heal()?;
    if interrupted.load(Ordering::SeqCst) {
        shared.stop_consuming.store(true, Ordering::SeqCst);
        return Err("interrupted".into());
    }
    // A partition whose last in-sync replica was wiped waits for an
    // operator; the run is one: it accepts the loss at once (the group
    // cannot read a partition without a leader), and the checker then
    // says what was lost.
    let unclean = elect_offline(&bootstrap);
    if unclean > 0 {
        println!("unclean elections: {unclean} partition(s) waited for a wiped replica");
    }
    // The group catches up with everything acknowledged (at most 60 s).
    let caught_up = cluster::Cluster::until(Duration::from_secs(60), || {
        let h = shared.history.lock().unwrap_or_else(|p| p.into_inner());
        h.acked.iter().all(|a| h.consumed.contains(&a.value))
    });
    if !caught_up {
        println!("the group had not read every acknowledged record after 60 s; the cluster now:");
        let queues = [QUEUE, jobs::QUEUE, "__groups"];
        print!("{}", cluster.describe(&bootstrap, &queues));
    }
    // The workers settle every acknowledged job (at most 90 s).
    let job_positions = match with_jobs {
        true => jobs::settle(&bootstrap, &job_history, Duration::from_secs(90)),
        false => BTreeMap::new(),
    };
    shared.stop_consuming.store(true, Ordering::SeqCst);
    for c in consuming {
        let _ = c.join();
    }
    let _ = sampling.join();
    let verdict = judge(&bootstrap, QUEUE, &shared, ended_ms)?;
    let fast_verdict = judge(&bootstrap, FAST_QUEUE, &fast, ended_ms)?;
    let job_verdict = match with_jobs {
        true => {
            let dead = jobs::dead_letters(&bootstrap, Duration::from_secs(60))?;
            let mut h = job_history.lock().unwrap_or_else(|p| p.into_inner());
            h.positions = job_positions;
            h.dead = dead;
            Some(checker::check_jobs(&h, jobs::is_poison))
        }
        false => None,
    };
    // A follower that found the leader's log parting from its own below
    // what it saw committed says so in its log (the broker follows the
    // leader, but an invariant broke): each one is a violation.
    let below_hw = count_in_logs(&dir, args.nodes, BELOW_HW_MARK);
    let violations = verdict.violations()
        + job_verdict.as_ref().map_or(0, |j| j.violations())
        + below_hw
        + fast_verdict.acks_one_violations();
    // A stretch this long without an ack is worth a look at the node logs
    // even when nothing was lost.
    let long_stretch = verdict.unavailable_ms > LONG_STRETCH_MS;
    // So is a node that exited by itself.
    let exited = cluster.exits > 0;
    let keep = !remove_after || violations > 0 || long_stretch || exited;
    if keep {
        if let Some(disks) = cluster.disks.as_mut() {
            disks.keep_images();
        }
    }
    drop(cluster);
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("the run directory is kept: {}", dir.display());
    }
    report(
        args,
        &applied,
        &verdict,
        &fast_verdict,
        job_verdict.as_ref(),
        below_hw,
        unclean,
    );
    Ok(violations)
}

/// Applies one fault and holds it, then undoes it.
fn apply(cluster: &mut cluster::Cluster, f: &Fault, bootstrap: &str, interrupted: &AtomicBool) -> Result<(), String> {
    let targets: Vec<u8> = match f.node {
        0 => (1..=cluster.size()).collect(),
        n => vec![n],
    };
    let hold = Duration::from_millis(f.hold_ms);
    let what = match (f.partition, f.node) {
        (Some(p), _) => p.describe(),
        (None, 0) => "every node".to_string(),
        (None, n) => format!("node {n}"),
    };
    println!(
        "{:>7.1}s {} {what} for {:.1}s",
        f.at_ms as f64 / 1000.0,
        f.nemesis.name(),
        hold.as_secs_f64()
    );
    match f.nemesis {
        Nemesis::Kill => {
            for id in &targets {
                cluster.kill(*id);
            }
            sleep_unless(hold, interrupted);
            cluster.heal()
        }
        Nemesis::Corrupt => {
            let mut rng = schedule::Rng::new(f.at_ms ^ u64::from(f.node) << 32);
            for id in &targets {
                println!("           ({})", cluster.corrupt(*id, &mut rng)?);
            }
            sleep_unless(hold, interrupted);
            cluster.heal()
        }
        Nemesis::PowerLoss => {
            // Every target down before any file system forgets.
            for id in &targets {
                cluster.kill(*id);
            }
            for id in &targets {
                let lost = cluster.power_loss(*id)?;
                let largest: Vec<String> = lost.largest.iter().map(|(f, b)| format!("{f} {b}")).collect();
                println!(
                    "           (node {id}: {} unsynced bytes in {} files taken back; most: {})",
                    lost.bytes,
                    lost.files,
                    largest.join(", ")
                );
            }
            sleep_unless(hold, interrupted);
            cluster.heal()
        }
        Nemesis::Clock => {
            let mut rng = schedule::Rng::new(f.at_ms ^ u64::from(f.node) << 32);
            let by_s = rng.range(10, 300) as i64 * if rng.range(0, 1) == 0 { 1 } else { -1 };
            println!("           (its wall clock {by_s:+} s, then back)");
            for id in &targets {
                cluster.shift_clock(*id, by_s)?;
            }
            sleep_unless(hold, interrupted);
            for id in &targets {
                cluster.shift_clock(*id, 0)?;
            }
            Ok(())
        }
        Nemesis::Wipe => {
            for id in &targets {
                cluster.wipe(*id)?;
            }
            sleep_unless(hold, interrupted);
            cluster.heal()
        }
        Nemesis::Pause => {
            for id in &targets {
                cluster.pause(*id);
            }
            sleep_unless(hold, interrupted);
            for id in &targets {
                cluster.resume(*id);
            }
            Ok(())
        }
        Nemesis::Partition => {
            let shape = f.partition.ok_or("a partition fault without a shape")?;
            let leader = match shape {
                schedule::Partition::IsolateLeader => workload::leader_of(bootstrap, QUEUE, 0).unwrap_or(f.node),
                _ => f.node,
            };
            let net = cluster
                .network
                .as_ref()
                .ok_or("partitions need the network namespaces")?;
            for (to, from) in shape.drops(cluster.size(), leader) {
                net.drop_from(to, from)?;
            }
            sleep_unless(hold, interrupted);
            net.heal()
        }
        Nemesis::Netem => {
            let net = cluster.network.as_mut().ok_or("netem needs the network namespaces")?;
            net.slow(f.node)?;
            println!("           ({})", net.slow_method());
            sleep_unless(hold, interrupted);
            net.heal()
        }
        Nemesis::DiskFull => {
            let disks = cluster.disks.as_ref().ok_or("disk-full needs the file systems")?;
            let taken = disks.fill(f.node)?;
            println!("           ({} MiB of ballast: no block left)", taken >> 20);
            sleep_unless(hold, interrupted);
            disks.release(f.node);
            Ok(())
        }
    }
}

/// Reads back everything `queue` holds and checks it against what its
/// producers saw (`shared`'s history; they stopped at `ended_ms`).
fn judge(bootstrap: &str, queue: &str, shared: &workload::Shared, ended_ms: u64) -> Result<checker::Verdict, String> {
    let stored = workload::read_back(bootstrap, queue, Duration::from_secs(120))?;
    let mut h = shared.history.lock().unwrap_or_else(|p| p.into_inner());
    h.stored = stored;
    h.ended_ms = ended_ms;
    Ok(checker::check(&h))
}

/// Gives a leader to every partition that waits for a wiped replica (an
/// unclean election each, as an operator would); how many. Tried for up
/// to 30 s (the healed cluster may still be electing).
fn elect_offline(bootstrap: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut elected = 0;
    while Instant::now() < deadline {
        let Ok(admin) = strand_client::Admin::connect(bootstrap) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let Ok(cluster) = strand_client::block_on(admin.describe_cluster()) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let waiting: Vec<_> = cluster.partitions.iter().filter(|p| p.lost_replica.is_some()).collect();
        if waiting.is_empty() {
            break;
        }
        for p in waiting {
            match strand_client::block_on(admin.elect_unclean(&p.queue, Some(p.partition), None)) {
                Ok(()) => {
                    println!("           (unclean election of {}/{})", p.queue, p.partition);
                    elected += 1;
                }
                Err(e) => println!("           (unclean election of {}/{}: {e})", p.queue, p.partition),
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    elected
}

/// What a broker logs when it truncates below its high watermark
/// (`broker/src/replication.rs`).
const BELOW_HW_MARK: &str = "truncating below the high watermark";

/// Lines holding `mark` in the node logs of the run directory.
fn count_in_logs(dir: &std::path::Path, nodes: u8, mark: &str) -> usize {
    (1..=nodes)
        .filter_map(|id| std::fs::read_to_string(dir.join(format!("node-{id}.log"))).ok())
        .map(|log| log.lines().filter(|l| l.contains(mark)).count())
        .sum()
}

fn report(
    args: &RunArgs,
    applied: &BTreeMap<&'static str, usize>,
    v: &checker::Verdict,
    fast: &checker::Verdict,
    jobs: Option<&checker::JobsVerdict>,
    below_hw: usize,
    unclean: usize,
) {
    println!(
        "acknowledged {}, failed {} (outcome unknown), stored {}; lost {}, misplaced {}, duplicates {}, \
         reordered {}, phantoms {}, commits backwards {}, never consumed {}, inconsistent offsets {}, truncated \
         reads {}, gaps {}; longest without an ack {:.1} s (from {:.1} s)",
        v.acked,
        v.failed,
        v.stored,
        v.lost,
        v.misplaced,
        v.duplicates,
        v.reordered,
        v.phantoms,
        v.commits_backwards,
        v.unconsumed,
        v.inconsistent_offsets,
        v.truncated_reads,
        v.gaps,
        v.unavailable_ms as f64 / 1000.0,
        v.unavailable_from_ms as f64 / 1000.0
    );
    if !v.failures.is_empty() {
        let kinds: Vec<String> = v
            .failures
            .iter()
            .map(|(kind, f)| format!("{kind} {} (mean {} ms)", f.count, f.total_ms / f.count.max(1) as u64))
            .collect();
        println!("failed by kind: {}", kinds.join(", "));
    }
    for e in &v.examples {
        println!("  {e}");
    }
    if below_hw > 0 {
        println!("followers truncated below their high watermark {below_hw} time(s) (node logs: \"{BELOW_HW_MARK}\")");
    }
    let mut summary = serde_json::json!({
        "seed": args.seed, "nodes": args.nodes, "duration_s": args.duration.as_secs(),
        "nemeses": applied, "acked": v.acked, "failed": v.failed,
        "failed_by_kind": v.failures.iter().map(|(kind, f)| (kind.clone(), f.count)).collect::<BTreeMap<_, _>>(),
        "stored": v.stored, "lost": v.lost,
        "misplaced": v.misplaced, "duplicates": v.duplicates, "reordered": v.reordered,
        "phantoms": v.phantoms, "commits_backwards": v.commits_backwards, "unconsumed": v.unconsumed,
        "inconsistent_offsets": v.inconsistent_offsets, "truncated_reads": v.truncated_reads, "gaps": v.gaps,
        "unavailable_s": v.unavailable_ms as f64 / 1000.0, "truncated_below_hw": below_hw,
        "unclean_elections": unclean,
        "acks1_acked": fast.acked, "acks1_lost": fast.lost + fast.misplaced,
        "acks1_violations": fast.acks_one_violations(),
        "violations": v.violations() + jobs.map_or(0, |j| j.violations()) + below_hw + fast.acks_one_violations(),
    });
    println!(
        "acks=1 ({FAST_QUEUE}, pipelined): acknowledged {}, stored {}; lost with a failed leader {} (allowed), \
         duplicates {}, reordered {}, phantoms {}, gaps {}",
        fast.acked,
        fast.stored,
        fast.lost + fast.misplaced,
        fast.duplicates,
        fast.reordered,
        fast.phantoms,
        fast.gaps
    );
    if let Some(j) = jobs {
        println!(
            "jobs (ack mode): acknowledged {} ({} poison), dead-lettered {} ({} good jobs whose locks ran out); \
             poison not dead-lettered {}, never settled {}, dead-lettered twice {}, wrong attempts or source {}, \
             delivered past the limit {}, dead letters never sent {}, delivery counts gone back {}",
            j.acked,
            j.poison,
            j.dead_lettered,
            j.good_dead_lettered,
            j.poison_live,
            j.unsettled,
            j.dead_duplicates,
            j.dead_wrong,
            j.over_delivered,
            j.dead_phantoms,
            j.counts_back
        );
        for e in &j.examples {
            println!("  {e}");
        }
        let fields = serde_json::json!({
            "jobs_acked": j.acked, "jobs_poison": j.poison, "jobs_dead_lettered": j.dead_lettered,
            "jobs_good_dead_lettered": j.good_dead_lettered, "jobs_poison_live": j.poison_live,
            "jobs_unsettled": j.unsettled, "jobs_dead_duplicates": j.dead_duplicates,
            "jobs_dead_wrong": j.dead_wrong, "jobs_over_delivered": j.over_delivered,
            "jobs_dead_phantoms": j.dead_phantoms, "jobs_counts_back": j.counts_back,
        });
        if let (Some(all), serde_json::Value::Object(more)) = (summary.as_object_mut(), fields) {
            all.extend(more);
        }
    }
    println!("{summary}");
}
