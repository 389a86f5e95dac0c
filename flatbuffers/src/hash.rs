//! The one hash Strand uses where a placement must be the same everywhere
//! and forever: which shard owns a partition (broker) and which partition a
//! key goes to (client, and the broker when it re-appends keyed records).
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

#[cfg(test)]
mod tests {
    use super::*;

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
