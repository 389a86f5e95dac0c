//! A fake host for the tuners' tests: a temporary root holding every file
//! they read, set to values that pass. Tests change one thing and look.

use std::path::{Path, PathBuf};

use crate::{Inputs, Root};

pub struct FakeHost {
    // Held so the tree lives as long as the host.
    _dir: tempfile::TempDir,
    pub root: Root,
}

impl FakeHost {
    /// A tuned 4-CPU host: the data directory on an XFS partition of an
    /// NVMe drive, one virtio NIC with two queue interrupts on two CPUs.
    pub fn tuned() -> FakeHost {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let host = FakeHost {
            root: Root::new(dir.path()),
            _dir: dir,
        };
        for (path, value) in [
            ("/proc/sys/kernel/osrelease", "6.1.0-18-amd64"),
            ("/proc/sys/kernel/io_uring_disabled", "0"),
            ("/proc/self/status", "Name:\tstrand\nSeccomp:\t0\nSeccomp_filters:\t0\n"),
            (
                "/proc/self/limits",
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max open files            1048576              1048576              files     \n\
                 Max locked memory         unlimited            unlimited            bytes     \n",
            ),
            ("/sys/devices/system/cpu/online", "0-3"),
            ("/sys/devices/system/cpu/isolated", ""),
            (
                "/proc/self/mountinfo",
                "22 1 0:21 / /proc rw,relatime - proc proc rw\n\
                 1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                 40 1 259:1 / /var/lib/strand rw,noatime - xfs /dev/nvme0n1p1 rw,attr2\n",
            ),
            ("/sys/devices/pci0000:00/nvme0n1/queue/scheduler", "[none] mq-deadline kyber"),
            ("/sys/devices/pci0000:00/nvme0n1/queue/nomerges", "2"),
            ("/sys/devices/pci0000:00/nvme0n1/queue/write_cache", "write back"),
            ("/sys/devices/pci0000:00/nvme0n1/nvme0n1p1/partition", "1"),
            ("/proc/sys/vm/swappiness", "1"),
            ("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never"),
            ("/proc/sys/vm/max_map_count", "262144"),
            ("/proc/sys/net/core/somaxconn", "4096"),
            ("/proc/sys/net/ipv4/tcp_max_syn_backlog", "4096"),
            ("/proc/sys/net/ipv4/tcp_rmem", "4096\t131072\t33554432"),
            ("/proc/sys/net/ipv4/tcp_wmem", "4096\t16384\t16777216"),
            ("/proc/sys/net/core/busy_poll", "0"),
            (
                "/proc/interrupts",
                "           CPU0       CPU1       CPU2       CPU3\n\
                 \x20 37:          0          0          0          0  PCI-MSIX-0000:00:03.0   0-edge      virtio2-config\n\
                 \x20 38:          0       2321          0          0  PCI-MSIX-0000:00:03.0   1-edge      virtio2-input.0\n\
                 \x20 39:       1486          0          0          0  PCI-MSIX-0000:00:03.0   2-edge      virtio2-output.0\n\
                 \x20 40:         12          0          0          0  PCI-MSIX-0000:00:04.0   1-edge      virtio20-input.0\n",
            ),
            ("/proc/irq/38/smp_affinity_list", "1"),
            ("/proc/irq/39/smp_affinity_list", "0"),
            ("/proc/irq/40/smp_affinity_list", "0"),
            ("/sys/devices/pci0000:00/0000:00:03.0/virtio2/vendor", "0x1af4"),
            ("/sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc"),
            ("/sys/devices/system/clocksource/clocksource0/available_clocksource", "tsc hpet acpi_pm"),
            ("/proc/sys/kernel/core_pattern", "|/lib/systemd/systemd-coredump %P %u %g %s %t %c %h"),
            ("/proc/sys/fs/aio-max-nr", "1048576"),
            ("/proc/sys/fs/nr_open", "1048576"),
        ] {
            host.set(path, value);
        }
        for cpu in 0..4 {
            host.set(
                &format!("/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
                "performance",
            );
        }
        host.link("/sys/dev/block/259:1", "../../devices/pci0000:00/nvme0n1/nvme0n1p1");
        host.link(
            "/sys/class/net/eth0/device",
            "../../../devices/pci0000:00/0000:00:03.0/virtio2",
        );
        std::fs::create_dir_all(host.root.path("/sys/class/net/lo")).expect("lo");
        std::fs::create_dir_all(host.root.path("/var/lib/strand")).expect("the data mount");
        host
    }

    /// Writes a file of the fake tree, making its directories.
    pub fn set(&self, path: &str, value: &str) {
        let file = self.root.path(path);
        std::fs::create_dir_all(file.parent().expect("an absolute path has a parent")).expect("directories");
        std::fs::write(file, value).expect("a fake file");
    }

    /// Makes `path` a symlink to `target` (relative, so it stays inside).
    pub fn link(&self, path: &str, target: &str) {
        let at = self.root.path(path);
        std::fs::create_dir_all(at.parent().expect("an absolute path has a parent")).expect("directories");
        std::os::unix::fs::symlink(target, &at).expect("a fake symlink");
    }

    pub fn get(&self, path: &str) -> String {
        self.root.read(path).unwrap_or_default()
    }

    pub fn path(&self, path: &str) -> PathBuf {
        self.root.path(Path::new(path))
    }
}

/// A two-shard broker with its data under /var/lib/strand/data.
pub fn inputs() -> Inputs {
    Inputs {
        data_dir: PathBuf::from("/var/lib/strand/data"),
        shards: 2,
        pinned_io_bytes: 512 << 20,
        memlock_min_bytes: 512 << 10,
        free_threshold: Box::new(|_| 0),
        unit_file: PathBuf::from("/etc/systemd/system/strand.service"),
    }
}
