//! What a load run asks for: which key, GET or SET, how large a value. Seeded and
//! reproducible: a thread's sequence depends only on the seed and its index.

use std::fmt;
use std::str::FromStr;

use super::rng::Rng;
use crate::units::ByteSize;

/// How keys are drawn from `0..count`.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDist {
    Uniform,
    /// Rank `k` (1-based) drawn with probability proportional to `1 / k^exponent`.
    Zipf {
        exponent: f64,
    },
}

impl FromStr for KeyDist {
    type Err = String;

    /// `uniform`, `zipf` (exponent 0.99) or `zipf:S`.
    fn from_str(text: &str) -> Result<KeyDist, String> {
        match text.split_once(':') {
            None if text == "uniform" => Ok(KeyDist::Uniform),
            None if text == "zipf" => Ok(KeyDist::Zipf { exponent: 0.99 }),
            Some(("zipf", s)) => match s.parse::<f64>() {
                Ok(exponent) if exponent > 0.0 && exponent.is_finite() => {
                    Ok(KeyDist::Zipf { exponent })
                }
                _ => Err(format!("zipf exponent '{s}' must be a positive number")),
            },
            _ => Err(format!(
                "key distribution '{text}' must be uniform, zipf or zipf:EXPONENT"
            )),
        }
    }
}

impl fmt::Display for KeyDist {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            KeyDist::Uniform => write!(f, "uniform"),
            KeyDist::Zipf { exponent } => write!(f, "zipf:{exponent}"),
        }
    }
}

/// Draws key indices in `0..count`. Zipf uses rejection-inversion (Hörmann and Derflinger,
/// 1996): O(1) per draw and no table, so key counts in the billions cost nothing.
#[derive(Clone, Debug)]
pub struct KeySampler {
    count: u64,
    zipf: Option<Zipf>,
}

#[derive(Clone, Debug)]
struct Zipf {
    exponent: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

impl Zipf {
    fn new(count: u64, exponent: f64) -> Zipf {
        let mut z = Zipf {
            exponent,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(count as f64 + 0.5);
        z.s = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        z
    }

    fn h(&self, x: f64) -> f64 {
        (-self.exponent * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.exponent) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.exponent)).max(-1.0);
        (helper1(t) * x).exp()
    }

    /// A rank in `1..=count`.
    fn sample(&self, count: u64, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.unit() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = ((x + 0.5) as u64).clamp(1, count);
            if k as f64 - x <= self.s || u >= self.h_integral(k as f64 + 0.5) - self.h(k as f64) {
                return k;
            }
        }
    }
}

/// `ln(1 + x) / x`, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

impl KeySampler {
    pub fn new(count: u64, dist: &KeyDist) -> KeySampler {
        assert!(count > 0, "at least one key");
        let zipf = match dist {
            KeyDist::Uniform => None,
            KeyDist::Zipf { exponent } => Some(Zipf::new(count, *exponent)),
        };
        KeySampler { count, zipf }
    }

    /// A key index in `0..count` (rank 1 of zipf is index 0, the hottest).
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match &self.zipf {
            None => rng.below(self.count),
            Some(z) => z.sample(self.count, rng) - 1,
        }
    }
}

/// Value sizes.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueSize {
    Fixed(u64),
    /// Uniform in `low..=high`.
    Range {
        low: u64,
        high: u64,
    },
    /// One of the sizes, chosen with the given weights.
    Weighted(Vec<(u64, u64)>),
}

impl FromStr for ValueSize {
    type Err = String;

    /// `1K` (fixed), `32-4K` (uniform range), `32:9,1K:1` (sizes with weights).
    fn from_str(text: &str) -> Result<ValueSize, String> {
        let size = |s: &str| {
            s.trim()
                .parse::<ByteSize>()
                .map(|b| b.0)
                .map_err(|e| format!("value size '{s}': {}", e.0))
        };
        if text.contains(':') {
            let mut list = Vec::new();
            for part in text.split(',') {
                let (s, w) = part
                    .split_once(':')
                    .ok_or_else(|| format!("'{part}' must be SIZE:WEIGHT"))?;
                let weight = w
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| format!("weight '{w}' must be a whole number"))?;
                list.push((size(s)?, weight));
            }
            if list.iter().map(|p| p.1).sum::<u64>() == 0 {
                return Err("the weights must not all be zero".into());
            }
            return Ok(ValueSize::Weighted(list));
        }
        if let Some((low, high)) = text.split_once('-') {
            let (low, high) = (size(low)?, size(high)?);
            if low > high {
                return Err(format!("value size range '{text}' runs backwards"));
            }
            return Ok(ValueSize::Range { low, high });
        }
        Ok(ValueSize::Fixed(size(text)?))
    }
}

impl fmt::Display for ValueSize {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            ValueSize::Fixed(n) => write!(f, "{}", ByteSize(*n)),
            ValueSize::Range { low, high } => write!(f, "{}-{}", ByteSize(*low), ByteSize(*high)),
            ValueSize::Weighted(list) => {
                let parts: Vec<String> = list
                    .iter()
                    .map(|(s, w)| format!("{}:{w}", ByteSize(*s)))
                    .collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

impl ValueSize {
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self {
            ValueSize::Fixed(n) => *n,
            ValueSize::Range { low, high } => rng.between(*low, *high),
            ValueSize::Weighted(list) => {
                let total: u64 = list.iter().map(|p| p.1).sum();
                let mut pick = rng.below(total);
                for &(size, weight) in list {
                    if pick < weight {
                        return size;
                    }
                    pick -= weight;
                }
                unreachable!("pick < total")
            }
        }
    }

    pub fn max(&self) -> u64 {
        match self {
            ValueSize::Fixed(n) => *n,
            ValueSize::Range { high, .. } => *high,
            ValueSize::Weighted(list) => list.iter().map(|p| p.0).max().unwrap_or(0),
        }
    }
}

/// SETs per GETs, as `S:G` (`1:10`: one SET for every ten GETs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    pub sets: u32,
    pub gets: u32,
}

impl FromStr for Ratio {
    type Err = String;

    fn from_str(text: &str) -> Result<Ratio, String> {
        let (s, g) = text
            .split_once(':')
            .ok_or_else(|| format!("ratio '{text}' must be SETS:GETS, for example 1:10"))?;
        let parse = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("ratio '{text}' must be two whole numbers"))
        };
        let ratio = Ratio {
            sets: parse(s)?,
            gets: parse(g)?,
        };
        if ratio.sets == 0 && ratio.gets == 0 {
            return Err(format!("ratio '{text}' has neither SETs nor GETs"));
        }
        Ok(ratio)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}:{}", self.sets, self.gets)
    }
}

/// One request of a load run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get { key: u64 },
    Set { key: u64, value_bytes: u64 },
}

/// The request sequence of one load thread.
#[derive(Clone, Debug)]
pub struct Workload {
    rng: Rng,
    keys: KeySampler,
    sizes: ValueSize,
    ratio: Ratio,
}

impl Workload {
    pub fn new(seed: u64, keys: KeySampler, sizes: ValueSize, ratio: Ratio) -> Workload {
        Workload {
            rng: Rng::new(seed),
            keys,
            sizes,
            ratio,
        }
    }

    pub fn next_op(&mut self) -> Op {
        let key = self.keys.next(&mut self.rng);
        let total = u64::from(self.ratio.sets + self.ratio.gets);
        if self.rng.below(total) < u64::from(self.ratio.sets) {
            Op::Set {
                key,
                value_bytes: self.sizes.next(&mut self.rng),
            }
        } else {
            Op::Get { key }
        }
    }
}

/// The key for index `i`: fixed width, so every key has the same length.
pub fn key_name(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:012}")
}

/// A value's bytes: a pattern of its key and length, so a reader can tell a wrong value.
pub fn fill_value(key: u64, out: &mut Vec<u8>, len: usize) {
    out.clear();
    out.extend((0..len).map(|i| (key as usize).wrapping_mul(31).wrapping_add(i) as u8));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_write() {
        assert_eq!("uniform".parse::<KeyDist>(), Ok(KeyDist::Uniform));
        assert_eq!(
            "zipf:1.2".parse::<KeyDist>(),
            Ok(KeyDist::Zipf { exponent: 1.2 })
        );
        assert!("zipf:-1".parse::<KeyDist>().is_err());
        assert!("pareto".parse::<KeyDist>().is_err());
        assert_eq!("1K".parse::<ValueSize>(), Ok(ValueSize::Fixed(1024)));
        assert_eq!(
            "32-4K".parse::<ValueSize>(),
            Ok(ValueSize::Range {
                low: 32,
                high: 4096
            })
        );
        assert_eq!(
            "32:9,1K:1".parse::<ValueSize>(),
            Ok(ValueSize::Weighted(vec![(32, 9), (1024, 1)]))
        );
        assert!("4K-32".parse::<ValueSize>().is_err());
        assert!("32:x".parse::<ValueSize>().is_err());
        assert!("32:0,64:0".parse::<ValueSize>().is_err());
        assert_eq!("1:10".parse::<Ratio>(), Ok(Ratio { sets: 1, gets: 10 }));
        assert!("0:0".parse::<Ratio>().is_err());
        assert!("10".parse::<Ratio>().is_err());
    }

    #[test]
    fn a_workload_is_reproducible_from_its_seed() {
        let make = |seed| {
            let mut w = Workload::new(
                seed,
                KeySampler::new(1000, &KeyDist::Zipf { exponent: 0.99 }),
                "32:9,1K:1".parse().unwrap(),
                Ratio { sets: 1, gets: 10 },
            );
            (0..500).map(|_| w.next_op()).collect::<Vec<_>>()
        };
        assert_eq!(make(3), make(3));
        assert_ne!(make(3), make(4));
    }

    #[test]
    fn the_mix_and_the_sizes_follow_their_weights() {
        let mut w = Workload::new(
            11,
            KeySampler::new(100, &KeyDist::Uniform),
            "32:9,1K:1".parse().unwrap(),
            Ratio { sets: 1, gets: 10 },
        );
        let (mut sets, mut small) = (0, 0);
        let n = 110_000;
        for _ in 0..n {
            if let Op::Set { key, value_bytes } = w.next_op() {
                assert!(key < 100);
                sets += 1;
                small += u32::from(value_bytes == 32);
            }
        }
        // 1 in 11 are SETs, 9 in 10 of those 32 bytes: within 3 %.
        assert!((9_700..=10_300).contains(&sets), "{sets} sets");
        let share = f64::from(small) / f64::from(sets);
        assert!((0.87..=0.93).contains(&share), "{share}");
    }

    #[test]
    fn zipf_follows_its_law() {
        let (count, exponent) = (1000u64, 0.99);
        let sampler = KeySampler::new(count, &KeyDist::Zipf { exponent });
        let mut rng = Rng::new(5);
        let mut hits = vec![0u64; count as usize];
        let draws = 400_000;
        for _ in 0..draws {
            hits[sampler.next(&mut rng) as usize] += 1;
        }
        let norm: f64 = (1..=count).map(|k| (k as f64).powf(-exponent)).sum();
        for rank in [1u64, 2, 10, 100] {
            let expected = (rank as f64).powf(-exponent) / norm * draws as f64;
            let got = hits[rank as usize - 1] as f64;
            assert!(
                (got - expected).abs() < 0.05 * expected + 30.0,
                "rank {rank}: {got} draws, {expected:.0} expected"
            );
        }
        // Uniform sanity: every key is reachable.
        let uniform = KeySampler::new(10, &KeyDist::Uniform);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[uniform.next(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
