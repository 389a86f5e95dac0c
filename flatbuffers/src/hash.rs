//! The one hash Strand uses where a placement must be the same everywhere
//! and forever: which shard owns a partition (broker, and shard-aware
//! clients) and which partition a key goes to (client, and the broker when
//! it re-appends keyed records); plus the mix that places a connection on a
//! shard by its client port.
//!
//! FNV-1a 64 is fixed by its definition (unlike `std`'s hasher, which may
//! change between Rust releases and is seeded per process), cheap for short
//! keys, and spreads well enough for `mod n` placement.

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The partition of a queue with `partitions` partitions that records with
/// `key` go to: `fnv1a64(key) mod partitions`. The same key always lands on
/// the same partition while the partition count stays the same (growing a
/// queue moves keys, as in Kafka). Panics if `partitions` is 0.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a queue has at least one partition");
    (fnv1a64(key) % u64::from(partitions)) as u32
}

/// The shard (`0..shards`) that owns `partition` of `queue` on a node with
/// `shards` shards: `(fnv1a64(queue) + partition) mod shards`. Consecutive
/// partitions of a queue land on consecutive shards; the name's hash offsets
/// queues from each other. Brokers route by it, and shard-aware clients
/// connect to the owning shard by it. Panics if `shards` is 0.
pub fn shard_for_partition(queue: &str, partition: u32, shards: u16) -> u16 {
    assert!(shards > 0, "a node has at least one shard");
    (fnv1a64(queue.as_bytes()).wrapping_add(u64::from(partition)) % u64::from(shards)) as u16
}

/// The shard that serves a client connection from TCP port `port` on a
/// node with `shards` shards (the broker hands each accepted connection to
/// it). A client that wants shard `s` binds a local port for which this
/// gives `s` — about one port in `shards` does — and its requests then
/// never cross between cores. Ports are mixed (the 64-bit MurmurHash3
/// finaliser) rather than taken `mod shards`: Linux gives `connect()`
/// mostly even ports, which `mod 2` would send all to shard 0. Panics if
/// `shards` is 0.
pub fn shard_for_port(port: u16, shards: u16) -> u16 {
    assert!(shards > 0, "a node has at least one shard");
    let mut x = u64::from(port);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    (x % u64::from(shards)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_and_ports_have_fixed_shards() {
        // Pinned: brokers and clients of different builds must agree.
        assert_eq!(shard_for_partition("orders", 0, 4), (fnv1a64(b"orders") % 4) as u16);
        assert_eq!(shard_for_partition("orders", 3, 1), 0);
        assert_eq!(
            (0..16).map(|p| shard_for_port(40_000 + p, 4)).collect::<Vec<_>>(),
            (0..16).map(|p| shard_for_port(40_000 + p, 4)).collect::<Vec<_>>()
        );
        assert_eq!(shard_for_port(0, 1), 0);
    }

    #[test]
    fn even_ports_spread_over_shards() {
        // Linux hands connect() mostly even ports: they must still spread.
        for shards in [2u16, 3, 4, 8, 16] {
            let mut counts = vec![0u32; usize::from(shards)];
            for port in (32_768u16..61_000).step_by(2) {
                counts[usize::from(shard_for_port(port, shards))] += 1;
            }
            let mean = 14_116 / u32::from(shards);
            for c in &counts {
                assert!(
                    c.abs_diff(mean) < mean / 10,
                    "uneven spread over {shards} shards: {counts:?}"
                );
            }
        }
    }

    #[test]
    fn fnv_matches_its_definition() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn keys_have_fixed_partitions() {
        // Pinned: changing these moves every user's keys.
        assert_eq!(partition_for_key(b"user-1", 8), (fnv1a64(b"user-1") % 8) as u32);
        assert_eq!(partition_for_key(b"", 3), (0xcbf2_9ce4_8422_2325u64 % 3) as u32);
        for p in 1..50 {
            assert!(partition_for_key(b"order-42", p) < p);
        }
    }

    #[test]
    fn keys_spread_evenly() {
        let mut counts = [0u32; 8];
        for i in 0..80_000 {
            counts[partition_for_key(format!("key-{i}").as_bytes(), 8) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "uneven spread: {counts:?}");
        }
    }
}
