//! CPU cost of the batch format per MiB, on one core, no I/O:
//! `cargo bench -p strand-bench --bench batch_cpu`.
//!
//! Times building 1 MiB batches of 1,000-byte records record by record
//! (the producer's floor: `BatchBuilder::push` per record, CRC at the end),
//! then the broker's work on such batches — full validation + stamping (CRC of the whole
//! batch, every record parsed), CRC alone, the copy into a write buffer —
//! and the consumer's record iteration. Prints the median of 7 rounds in
//! µs per MiB; the last line is JSON.

use std::time::Instant;

use bytes::BytesMut;
use strand_storage::batch::{self, RecordBatch, Stamp};
use strand_storage::{testkit, LeaderEpoch, Offset};

const BATCHES: u64 = 64;
/// 1,000-byte records in a ~1 MiB batch.
const RECORDS: u32 = 1034;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn per_mib(bytes: usize, secs: f64) -> f64 {
    secs * 1e6 / (bytes as f64 / (1 << 20) as f64)
}

fn main() {
    let built: Vec<BytesMut> = (0..BATCHES).map(|t| testkit::batch(t, RECORDS, 1000, 0)).collect();
    let bytes: usize = built.iter().map(|b| b.len()).sum();
    let mut stamp_us = Vec::new();
    let mut crc_us = Vec::new();
    let mut copy_us = Vec::new();
    let mut iterate_us = Vec::new();
    let mut build_us = Vec::new();
    let mut dst = vec![0u8; 2 << 20];
    let value = vec![b'v'; 1000];
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut built_bytes = 0;
        for _ in 0..BATCHES {
            let mut b = strand_wire::batch::BatchBuilder::with_capacity(1 << 20);
            for _ in 0..RECORDS {
                b.push(None, Some(&value), &[], 1_700_000_000_000);
            }
            built_bytes += std::hint::black_box(b.build()).len();
        }
        build_us.push(per_mib(built_bytes, t.elapsed().as_secs_f64()));

        let mut batches = built.clone();
        let t = Instant::now();
        for b in batches.iter_mut() {
            let stamp = Stamp {
                base_offset: Offset(1),
                leader_epoch: LeaderEpoch(1),
                log_append_time_ms: None,
            };
            batch::stamp(b, 1 << 24, stamp).expect("valid batch");
        }
        stamp_us.push(per_mib(bytes, t.elapsed().as_secs_f64()));

        let t = Instant::now();
        let mut sum = 0u32;
        for b in &batches {
            sum ^= crc32fast::hash(b);
        }
        std::hint::black_box(sum);
        crc_us.push(per_mib(bytes, t.elapsed().as_secs_f64()));

        let t = Instant::now();
        for b in &batches {
            dst[..b.len()].copy_from_slice(b);
            std::hint::black_box(&dst);
        }
        copy_us.push(per_mib(bytes, t.elapsed().as_secs_f64()));

        let frozen: Vec<RecordBatch> = batches
            .into_iter()
            .map(|b| RecordBatch::new(b.freeze(), 1 << 24).expect("valid batch"))
            .collect();
        let t = Instant::now();
        let mut n = 0usize;
        for b in &frozen {
            for r in b.records() {
                n += r.value.map_or(0, |v| v.len());
            }
        }
        std::hint::black_box(n);
        iterate_us.push(per_mib(bytes, t.elapsed().as_secs_f64()));
    }
    let (stamp, crc, copy, iterate) = (median(stamp_us), median(crc_us), median(copy_us), median(iterate_us));
    let build = median(build_us);
    println!("batch CPU cost, µs per MiB (median of {ROUNDS} rounds, {BATCHES} × 1 MiB batches):");
    println!("  build record by record      {build:8.1}");
    println!("  validate + stamp (broker)   {stamp:8.1}");
    println!("    of which CRC-32           {crc:8.1}");
    println!("  copy into a write buffer    {copy:8.1}");
    println!("  iterate records (consumer)  {iterate:8.1}");
    println!(
        "{{\"build_us_per_mib\":{build:.1},\"stamp_us_per_mib\":{stamp:.1},\"crc_us_per_mib\":{crc:.1},\"copy_us_per_mib\":{copy:.1},\"iterate_us_per_mib\":{iterate:.1}}}"
    );
}
