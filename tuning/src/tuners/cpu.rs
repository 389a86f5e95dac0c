//! The CPUs the shards are pinned to: one shard thread per core, spinning
//! briefly before it parks, so a core that clocks down or is shared costs
//! every request it serves.

use super::{format_cpu_list, online_cpus, parse_cpu_list};
use crate::{Action, Finding, Fix, Inputs, Root};

pub fn findings(root: &Root, inputs: &Inputs) -> Vec<Finding> {
    let online = online_cpus(root);
    vec![governor(root, &online), cores(inputs, &online), isolated(root, inputs)]
}

fn governor(root: &Root, online: &[usize]) -> Finding {
    let path = |cpu: usize| format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor");
    let governors: Vec<(usize, String)> = online
        .iter()
        .filter_map(|&cpu| root.read(path(cpu)).map(|g| (cpu, g)))
        .collect();
    let slow: Vec<usize> = governors
        .iter()
        .filter(|(_, g)| g != "performance")
        .map(|(cpu, _)| *cpu)
        .collect();
    let current = if governors.is_empty() {
        "no cpufreq (the hypervisor or firmware sets the clock)".to_string()
    } else {
        // Group the CPUs by governor: `performance on 0-7, powersave on 8-15`.
        let mut names: Vec<&str> = governors.iter().map(|(_, g)| g.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names
            .iter()
            .map(|name| {
                let cpus: Vec<usize> = governors.iter().filter(|(_, g)| g == name).map(|(c, _)| *c).collect();
                format!("{name} on {}", format_cpu_list(&cpus))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    Finding {
        name: "cpu_governor",
        why: "a shard's core clocking down between requests adds its ramp-up to their latency",
        current,
        recommended: "performance".into(),
        pass: slow.is_empty(),
        required: false,
        fix: if slow.is_empty() {
            Fix::None
        } else {
            Fix::Actions(
                slow.iter()
                    .map(|&cpu| Action::Write {
                        path: path(cpu),
                        value: "performance".into(),
                    })
                    .collect(),
            )
        },
    }
}

fn cores(inputs: &Inputs, online: &[usize]) -> Finding {
    Finding {
        name: "cpu_cores",
        why: "each shard is pinned to a CPU of its own; the broker refuses more shards than CPUs",
        current: format!(
            "{} shard(s); CPUs online: {} ({})",
            inputs.shards,
            format_cpu_list(online),
            online.len()
        ),
        recommended: format!("≥ {} CPUs online", inputs.shards),
        pass: inputs.shards <= online.len(),
        required: true,
        fix: Fix::Manual("lower `cores` in the broker's config (or --cores)".into()),
    }
}

fn isolated(root: &Root, inputs: &Inputs) -> Finding {
    let isolated = root
        .read("/sys/devices/system/cpu/isolated")
        .map(|l| parse_cpu_list(&l))
        .unwrap_or_default();
    // Some isolated CPUs but fewer than shards: the other shards share
    // their cores with everything else while these sit idle for others.
    let pass = isolated.is_empty() || isolated.len() >= inputs.shards;
    Finding {
        name: "cpu_isolated",
        why: "isolated cores (isolcpus, nohz_full) keep other work off the shards' cores; start the broker on them",
        current: if isolated.is_empty() {
            "none isolated".into()
        } else {
            format!("{} isolated ({})", format_cpu_list(&isolated), isolated.len())
        },
        recommended: format!(
            "none, or at least {} (one per shard; run the broker with taskset -c on them)",
            inputs.shards
        ),
        pass,
        required: false,
        fix: Fix::Manual("change isolcpus= on the kernel command line, or `cores` in the broker's config".into()),
    }
}
