//! The nemesis schedule: from a seed, which fault hits which node, when,
//! and for how long. Pure and deterministic: the same seed, nemeses, node
//! count and duration give the same schedule, so a failing run is replayed
//! from its printed command.
//!
//! Faults come one at a time (a healthy gap of 2–5 s, then a fault held
//! 2–6 s), so a majority of the nodes is up between faults. The first
//! faults use each chosen nemesis once (in a seeded order); later ones pick
//! at random. No fault starts in the first 5 s (the workload warms up) or
//! ends in the last 5 s (the cluster heals before the checker reads).

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Nemesis {
    /// kill -9 of one node (now and then of every node at once: a power
    /// loss), restarted when the fault ends.
    Kill,
    /// SIGSTOP of one node, SIGCONT when the fault ends.
    Pause,
    /// Network partitions between nodes.
    Partition,
    /// Latency and loss (tc netem).
    Netem,
    /// One node's data file system full.
    DiskFull,
    /// kill -9 of one node, its data directory deleted (a replaced disk,
    /// or a mount that failed), started again when the fault ends.
    Wipe,
    /// kill -9 of one node, then one of its partitions' files damaged
    /// (bytes flipped, or the file cut short): a segment, an index, a
    /// checkpoint or a journal file; started again when the fault ends.
    Corrupt,
    /// kill -9 of one node (now and then of every node at once), then
    /// every write its file system took since that file's last sync taken
    /// back (see `lazyfs.rs`); started again when the fault ends.
    PowerLoss,
    /// One node's wall clock jumps 10 s to 5 min ahead or back (and runs
    /// skewed so), then jumps back when the fault ends (libfaketime; the
    /// monotonic clock is left alone, as a real jump leaves it).
    Clock,
}

impl Nemesis {
    pub const ALL: [Nemesis; 9] = [
        Nemesis::Kill,
        Nemesis::Pause,
        Nemesis::Partition,
        Nemesis::Netem,
        Nemesis::DiskFull,
        Nemesis::Wipe,
        Nemesis::Corrupt,
        Nemesis::PowerLoss,
        Nemesis::Clock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Kill => "kill",
            Nemesis::Pause => "pause",
            Nemesis::Partition => "partition",
            Nemesis::Netem => "netem",
            Nemesis::DiskFull => "disk-full",
            Nemesis::Wipe => "wipe",
            Nemesis::Corrupt => "corrupt",
            Nemesis::PowerLoss => "power-loss",
            Nemesis::Clock => "clock",
        }
    }

    /// `kill,pause,...` (the `--nemesis` flag).
    pub fn parse_list(text: &str) -> Result<Vec<Nemesis>, String> {
        let mut out = Vec::new();
        for name in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let n = Nemesis::ALL.into_iter().find(|n| n.name() == name).ok_or_else(|| {
                let known: Vec<&str> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                format!("unknown nemesis {name:?} (known: {})", known.join(", "))
            })?;
            if !out.contains(&n) {
                out.push(n);
            }
        }
        if out.is_empty() {
            return Err("no nemesis named".into());
        }
        Ok(out)
    }
}

/// A fault: `nemesis` on `node` (0: every node) from `at_ms` after the
/// start, for `hold_ms`; for a partition, its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub at_ms: u64,
    pub nemesis: Nemesis,
    pub node: u8,
    pub hold_ms: u64,
    pub partition: Option<Partition>,
}

/// Which links a partition cuts. Node sets are bit masks (bit N-1: node N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// One node cut from every other, both ways.
    Isolate(u8),
    /// The leader of the queue's partition 0 when the fault starts, cut
    /// from every other node.
    IsolateLeader,
    /// A minority of the nodes cut from the majority, both ways.
    Split { minority: u16 },
    /// `to` receives nothing from `from`; the other direction works.
    OneWay { from: u8, to: u8 },
    /// `bridge` sees every node; the others form two sides (`side` and the
    /// rest) that do not see each other.
    Bridge { bridge: u8, side: u16 },
}

impl Partition {
    /// A seeded shape over `nodes` nodes.
    fn pick(rng: &mut Rng, nodes: u8) -> Partition {
        let mut order: Vec<u8> = (1..=nodes).collect();
        for i in (1..order.len()).rev() {
            let j = rng.range(0, i as u64) as usize;
            order.swap(i, j);
        }
        let mask = |ids: &[u8]| ids.iter().fold(0u16, |m, id| m | 1 << (id - 1));
        match rng.range(0, 4) {
            0 => Partition::Isolate(order[0]),
            1 => Partition::IsolateLeader,
            2 => {
                let size = rng.range(1, u64::from((nodes - 1) / 2)) as usize;
                Partition::Split {
                    minority: mask(&order[..size]),
                }
            }
            3 => Partition::OneWay {
                from: order[0],
                to: order[1],
            },
            _ => {
                let rest = &order[1..];
                let half = rng.range(1, rest.len() as u64 - 1) as usize;
                Partition::Bridge {
                    bridge: order[0],
                    side: mask(&rest[..half]),
                }
            }
        }
    }

    /// The one-way drops `(to, from)` of this shape over `nodes` nodes
    /// (`leader` stands in for [`Partition::IsolateLeader`]).
    pub fn drops(self, nodes: u8, leader: u8) -> Vec<(u8, u8)> {
        let all = 1..=nodes;
        let inside = |mask: u16, id: u8| mask & (1 << (id - 1)) != 0;
        let both = |a: u8, b: u8| [(a, b), (b, a)];
        match self {
            Partition::Isolate(n) => all.filter(|o| *o != n).flat_map(|o| both(n, o)).collect(),
            Partition::IsolateLeader => Partition::Isolate(leader).drops(nodes, leader),
            Partition::Split { minority } => all
                .clone()
                .filter(|a| inside(minority, *a))
                .flat_map(|a| {
                    all.clone()
                        .filter(move |b| !inside(minority, *b))
                        .flat_map(move |b| both(a, b))
                })
                .collect(),
            Partition::OneWay { from, to } => vec![(to, from)],
            Partition::Bridge { bridge, side } => all
                .clone()
                .filter(|a| inside(side, *a))
                .flat_map(|a| {
                    all.clone()
                        .filter(move |b| *b != bridge && !inside(side, *b))
                        .flat_map(move |b| both(a, b))
                })
                .collect(),
        }
    }

    /// In words, for the run's log.
    pub fn describe(self) -> String {
        let ids = |mask: u16| {
            let v: Vec<String> = (1..=16u8)
                .filter(|id| mask & (1 << (id - 1)) != 0)
                .map(|id| id.to_string())
                .collect();
            v.join(",")
        };
        match self {
            Partition::Isolate(n) => format!("node {n} isolated"),
            Partition::IsolateLeader => "the leader of partition 0 isolated".into(),
            Partition::Split { minority } => format!("nodes {} split from the rest", ids(minority)),
            Partition::OneWay { from, to } => format!("node {to} deaf to node {from}"),
            Partition::Bridge { bridge, side } => {
                format!("nodes {} cut from the others, node {bridge} sees both", ids(side))
            }
        }
    }
}

/// splitmix64: small, fast, and the same everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The faults of a run (see the module doc).
pub fn schedule(seed: u64, nemeses: &[Nemesis], nodes: u8, duration_ms: u64) -> Vec<Fault> {
    let mut rng = Rng::new(seed);
    let mut first: Vec<Nemesis> = nemeses.to_vec();
    // A seeded order for the first round.
    for i in (1..first.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        first.swap(i, j);
    }
    let mut out = Vec::new();
    let mut at = 5_000;
    loop {
        at += rng.range(2_000, 5_000);
        let hold = rng.range(2_000, 6_000);
        if nemeses.is_empty() || at + hold + 5_000 > duration_ms {
            return out;
        }
        let nemesis = match out.len() < first.len() {
            true => first[out.len()],
            false => nemeses[rng.range(0, nemeses.len() as u64 - 1) as usize],
        };
        // One kill in six, and one power loss in three, takes every node
        // down at once.
        let all = match nemesis {
            Nemesis::Kill => rng.range(0, 5) == 0,
            Nemesis::PowerLoss => rng.range(0, 2) == 0,
            _ => false,
        };
        let node = if all { 0 } else { rng.range(1, u64::from(nodes)) as u8 };
        let partition = (nemesis == Nemesis::Partition).then(|| Partition::pick(&mut rng, nodes));
        out.push(Fault {
            at_ms: at,
            nemesis,
            node,
            hold_ms: hold,
            partition,
        });
        at += hold;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_every_nemesis_comes() {
        let all = Nemesis::ALL;
        let a = schedule(7, &all, 3, 120_000);
        assert_eq!(a, schedule(7, &all, 3, 120_000));
        assert_ne!(a, schedule(8, &all, 3, 120_000));
        for n in all {
            assert!(a.iter().any(|f| f.nemesis == n), "{n:?} never comes");
        }
        // One at a time, inside the run, on existing nodes.
        for w in a.windows(2) {
            assert!(w[0].at_ms + w[0].hold_ms < w[1].at_ms);
        }
        for f in &a {
            assert!(f.at_ms >= 5_000 && f.at_ms + f.hold_ms + 5_000 <= 120_000);
            assert!(f.node <= 3);
            assert!(f.node != 0 || matches!(f.nemesis, Nemesis::Kill | Nemesis::PowerLoss));
            assert_eq!(f.partition.is_some(), f.nemesis == Nemesis::Partition);
        }
    }

    #[test]
    fn partitions_cut_the_links_their_shape_says() {
        let cuts = |p: Partition, n: u8| {
            let mut d = p.drops(n, 2);
            d.sort();
            d
        };
        assert_eq!(cuts(Partition::Isolate(1), 3), vec![(1, 2), (1, 3), (2, 1), (3, 1)]);
        assert_eq!(cuts(Partition::IsolateLeader, 3), vec![(1, 2), (2, 1), (2, 3), (3, 2)]);
        assert_eq!(cuts(Partition::OneWay { from: 3, to: 1 }, 3), vec![(1, 3)]);
        // Node 1 sees 2 and 3; 2 and 3 do not see each other.
        assert_eq!(
            cuts(Partition::Bridge { bridge: 1, side: 0b10 }, 3),
            vec![(2, 3), (3, 2)]
        );
        // Nodes 1 and 2 of five split from 3, 4 and 5: 12 one-way drops.
        let split = cuts(Partition::Split { minority: 0b11 }, 5);
        assert_eq!(split.len(), 12);
        assert!(split.contains(&(1, 5)) && split.contains(&(5, 2)) && !split.contains(&(1, 2)));
        // Every seeded shape over 3 and 5 nodes cuts something and leaves
        // every node on existing ids.
        for nodes in [3u8, 5] {
            let mut rng = Rng::new(9);
            for _ in 0..200 {
                let d = Partition::pick(&mut rng, nodes).drops(nodes, 1);
                assert!(!d.is_empty());
                assert!(d
                    .iter()
                    .all(|(a, b)| a != b && (1..=nodes).contains(a) && (1..=nodes).contains(b)));
            }
        }
    }

    #[test]
    fn nemesis_names_parse_and_unknown_ones_are_refused() {
        assert_eq!(
            Nemesis::parse_list("kill,pause,kill").unwrap(),
            vec![Nemesis::Kill, Nemesis::Pause]
        );
        assert_eq!(Nemesis::parse_list("disk-full").unwrap(), vec![Nemesis::DiskFull]);
        assert!(Nemesis::parse_list("kill,flood").unwrap_err().contains("flood"));
        assert!(Nemesis::parse_list("").is_err());
    }
}
