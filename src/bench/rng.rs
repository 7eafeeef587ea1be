//! A small seeded generator (SplitMix64): every workload is reproducible from its seed.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for the n used here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high);
        low + self.below(high - low + 1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`, uniformly; `None` when there are none.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }

    /// Log-uniform in `[low, high]`: sizes spread evenly over orders of magnitude.
    pub fn log_uniform(&mut self, low: u64, high: u64) -> u64 {
        assert!(0 < low && low <= high);
        let (l, h) = ((low as f64).ln(), (high as f64).ln());
        ((l + (h - l) * self.unit()).exp() as u64).clamp(low, high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn ranges_hold() {
        let mut rng = Rng::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..100_000 {
            let x = rng.below(10);
            seen[x as usize] += 1;
            let y = rng.between(5, 9);
            assert!((5..=9).contains(&y));
            let z = rng.log_uniform(4096, 1 << 30);
            assert!((4096..=1 << 30).contains(&z));
            let u = rng.unit();
            assert!((0.0..1.0).contains(&u));
        }
        // Each of 10 values within 5 % of 10,000.
        assert!(
            seen.iter().all(|&n| (9_500..=10_500).contains(&n)),
            "{seen:?}"
        );
    }
}
