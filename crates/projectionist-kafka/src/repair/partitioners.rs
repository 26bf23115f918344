//! The partitions a key can be on under the default partitioners of the common Kafka
//! producers (see [`super::Partitions::OfTheirKeys`]): a repair reads only those.

use std::collections::BTreeSet;

/// The partitions of a topic of `count` partitions that `key` can be on.
pub(crate) fn candidates(key: &[u8], count: i32) -> BTreeSet<i32> {
    if count <= 0 {
        return BTreeSet::new();
    }
    let n = count as u32;
    let fnv = fnv1a(key);
    // Sarama takes the hash as a signed number, and the remainder's absolute value.
    let sarama = ((fnv as i32) % count).unsigned_abs() as i32;
    [(murmur2(key) as u32 & 0x7fff_ffff) % n, crc32(key) % n, fnv % n]
        .into_iter()
        .map(|p| p as i32)
        .chain([sarama])
        .collect()
}

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`), as its Java client
/// hashes a key.
pub(crate) fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// CRC-32 (IEEE, as zlib and librdkafka compute it).
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// FNV-1a, 32 bits.
pub(crate) fn fnv1a(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5u32, |h, byte| (h ^ u32::from(*byte)).wrapping_mul(0x0100_0193))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by Kafka 3.9.1's `Utils.murmur2` (and `toPositive(h) % 12`).
    #[test]
    fn murmur2_is_kafkas() {
        let cases: [(&str, i32, i32); 9] = [
            ("", 275_646_681, 9),
            ("a", -1_563_381_124, 4),
            ("ab", 316_155_434, 2),
            ("abc", 479_470_107, 3),
            ("21", -973_932_308, 0),
            ("foobar", -790_332_482, 6),
            ("acc-42", -745_712_515, 1),
            ("a-little-bit-longer-string", -1_486_304_829, 11),
            ("ünïcode-ключ", 1_780_578_159, 3),
        ];
        for (key, hash, partition) in cases {
            assert_eq!(murmur2(key.as_bytes()), hash, "{key}");
            assert_eq!((murmur2(key.as_bytes()) as u32 & 0x7fff_ffff) % 12, partition as u32, "{key}");
            assert!(candidates(key.as_bytes(), 12).contains(&partition), "{key}");
        }
    }

    /// Values of Python's `zlib.crc32` and a plain FNV-1a.
    #[test]
    fn crc32_and_fnv1a_are_the_usual_ones() {
        for (key, crc, fnv) in
            [("", 0, 2_166_136_261), ("a", 3_904_355_907, 3_826_002_220), ("abc", 891_568_578, 440_920_331)]
        {
            assert_eq!((crc32(key.as_bytes()), fnv1a(key.as_bytes())), (crc, fnv), "{key}");
        }
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926, "the CRC-32 check value");
        assert!(candidates(b"acc-42", 12).is_superset(&[0, 1, 7].into()));
        assert!(candidates(b"x", 0).is_empty());
        assert!(candidates(b"x", 1) == [0].into());
    }
}
