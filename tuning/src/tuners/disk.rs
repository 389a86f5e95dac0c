//! The disks under the data directory: the log writes whole aligned
//! blocks with O_DIRECT and fdatasyncs them, so what lies between it and
//! the drive (I/O scheduler, request merging, the file system, online
//! discard) is on every acknowledgement's path.
//!
//! The data directory is found on its mount (`/proc/self/mountinfo`, the
//! longest mount point above it), the mount's device in
//! `/sys/dev/block/MAJ:MIN`, a partition's disk above it, and a device
//! mapper or md device's disks in its `slaves/`.

use std::path::{Path, PathBuf};

use super::{bracketed, size};
use crate::{Action, Finding, Fix, Inputs, Root};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    major: u32,
    minor: u32,
    point: PathBuf,
    fstype: String,
    /// The mount's options and the file system's, together.
    options: Vec<String>,
}

/// A disk with a request queue (`/sys/block/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Disk {
    name: String,
    sys: PathBuf,
}

pub fn findings(root: &Root, inputs: &Inputs) -> Vec<Finding> {
    let place = existing_ancestor(root, &inputs.data_dir);
    let mounts = root
        .read("/proc/self/mountinfo")
        .map(|m| parse_mountinfo(&m))
        .unwrap_or_default();
    let mount = mount_of(&mounts, &place);
    let disks = mount.map(|m| disks_of(root, m.major, m.minor)).unwrap_or_default();
    let (scheduler, nomerges, write_cache) = queue_findings(root, &disks, mount, &place);
    vec![
        scheduler,
        nomerges,
        write_cache,
        filesystem(mount, &place),
        discard(mount, &place),
        free_space(root, inputs, &place),
    ]
}

/// The data directory, or the nearest directory above it that exists, as
/// an absolute path seen from the root with every symlink followed.
fn existing_ancestor(root: &Root, dir: &Path) -> PathBuf {
    dir.ancestors()
        .find_map(|p| root.resolve(p))
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// The mounts, in order; lines that do not parse are skipped.
fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split_whitespace().collect();
            let right: Vec<&str> = right.split_whitespace().collect();
            let (major, minor) = left.get(2)?.split_once(':')?;
            let mut options: Vec<String> = left.get(5)?.split(',').map(String::from).collect();
            options.extend(right.get(2).into_iter().flat_map(|o| o.split(',').map(String::from)));
            Some(Mount {
                major: major.parse().ok()?,
                minor: minor.parse().ok()?,
                point: PathBuf::from(unescape(left.get(4)?)),
                fstype: (*right.first()?).to_string(),
                options,
            })
        })
        .collect()
}

/// mountinfo writes space, tab, newline and backslash as `\040` etc.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount holding `path`: the last-mounted of the longest mount points
/// above it (a later mount on the same point hides an earlier one).
fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.point))
        .max_by_key(|(i, m)| (m.point.components().count(), *i))
        .map(|(_, m)| m)
}

/// The disks (with a request queue) under device MAJ:MIN.
fn disks_of(root: &Root, major: u32, minor: u32) -> Vec<Disk> {
    let mut disks = Vec::new();
    if let Some(dev) = root.resolve(format!("/sys/dev/block/{major}:{minor}")) {
        collect_disks(root, &dev, 0, &mut disks);
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    disks.dedup();
    disks
}

fn collect_disks(root: &Root, dev: &Path, depth: usize, disks: &mut Vec<Disk>) {
    // Bounded: device stacks (dm on md on partitions) are a few levels.
    if depth > 4 {
        return;
    }
    let slaves = root.list(dev.join("slaves"));
    if !slaves.is_empty() {
        for slave in slaves {
            if let Some(below) = root.resolve(dev.join("slaves").join(&slave)) {
                collect_disks(root, &below, depth + 1, disks);
            }
        }
        return;
    }
    let disk = if root.exists(dev.join("partition")) {
        dev.parent().map(Path::to_path_buf)
    } else {
        Some(dev.to_path_buf())
    };
    if let Some(disk) = disk.filter(|d| root.exists(d.join("queue/scheduler"))) {
        let name = disk
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        disks.push(Disk { name, sys: disk });
    }
}

/// `none [mq-deadline] kyber` → (`mq-deadline`, all offered).
fn parse_scheduler(line: &str) -> (String, Vec<String>) {
    let offered: Vec<String> = line
        .split_whitespace()
        .map(|s| s.trim_matches(|c| c == '[' || c == ']').to_string())
        .collect();
    (bracketed(line), offered)
}

/// The scheduler a disk should run: `none` on NVMe (the drive queues
/// better than the kernel), `mq-deadline` or `none` on the rest.
fn scheduler_ok(disk: &str, active: &str) -> bool {
    active == "none" || (active == "mq-deadline" && !disk.starts_with("nvme"))
}

fn queue_findings(root: &Root, disks: &[Disk], mount: Option<&Mount>, place: &Path) -> (Finding, Finding, Finding) {
    let none_here = || match mount {
        Some(m) => format!(
            "no disk under {} ({} on {})",
            place.display(),
            m.fstype,
            m.point.display()
        ),
        None => format!("no mount found for {}", place.display()),
    };
    let knob = |disk: &Disk, file: &str| disk.sys.join("queue").join(file).display().to_string();
    let read = |disk: &Disk, file: &str| root.read(knob(disk, file));
    let summary = |values: &[(String, String)]| {
        if values.is_empty() {
            none_here()
        } else {
            values
                .iter()
                .map(|(d, v)| format!("{d}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };

    let mut schedulers = Vec::new();
    let mut scheduler_fixes = Vec::new();
    for disk in disks {
        let (active, offered) = parse_scheduler(&read(disk, "scheduler").unwrap_or_default());
        if !scheduler_ok(&disk.name, &active) {
            let want = if disk.name.starts_with("nvme") || !offered.iter().any(|o| o == "mq-deadline") {
                "none"
            } else {
                "mq-deadline"
            };
            scheduler_fixes.push(Action::Write {
                path: knob(disk, "scheduler"),
                value: want.into(),
            });
        }
        schedulers.push((disk.name.clone(), active));
    }
    let scheduler = Finding {
        name: "disk_scheduler",
        why:
            "the log sends large aligned writes it orders itself: a scheduler that reorders or holds them adds latency",
        current: summary(&schedulers),
        recommended: "none on NVMe; mq-deadline or none otherwise".into(),
        pass: scheduler_fixes.is_empty(),
        required: false,
        fix: actions(scheduler_fixes),
    };

    let mut merges = Vec::new();
    let mut merge_fixes = Vec::new();
    for disk in disks {
        let value = read(disk, "nomerges").unwrap_or_else(|| "unknown".into());
        if value != "2" {
            merge_fixes.push(Action::Write {
                path: knob(disk, "nomerges"),
                value: "2".into(),
            });
        }
        merges.push((disk.name.clone(), value));
    }
    let nomerges = Finding {
        name: "disk_nomerges",
        why: "the log's writes are whole blocks already; looking for merges costs CPU on every request",
        current: summary(&merges),
        recommended: "2 (no merging)".into(),
        pass: merge_fixes.is_empty(),
        required: false,
        fix: actions(merge_fixes),
    };

    let caches: Vec<(String, String)> = disks
        .iter()
        .map(|d| {
            (
                d.name.clone(),
                read(d, "write_cache").unwrap_or_else(|| "unknown".into()),
            )
        })
        .collect();
    let write_cache = Finding {
        name: "disk_write_cache",
        why: "with `write back` every fdatasync also flushes the drive's cache; `write through` sends no flush, safe \
              only on a drive whose cache survives power loss",
        current: summary(&caches),
        recommended: "write back, or write through on a drive with power-loss protection".into(),
        pass: caches.iter().all(|(_, c)| c == "write back" || c == "write through"),
        required: false,
        fix: Fix::Manual("check the drive's cache with its vendor tool (hdparm -W, nvme get-feature -f 6)".into()),
    };
    (scheduler, nomerges, write_cache)
}

fn actions(list: Vec<Action>) -> Fix {
    if list.is_empty() {
        Fix::None
    } else {
        Fix::Actions(list)
    }
}

fn filesystem(mount: Option<&Mount>, place: &Path) -> Finding {
    let fstype = mount.map(|m| m.fstype.clone());
    Finding {
        name: "filesystem",
        why: "the log is tested on XFS and ext4; on ext4 each fdatasync into new file space commits the journal \
              (0.75-1 ms measured, against ~60 µs over recycled segments)",
        current: match (&fstype, mount) {
            (Some(t), Some(m)) => format!("{t} on {} (holds {})", m.point.display(), place.display()),
            _ => format!("unknown (no mount found for {})", place.display()),
        },
        recommended: "xfs or ext4".into(),
        pass: matches!(fstype.as_deref(), Some("xfs" | "ext4")),
        required: false,
        fix: Fix::Manual("put the data directory on an XFS or ext4 file system of its own".into()),
    }
}

fn discard(mount: Option<&Mount>, place: &Path) -> Finding {
    let online = mount.is_some_and(|m| m.options.iter().any(|o| o == "discard"));
    Finding {
        name: "disk_discard",
        why: "online discard trims inline as retention deletes segments, which stalls the writes behind it on many \
              drives; a weekly fstrim does the same work off the write path",
        current: match mount {
            Some(m) if online => format!("{} mounted with discard", m.point.display()),
            Some(m) => format!("{} mounted without discard", m.point.display()),
            None => format!("unknown (no mount found for {})", place.display()),
        },
        recommended: "no discard mount option; fstrim.timer enabled".into(),
        pass: mount.is_some() && !online,
        required: false,
        fix: Fix::Manual(
            "remount without `discard` (and drop it from /etc/fstab); systemctl enable fstrim.timer".into(),
        ),
    }
}

fn free_space(root: &Root, inputs: &Inputs, place: &Path) -> Finding {
    let why = "below the broker's free-space threshold (min_free_bytes) produce is refused with StorageFull";
    match root.space(place) {
        Ok((free, total)) => {
            let threshold = (inputs.free_threshold)(total);
            Finding {
                name: "disk_free",
                why,
                current: format!("{} free of {} at {}", size(free), size(total), place.display()),
                recommended: format!("> {} (min_free_bytes)", size(threshold)),
                pass: free > threshold,
                required: true,
                fix: Fix::Manual("free space on the data directory's file system, or lower min_free_bytes".into()),
            }
        }
        Err(e) => Finding {
            name: "disk_free",
            why,
            current: format!("unknown (statvfs {}: {e})", place.display()),
            recommended: "more free than min_free_bytes".into(),
            pass: false,
            required: true,
            fix: Fix::None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
40 27 259:1 / /var/lib/strand rw,noatime shared:5 - xfs /dev/nvme0n1p1 rw,attr2
41 27 0:50 / /mnt/with\\040space rw - tmpfs tmpfs rw
";

    #[test]
    fn mountinfo_parses_and_the_longest_mount_point_holds_a_path() {
        let mounts = parse_mountinfo(MOUNTINFO);
        assert_eq!(mounts.len(), 4);
        let data = mount_of(&mounts, Path::new("/var/lib/strand/data")).unwrap();
        assert_eq!((data.major, data.minor, data.fstype.as_str()), (259, 1, "xfs"));
        assert!(data.options.contains(&"attr2".to_string()));
        let rootfs = mount_of(&mounts, Path::new("/var/lib/strandx")).unwrap();
        assert_eq!(rootfs.fstype, "ext4");
        assert!(rootfs.options.contains(&"discard".to_string()));
        assert_eq!(mounts[3].point, PathBuf::from("/mnt/with space"));
        assert_eq!(parse_mountinfo("garbage\n1 2 x:y / / rw - ext4 a b"), vec![]);
    }

    #[test]
    fn schedulers_parse_and_nvme_wants_none() {
        assert_eq!(parse_scheduler("none [mq-deadline] kyber bfq").0, "mq-deadline");
        assert_eq!(parse_scheduler("[none] mq-deadline").1, vec!["none", "mq-deadline"]);
        assert_eq!(parse_scheduler("none").0, "none");
        assert!(scheduler_ok("sda", "mq-deadline") && scheduler_ok("nvme0n1", "none"));
        assert!(!scheduler_ok("nvme0n1", "mq-deadline") && !scheduler_ok("sda", "bfq"));
    }
}
