//! A broker whose data directory is on a small file system (a
//! loop-mounted 64 MiB ext4 image: tmpfs does not take O_DIRECT) fills
//! it: producers get `StorageFull` naming the node before the disk runs
//! out, everything acknowledged stays readable, and producing resumes by
//! itself once retention frees space. Needs root (mount), as `.ci/run`
//! has.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Broker;
use strand_client::{block_on, Acks, Consumer, ConsumerConfig, Producer, ProducerConfig, Seek};
use strand_wire::ErrorCode;

/// An ext4 file system of `mib` MiB in an image file, mounted on a
/// directory of its own; unmounted (and the image removed) when dropped.
struct SmallFs {
    dir: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallFs {
    fn mount(mib: u64) -> SmallFs {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image).unwrap().set_len(mib << 20).unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mount));
        SmallFs { dir, mount }
    }

    fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.mount).status().is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a process being reaped): detach it lazily.
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        let _ = &self.dir;
    }
}

#[test]
fn a_full_disk_refuses_produce_keeps_reads_and_resumes_once_space_is_freed() {
    let fs = SmallFs::mount(64);
    let settings = fs.dir.path().join("small.toml");
    std::fs::write(
        &settings,
        "segment_bytes = 1048576\nmax_message_bytes = 262144\nmin_free_bytes = 16777216\n\
         io_memory_bytes = 33554432\nreadahead_budget_bytes = 8388608\ntail_cache_budget_bytes = 8388608\n",
    )
    .unwrap();
    let data = fs.path().join("data");
    let broker = Broker::start_with(&data, &["--config", settings.to_str().unwrap(), "--cores", "1"]);
    let addr = broker.addr.to_string();
    let strand = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_strand"))
            .args(args)
            .args(["--brokers", &addr])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    strand(&["queue", "create", "fill", "--partitions", "1"]);
    let producer = Producer::new(
        &addr,
        ProducerConfig {
            acks: Acks::All,
            delivery_timeout: Duration::from_secs(10),
            ..ProducerConfig::default()
        },
    )
    .unwrap();
    let value = vec![7u8; 64 << 10];
    // Some 51 MiB are free; below 16 MiB produce stops. At most 25 MiB/s,
    // so the broker's looks (every 100 ms) see the threshold coming.
    let mut acked = 0u64;
    let refusal = loop {
        assert!(acked < 1000, "64 MiB written and never refused");
        match block_on(producer.send("fill", None, &value, &[])) {
            Ok(_) => acked += 1,
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    eprintln!("refused after {acked} records of 64 KiB: {refusal}");
    assert_eq!(refusal.code(), Some(ErrorCode::StorageFull), "{refusal}");
    assert!(refusal.to_string().contains("node 1"), "names the node: {refusal}");
    assert!(acked > 300, "refused early: after {acked} records");

    // Everything acknowledged is read back.
    let read_all = || {
        let mut consumer = Consumer::new(
            &addr,
            ConsumerConfig {
                start: Seek::Earliest,
                max_wait: Duration::from_millis(100),
                ..ConsumerConfig::default()
            },
        )
        .unwrap();
        consumer.assign("fill", &[0]);
        let (mut got, mut last) = (0u64, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let records = block_on(consumer.poll()).unwrap();
            if records.is_empty() && got > 0 {
                break;
            }
            for r in records {
                assert_eq!(r.value.as_deref(), Some(&value[..]));
                got += 1;
                last = Some(r.offset);
            }
        }
        (got, last)
    };
    let (got, last) = read_all();
    assert_eq!((got, last), (acked, Some(acked - 1)), "reads while the disk is full");

    // Retention frees space (it looks every 10 s): producing resumes.
    strand(&["queue", "alter", "fill", "--retention-bytes", "4MiB"]);
    let deadline = Instant::now() + Duration::from_secs(40);
    let resumed_at = loop {
        match block_on(producer.send("fill", None, &value, &[])) {
            Ok(d) => break d.offset.unwrap(),
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::StorageFull), "{e}");
                assert!(Instant::now() < deadline, "produce never resumed: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    };
    assert_eq!(resumed_at, acked, "the log goes on where it stopped");
    let (_, last) = read_all();
    assert_eq!(last, Some(acked), "the newest record is read");
    drop(broker);
}
