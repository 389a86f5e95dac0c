//! The cluster under test: `strand serve` processes, node N on
//! 127.0.0.N:PORT (all of 127/8 is this machine's loopback), nodes 1–3 the
//! controller's voters, one shard each and small memory budgets, data
//! under a directory this run made. Faults act on them by PID: kill -9
//! and restart, SIGSTOP and SIGCONT. Every process this run started is
//! continued and killed when the cluster is dropped (also after Ctrl-C:
//! the run notices and unwinds).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
}

impl Cluster {
    /// Starts `n` nodes and waits until each is ready.
    pub fn start(strand: &Path, dir: &Path, n: u8, port: u16) -> Result<Cluster, String> {
        std::fs::write(dir.join("node.toml"), SETTINGS).map_err(|e| format!("writing the settings: {e}"))?;
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
        };
        for id in 1..=n {
            c.spawn(id)?;
        }
        for id in 1..=n {
            c.wait_ready(id, Duration::from_secs(60))?;
        }
        Ok(c)
    }

    pub fn addr(&self, id: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, id], self.port))
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
        let child = Command::new(&self.strand)
            .arg("serve")
            .args(["--node-id", &id.to_string(), "--cores", "1"])
            .args(["--listen", &self.addr(id).to_string()])
            .args(["--metrics-listen", &SocketAddr::from(([127, 0, 0, id], 0)).to_string()])
            .args(["--controller-voters", &voters.join(",")])
            .arg("--config")
            .arg(self.dir.join("node.toml"))
            .arg("--data-dir")
            .arg(self.dir.join(format!("node-{id}")))
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
    /// of the voters runs (after every node was killed at once).
    pub fn heal(&mut self) -> Result<(), String> {
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
            self.wait_ready(id, Duration::from_secs(60))?;
        }
        Ok(())
    }

    pub fn size(&self) -> u8 {
        self.nodes.len() as u8
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
