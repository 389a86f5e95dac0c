//! The rest of the host: the clock every timestamp and timeout reads,
//! where a crashed broker's core goes, and system-wide file ceilings.

use super::{sysctl_bound, unreadable, write_fix, Bound};
use crate::{Action, Finding, Fix, Root};

const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
const CLOCKSOURCES: &str = "/sys/devices/system/clocksource/clocksource0/available_clocksource";
/// Where `apply` sends core dumps: off the data directory, named so that
/// several never overwrite each other.
const CORE_DIR: &str = "/var/lib/strand-cores";

pub fn findings(root: &Root) -> Vec<Finding> {
    vec![
        clocksource(root),
        core_pattern(root),
        sysctl_bound(
            root,
            "aio_max_nr",
            "fs.aio-max-nr",
            Bound::AtLeast(1_048_576),
            "Strand's I/O is io_uring, which this does not cap; other direct-I/O software on the host (Linux AIO) \
             shares the ceiling",
        ),
        sysctl_bound(
            root,
            "nr_open",
            "fs.nr_open",
            Bound::AtLeast(1_048_576),
            "no process's open-file limit (LimitNOFILE) may exceed it",
        ),
    ]
}

fn clocksource(root: &Root) -> Finding {
    let why = "every timestamp, lease and timeout reads the clock: tsc reads in user space, others can trap to the \
               kernel or hypervisor";
    let Some(current) = root.read(CLOCKSOURCE) else {
        return unreadable("clocksource", why, CLOCKSOURCE, "tsc".into(), false);
    };
    let available = root.read(CLOCKSOURCES).unwrap_or_default();
    let has_tsc = available.split_whitespace().any(|c| c == "tsc");
    let pass = current == "tsc" || !has_tsc;
    Finding {
        name: "clocksource",
        why,
        current: format!("{current} (available: {available})"),
        recommended: if has_tsc {
            "tsc".into()
        } else {
            format!("{current} (no tsc here)")
        },
        pass,
        required: false,
        fix: write_fix(pass, CLOCKSOURCE.into(), "tsc".into()),
    }
}

fn core_pattern(root: &Root) -> Finding {
    let why = "a relative core_pattern writes a crashed broker's core (its whole memory) into its working \
               directory, often the data disk";
    let path = crate::root::sysctl_path("kernel.core_pattern");
    let recommended = format!("a pipe to a collector (systemd-coredump) or an absolute directory ({CORE_DIR})");
    let Some(pattern) = root.sysctl("kernel.core_pattern") else {
        return unreadable("core_pattern", why, &path, recommended, false);
    };
    let pass = pattern.starts_with('|') || pattern.starts_with('/');
    Finding {
        name: "core_pattern",
        why,
        current: format!("kernel.core_pattern = {pattern}"),
        recommended,
        pass,
        required: false,
        fix: if pass {
            Fix::None
        } else {
            Fix::Actions(vec![
                Action::CreateDir { path: CORE_DIR.into() },
                Action::Write {
                    path,
                    value: format!("{CORE_DIR}/core.%e.%p.%t"),
                },
            ])
        },
    }
}
