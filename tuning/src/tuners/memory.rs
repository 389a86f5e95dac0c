//! Memory: a broker's page cache is the tail its consumers read, and its
//! shards allocate their pools once at start; swapping either out, or the
//! kernel compacting pages under them, stalls a shard thread.

use super::{bracketed, sysctl_bound, unreadable, write_fix, Bound};
use crate::{Finding, Root};

const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

pub fn findings(root: &Root) -> Vec<Finding> {
    vec![
        sysctl_bound(
            root,
            "swappiness",
            "vm.swappiness",
            Bound::AtMost(1),
            "a shard whose pools or hot tail were swapped out stalls every partition it owns while they page back in",
        ),
        transparent_hugepages(root),
        sysctl_bound(
            root,
            "max_map_count",
            "vm.max_map_count",
            Bound::AtLeast(65_530),
            "Strand maps no files (direct I/O), but allocations over 64 MiB are mappings: below the kernel's \
             default they can fail",
        ),
    ]
}

fn transparent_hugepages(root: &Root) -> Finding {
    let why = "with `always`, khugepaged compacts memory under the shards and page faults can stall on compaction";
    let recommended = "madvise or never".to_string();
    let Some(line) = root.read(THP) else {
        return unreadable("transparent_hugepages", why, THP, recommended, false);
    };
    let active = bracketed(&line);
    let pass = active == "madvise" || active == "never";
    Finding {
        name: "transparent_hugepages",
        why,
        current: active,
        recommended,
        pass,
        required: false,
        fix: write_fix(pass, THP.into(), "madvise".into()),
    }
}
