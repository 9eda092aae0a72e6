//! The layer a node lives on.

/// Level of internal id `id`: `floor(-ln(u) * scale)` with `u` uniform in
/// (0, 1], drawn from a hash of (seed, id) so that it needs no stored random
/// state and the same input always builds the same layers.
pub(crate) fn level_for(seed: u64, id: u32, scale: f64) -> u8 {
    let h = splitmix64(seed ^ u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    // 53 random bits, shifted into (0, 1].
    let u = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    (-u.ln() * scale).floor().min(15.0) as u8
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_the_geometric_distribution() {
        let scale = 1.0 / 16f64.ln();
        let n = 200_000u32;
        let mut counts = [0u32; 16];
        for id in 0..n {
            counts[level_for(7, id, scale) as usize] += 1;
        }
        // P(level >= 1) = 1/16 for M = 16.
        let above = f64::from(n - counts[0]) / f64::from(n);
        assert!((above - 1.0 / 16.0).abs() < 0.003, "fraction above level 0: {above}");
        assert!(counts[1] > counts[2] && counts[2] > counts[3]);
        assert_eq!(level_for(7, 12345, scale), level_for(7, 12345, scale));
    }
}
