//! A cluster of real `strand serve` processes on one machine: node N
//! listens on `127.0.0.N:PORT` (all of 127/8 is local), one shard each,
//! small memory budgets, every node a controller voter. Started together
//! (no node is ready before a controller leader is elected); stopped
//! (SIGKILL) when dropped.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use strand_client::{block_on, Acks, Consumer, ConsumerConfig, Producer, ProducerConfig, Seek};
use strand_net::message::{body, TailBuilder};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

use super::{serve_command, Broker, Client, Starting};

/// Settings that keep a node small: one shard, 32 MiB of I/O memory.
const SMALL: &str = "io_memory_bytes = 33554432\nreadahead_budget_bytes = 8388608\n\
                     tail_cache_budget_bytes = 16777216\nspin_before_park_us = 0\n";

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// By node id - 1; `None` while a node is down.
    pub nodes: Vec<Option<Broker>>,
    /// Nodes 1 to `voters` vote; later ones are learners.
    pub voters: u8,
    /// Environment variables every node starts with.
    pub env: Vec<(String, String)>,
}

impl Cluster {
    /// Starts `n` nodes and waits until every one is ready.
    pub fn start(n: u8) -> Cluster {
        Cluster::start_with(n, "")
    }

    /// [`Cluster::start`] with more settings (TOML lines) for every node.
    pub fn start_with(n: u8, settings: &str) -> Cluster {
        Cluster::start_with_env(n, settings, &[])
    }

    /// [`Cluster::start_with`], every node also given the variables `env`.
    /// `{node}` in `settings` is each node's id (per-node certificates).
    pub fn start_with_env(n: u8, settings: &str, env: &[(&str, &str)]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("small.toml"), format!("{SMALL}{settings}")).unwrap();
        // Two more addresses free: a learner, and a node that tries to
        // take another's id.
        if settings.contains("{node}") {
            for id in 1..=n + 2 {
                let mine = settings.replace("{node}", &id.to_string());
                std::fs::write(dir.path().join(format!("small-{id}.toml")), format!("{SMALL}{mine}")).unwrap();
            }
        }
        let port = free_port(n + 2);
        let mut cluster = Cluster {
            dir,
            port,
            nodes: Vec::new(),
            voters: n,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        let starting: Vec<Starting> = (1..=n).map(|id| cluster.launch(id, n)).collect();
        cluster.nodes = starting.into_iter().map(|s| Some(s.ready())).collect();
        cluster
    }

    /// The voters: the nodes the cluster started with.
    fn size(&self) -> u8 {
        self.voters
    }

    /// Node `id`'s client address.
    pub fn addr(&self, id: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, id], self.port))
    }

    pub fn data_dir(&self, id: u8) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    fn launch(&self, id: u8, n: u8) -> Starting {
        Starting::spawn(self.command(id, n, self.addr(id)), &self.data_dir(id))
    }

    /// The `strand serve` of node `id` listening on `listen`, with voters
    /// 1 to `n`, its data in [`Cluster::data_dir`] of the listen address's
    /// last byte.
    pub fn command(&self, id: u8, n: u8, listen: SocketAddr) -> std::process::Command {
        let voters: Vec<String> = (1..=n).map(|v| format!("{v}@{}", self.addr(v))).collect();
        let dir = match listen.ip() {
            std::net::IpAddr::V4(ip) => self.data_dir(ip.octets()[3]),
            std::net::IpAddr::V6(_) => self.data_dir(id),
        };
        let listen = listen.to_string();
        let id_text = id.to_string();
        let own = self.dir.path().join(format!("small-{id}.toml"));
        let config = if own.exists() {
            own
        } else {
            self.dir.path().join("small.toml")
        };
        let mut command = serve_command(
            &listen,
            &[
                "--node-id",
                &id_text,
                "--cores",
                "1",
                "--controller-voters",
                &voters.join(","),
            ],
        );
        command.arg("--config").arg(&config).arg("--data-dir").arg(dir);
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Runs `strand ARGS --brokers <node id's address>` and returns its
    /// stdout, asserting it succeeded.
    pub fn strand(&self, id: u8, args: &[&str]) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strand"))
            .args(args)
            .arg("--brokers")
            .arg(self.addr(id).to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "strand {args:?} on node {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Creates `name` with replication factor 3 through node 1 and waits
    /// until every node's metadata shows the same leaders, each partition
    /// led; returns them.
    pub fn create_replicated(&self, name: &str, partitions: u32) -> Vec<u32> {
        let p = partitions.to_string();
        self.strand(
            1,
            &["queue", "create", name, "--partitions", &p, "--replication-factor", "3"],
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let seen: Vec<Vec<u32>> = (1..=3)
                .map(|id| metadata(&mut self.client(id), Some(name)).leaders)
                .collect();
            let led = seen[0].len() == partitions as usize && !seen[0].contains(&0);
            if led && seen.iter().all(|l| *l == seen[0]) {
                return seen[0].clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "leaders of {name} never agreed: {seen:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Starts node `id` again (after [`Cluster::kill9`]) without waiting
    /// for it: [`Starting::ready`] does, then [`Cluster::started`] keeps it.
    pub fn start_again(&self, id: u8) -> Starting {
        self.launch(id, self.size())
    }

    /// Keeps node `id`, started by [`Cluster::start_again`], once ready.
    pub fn started(&mut self, id: u8, node: Starting) {
        self.nodes[usize::from(id - 1)] = Some(node.ready());
    }

    /// Starts node `id` again (after [`Cluster::kill9`]) and waits for it.
    pub fn restart(&mut self, id: u8) {
        let n = self.size();
        let node = self.launch(id, n).ready();
        self.nodes[usize::from(id - 1)] = Some(node);
    }

    /// kill -9 of every node, then all started again together (a power
    /// loss): none is ready before a majority of the voters runs.
    pub fn kill_all_and_restart(&mut self) {
        for id in 1..=self.nodes.len() as u8 {
            self.kill9(id);
        }
        let voters = self.size();
        let starting: Vec<Starting> = (1..=self.nodes.len() as u8).map(|id| self.launch(id, voters)).collect();
        for (i, s) in starting.into_iter().enumerate() {
            self.nodes[i] = Some(s.ready());
        }
    }

    /// Starts node `id` with the cluster's voters, not among them: it
    /// joins as a learner (a broker without a vote).
    pub fn add_learner(&mut self, id: u8) {
        let voters = self.size();
        let node = self.launch(id, voters).ready();
        assert_eq!(usize::from(id), self.nodes.len() + 1, "learners take the next id");
        self.nodes.push(Some(node));
    }

    /// SIGTERM to node `id`, waiting for it to exit (a controlled shutdown).
    pub fn terminate(&mut self, id: u8) -> std::process::ExitStatus {
        self.nodes[usize::from(id - 1)].take().unwrap().terminate()
    }

    /// kill -9 of node `id`.
    pub fn kill9(&mut self, id: u8) {
        if let Some(node) = self.nodes[usize::from(id - 1)].take() {
            node.kill9();
        }
    }

    pub fn node(&self, id: u8) -> &Broker {
        self.nodes[usize::from(id - 1)].as_ref().unwrap()
    }

    pub fn client(&self, id: u8) -> Client {
        Client::connect(self.addr(id))
    }
}

/// A port free on 127.0.0.1 to 127.0.0.n, below the kernel's ephemeral
/// range (32768 and up here): an ephemeral port can be taken at any time
/// as the source port of a connection (the nodes' own connections to one
/// another among them, which once took a node's port before it bound it).
fn free_port(n: u8) -> u16 {
    let mut seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
    for _ in 0..1000 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let port = 20_000 + (seed >> 33) as u16 % 12_000;
        let free = (1..=n).all(|id| TcpListener::bind(SocketAddr::from(([127, 0, 0, id], port))).is_ok());
        if free {
            return port;
        }
    }
    panic!("no port free on every node's address");
}

/// What a node's Metadata says: the controller leader (0: none), the
/// brokers (id, address), the fenced ones, and per partition of `queue` (if
/// given) its leader.
pub struct Seen {
    pub controller: u32,
    pub brokers: Vec<(u32, String)>,
    pub fenced: Vec<u32>,
    /// The controller log index the node's metadata reflects.
    pub applied_index: u64,
    pub leaders: Vec<u32>,
    /// Each partition's leader epoch, as `leaders`.
    pub leader_epochs: Vec<u32>,
    /// The queue's id (0 without a queue).
    pub queue_id: u64,
    pub queues: Vec<String>,
}

pub fn metadata(c: &mut Client, queue: Option<&str>) -> Seen {
    let mut fbb = FlatBufferBuilder::new();
    let names = queue.map(|q| {
        let n = fbb.create_string(q);
        fbb.create_vector(&[n])
    });
    let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: names });
    fbb.finish_minimal(root);
    let f = c.call(Api::Metadata, &fbb, TailBuilder::default());
    let resp = body::<MetadataResponse>(&f).unwrap();
    let brokers = resp
        .brokers()
        .unwrap()
        .iter()
        .map(|b| (b.node_id(), format!("{}:{}", b.host().unwrap_or_default(), b.port())))
        .collect();
    let fenced = resp
        .brokers()
        .unwrap()
        .iter()
        .filter(|b| b.fenced())
        .map(|b| b.node_id())
        .collect();
    let queues: Vec<_> = resp.queues().unwrap().iter().collect();
    let partitions = queue.and_then(|_| queues[0].partitions());
    let leaders = partitions.iter().flatten().map(|p| p.leader()).collect();
    let leader_epochs = partitions.iter().flatten().map(|p| p.leader_epoch()).collect();
    Seen {
        controller: resp.controller(),
        brokers,
        fenced,
        applied_index: resp.applied_index(),
        leaders,
        leader_epochs,
        queue_id: queue.map_or(0, |_| queues[0].id()),
        queues: queues
            .iter()
            .filter(|q| q.error().is_none())
            .map(|q| q.name().unwrap_or_default().to_string())
            .collect(),
    }
}

/// Records by (partition, offset).
pub type Records = BTreeMap<(u32, u64), Vec<u8>>;

/// The describe JSON of `queue` as node `via` gives it.
pub fn describe(c: &Cluster, via: u8, queue: &str) -> serde_json::Value {
    let out = c.strand(via, &["queue", "describe", queue, "--output", "json"]);
    serde_json::from_str(out.trim()).unwrap()
}

/// The bytes of a partition's segment files on one node, trailing zeros
/// (the unwritten rest of the last block) cut.
pub fn segments(dir: &Path, queue: &str, partition: u32) -> Vec<(String, Vec<u8>)> {
    let dir = dir.join(queue).join(partition.to_string());
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| {
            let mut bytes = std::fs::read(&p).unwrap();
            while bytes.last() == Some(&0) {
                bytes.pop();
            }
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    files
}

/// Every record of `queue` read from the partitions' leaders, by partition
/// and offset, once `want` records are there (or the deadline passed).
pub fn read_all(bootstrap: &str, queue: &str, want: usize) -> Records {
    let config = ConsumerConfig {
        start: Seek::Earliest,
        max_wait: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(bootstrap, config).unwrap();
    block_on(consumer.assign_all(queue)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = BTreeMap::new();
    let mut last_error = String::new();
    while got.len() < want && Instant::now() < deadline {
        match block_on(consumer.poll()) {
            Ok(records) => {
                for r in records {
                    got.insert((r.partition, r.offset), r.value.map(|v| v.to_vec()).unwrap_or_default());
                }
            }
            Err(e) if e.to_string() != last_error => {
                eprintln!("reading {queue}: {e}");
                last_error = e.to_string();
            }
            Err(_) => {}
        }
    }
    got
}

/// A thread producing keyed acks=all records to `queue` through every node
/// (3 s delivery timeout each) until `stop`; it returns the acknowledged
/// records by (partition, offset) and the failures.
pub fn produce_keyed_until(
    c: &Cluster,
    queue: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(Records, Vec<String>)> {
    let bootstrap: Vec<String> = (1..=3).map(|id| c.addr(id).to_string()).collect();
    std::thread::spawn(move || {
        let config = ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(3),
            ..ProducerConfig::default()
        };
        let producer = Producer::new(&bootstrap.join(","), config).unwrap();
        let (mut acked, mut failed) = (BTreeMap::new(), Vec::new());
        let mut i = 0u32;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let (key, value) = (format!("k{}", i % 11), format!("v{i}"));
            match block_on(producer.send(queue, Some(key.as_bytes()), value.as_bytes(), &[])) {
                Ok(d) => {
                    acked.insert((d.partition, d.offset.unwrap()), value.into_bytes());
                }
                Err(e) => failed.push(format!("{value}: {e}")),
            }
            i += 1;
        }
        (acked, failed)
    })
}

/// After [`produce_keyed_until`]: no acks=all produce failed, more than
/// 100 were acknowledged, and every acknowledged record is in `got`, where
/// [`read_all`] through node `via` adds what `got` lacks.
pub fn assert_none_failed_none_lost(
    c: &Cluster,
    via: u8,
    queue: &str,
    (acked, failed): (Records, Vec<String>),
    mut got: Records,
) {
    eprintln!("{} records acknowledged, {} failed", acked.len(), failed.len());
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        acked.len() + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(acked.len() > 100, "only {} records acknowledged", acked.len());
    got.extend(read_all(&c.addr(via).to_string(), queue, acked.len()));
    for (at, value) in &acked {
        assert_eq!(got.get(at), Some(value), "acknowledged record at {at:?} lost");
    }
}
