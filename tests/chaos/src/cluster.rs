//! The cluster under test: `strand serve` processes, node N on
//! 127.0.0.N:PORT (all of 127/8 is this machine's loopback) or, with a
//! [`Network`], in its own network namespace at 10.213.S.N:PORT; nodes 1–3
//! the controller's voters, one shard each and small memory budgets, data
//! under a directory this run made. Faults act on them by PID: kill -9
//! and restart, SIGSTOP and SIGCONT. Every process this run started is
//! continued and killed when the cluster is dropped (also after Ctrl-C:
//! the run notices and unwinds).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::disk::{self, Disks};
use crate::lazyfs::{LazyDisk, Lost};
use crate::network::Network;

/// Settings that keep a node small, and replicas quick to leave and rejoin
/// the ISR.
const SETTINGS: &str = "io_memory_bytes = 33554432\nreadahead_budget_bytes = 8388608\n\
                        tail_cache_budget_bytes = 16777216\nspin_before_park_us = 0\n\
                        replica_lag_time_max_ms = 2000\nreplica_fetch_wait_ms = 200\n";

struct Node {
    child: Option<Child>,
    paused: bool,
}

pub struct Cluster {
    strand: PathBuf,
    dir: PathBuf,
    port: u16,
    nodes: Vec<Node>,
    /// Nodes that exited by themselves (and were started again).
    pub exits: usize,
    /// The nodes' namespaces, when each is its own host.
    pub network: Option<Network>,
    /// Each node's data directory as a file system that forgets unsynced
    /// writes on a power loss, when a run names `power-loss` (unmounted
    /// after the nodes are killed, before `disks`: fields drop in order,
    /// after `Drop::drop`).
    lazy: Vec<LazyDisk>,
    /// The nodes' file systems, when each has its own (dropped after the
    /// nodes are killed: fields drop after `Drop::drop`).
    pub disks: Option<Disks>,
    /// libfaketime, preloaded into every node when a run names `clock`:
    /// each node reads its wall-clock offset from `node-N/faketime`.
    faketime: Option<PathBuf>,
}

/// Where Debian's `faketime` package puts the thread-safe library.
const FAKETIME_LIBRARIES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
];

/// libfaketime's library, or why a clock fault cannot be made.
pub fn faketime_library() -> Result<PathBuf, String> {
    FAKETIME_LIBRARIES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "nemesis clock needs libfaketime (apt-get install faketime)".to_string())
}

impl Cluster {
    /// Starts `n` nodes and waits until each is ready.
    /// With `disks`, each node's directory is a file system of its own;
    /// with `lazy`, each node's data directory forgets unsynced writes on
    /// [`Cluster::power_loss`]; with `faketime`, each node's wall clock can
    /// be moved ([`Cluster::shift_clock`]); `settings`: more lines of every
    /// node's config file.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        strand: &Path,
        dir: &Path,
        n: u8,
        port: u16,
        network: Option<Network>,
        disks: bool,
        lazy: bool,
        faketime: Option<PathBuf>,
        settings: &[String],
    ) -> Result<Cluster, String> {
        let file: String = std::iter::once(SETTINGS.to_string())
            .chain(settings.iter().map(|s| format!("{s}\n")))
            .collect();
        std::fs::write(dir.join("node.toml"), file).map_err(|e| format!("writing the settings: {e}"))?;
        let mut c = Cluster {
            strand: strand.to_path_buf(),
            dir: dir.to_path_buf(),
            port,
            nodes: (0..n)
                .map(|_| Node {
                    child: None,
                    paused: false,
                })
                .collect(),
            network,
            lazy: Vec::new(),
            disks: None,
            faketime,
            exits: 0,
        };
        if disks {
            let dirs: Vec<PathBuf> = (1..=n).map(|id| c.node_dir(id)).collect();
            c.disks = Some(Disks::create(&dirs)?);
        }
        if lazy {
            for id in 1..=n {
                let node = c.node_dir(id);
                c.lazy
                    .push(LazyDisk::mount(&node.join("disk"), &disk::data_dir(&node))?);
            }
        }
        if c.faketime.is_some() {
            for id in 1..=n {
                c.shift_clock(id, 0)?;
            }
        }
        for id in 1..=n {
            c.spawn(id)?;
        }
        for id in 1..=n {
            c.wait_ready(id, Duration::from_secs(60))?;
        }
        Ok(c)
    }

    /// Node `id`'s wall clock `by_s` seconds off the machine's from now on
    /// (0: right again). libfaketime reads the file again at most 1 s
    /// later; the node's monotonic clock is not touched.
    pub fn shift_clock(&mut self, id: u8, by_s: i64) -> Result<(), String> {
        let path = self.node_dir(id).join("faketime");
        std::fs::create_dir_all(self.node_dir(id)).map_err(|e| e.to_string())?;
        // Written whole, then renamed: the node never reads half a line.
        let tmp = path.with_extension("new");
        std::fs::write(&tmp, format!("{by_s:+}\n")).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn node_dir(&self, id: u8) -> PathBuf {
        self.dir.join(format!("node-{id}"))
    }

    fn ip(&self, id: u8) -> IpAddr {
        match &self.network {
            Some(net) => IpAddr::V4(net.addr(id)),
            None => IpAddr::V4(Ipv4Addr::new(127, 0, 0, id)),
        }
    }

    pub fn addr(&self, id: u8) -> SocketAddr {
        SocketAddr::new(self.ip(id), self.port)
    }

    /// Every node's address, comma-separated (a client's bootstrap list).
    pub fn bootstrap(&self) -> String {
        let all: Vec<String> = (1..=self.nodes.len() as u8)
            .map(|id| self.addr(id).to_string())
            .collect();
        all.join(",")
    }

    fn spawn(&mut self, id: u8) -> Result<(), String> {
        let voters: Vec<String> = (1..=3.min(self.nodes.len() as u8))
            .map(|v| format!("{v}@{}", self.addr(v)))
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("node-{id}.log")))
            .map_err(|e| format!("node {id}'s log: {e}"))?;
        let mut command = Command::new(&self.strand);
        // In its namespace, the node is its own host (what `ip netns exec`
        // does, without a process in between: the PID is the broker's).
        let namespace = match &self.network {
            Some(net) => {
                Some(std::fs::File::open(net.namespace_path(id)).map_err(|e| format!("node {id}'s namespace: {e}"))?)
            }
            None => None,
        };
        if let Some(library) = &self.faketime {
            command
                .env("LD_PRELOAD", library)
                .env("FAKETIME_TIMESTAMP_FILE", self.node_dir(id).join("faketime"))
                .env("FAKETIME_CACHE_DURATION", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        if let Some(ns) = &namespace {
            let fd = ns.as_raw_fd();
            // SAFETY: setns(2) is async-signal-safe; the descriptor stays
            // open in the parent until spawn returns (close-on-exec here).
            unsafe {
                command.pre_exec(move || match libc::setns(fd, libc::CLONE_NEWNET) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                });
            }
        }
        let child = command
            .arg("serve")
            .args(["--node-id", &id.to_string(), "--cores", "1"])
            .args(["--listen", &self.addr(id).to_string()])
            // Its own namespace's addresses are not loopback ones: the
            // chaos run tests faults, not logins.
            .args(["--auth", "none"])
            .args(["--metrics-listen", &SocketAddr::new(self.ip(id), 0).to_string()])
            .args(["--controller-voters", &voters.join(",")])
            .arg("--config")
            .arg(self.dir.join("node.toml"))
            .arg("--data-dir")
            .arg(disk::data_dir(&self.node_dir(id)))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.strand.display()))?;
        self.nodes[usize::from(id - 1)] = Node {
            child: Some(child),
            paused: false,
        };
        Ok(())
    }

    /// Waits for node `id`'s ready line (its stdout), then keeps draining
    /// its stdout on a thread.
    fn wait_ready(&mut self, id: u8, limit: Duration) -> Result<(), String> {
        let out = self.nodes[usize::from(id - 1)]
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .ok_or_else(|| format!("node {id} is not running"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut told = false;
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if !told && line.contains("ready") {
                    let _ = tx.send(());
                    told = true;
                }
            }
        });
        let deadline = Instant::now() + limit;
        loop {
            if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            let exited = self.nodes[usize::from(id - 1)]
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.nodes[usize::from(id - 1)].child = None;
                return Err(format!(
                    "node {id} exited while starting ({status}); its log is node-{id}.log in the run directory"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "node {id} was not ready within {limit:?} (see its log in the run directory)"
                ));
            }
        }
    }

    fn pid(&self, id: u8) -> Option<i32> {
        self.nodes[usize::from(id - 1)].child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, id: u8, sig: i32) {
        if let Some(pid) = self.pid(id) {
            // SAFETY: kill(2) on a child this run started and has not reaped.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// kill -9 of node `id` (a no-op if it is down).
    pub fn kill(&mut self, id: u8) {
        self.signal(id, libc::SIGKILL);
        if let Some(mut c) = self.nodes[usize::from(id - 1)].child.take() {
            let _ = c.wait();
        }
        self.nodes[usize::from(id - 1)].paused = false;
    }

    /// kill -9 of node `id` and its data directory deleted: it starts
    /// again empty at the next [`Cluster::heal`].
    pub fn wipe(&mut self, id: u8) -> Result<(), String> {
        self.kill(id);
        let data = disk::data_dir(&self.node_dir(id));
        let entries = match std::fs::read_dir(&data) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("wiping {}: {e}", data.display())),
        };
        // What it holds (the directory itself may be a mount point).
        for entry in entries {
            let path = entry.map_err(|e| format!("wiping {}: {e}", data.display()))?.path();
            let gone = match path.is_dir() {
                true => std::fs::remove_dir_all(&path),
                false => std::fs::remove_file(&path),
            };
            gone.map_err(|e| format!("wiping {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// A power cut of node `id`: kill -9, then every write its file system
    /// took since that file's last sync taken back. It starts again at
    /// the next [`Cluster::heal`].
    pub fn power_loss(&mut self, id: u8) -> Result<Lost, String> {
        self.kill(id);
        let disk = self
            .lazy
            .get_mut(usize::from(id - 1))
            .ok_or("power-loss needs the lazy file systems")?;
        disk.power_loss()
    }

    /// kill -9 of node `id`, then one file of its partitions damaged,
    /// chosen with `rng`: a segment, index, checkpoint or journal file has
    /// 1–8 bytes flipped where it holds data, or is cut short. Says what
    /// it did. The node starts again at the next [`Cluster::heal`].
    pub fn corrupt(&mut self, id: u8, rng: &mut crate::schedule::Rng) -> Result<String, String> {
        self.kill(id);
        let data = disk::data_dir(&self.node_dir(id));
        let mut files = Vec::new();
        collect_damageable(&data, &mut files);
        files.sort();
        // Half the time a segment (most of what a disk holds), else any.
        let segments: Vec<_> = files
            .iter()
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .cloned()
            .collect();
        let pool = if !segments.is_empty() && rng.range(0, 1) == 0 {
            segments
        } else {
            files
        };
        if pool.is_empty() {
            return Ok("no file to damage".into());
        }
        let path = &pool[rng.range(0, pool.len() as u64 - 1) as usize];
        let mut bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        // Where it holds data: up to its last byte that is not zero
        // (segments and journal files are zero-filled ahead).
        let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        let what = if end == 0 {
            return Ok(format!("{} holds no data", path.display()));
        } else if rng.range(0, 3) == 0 {
            let keep = rng.range(0, end as u64 - 1) as usize;
            bytes.truncate(keep);
            format!("cut {} to {keep} of {end} bytes", path.display())
        } else {
            let count = rng.range(1, 8) as usize;
            let at = rng.range(0, end as u64 - 1) as usize;
            for b in bytes.iter_mut().skip(at).take(count) {
                *b ^= 1 << rng.range(0, 7);
            }
            format!(
                "flipped a bit in each of {count} bytes of {} at {at} (of {end})",
                path.display()
            )
        };
        // Synced: the damage stays also across a later power loss.
        let write = |bytes: &[u8]| -> std::io::Result<()> {
            let mut f = std::fs::File::create(path)?;
            std::io::Write::write_all(&mut f, bytes)?;
            f.sync_all()
        };
        write(&bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(what)
    }

    pub fn pause(&mut self, id: u8) {
        self.signal(id, libc::SIGSTOP);
        self.nodes[usize::from(id - 1)].paused = true;
    }

    pub fn resume(&mut self, id: u8) {
        self.signal(id, libc::SIGCONT);
        self.nodes[usize::from(id - 1)].paused = false;
    }

    /// Every node running and continued. Nodes that are down start
    /// together, then each is waited for: none is ready before a majority
    /// of the voters runs (after every node was killed at once). A node
    /// that exited by itself (a broker whose controller member stopped on
    /// a full disk exits for its supervisor) counts as down: this is its
    /// supervisor.
    pub fn heal(&mut self) -> Result<(), String> {
        self.reap();
        let mut started = Vec::new();
        for id in 1..=self.nodes.len() as u8 {
            if self.nodes[usize::from(id - 1)].paused {
                self.resume(id);
            }
            if self.nodes[usize::from(id - 1)].child.is_none() {
                self.spawn(id)?;
                started.push(id);
            }
        }
        for id in started {
            // A start that fails (the controller busy electing, say) is
            // tried again, as a supervisor would, up to four more times.
            let mut tries = 1;
            while let Err(e) = self.wait_ready(id, Duration::from_secs(60)) {
                if tries == 5 || self.nodes[usize::from(id - 1)].child.is_some() {
                    return Err(e);
                }
                println!("           ({e}; started again)");
                std::thread::sleep(Duration::from_secs(1));
                self.spawn(id)?;
                tries += 1;
            }
        }
        Ok(())
    }

    /// Forgets nodes whose process exited by itself (logged).
    pub fn reap(&mut self) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let exited = node.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                println!("           (node {} exited by itself: {status}; started again)", i + 1);
                node.child = None;
                node.paused = false;
                self.exits += 1;
            }
        }
    }

    pub fn size(&self) -> u8 {
        self.nodes.len() as u8
    }

    /// The cluster as `strand cluster status` and `strand queue describe`
    /// show it (each command bounded to 10 s), for a run that went wrong:
    /// which partitions lack a leader or ISR members, at which epochs.
    pub fn describe(&self, bootstrap: &str, queues: &[&str]) -> String {
        let mut out = String::new();
        let mut show = |args: &[&str]| {
            let run = Command::new("timeout")
                .arg("10")
                .arg(&self.strand)
                .args(args)
                .args(["--brokers", bootstrap])
                .output();
            match run {
                Ok(o) => {
                    out.push_str(&String::from_utf8_lossy(&o.stdout));
                    out.push_str(&String::from_utf8_lossy(&o.stderr));
                }
                Err(e) => out.push_str(&format!("strand {}: {e}\n", args.join(" "))),
            }
        };
        show(&["cluster", "status"]);
        for q in queues {
            show(&["queue", "describe", q]);
        }
        out
    }

    /// Waits until `done` (checked every 200 ms) or `limit`.
    pub fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        done()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in 1..=self.nodes.len() as u8 {
            self.resume(id);
            self.kill(id);
        }
    }
}

/// The files under `dir` a corruption may hit: partition data (segments,
/// indexes, checkpoints, producer snapshots) and the shard journal; not the
/// controller's Raft state, the lock or the directory id.
fn collect_damageable(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "__controller" | "__lock" | "__directory") {
            continue;
        }
        if path.is_dir() {
            collect_damageable(&path, out);
        } else if !name.starts_with('.') && entry.metadata().is_ok_and(|m| m.len() > 0) {
            out.push(path);
        }
    }
}
