//! The network: clients reconnect in bursts after a leader moves, and
//! replication fetches and large produce batches want a window of their
//! own per connection; a NIC's interrupts all on one core make that core
//! the broker's bottleneck.

use super::{format_cpu_list, online_cpus, parse_cpu_list, sysctl_bound, unreadable, Bound};
use crate::{Action, Finding, Fix, Root};

/// Socket buffer ceiling recommended for autotuning (tcp_rmem/tcp_wmem max).
const TCP_BUFFER_MAX: u64 = 16 << 20;

pub fn findings(root: &Root) -> Vec<Finding> {
    vec![
        sysctl_bound(
            root,
            "somaxconn",
            "net.core.somaxconn",
            Bound::AtLeast(4096),
            "caps each listener's accept backlog: every client reconnects at once after a failover",
        ),
        sysctl_bound(
            root,
            "tcp_max_syn_backlog",
            "net.ipv4.tcp_max_syn_backlog",
            Bound::AtLeast(4096),
            "half-open connections beyond it are dropped (or answered with cookies) during a reconnect burst",
        ),
        tcp_buffer(root, "tcp_rmem", "net.ipv4.tcp_rmem"),
        tcp_buffer(root, "tcp_wmem", "net.ipv4.tcp_wmem"),
        sysctl_bound(
            root,
            "busy_poll",
            "net.core.busy_poll",
            Bound::AtMost(0),
            "the shards spin in user space before parking (spin_before_park_us); kernel busy polling on top spends \
             the same core twice",
        ),
        nic_irqs(root),
    ]
}

/// `net.ipv4.tcp_rmem` = `min default max`: the broker sets no socket
/// buffer sizes, so autotuning's max bounds a connection at max / RTT.
fn tcp_buffer(root: &Root, name: &'static str, sysctl: &str) -> Finding {
    let why = "the broker leaves socket buffers to autotuning: its ceiling bounds one connection (a replication \
               fetch, a producer) at ceiling / round-trip time";
    let path = crate::root::sysctl_path(sysctl);
    let recommended = format!("{sysctl} max ≥ {TCP_BUFFER_MAX}");
    let Some(raw) = root.sysctl(sysctl) else {
        return unreadable(name, why, &path, recommended, false);
    };
    let fields: Vec<u64> = raw.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let pass = fields.len() == 3 && fields[2] >= TCP_BUFFER_MAX;
    let fix = match fields.as_slice() {
        [min, default, _] if !pass => Fix::Actions(vec![Action::Write {
            path,
            value: format!("{min} {default} {TCP_BUFFER_MAX}"),
        }]),
        _ => Fix::None,
    };
    Finding {
        name,
        why,
        current: format!("{sysctl} = {}", raw.split_whitespace().collect::<Vec<_>>().join(" ")),
        recommended,
        pass,
        required: false,
        fix,
    }
}

/// A NIC's queue interrupts: `(irq, effective CPUs)` per queue.
struct Nic {
    name: String,
    irqs: Vec<(u32, Vec<usize>)>,
}

/// The physical NICs (those with a `device`), each with the interrupts
/// `/proc/interrupts` names after it, its driver instance or its PCI
/// address (queue interrupts only: `-config` ones carry no traffic).
fn nics(root: &Root) -> Vec<Nic> {
    let interrupts = root.read("/proc/interrupts").unwrap_or_default();
    root.list("/sys/class/net")
        .into_iter()
        .filter(|n| n != "lo")
        .filter_map(|name| {
            let device = root.resolve(format!("/sys/class/net/{name}/device"))?;
            let mut labels = vec![name.clone()];
            labels.extend(device.file_name().map(|n| n.to_string_lossy().into_owned()));
            // virtio's interrupts are named after the PCI device above it.
            if let Some(parent) = device.parent().and_then(|p| p.file_name()) {
                let parent = parent.to_string_lossy();
                if parent.contains(':') {
                    labels.push(parent.into_owned());
                }
            }
            let irqs = interrupts
                .lines()
                .filter_map(|line| {
                    let (irq, rest) = line.trim_start().split_once(':')?;
                    let irq: u32 = irq.parse().ok()?;
                    let label_hit = labels.iter().any(|l| names_label(rest, l));
                    (label_hit && !rest.trim_end().ends_with("-config")).then_some(irq)
                })
                .map(|irq| {
                    let cpus = root
                        .read(format!("/proc/irq/{irq}/effective_affinity_list"))
                        .or_else(|| root.read(format!("/proc/irq/{irq}/smp_affinity_list")))
                        .map(|l| parse_cpu_list(&l))
                        .unwrap_or_default();
                    (irq, cpus)
                })
                .collect();
            Some(Nic { name, irqs })
        })
        .collect()
}

/// Whether `line` contains `label` as a whole name (`virtio2` is not in
/// `virtio20-input.0`).
fn names_label(line: &str, label: &str) -> bool {
    line.match_indices(label).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + label.len()..].chars().next();
        before.is_none_or(|c| !c.is_ascii_alphanumeric()) && after.is_none_or(|c| !c.is_ascii_alphanumeric())
    })
}

fn nic_irqs(root: &Root) -> Finding {
    let online = online_cpus(root);
    let nics = nics(root);
    let mut actions = Vec::new();
    let mut parts = Vec::new();
    for nic in &nics {
        let mut used: Vec<usize> = nic.irqs.iter().flat_map(|(_, cpus)| cpus.iter().copied()).collect();
        used.sort_unstable();
        used.dedup();
        // One CPU serves every queue interrupt though there are more
        // queues and more CPUs: spread them, queue i on CPU i mod n.
        let crowded = nic.irqs.len() > 1 && online.len() > 1 && used.len() <= 1;
        parts.push(format!(
            "{}: {} queue interrupt(s) on CPU(s) {}",
            nic.name,
            nic.irqs.len(),
            if used.is_empty() {
                "?".into()
            } else {
                format_cpu_list(&used)
            }
        ));
        if crowded {
            actions.extend(nic.irqs.iter().enumerate().map(|(i, (irq, _))| Action::Write {
                path: format!("/proc/irq/{irq}/smp_affinity_list"),
                value: online[i % online.len()].to_string(),
            }));
        }
    }
    Finding {
        name: "nic_irqs",
        why: "a NIC whose queue interrupts all land on one core makes that core everyone's network bottleneck \
              (irqbalance, if it runs, may move them back)",
        current: if parts.is_empty() {
            "no physical NIC".into()
        } else {
            parts.join("; ")
        },
        recommended: "queue interrupts spread over the CPUs".into(),
        pass: actions.is_empty(),
        required: false,
        fix: if actions.is_empty() {
            Fix::None
        } else {
            Fix::Actions(actions)
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_matches_only_as_a_whole_name() {
        assert!(names_label(
            " 0 12 PCI-MSIX-0000:00:03.0 1-edge virtio2-input.0",
            "virtio2"
        ));
        assert!(!names_label(
            " 0 12 PCI-MSIX-0000:00:03.0 1-edge virtio20-input.0",
            "virtio2"
        ));
        assert!(names_label(" 5 0 IR-PCI-MSI 1-edge eth0-TxRx-0", "eth0"));
        assert!(!names_label(" 5 0 IR-PCI-MSI 1-edge eth01-TxRx-0", "eth0"));
    }
}
