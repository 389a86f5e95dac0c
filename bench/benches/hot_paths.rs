//! Hot paths besides the batch format (`batch_cpu`), one core each, no
//! disk: `cargo bench -p strand-bench --bench hot_paths`.
//!
//! - index lookup: a full 1 GiB segment's sparse offset index (one entry
//!   per 32 KiB) asked for random offsets — ns per lookup;
//! - frame decode: a buffer of small produce-sized frames cut into frames
//!   (length, fixed fields, body, tail sliced without copying) — ns per
//!   frame;
//! - cross-shard forward: a request and its reply over glommio's channel
//!   mesh between two executors on their own threads (what a request for
//!   another shard's partition pays) — ns per round trip, with the
//!   broker's default 50 µs spin before an idle executor parks.
//!
//! Prints the median of 7 rounds; the last line is JSON.

use std::time::Instant;

use bytes::BytesMut;
use glommio::channels::channel_mesh::MeshBuilder;
use strand_net::frame::{decode, encode_head, FrameHeader, FrameLimits};
use strand_storage::index::SegmentIndex;

const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn index_lookup_ns() -> f64 {
    // 1 GiB of 16 KiB batches of 16 records: an entry every 32 KiB.
    let mut index = SegmentIndex::new();
    let batches = (1u32 << 30) / (16 << 10);
    for b in 0..batches {
        index.on_batch(b * 16, b * (16 << 10), 16 << 10, i64::from(b), 32 << 10);
    }
    let last = batches * 16;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let lookups = 1_000_000;
    let t = Instant::now();
    let mut sum = 0u64;
    for _ in 0..lookups {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (rel, pos) = index.lookup_offset((x % u64::from(last)) as u32);
        sum = sum.wrapping_add(u64::from(rel) + u64::from(pos));
    }
    std::hint::black_box(sum);
    t.elapsed().as_nanos() as f64 / f64::from(lookups)
}

fn frame_decode_ns() -> f64 {
    let frames = 100_000u32;
    let body = vec![0x11u8; 96];
    let tail = vec![0x22u8; 120];
    let mut wire = BytesMut::new();
    for i in 0..frames {
        let header = FrameHeader {
            api: 6,
            version: 0,
            correlation_id: i,
        };
        encode_head(&mut wire, header, &body, tail.len());
        wire.extend_from_slice(&tail);
    }
    let t = Instant::now();
    let mut n = 0u32;
    while let Ok(Some(f)) = decode(&mut wire, FrameLimits::default()) {
        std::hint::black_box(&f);
        n += 1;
    }
    assert_eq!(n, frames, "every frame decodes");
    t.elapsed().as_nanos() as f64 / f64::from(frames)
}

fn cross_shard_ns() -> f64 {
    let trips = 200_000u32;
    let mesh = MeshBuilder::<u64, _>::full(2, 1024);
    let (m0, m1) = (mesh.clone(), mesh);
    // As the broker's shards do (`--spin-before-park-us`, default 50).
    let spin = std::time::Duration::from_micros(50);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).max(2);
    let server = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(1 % cores))
        .spin_before_park(spin)
        .spawn(move || async move {
            let (senders, receivers) = m1.join().await.expect("joining the mesh");
            let peer = if senders.peer_id() == 0 { 1 } else { 0 };
            for _ in 0..trips {
                let Ok(Some(v)) = receivers.recv_from(peer).await else {
                    break;
                };
                if senders.send_to(peer, v + 1).await.is_err() {
                    break;
                }
            }
        })
        .expect("spawning an executor");
    let client = glommio::LocalExecutorBuilder::new(glommio::Placement::Fixed(0))
        .spin_before_park(spin)
        .spawn(move || async move {
            let (senders, receivers) = m0.join().await.expect("joining the mesh");
            let peer = if senders.peer_id() == 0 { 1 } else { 0 };
            let t = Instant::now();
            for i in 0..u64::from(trips) {
                senders.send_to(peer, i).await.expect("sending");
                let got = receivers.recv_from(peer).await.expect("receiving").expect("a reply");
                assert_eq!(got, i + 1);
            }
            t.elapsed().as_nanos() as f64 / f64::from(trips)
        })
        .expect("spawning an executor");
    let ns = client.join().expect("the client executor");
    server.join().expect("the server executor");
    ns
}

fn main() {
    let (mut index, mut frames, mut mesh) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        index.push(index_lookup_ns());
        frames.push(frame_decode_ns());
    }
    for _ in 0..3 {
        mesh.push(cross_shard_ns());
    }
    let (index, frames, mesh) = (median(index), median(frames), median(mesh));
    println!("index lookup (1 GiB segment, 32 KiB interval)   {index:>10.1} ns");
    println!("frame decode (216-byte frames)                   {frames:>10.1} ns");
    println!("cross-shard round trip (glommio channel mesh)    {mesh:>10.1} ns");
    println!(
        "{}",
        serde_json::json!({
            "index_lookup_ns": (index * 10.0).round() / 10.0,
            "frame_decode_ns": (frames * 10.0).round() / 10.0,
            "cross_shard_round_trip_ns": (mesh * 10.0).round() / 10.0,
        })
    );
}
