//! The tuners, grouped by what they look at. Each is a function from the
//! machine (through the [`Root`]) to one [`Finding`]; this module holds the
//! order they are reported in and the readings several of them share.

mod cpu;
mod disk;
mod io_uring;
mod limits;
mod memory;
mod network;
mod system;

use crate::root::sysctl_path;
use crate::{Action, Finding, Fix, Inputs, Probe, Root};

/// Every finding, in report order.
pub fn all(root: &Root, inputs: &Inputs, probe: &Probe) -> Vec<Finding> {
    let mut findings = Vec::new();
    findings.extend(io_uring::findings(root, probe));
    findings.extend(limits::findings(root, inputs));
    findings.extend(cpu::findings(root, inputs));
    findings.extend(disk::findings(root, inputs));
    findings.extend(memory::findings(root));
    findings.extend(network::findings(root));
    findings.extend(system::findings(root));
    findings
}

/// Which way a numeric sysctl should lie.
#[derive(Debug, Clone, Copy)]
enum Bound {
    AtLeast(u64),
    AtMost(u64),
}

/// A finding for one numeric sysctl: passes within the bound, and is
/// fixed by writing the bound itself.
fn sysctl_bound(root: &Root, name: &'static str, sysctl: &str, bound: Bound, why: &'static str) -> Finding {
    let (recommended, target) = match bound {
        Bound::AtLeast(v) => (format!("≥ {v}"), v),
        Bound::AtMost(v) => (format!("≤ {v}"), v),
    };
    let Some(raw) = root.sysctl(sysctl) else {
        return unreadable(name, why, &sysctl_path(sysctl), recommended, false);
    };
    let pass = match (raw.parse::<u64>(), bound) {
        (Ok(v), Bound::AtLeast(min)) => v >= min,
        (Ok(v), Bound::AtMost(max)) => v <= max,
        (Err(_), _) => false,
    };
    Finding {
        name,
        why,
        current: format!("{sysctl} = {raw}"),
        recommended: format!("{sysctl} {recommended}"),
        pass,
        required: false,
        fix: write_fix(pass, sysctl_path(sysctl), target.to_string()),
    }
}

/// The fix that writes one value, when the finding fails.
fn write_fix(pass: bool, path: String, value: String) -> Fix {
    if pass {
        Fix::None
    } else {
        Fix::Actions(vec![Action::Write { path, value }])
    }
}

/// A finding whose file could not be read: it does not pass (nothing says
/// the host is right), and there is nothing to write.
fn unreadable(name: &'static str, why: &'static str, path: &str, recommended: String, required: bool) -> Finding {
    Finding {
        name,
        why,
        current: format!("unknown ({path} unreadable)"),
        recommended,
        pass: false,
        required,
        fix: Fix::None,
    }
}

/// The active choice of a sysfs selector (`none [mq-deadline] kyber`,
/// `always [madvise] never`): the bracketed word, else the whole value.
fn bracketed(line: &str) -> String {
    line.split_whitespace()
        .find(|s| s.starts_with('['))
        .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| line.trim().to_string())
}

/// `0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11] (the kernel's CPU list format).
fn parse_cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    // Bounded: a CPU list names at most the kernel's CPUs.
                    cpus.extend(a..=b.min(a + 65_536));
                }
            }
            None => cpus.extend(part.parse::<usize>().ok()),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// [0, 1, 2, 3, 8] → `0-3,8`.
fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        let mut end = start;
        while i + 1 < cpus.len() && cpus[i + 1] == end + 1 {
            i += 1;
            end = cpus[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}

/// The CPUs online (`/sys/devices/system/cpu/online`).
fn online_cpus(root: &Root) -> Vec<usize> {
    root.read("/sys/devices/system/cpu/online")
        .map(|l| parse_cpu_list(&l))
        .unwrap_or_default()
}

/// `256 MiB`, `1.5 GiB`, `512 KiB`.
fn size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

#[cfg(test)]
pub(crate) mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_format_both_ways() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(parse_cpu_list("x,2"), vec![2]);
    }

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(size(512 << 10), "512 KiB");
        assert_eq!(size(256 << 20), "256 MiB");
        assert_eq!(size(3 << 29), "1.5 GiB");
    }
}
