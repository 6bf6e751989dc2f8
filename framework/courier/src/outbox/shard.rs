//! Shard assignment: `shard = stable_hash(aggregate_id) % shard_count`.
//!
//! The hash must never change between releases or differ between processes, so it is FNV-1a
//! (64-bit) written out here rather than `std`'s `DefaultHasher`, whose output is unspecified.

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `key`'s UTF-8 bytes.
pub fn stable_hash(key: &str) -> u64 {
    key.bytes().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The shard of `aggregate_id` among `shard_count` shards (`shard_count` ≥ 1).
pub fn shard_of(aggregate_id: &str, shard_count: u32) -> u32 {
    let count = u64::from(shard_count.max(1));
    // The remainder is < shard_count, which fits in u32.
    u32::try_from(stable_hash(aggregate_id) % count).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_published_fnv1a_vectors() {
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn shards_are_in_range_and_spread() {
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            let shard = shard_of(&format!("video-{i}"), 8);
            counts[shard as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert_eq!(shard_of("anything", 1), 0);
    }
}
