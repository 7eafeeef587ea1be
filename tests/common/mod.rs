//! Shared test helpers: a seeded generator that prints its seed; a real server and client.
#![allow(dead_code)]

pub mod server;

use std::time::{SystemTime, UNIX_EPOCH};

/// SplitMix64: tiny, fast, and the same sequence for the same seed on every machine.
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

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.below(items.len() as u64) as usize])
    }
}

/// `len` bytes of a seeded xorshift stream: large values whose every byte is checkable.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The seeds a model test runs: `HEADROOM_SEED=N` replays one; otherwise `count` seeds from
/// the clock. Each is printed so a failure can be replayed.
pub fn seeds(test: &str, count: u64) -> Vec<u64> {
    if let Ok(text) = std::env::var("HEADROOM_SEED") {
        let seed = text.parse().expect("HEADROOM_SEED must be a number");
        println!("{test}: replaying seed {seed}");
        return vec![seed];
    }
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let seeds: Vec<u64> = (0..count)
        .map(|i| base.wrapping_add(i.wrapping_mul(7919)))
        .collect();
    println!(
        "{test}: seeds {}..(+{count}); replay one with HEADROOM_SEED=<seed>",
        seeds[0]
    );
    seeds
}

/// Runs `body` for every seed, naming the seed in any panic.
pub fn for_each_seed(test: &str, count: u64, mut body: impl FnMut(u64)) {
    for seed in seeds(test, count) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(seed)));
        if let Err(panic) = result {
            eprintln!("{test}: FAILED with seed {seed}; replay with HEADROOM_SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}
