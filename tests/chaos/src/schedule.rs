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
}

impl Nemesis {
    pub const ALL: [Nemesis; 5] = [
        Nemesis::Kill,
        Nemesis::Pause,
        Nemesis::Partition,
        Nemesis::Netem,
        Nemesis::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::Kill => "kill",
            Nemesis::Pause => "pause",
            Nemesis::Partition => "partition",
            Nemesis::Netem => "netem",
            Nemesis::DiskFull => "disk-full",
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
/// start, for `hold_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub at_ms: u64,
    pub nemesis: Nemesis,
    pub node: u8,
    pub hold_ms: u64,
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
        // One kill in six takes every node down at once.
        let all = nemesis == Nemesis::Kill && rng.range(0, 5) == 0;
        let node = if all { 0 } else { rng.range(1, u64::from(nodes)) as u8 };
        out.push(Fault {
            at_ms: at,
            nemesis,
            node,
            hold_ms: hold,
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
            assert!(f.node != 0 || f.nemesis == Nemesis::Kill);
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
