//! Token-id prefix comparison, the inner loop of every chain merge.
//!
//! Plain slice equality compiles to a byte-at-a-time `memcmp` in a wasm
//! guest, 7-8x slower than native. Here each step ORs together the XOR of
//! 8 id pairs (256 bits) and branches once; with `+simd128` LLVM lowers it
//! to two `v128` loads per side, `i32x4.ne` and `v128.any_true` (checked in
//! the wasm assembly), natively to SSE/AVX compares. Only the block holding
//! the first difference is scanned id by id.

/// Ids compared per step of the fast loop.
const BLOCK: usize = 8;

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut start = 0;
    for (x, y) in a.chunks_exact(BLOCK).zip(b.chunks_exact(BLOCK)) {
        // Branch-free over the block so it vectorises.
        let differs = x.iter().zip(y).fold(0u32, |acc, (a, b)| acc | (a ^ b));
        if differs != 0 {
            break;
        }
        start += BLOCK;
    }
    // Tail, or the block that holds the first difference.
    start
        + a[start..]
            .iter()
            .zip(&b[start..])
            .take_while(|(x, y)| x == y)
            .count()
}

/// Whether `haystack` starts with `prefix`.
pub fn starts_with_ids(haystack: &[u32], prefix: &[u32]) -> bool {
    prefix.len() <= haystack.len() && common_prefix_len(haystack, prefix) == prefix.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_common_prefix_len(a: &[u32], b: &[u32]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn matches_naive_version_for_every_length_and_mismatch_position() {
        for len in 0..40usize {
            let base: Vec<u32> = (0..len as u32).map(|i| i * 7 + 1).collect();
            // Identical, and a shorter/longer other side.
            for other_len in 0..=len + 3 {
                let other: Vec<u32> = (0..other_len as u32).map(|i| i * 7 + 1).collect();
                assert_eq!(
                    common_prefix_len(&base, &other),
                    naive_common_prefix_len(&base, &other),
                    "len {len} vs {other_len}"
                );
            }
            // One differing id at every position, including odd tails.
            for at in 0..len {
                let mut other = base.clone();
                other[at] ^= 1 << 31;
                assert_eq!(
                    common_prefix_len(&base, &other),
                    at,
                    "len {len}, mismatch at {at}"
                );
                assert_eq!(common_prefix_len(&other, &base), at);
            }
        }
    }

    #[test]
    fn a_difference_in_the_high_half_of_an_id_is_found() {
        let a = vec![5u32; 16];
        let mut b = a.clone();
        b[9] = 5 | 0x8000_0000;
        assert_eq!(common_prefix_len(&a, &b), 9);
    }

    #[test]
    fn starts_with_ids_agrees_with_slice_starts_with() {
        let hay: Vec<u32> = (0..21).collect();
        for cut in 0..=hay.len() {
            assert!(starts_with_ids(&hay, &hay[..cut]));
        }
        let mut longer = hay.clone();
        longer.push(99);
        assert!(!starts_with_ids(&hay, &longer));
        let mut wrong = hay[..13].to_vec();
        wrong[12] = 1000;
        assert!(!starts_with_ids(&hay, &wrong));
        assert!(starts_with_ids(&[], &[]));
        assert!(!starts_with_ids(&[], &[1]));
    }
}
