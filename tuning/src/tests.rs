//! check, apply and script against fake hosts (see `tuners::fake`).

use crate::tuners::fake::{inputs, FakeHost};
use crate::{apply, check, report, required_failed, script, Finding, Outcome, Probe};

const PROBE_OK: Probe = Probe::Given(Ok(()));

fn find<'a>(findings: &'a [Finding], name: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no tuner {name}"))
}

fn failing(findings: &[Finding]) -> Vec<&'static str> {
    findings.iter().filter(|f| !f.pass).map(|f| f.name).collect()
}

#[test]
fn a_tuned_host_passes_every_tuner_and_each_name_is_reported_once() {
    let host = FakeHost::tuned();
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    assert_eq!(failing(&findings), Vec::<&str>::new(), "{findings:#?}");
    assert!(!required_failed(&findings));
    let mut names: Vec<&str> = findings.iter().map(|f| f.name).collect();
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "duplicate names");
    assert!(count >= 25, "{count} tuners");
    // What was read is what is shown.
    assert_eq!(find(&findings, "disk_scheduler").current, "nvme0n1: none");
    assert!(find(&findings, "filesystem")
        .current
        .starts_with("xfs on /var/lib/strand"));
    assert_eq!(
        find(&findings, "nic_irqs").current,
        "eth0: 2 queue interrupt(s) on CPU(s) 0-1"
    );
}

#[test]
fn an_untuned_host_fails_and_apply_fixes_what_can_be_written() {
    let host = FakeHost::tuned();
    host.set("/proc/sys/kernel/io_uring_disabled", "2");
    host.set("/proc/sys/vm/swappiness", "60");
    host.set("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never");
    host.set("/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "powersave");
    host.set(
        "/sys/devices/pci0000:00/nvme0n1/queue/scheduler",
        "none [mq-deadline] kyber",
    );
    host.set("/sys/devices/pci0000:00/nvme0n1/queue/nomerges", "0");
    host.set("/proc/sys/net/core/somaxconn", "128");
    host.set("/proc/sys/net/ipv4/tcp_rmem", "4096 131072 6291456");
    host.set("/proc/irq/38/smp_affinity_list", "0");
    host.set(
        "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        "hpet",
    );
    host.set("/proc/sys/kernel/core_pattern", "core");
    let fixable = [
        "io_uring_enabled",
        "cpu_governor",
        "disk_scheduler",
        "disk_nomerges",
        "swappiness",
        "transparent_hugepages",
        "somaxconn",
        "tcp_rmem",
        "nic_irqs",
        "clocksource",
        "core_pattern",
    ];

    let before = check(&host.root, &inputs(), &PROBE_OK);
    assert_eq!(failing(&before), fixable);
    assert!(required_failed(&before), "io_uring_enabled is required");
    assert_eq!(
        find(&before, "cpu_governor").current,
        "performance on 0,2-3, powersave on 1"
    );
    assert_eq!(
        find(&before, "nic_irqs").current,
        "eth0: 2 queue interrupt(s) on CPU(s) 0"
    );

    let after = apply(&host.root, &inputs(), &PROBE_OK);
    for (finding, outcome) in &after {
        assert!(finding.pass, "{} still fails after apply: {finding:?}", finding.name);
        let expected = if fixable.contains(&finding.name) {
            Outcome::Changed
        } else {
            Outcome::Unchanged
        };
        assert_eq!(*outcome, expected, "{}", finding.name);
    }
    assert_eq!(host.get("/proc/sys/vm/swappiness"), "1");
    assert_eq!(host.get("/sys/devices/pci0000:00/nvme0n1/queue/scheduler"), "none");
    assert_eq!(host.get("/proc/sys/net/ipv4/tcp_rmem"), "4096 131072 16777216");
    assert_eq!(host.get("/proc/irq/38/smp_affinity_list"), "0");
    assert_eq!(host.get("/proc/irq/39/smp_affinity_list"), "1");
    assert_eq!(
        host.get("/proc/sys/kernel/core_pattern"),
        "/var/lib/strand-cores/core.%e.%p.%t"
    );
    assert!(host.path("/var/lib/strand-cores").is_dir());
    // The interrupt of another NIC (virtio20) was left alone.
    assert_eq!(host.get("/proc/irq/40/smp_affinity_list"), "0");
    // A second apply changes nothing.
    assert!(apply(&host.root, &inputs(), &PROBE_OK)
        .iter()
        .all(|(f, o)| f.pass && *o == Outcome::Unchanged));
}

#[test]
fn what_apply_cannot_change_it_says_and_the_finding_still_fails() {
    let host = FakeHost::tuned();
    host.set(
        "/proc/self/mountinfo",
        "1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n40 1 0:50 / /var/lib/strand rw - tmpfs tmpfs rw,discard\n",
    );
    host.set("/sys/devices/system/cpu/isolated", "3");
    let after = apply(&host.root, &inputs(), &PROBE_OK);
    let (fs, outcome) = after.iter().find(|(f, _)| f.name == "filesystem").unwrap();
    assert!(!fs.pass && fs.current.starts_with("tmpfs on /var/lib/strand"), "{fs:?}");
    assert!(matches!(outcome, Outcome::CouldNot(what) if what.contains("XFS or ext4")));
    let (discard, _) = after.iter().find(|(f, _)| f.name == "disk_discard").unwrap();
    assert!(!discard.pass, "{discard:?}");
    let (isolated, _) = after.iter().find(|(f, _)| f.name == "cpu_isolated").unwrap();
    assert!(!isolated.pass && isolated.current == "3 isolated (1)", "{isolated:?}");
    // No block device under a tmpfs: nothing to tune there, and it says so.
    let (scheduler, _) = after.iter().find(|(f, _)| f.name == "disk_scheduler").unwrap();
    assert!(scheduler.pass && scheduler.current.starts_with("no disk under /var/lib/strand"));
}

#[test]
fn limits_come_from_the_unit_that_starts_the_broker_when_there_is_one() {
    let host = FakeHost::tuned();
    let unit = "/etc/systemd/system/strand.service";
    host.set(
        unit,
        "[Service]\nExecStart=/usr/local/bin/strand serve\nLimitMEMLOCK=64K\nLimitNOFILE=1048576\n",
    );
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    let start = find(&findings, "memlock_start");
    assert!(!start.pass && start.required, "{start:?}");
    assert!(start.current.contains("LimitMEMLOCK=64K"), "{start:?}");
    assert!(required_failed(&findings));
    assert!(find(&findings, "open_files").pass);

    host.set(unit, "[Service]\nLimitMEMLOCK=infinity\n");
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    assert!(find(&findings, "memlock_start").pass && find(&findings, "memlock_registered").pass);
    let nofile = find(&findings, "open_files");
    assert!(
        !nofile.pass && nofile.current.contains("sets no LimitNOFILE="),
        "{nofile:?}"
    );

    // No unit: this shell's limits, which a broker started from it gets.
    host.set(
        "/proc/self/limits",
        "Max open files            1024                 4096                 files\n\
         Max locked memory         8388608              8388608              bytes\n",
    );
    std::fs::remove_file(host.path(unit)).unwrap();
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    let start = find(&findings, "memlock_start");
    assert!(
        start.pass && start.current == "8 MiB (this shell's ulimit)",
        "{start:?}"
    );
    assert!(
        !find(&findings, "memlock_registered").pass,
        "8 MiB is below 512 MiB of I/O memory"
    );
}

#[test]
fn a_refused_ring_and_a_full_disk_are_required_failures() {
    let host = FakeHost::tuned();
    host.set("/proc/self/status", "Seccomp:\t2\nSeccomp_filters:\t1\n");
    let refused = Probe::Given(Err("Operation not permitted (os error 1)".into()));
    let mut full = inputs();
    full.free_threshold = Box::new(|_| u64::MAX);
    let findings = check(&host.root, &full, &refused);
    assert_eq!(failing(&findings), ["io_uring_seccomp", "io_uring_probe", "disk_free"]);
    assert!(find(&findings, "io_uring_seccomp")
        .current
        .contains("may be what refuses"));
    assert!(find(&findings, "disk_free").required && find(&findings, "io_uring_probe").required);

    // The same filter, when a ring can be created, is no problem.
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    assert!(find(&findings, "io_uring_seccomp").pass);
    // Under a root that is not this machine nothing is probed, and it says so.
    let skipped = find(&check(&host.root, &inputs(), &Probe::Skipped), "io_uring_probe").clone();
    assert!(skipped.pass && skipped.current.starts_with("not probed"));
}

#[test]
fn an_old_kernel_and_more_shards_than_cpus_are_required_failures() {
    let host = FakeHost::tuned();
    host.set("/proc/sys/kernel/osrelease", "4.19.0-26-amd64");
    let mut big = inputs();
    big.shards = 8;
    let findings = check(&host.root, &big, &PROBE_OK);
    assert!(failing(&findings).starts_with(&["io_uring_kernel"]));
    assert!(!find(&findings, "cpu_cores").pass);
}

#[test]
fn a_device_mapper_volume_is_tuned_on_the_disks_under_it() {
    let host = FakeHost::tuned();
    host.set(
        "/proc/self/mountinfo",
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n40 1 253:0 / /var/lib/strand rw - xfs /dev/mapper/data rw\n",
    );
    host.link("/sys/dev/block/253:0", "../../devices/virtual/block/dm-0");
    host.link(
        "/sys/devices/virtual/block/dm-0/slaves/sdb1",
        "../../../../pci0000:00/sdb/sdb1",
    );
    host.set("/sys/devices/pci0000:00/sdb/sdb1/partition", "1");
    host.set("/sys/devices/pci0000:00/sdb/queue/scheduler", "mq-deadline [bfq] none");
    host.set("/sys/devices/pci0000:00/sdb/queue/nomerges", "2");
    host.set("/sys/devices/pci0000:00/sdb/queue/write_cache", "write through");
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    assert_eq!(find(&findings, "disk_scheduler").current, "sdb: bfq");
    assert_eq!(find(&findings, "disk_write_cache").current, "sdb: write through");
    apply(&host.root, &inputs(), &PROBE_OK);
    // Not NVMe, and mq-deadline is offered: that is what it gets.
    assert_eq!(host.get("/sys/devices/pci0000:00/sdb/queue/scheduler"), "mq-deadline");
}

#[test]
fn script_prints_the_fixes_as_commands_and_what_needs_a_person_as_comments() {
    let host = FakeHost::tuned();
    host.set("/proc/sys/vm/swappiness", "60");
    host.set("/proc/sys/kernel/core_pattern", "core");
    host.set("/proc/sys/kernel/osrelease", "4.19.0");
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    let text = script(&host.root, &findings);
    let root = host.path("/").display().to_string();
    let root = root.trim_end_matches('/');
    assert!(text.starts_with("#!/bin/sh\n"), "{text}");
    assert!(
        text.contains(&format!("echo 1 > {root}/proc/sys/vm/swappiness\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("mkdir -p {root}/var/lib/strand-cores\n")),
        "{text}"
    );
    assert!(text.contains("# by hand: upgrade the kernel\n"), "{text}");
    // Nothing was changed by printing it.
    assert_eq!(host.get("/proc/sys/vm/swappiness"), "60");
    // The script runs, and afterwards the host passes those tuners.
    let status = std::process::Command::new("sh").arg("-c").arg(&text).status().unwrap();
    assert!(status.success());
    let after = check(&host.root, &inputs(), &PROBE_OK);
    assert_eq!(failing(&after), ["io_uring_kernel"]);
}

#[test]
fn the_json_report_carries_the_contract_keys() {
    let host = FakeHost::tuned();
    host.set("/proc/sys/vm/swappiness", "60");
    let findings = check(&host.root, &inputs(), &PROBE_OK);
    let doc = report::json(&findings, None);
    let tuners = doc["tuners"].as_array().unwrap();
    assert_eq!(tuners.len(), findings.len());
    for row in tuners {
        for key in ["name", "current", "recommended", "why"] {
            assert!(row[key].is_string(), "{key} in {row}");
        }
        assert!(row["pass"].is_boolean() && row["required"].is_boolean(), "{row}");
    }
    let swappiness = tuners.iter().find(|r| r["name"] == "swappiness").unwrap();
    assert_eq!(swappiness["current"], "vm.swappiness = 60");
    assert_eq!(swappiness["pass"], false);
    assert_eq!(doc["required_failed"], false);
    let outcomes: Vec<Outcome> = findings.iter().map(|_| Outcome::Changed).collect();
    assert_eq!(
        report::json(&findings, Some(&outcomes))["tuners"][0]["outcome"],
        "changed"
    );
    let table = report::table(&findings, None);
    assert!(table.contains("warn  swappiness"), "{table}");
    assert!(table.contains("recommended: vm.swappiness ≤ 1"), "{table}");
}
