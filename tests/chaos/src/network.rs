//! Each node its own host: a network namespace per node, joined to a
//! bridge that lives in a hub namespace of its own, and one veth from this
//! machine into the hub for the workload. The network faults act inside
//! the node namespaces; nothing but that one veth address is added to
//! this machine's own network.
//!
//! ```text
//!  this machine (the workload)          hub namespace          node namespaces
//!  sc<PID>h  10.213.S.254/24  <---->  uplink ─┐                 ┌── eth0 10.213.S.1  (sc<PID>n1)
//!                                         ├── bridge0 ──────┼── eth0 10.213.S.2  (sc<PID>n2)
//!                                         └─ v1, v2, v3 ────┴── eth0 10.213.S.3  (sc<PID>n3)
//! ```
//!
//! Why a hub namespace: Docker sets this machine's FORWARD policy to DROP
//! and bridged frames pass iptables (`bridge-nf-call-iptables`), so a
//! bridge here would need a FORWARD rule in this machine's tables. In a
//! namespace of its own the bridge forwards under empty tables, and
//! deleting the namespaces removes every link, rule and qdisc the run made.
//!
//! - **Partitions** are iptables DROP rules on a node's INPUT chain by the
//!   source address of another node (the workload's address, .254, is
//!   never cut: clients reach every side, as in Jepsen's tests).
//! - **Slow links**: `tc netem` (delay 50±40 ms, 5 % loss) on the node's
//!   eth0 where the kernel has it; this machine's kernel is built without
//!   `CONFIG_NET_SCH_NETEM`, so the fallback is a `tbf` rate limit of
//!   1 Mbit/s with up to 500 ms of queueing (a slow, congested link) plus
//!   a random 5 % DROP of incoming packets (iptables `statistic`).
//!
//! Names carry this process's PID: [`sweep`] removes what a run that was
//! killed (and so could not clean up) left, once its PID is gone.

use std::process::Command;

/// The private test subnet is 10.213.S.0/24, S chosen free at start.
const PREFIX: [u8; 2] = [10, 213];
/// The workload's own address in the subnet (10.213.S.254).
const HOST: u8 = 254;

pub struct Network {
    tag: String,
    subnet: u8,
    nodes: u8,
    /// Which slow-link method works here (decided at the first use).
    netem: Option<bool>,
}

/// Runs a command, failing with its stderr.
fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A command inside namespace `ns`.
fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    sh("ip", &all)
}

/// Whether this process runs as root (namespaces, iptables, mounts need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Removes namespaces and links named by an earlier run whose process is
/// gone (a run killed with SIGKILL cannot clean up after itself).
pub fn sweep() {
    let Ok(list) = sh("ip", &["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("sc")
            .and_then(|rest| rest.split(['h', 'n']).next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = sh("ip", &["netns", "delete", name]);
        let _ = sh("ip", &["link", "delete", &format!("sc{pid}h")]);
    }
}

impl Network {
    /// Builds the hub, the bridge and `nodes` node namespaces.
    pub fn create(nodes: u8) -> Result<Network, String> {
        sweep();
        let tag = format!("sc{}", std::process::id());
        let used = sh("ip", &["-4", "-o", "addr", "show"])?;
        let start = (std::process::id() % 200) as u8;
        let subnet = (0..200u8)
            .map(|i| 20 + (start + i) % 200)
            .find(|s| !used.contains(&format!("{}.{}.{s}.", PREFIX[0], PREFIX[1])))
            .ok_or("no 10.213.x.0/24 subnet is free")?;
        let net = Network {
            tag,
            subnet,
            nodes,
            netem: None,
        };
        // From here on, Drop removes whatever was made.
        net.build()?;
        Ok(net)
    }

    fn hub(&self) -> String {
        format!("{}h", self.tag)
    }

    /// The namespace of node `id`.
    pub fn namespace(&self, id: u8) -> String {
        format!("{}n{id}", self.tag)
    }

    /// The link on this machine into the hub.
    fn uplink(&self) -> String {
        format!("{}h", self.tag)
    }

    pub fn addr(&self, id: u8) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(PREFIX[0], PREFIX[1], self.subnet, id)
    }

    fn build(&self) -> Result<(), String> {
        let hub = self.hub();
        sh("ip", &["netns", "add", &hub])?;
        in_ns(&hub, "ip", &["link", "add", "name", "bridge0", "type", "bridge"])?;
        in_ns(&hub, "ip", &["link", "set", "dev", "bridge0", "up"])?;
        let uplink = self.uplink();
        sh(
            "ip",
            &[
                "link", "add", &uplink, "type", "veth", "peer", "name", "uplink", "netns", &hub,
            ],
        )?;
        in_ns(&hub, "ip", &["link", "set", "dev", "uplink", "master", "bridge0", "up"])?;
        let host = format!("{}/24", self.addr(HOST));
        sh("ip", &["addr", "add", &host, "dev", &uplink])?;
        sh("ip", &["link", "set", "dev", &uplink, "up"])?;
        for id in 1..=self.nodes {
            let ns = self.namespace(id);
            let port = format!("v{id}");
            sh("ip", &["netns", "add", &ns])?;
            in_ns(
                &hub,
                "ip",
                &[
                    "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            in_ns(&hub, "ip", &["link", "set", "dev", &port, "master", "bridge0", "up"])?;
            let addr = format!("{}/24", self.addr(id));
            in_ns(&ns, "ip", &["addr", "add", &addr, "dev", "eth0"])?;
            in_ns(&ns, "ip", &["link", "set", "dev", "eth0", "up"])?;
            in_ns(&ns, "ip", &["link", "set", "dev", "lo", "up"])?;
        }
        Ok(())
    }

    /// The path whose file descriptor `setns` takes to enter node `id`'s
    /// namespace (what `ip netns exec` does).
    pub fn namespace_path(&self, id: u8) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/var/run/netns/{}", self.namespace(id)))
    }

    /// Node `to` stops receiving anything node `from` sends.
    pub fn drop_from(&self, to: u8, from: u8) -> Result<(), String> {
        let source = self.addr(from).to_string();
        in_ns(
            &self.namespace(to),
            "iptables",
            &["-A", "INPUT", "-s", &source, "-j", "DROP"],
        )
        .map(drop)
    }

    /// Node `id`'s link slowed and lossy (see the module doc).
    pub fn slow(&mut self, id: u8) -> Result<(), String> {
        let ns = self.namespace(id);
        if self.netem != Some(false) {
            let netem = in_ns(
                &ns,
                "tc",
                &[
                    "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "50ms", "40ms", "loss", "5%",
                ],
            );
            self.netem = Some(netem.is_ok());
            if netem.is_ok() {
                return Ok(());
            }
        }
        in_ns(
            &ns,
            "tc",
            &[
                "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "1mbit", "burst", "32kbit", "latency", "500ms",
            ],
        )?;
        in_ns(
            &ns,
            "iptables",
            &[
                "-A",
                "INPUT",
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                "0.05",
                "-j",
                "DROP",
            ],
        )
        .map(drop)
    }

    /// What [`Network::slow`] does here, in words (for the summary).
    pub fn slow_method(&self) -> &'static str {
        match self.netem {
            Some(true) => "netem: 50±40 ms, 5% loss",
            Some(false) => "no sch_netem here: tbf 1 Mbit/s, 5% drop",
            None => "not used",
        }
    }

    /// Every link whole again: no DROP rule, no qdisc.
    pub fn heal(&self) -> Result<(), String> {
        for id in 1..=self.nodes {
            let ns = self.namespace(id);
            in_ns(&ns, "iptables", &["-F", "INPUT"])?;
            // No root qdisc to delete is not an error worth failing on.
            let _ = in_ns(&ns, "tc", &["qdisc", "del", "dev", "eth0", "root"]);
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for id in 1..=self.nodes {
            let _ = sh("ip", &["netns", "delete", &self.namespace(id)]);
        }
        let _ = sh("ip", &["netns", "delete", &self.hub()]);
        let _ = sh("ip", &["link", "delete", &self.uplink()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a two-node network, checks a node's address answers from
    /// this machine and a cut between nodes holds, and that everything is
    /// gone after the drop. Needs root (skipped otherwise).
    #[test]
    fn a_network_is_built_cut_healed_and_removed() {
        if !is_root() {
            eprintln!("skipped: not root");
            return;
        }
        let net = Network::create(2).expect("network");
        let ns1 = net.namespace(1);
        // Node 2 reaches node 1 by address (a connect to a closed port is
        // refused at once); after a cut the connect times out.
        let probe = |from: u8| {
            in_ns(
                &net.namespace(from),
                "bash",
                &[
                    "-c",
                    &format!("timeout 2 bash -c '</dev/tcp/{}/9' 2>&1; echo rc=$?", net.addr(1)),
                ],
            )
            .unwrap()
        };
        assert!(probe(2).contains("refused"), "{}", probe(2));
        net.drop_from(1, 2).unwrap();
        net.drop_from(2, 1).unwrap();
        assert!(probe(2).contains("rc=124"), "the cut let the connect through");
        net.heal().unwrap();
        assert!(probe(2).contains("refused"));
        let hub = net.hub();
        drop(net);
        let list = sh("ip", &["netns", "list"]).unwrap();
        assert!(!list.contains(&ns1) && !list.contains(&hub), "{list}");
    }
}
