//! Per-process limits the broker runs under: locked memory (the shards
//! register their I/O memory with io_uring) and open files. The limits that
//! count are those of the process that starts the broker: the systemd
//! unit's `LimitMEMLOCK=`/`LimitNOFILE=` when the unit exists, else this
//! shell's (`ulimit`), which `strand serve` started from it inherits.

use std::path::Path;

use super::size;
use crate::{Finding, Fix, Inputs, Root};

/// What systemd gives a unit that sets no `LimitMEMLOCK=` (v252 and
/// before, as on Debian 12; v253 raised it to 8 MiB).
const SYSTEMD_DEFAULT_MEMLOCK: u64 = 64 << 10;
/// What systemd gives a unit that sets no `LimitNOFILE=` (its soft limit).
const SYSTEMD_DEFAULT_NOFILE: u64 = 1024;
/// Open files recommended: each partition keeps its active segment and
/// index open, and each client and peer connection is a socket.
const NOFILE_RECOMMENDED: u64 = 65_536;

/// One limit and where it was read.
struct Limit {
    /// `None`: unlimited.
    value: Option<u64>,
    source: String,
}

pub fn findings(root: &Root, inputs: &Inputs) -> Vec<Finding> {
    let memlock = limit(
        root,
        &inputs.unit_file,
        "LimitMEMLOCK=",
        "Max locked memory",
        SYSTEMD_DEFAULT_MEMLOCK,
    );
    let nofile = limit(
        root,
        &inputs.unit_file,
        "LimitNOFILE=",
        "Max open files",
        SYSTEMD_DEFAULT_NOFILE,
    );
    let fix = |what: &str| {
        Fix::Manual(format!(
            "set {what} in {} (the Ansible strand role does), or raise `ulimit` in the shell that runs strand serve",
            inputs.unit_file.display()
        ))
    };
    let shown = |l: &Limit, as_size: bool| match l.value {
        None => format!("unlimited ({})", l.source),
        Some(v) if as_size => format!("{} ({})", size(v), l.source),
        Some(v) => format!("{v} ({})", l.source),
    };
    let at_least = |l: &Limit, min: u64| l.value.is_none_or(|v| v >= min);
    vec![
        Finding {
            name: "memlock_start",
            why: "glommio starts no shard under this locked-memory limit",
            current: shown(&memlock, true),
            recommended: format!("≥ {}", size(inputs.memlock_min_bytes)),
            pass: at_least(&memlock, inputs.memlock_min_bytes),
            required: true,
            fix: fix("LimitMEMLOCK=infinity"),
        },
        Finding {
            name: "memlock_registered",
            why: "below the shards' I/O memory, disk I/O uses unregistered buffers (catch-up reads up to 40 % slower)",
            current: shown(&memlock, true),
            recommended: format!(
                "≥ {} ({} shard(s) × io_memory_bytes), or unlimited",
                size(inputs.pinned_io_bytes),
                inputs.shards
            ),
            pass: at_least(&memlock, inputs.pinned_io_bytes),
            required: false,
            fix: fix("LimitMEMLOCK=infinity"),
        },
        Finding {
            name: "open_files",
            why: "every partition keeps its active segment and index open, every connection is a socket",
            current: shown(&nofile, false),
            recommended: format!("≥ {NOFILE_RECOMMENDED}"),
            pass: at_least(&nofile, NOFILE_RECOMMENDED),
            required: false,
            fix: fix(&format!("LimitNOFILE={}", NOFILE_RECOMMENDED * 16)),
        },
    ]
}

/// The unit's setting when the unit exists, else this process's soft limit.
fn limit(root: &Root, unit_file: &Path, unit_key: &str, proc_row: &str, systemd_default: u64) -> Limit {
    if let Some(unit) = root.read(unit_file) {
        let unit_name = unit_file.display();
        // The last assignment wins in systemd unit files.
        return match unit.lines().rev().find_map(|l| l.trim().strip_prefix(unit_key)) {
            Some(v) => match parse_unit_limit(v) {
                Some(value) => Limit {
                    value,
                    source: format!("{unit_key}{} in {unit_name}", v.trim()),
                },
                None => Limit {
                    value: Some(0),
                    source: format!("unparsable {unit_key}{} in {unit_name}", v.trim()),
                },
            },
            None => Limit {
                value: Some(systemd_default),
                source: format!("{unit_name} sets no {unit_key}: systemd's default"),
            },
        };
    }
    let limits = root.read("/proc/self/limits").unwrap_or_default();
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix(proc_row))
        .and_then(|rest| rest.split_whitespace().next());
    match soft {
        Some("unlimited") => Limit {
            value: None,
            source: "this shell's ulimit".into(),
        },
        Some(v) => Limit {
            value: Some(v.parse().unwrap_or(0)),
            source: "this shell's ulimit".into(),
        },
        None => Limit {
            value: Some(0),
            source: "unknown: /proc/self/limits unreadable".into(),
        },
    }
}

/// systemd's `infinity`, `65536`, `64K`, `8M`, `1G`, `SOFT:HARD`:
/// `Some(None)` for unlimited, `None` when unparsable.
fn parse_unit_limit(value: &str) -> Option<Option<u64>> {
    let soft = value.trim().split(':').next()?.trim();
    if soft.eq_ignore_ascii_case("infinity") {
        return Some(None);
    }
    let (digits, shift) = match soft.char_indices().last()? {
        (i, 'K' | 'k') => (&soft[..i], 10),
        (i, 'M' | 'm') => (&soft[..i], 20),
        (i, 'G' | 'g') => (&soft[..i], 30),
        (i, 'T' | 't') => (&soft[..i], 40),
        _ => (soft, 0),
    };
    digits.parse::<u64>().ok().map(|n| Some(n.saturating_mul(1 << shift)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_limits_parse_as_systemd_writes_them() {
        assert_eq!(parse_unit_limit("infinity"), Some(None));
        assert_eq!(parse_unit_limit("64K"), Some(Some(64 << 10)));
        assert_eq!(parse_unit_limit("8M:16M"), Some(Some(8 << 20)));
        assert_eq!(parse_unit_limit("1048576"), Some(Some(1_048_576)));
        assert_eq!(parse_unit_limit("lots"), None);
    }
}
